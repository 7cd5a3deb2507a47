"""Faults: what ``tripwire serve`` loses when Redis restarts, PostgreSQL goes away for 10 s, or
the service itself is killed with SIGKILL and restarted.

Each scenario runs a real ``tripwire serve`` process and an exporter-like client: runs of a
root span and 8 tool calls (one run in four loops: a stuck verdict, a kill flag, an alert),
the spans of each run in two requests, 32 runs a request; the client retries 429/503 after
``Retry-After`` and connection errors after 0.5 s (as the stock exporters do), for at most
60 s per request. A run is *acknowledged* when both its requests got 200. After the load the
service is stopped gracefully and the store is read: every acknowledged run must have its run
row, ended, with its receipt and its 8 calls counted; every acknowledged loop its ``stuck``
verdict and its alert in the outbox (and, with Redis, its kill flag key).

1. **Redis restarted** mid-run: a private ``redis-server`` on another port, started by this
   script (never the shared one on 6379), stopped (``SHUTDOWN``, its snapshot saved) and
   started again 3 s later. The service uses it as its kill channel.
2. **PostgreSQL unreachable for 10 s**: the store is ``127.0.0.1:5432/tripwire_bench_faults`` (a
   database of its own, made if missing) through a TCP proxy
   of this script's own (asyncio); the proxy drops every connection and refuses new ones for
   10 s.
3. **SIGKILL**: the service (SQLite store) is killed with SIGKILL mid-run and started again on
   the same port and store, with the write-ahead spool and, as the baseline, without it.

And the cost of the write-ahead: one ``Spool.append`` of a 512-span request against judging
that request (decode + detection), measured in the same run.

Only loopback addresses; every loop is bounded in count and time. The machine is shared:
timings are noisy.

Run: ``python bench/bench_serve_faults.py [--runs 1600] [--only redis,postgres,sigkill,cost]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TOKEN = "faults-token-0123456789abcdef"
CALLS = 8
PER_REQUEST = 32
PG_DATABASE = "tripwire_bench_faults"
"""A database of the bench's own (made if missing): it empties its runs table, and the tests'
``test`` database may be in use meanwhile."""
PG = "postgresql+psycopg://postgres@127.0.0.1:{port}/" + PG_DATABASE


def _own_database() -> None:
    import psycopg

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True, connect_timeout=5) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (PG_DATABASE,)).fetchone() is None:
            conn.execute(f'CREATE DATABASE "{PG_DATABASE}"')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- the load ------------------------------------------------------------------------------------


@dataclass
class Run:
    trace_id: bytes
    looping: bool
    parts_ok: int = 0


def _requests(runs: list[Run], seed: int) -> list[tuple[list[Run], bytes]]:
    """Two requests per group of runs: calls 0-3, then calls 4-7 and the root span."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    out: list[tuple[list[Run], bytes]] = []
    base = time.time_ns()
    rng = random.Random(seed)
    for g in range(0, len(runs), PER_REQUEST):
        group = runs[g : g + PER_REQUEST]
        for half in (0, 1):
            req = ExportTraceServiceRequest()
            rs = req.resource_spans.add()
            kv = rs.resource.attributes.add()
            kv.key, kv.value.string_value = "service.name", "faults-agent"
            ss = rs.scope_spans.add()
            for run in group:
                root_id = int.from_bytes(run.trace_id[:8], "big") or 1
                for i in range(half * CALLS // 2, (half + 1) * CALLS // 2):
                    span = ss.spans.add()
                    span.trace_id = run.trace_id
                    span.span_id = ((root_id + i + 1) % (1 << 64) or 7).to_bytes(8, "big")
                    span.parent_span_id = root_id.to_bytes(8, "big")
                    span.name = "execute_tool search_docs"
                    span.start_time_unix_nano = base + i * 1_000_000
                    span.end_time_unix_nano = span.start_time_unix_nano + 500_000
                    query = "refund policy" if run.looping else f"query {rng.random()}"
                    for key, value in (
                        ("gen_ai.operation.name", "execute_tool"),
                        ("gen_ai.tool.name", "search_docs"),
                        ("gen_ai.tool.call.id", f"{run.trace_id.hex()}-{i}"),
                        ("gen_ai.tool.call.arguments", json.dumps({"query": query})),
                        ("gen_ai.tool.call.result", "No results." if run.looping else f"page {query}"),
                    ):
                        a = span.attributes.add()
                        a.key, a.value.string_value = key, value
                if half == 1:
                    root = ss.spans.add()
                    root.trace_id = run.trace_id
                    root.span_id = root_id.to_bytes(8, "big")
                    root.name = "invoke_agent faults"
                    root.start_time_unix_nano = base
                    root.end_time_unix_nano = base + CALLS * 1_000_000 + 1
                    for key, value in (("gen_ai.operation.name", "invoke_agent"), ("gen_ai.agent.name", "faults")):
                        a = root.attributes.add()
                        a.key, a.value.string_value = key, value
            out.append((group, req.SerializeToString()))
    return out


@dataclass
class Load:
    """An exporter-like client in a thread: sends the requests in order, retrying."""

    port_of: Any
    requests: list[tuple[list[Run], bytes]]
    rate_rps: float
    retries: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    gave_up: int = 0
    done: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        import httpx

        headers = {"Content-Type": "application/x-protobuf", "Authorization": f"Bearer {TOKEN}"}
        t0 = time.monotonic()
        with httpx.Client(timeout=10) as client:
            for n, (group, body) in enumerate(self.requests):
                wait = t0 + n / self.rate_rps - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                deadline = time.monotonic() + 60
                while True:
                    try:
                        r = client.post(f"http://127.0.0.1:{self.port_of()}/v1/traces", content=body, headers=headers)
                        if r.status_code == 200:
                            for run in group:
                                run.parts_ok += 1
                            break
                        key = str(r.status_code)
                        pause = min(2.0, float(r.headers.get("retry-after", "1")))
                    except httpx.TransportError as exc:
                        key = type(exc).__name__
                        pause = 0.5
                    self.refused[key] = self.refused.get(key, 0) + 1
                    self.retries += 1
                    if time.monotonic() + pause > deadline:
                        self.gave_up += 1
                        break
                    time.sleep(pause)
        self.done.set()


# -- the service --------------------------------------------------------------------------------


def start_serve(port: int, store: str, tmp: Path, extra: list[str]) -> subprocess.Popen[bytes]:
    import httpx

    env = dict(os.environ, TRIPWIRE_TOKEN=TOKEN)
    proc = subprocess.Popen(
        [sys.executable, "-c", "from tripwire.cli import main; main()", "serve", "--port", str(port),
         "--store", store, "--log-format", "text", "--webhook", f"http://127.0.0.1:{free_port()}/nobody",
         *extra],
        env=env, stdout=subprocess.DEVNULL, stderr=open(tmp / "serve.log", "ab"),  # noqa: SIM115
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"tripwire serve exited; see {tmp / 'serve.log'}")
        try:
            got = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
            if got.status_code == 200 and got.json().get("started", True):
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise SystemExit("tripwire serve did not start")


def stop_serve(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def check(store_url: str, runs: list[Run], redis_port: int | None = None) -> dict[str, int]:
    """What the store (and Redis) holds of the acknowledged runs."""
    from tripwire.store.runs import RunStore

    store = RunStore.open(store_url)
    try:
        acked = [r for r in runs if r.parts_ok == 2]
        by_id: dict[str, Any] = {}
        offset = 0
        while True:
            rows, total = store.runs(limit=1000, offset=offset)
            by_id.update((row.trace_id, row) for row in rows)
            offset += len(rows)
            if not rows or offset >= total:
                break
        alerts = {row["trace_id"] for row in store.outbox() if row["action"] == "trigger"}
    finally:
        store.dispose()
    missing = no_receipt = wrong_count = loops_missed = alerts_missing = flags_missing = 0
    client = None
    if redis_port is not None:
        import redis

        client = redis.Redis(port=redis_port)
    for run in acked:
        row = by_id.get(run.trace_id.hex())
        if row is None:
            missing += 1
            continue
        if row.status != "ended" or row.receipt is None:
            no_receipt += 1
        if row.tool_calls != CALLS:
            wrong_count += 1
        if run.looping:
            if row.verdict != "stuck" and row.first_stuck_call is None:
                loops_missed += 1
            if run.trace_id.hex() not in alerts:
                alerts_missing += 1
            if client is not None and not client.exists("tripwire:kill:" + run.trace_id.hex()):
                flags_missing += 1
    return {
        "acknowledged runs": len(acked), "loops among them": sum(r.looping for r in acked),
        "run rows missing": missing, "not ended / no receipt": no_receipt,
        "calls miscounted": wrong_count, "loops not stuck": loops_missed,
        "alerts missing": alerts_missing, **({"kill flags missing": flags_missing} if client else {}),
    }


def make_runs(n: int, seed: int) -> list[Run]:
    rng = random.Random(seed)
    return [Run(trace_id=rng.randbytes(16), looping=i % 4 == 0) for i in range(n)]


def report(name: str, load: Load, result: dict[str, int], extra: str = "") -> None:
    lost = sum(v for k, v in result.items() if k not in ("acknowledged runs", "loops among them"))
    print(f"\n{name}{extra}")
    print(f"  client: {len(load.requests)} requests, retried {load.retries} times {dict(sorted(load.refused.items()))}, gave up {load.gave_up}")
    print("  " + ", ".join(f"{k}: {v}" for k, v in result.items()))
    print(f"  {'NOTHING LOST' if lost == 0 else 'LOST: ' + str(lost)}")


# -- scenario 1: Redis restarted ----------------------------------------------------------------


def redis_restart(n_runs: int, rate: float) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="tripwire-faults-redis-"))
    rport, port = free_port(), free_port()

    def redis_up() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--dir", str(tmp),
                                 "--save", "60 1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis

        for _ in range(100):
            try:
                if redis.Redis(port=rport).ping():
                    return proc
            except redis.ConnectionError:
                time.sleep(0.05)
        raise SystemExit("the private redis-server did not start")

    rproc = redis_up()
    store = f"sqlite:///{tmp}/runs.db"
    serve = start_serve(port, store, tmp, ["--redis", f"redis://127.0.0.1:{rport}/0", "--spool", str(tmp / "spool")])
    runs = make_runs(n_runs, 1)
    load = Load(lambda: port, _requests(runs, 1), rate)
    thread = threading.Thread(target=load.run)
    thread.start()
    time.sleep(len(load.requests) / rate / 3)
    import redis

    with_flags_before = int(redis.Redis(port=rport).dbsize())
    down = time.monotonic()
    with contextlib.suppress(redis.ConnectionError):
        redis.Redis(port=rport).shutdown(save=True)
    rproc.wait(timeout=30)
    time.sleep(3)
    rproc = redis_up()
    up = time.monotonic()
    thread.join(timeout=600)
    time.sleep(2)
    stop_serve(serve)
    result = check(store, runs, redis_port=rport)
    log = (tmp / "serve.log").read_text()
    report("1. Redis restarted (SHUTDOWN with its snapshot, 3 s down)", load, result,
           f": {with_flags_before} keys before; down {up - down:.1f} s; the service logged "
           f"{log.count('raising kill flags failed')} channel failure(s), re-raised after: {'raised' in log and 'refused' in log}")
    rproc.terminate()
    rproc.wait(timeout=30)
    shutil.rmtree(tmp, ignore_errors=True)


# -- scenario 2: PostgreSQL unreachable ---------------------------------------------------------


def _tcp_proxy() -> Any:
    """The tests' cuttable TCP proxy (tests/serve/tcp_proxy.py) in front of 127.0.0.1:5432."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "serve"))
    from tcp_proxy import TcpProxy

    return TcpProxy(target_port=5432, port=free_port())


def postgres_outage(n_runs: int, rate: float, seconds: float = 10.0) -> None:
    from tripwire.store.runs import RunStore

    tmp = Path(tempfile.mkdtemp(prefix="tripwire-faults-pg-"))
    try:
        _own_database()
        direct = RunStore.open(PG.format(port=5432))
    except Exception as exc:
        print(f"\n2. PostgreSQL unreachable: SKIPPED, PostgreSQL at 127.0.0.1:5432 is not there ({exc})")
        return
    direct.truncate()
    direct.dispose()
    proxy = _tcp_proxy()
    store = PG.format(port=proxy.port)
    port = free_port()
    serve = start_serve(port, store, tmp, ["--spool", str(tmp / "spool")])
    runs = make_runs(n_runs, 2)
    load = Load(lambda: port, _requests(runs, 2), rate)
    thread = threading.Thread(target=load.run)
    thread.start()
    time.sleep(len(load.requests) / rate / 3)
    proxy.cut()
    cut_at = time.monotonic()
    time.sleep(seconds)
    proxy.restore()
    restored = time.monotonic() - cut_at
    thread.join(timeout=600)
    time.sleep(2)
    stop_serve(serve)
    result = check(PG.format(port=5432), runs)
    log = (tmp / "serve.log").read_text()
    report(f"2. PostgreSQL unreachable for {restored:.1f} s (TCP proxy cut)", load, result,
           f"; the service logged {log.count('run store')} store line(s)")
    proxy.close()
    shutil.rmtree(tmp, ignore_errors=True)


# -- scenario 3: SIGKILL ------------------------------------------------------------------------


def sigkill(n_runs: int, rate: float, spool: bool) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="tripwire-faults-kill-"))
    store = f"sqlite:///{tmp}/runs.db"
    port = free_port()
    extra = ["--spool", str(tmp / "spool") if spool else "off"]
    serve = start_serve(port, store, tmp, extra)
    runs = make_runs(n_runs, 3)
    load = Load(lambda: port, _requests(runs, 3), rate)
    thread = threading.Thread(target=load.run)
    thread.start()
    time.sleep(len(load.requests) / rate / 3)
    serve.send_signal(signal.SIGKILL)
    serve.wait()
    killed = time.monotonic()
    spooled = sum(p.stat().st_size for p in (tmp / "spool").glob("seg-*.log")) if spool else 0
    serve = start_serve(port, store, tmp, extra)
    restart = time.monotonic() - killed
    thread.join(timeout=600)
    time.sleep(2)
    stop_serve(serve)
    result = check(store, runs)
    log = (tmp / "serve.log").read_text()
    replayed = [line for line in log.splitlines() if "replayed" in line]
    report(f"3. SIGKILL and restart, write-ahead spool {'on' if spool else 'OFF (baseline)'}", load, result,
           f": back in {restart:.1f} s; {spooled / 1e6:.1f} MB in the spool at the kill"
           + (f"; {replayed[0].split(': ', 1)[-1]}" if replayed else ""))
    shutil.rmtree(tmp, ignore_errors=True)


# -- the write-ahead's cost ---------------------------------------------------------------------


def cost() -> None:
    import statistics

    from tripwire.serve.fleet import Fleet
    from tripwire.serve.otlp import decode_request
    from tripwire.serve.spool import Spool

    sys.path.insert(0, str(Path(__file__).parent))
    from bench_serve import _request  # the throughput bench's 512-span requests

    bodies = [_request(seed) for seed in range(20)]
    tmp = Path(tempfile.mkdtemp(prefix="tripwire-faults-cost-"))
    spool = Spool(tmp / "spool", segment_bytes=1 << 40)
    appends, judges = [], []
    fleet = Fleet(reorder_s=0)
    for rnd in range(5):
        t0 = time.perf_counter()
        for i, b in enumerate(bodies):
            spool.append(float(rnd * 100 + i), "application/x-protobuf", None, b)
        appends.append((time.perf_counter() - t0) / len(bodies))
        t0 = time.perf_counter()
        for b in bodies:
            fleet.process(decode_request(b, "application/x-protobuf").views, time.time(), flush=True)
        judges.append((time.perf_counter() - t0) / len(bodies))
    spool.close(empty=True)
    shutil.rmtree(tmp, ignore_errors=True)
    a, j = statistics.median(appends), statistics.median(judges)
    print(f"\n4. write-ahead cost per 512-span request ({len(bodies[0]) / 1024:.0f} KiB): append {a * 1e6:,.0f} µs "
          f"(one writev + CRC-32), decode + detection {j * 1e6:,.0f} µs; the append is {a / j:.1%} of it "
          f"(at 5-10x faster decoding: {a / (j / 5):.0%}-{a / (j / 10):.0%})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1600, help="runs per scenario (1600: 100 requests)")
    parser.add_argument("--rate", type=float, default=10.0, help="requests per second the client offers")
    parser.add_argument("--only", default="redis,postgres,sigkill,cost")
    args = parser.parse_args()
    only = set(args.only.split(","))
    print(f"{args.runs} runs of {CALLS} tool calls and a root span, {PER_REQUEST} runs a request, two requests a run, "
          f"{args.rate:g} requests/s")
    if "cost" in only:
        cost()
    if "redis" in only:
        redis_restart(args.runs, args.rate)
    if "postgres" in only:
        postgres_outage(args.runs, args.rate)
    if "sigkill" in only:
        sigkill(args.runs, args.rate, spool=False)
        sigkill(args.runs, args.rate, spool=True)


if __name__ == "__main__":
    main()
