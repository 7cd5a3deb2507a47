"""Overload: offer a ``tripwire serve`` process 5x the load it can take, for 30 s.

What it checks, and prints:

1. the receiver's capacity, measured first in the same run: a closed loop of two client
   connections for ``--capacity-seconds`` (the plain baseline this run is compared with);
2. then an open loop at ``--factor`` (5) times that rate for ``--seconds`` (30): requests are
   sent on a fixed schedule whether or not the earlier ones were answered (at most
   ``--connections`` outstanding; a send that finds them all busy is counted as "could not
   send"), which is what a fleet of exporters does to a receiver;
3. every second, the receiver's resident memory (``/proc/PID/status`` VmRSS) and the answers
   so far: memory must stay bounded;
4. the answers: 200, 429/503 (each must carry ``Retry-After``), anything else (a 5xx without
   it, a reset connection, a timeout: the receiver falling over);
5. after the load: spans accepted (the 200s × 512) against spans judged
   (``tripwire_tool_calls_judged_total`` on ``/metrics``, after the reorder buffer drained):
   every accepted span must be judged.

Each request is 512 GenAI tool spans with call ids of its own (a template with a placeholder
replaced per request, so the client costs little CPU and no span is a duplicate); eight
consecutive requests share 64 traces, so traces start and go quiet all the time, and one in
four loops (stuck verdicts, kill flags, alerts rows).

Only 127.0.0.1; every loop is bounded in time and count. The machine is shared: figures are
noisy, the lead re-runs on an idle machine.

Run: ``python bench/bench_serve_overload.py [--seconds 30] [--factor 5]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TOKEN = "overload-token-0123456789abcdef"
SPANS = 512
TRACES = 64
_CALL_MARK = b"QQQQQQQQ"
_TRACE_MARK = b"\xa5TRQ\x00\x00\x00\x00"
_WORDS = ("billing", "shipping", "returns", "warranty", "invoices", "accounts", "refunds", "orders")


def template() -> bytes:
    """One OTLP protobuf request with placeholders for the request number."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    kv = rs.resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", "overload-agent"
    ss = rs.scope_spans.add()
    ss.scope.name = "bench"
    base = time.time_ns()
    for i in range(SPANS):
        t = i % TRACES
        span = ss.spans.add()
        span.trace_id = _TRACE_MARK + (t + 1).to_bytes(8, "big")
        span.span_id = (i + 1).to_bytes(8, "big")
        span.parent_span_id = (t + 1).to_bytes(8, "big")
        span.name = "execute_tool search_docs"
        span.start_time_unix_nano = base + i * 1_000_000
        span.end_time_unix_nano = span.start_time_unix_nano + 500_000
        looping = t % 4 == 0
        query = "refund policy" if looping else f"{_WORDS[i % 8]} {_CALL_MARK.decode()} {i}"
        for key, value in (
            ("gen_ai.operation.name", "execute_tool"),
            ("gen_ai.tool.name", "search_docs"),
            ("gen_ai.tool.call.id", f"c{_CALL_MARK.decode()}_{i}"),
            ("gen_ai.tool.call.arguments", json.dumps({"query": query})),
            ("gen_ai.tool.call.result", "No results." if looping else f"page about {query}"),
        ):
            a = span.attributes.add()
            a.key, a.value.string_value = key, value
    return req.SerializeToString()


def body(tpl: bytes, n: int) -> bytes:
    """Request ``n``: its own call ids; requests 8k…8k+7 share their 64 traces."""
    out = tpl.replace(_CALL_MARK, b"%08x" % n)
    return out.replace(_TRACE_MARK, _TRACE_MARK[:4] + (n // 8).to_bytes(4, "big"))


def rss_mb(pid: int) -> float:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return float("nan")
    m = re.search(r"VmRSS:\s+(\d+) kB", text)
    return int(m.group(1)) / 1024 if m else float("nan")


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process used so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


class Conn:
    """One keep-alive HTTP/1.1 connection on raw asyncio streams: a client that costs the
    shared machine little CPU (httpx costs about a core at these rates)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.used = 0.0

    async def post(self, payload: bytes, timeout: float = 10.0) -> tuple[int, dict[str, str]]:
        if self.writer is not None and time.monotonic() - self.used > 4.0:
            self.close()  # uvicorn closes keep-alive connections idle for 5 s: do not race it
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.used = time.monotonic()
        assert self.reader is not None
        head = (
            f"POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
            f"Content-Type: application/x-protobuf\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n"
        ).encode()
        try:
            self.writer.write(head + payload)
            await self.writer.drain()
            status_line = await asyncio.wait_for(self.reader.readline(), timeout)
            if not status_line:
                raise ConnectionResetError("closed by the receiver")
            headers: dict[str, str] = {}
            while True:
                line = await asyncio.wait_for(self.reader.readline(), timeout)
                if line in (b"\r\n", b""):
                    break
                k, _, v = line.decode("latin-1").partition(":")
                headers[k.strip().lower()] = v.strip()
            await asyncio.wait_for(self.reader.readexactly(int(headers.get("content-length", "0"))), timeout)
            self.used = time.monotonic()
            if headers.get("connection", "").lower() == "close":
                self.close()
            return int(status_line.split()[1]), headers
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def closed_loop(port: int, tpl: bytes, seconds: float, start: int) -> tuple[float, int]:
    """Two connections back to back: the receiver's capacity in spans/s."""
    counter = [start]
    ok = [0]
    stop = time.monotonic() + seconds

    async def worker() -> None:
        conn = Conn(port)
        while time.monotonic() < stop and counter[0] < start + 100_000:
            n = counter[0]
            counter[0] += 1
            status, _ = await conn.post(body(tpl, n), timeout=30)
            if status == 200:
                ok[0] += 1
        conn.close()

    t0 = time.monotonic()
    await asyncio.gather(worker(), worker())
    return ok[0] * SPANS / (time.monotonic() - t0), counter[0]


async def open_loop(
    port: int, tpl: bytes, rate_rps: float, seconds: float, connections: int, start: int, pid: int
) -> dict[str, object]:
    codes: dict[str, int] = {}
    missing_retry_after = 0
    could_not_send = 0
    rss: list[tuple[float, float, int, int]] = []
    n = start
    idle = [Conn(port) for _ in range(connections)]
    tasks: set[asyncio.Task[None]] = set()

    async def one(conn: Conn, number: int) -> None:
        nonlocal missing_retry_after
        try:
            status, headers = await conn.post(body(tpl, number))
            key = str(status)
            if status in (429, 503) and "retry-after" not in headers:
                missing_retry_after += 1
        except asyncio.TimeoutError:
            key = "timeout"
        except (OSError, asyncio.IncompleteReadError) as exc:
            key = type(exc).__name__
        finally:
            idle.append(conn)
        codes[key] = codes.get(key, 0) + 1

    t0 = time.monotonic()
    next_sample = t0 + 1
    sent = 0
    while (now := time.monotonic()) < t0 + seconds and sent < 1_000_000:
        due = int((now - t0) * rate_rps) - sent
        for _ in range(max(0, due)):
            sent += 1
            if not idle:
                could_not_send += 1
                continue
            task = asyncio.create_task(one(idle.pop(), n))
            n += 1
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if now >= next_sample:
            refused = sum(v for k, v in codes.items() if k in ("429", "503"))
            rss.append((now - t0, rss_mb(pid), codes.get("200", 0), refused))
            next_sample += 1
        await asyncio.sleep(0.002)
    if tasks:
        await asyncio.wait(tasks, timeout=30)
    for conn in idle:
        conn.close()
    return {
        "codes": codes, "missing_retry_after": missing_retry_after, "could_not_send": could_not_send,
        "offered": sent, "rss": rss, "elapsed": time.monotonic() - t0, "next": n,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="length of the overload (30)")
    parser.add_argument("--factor", type=float, default=5.0, help="offered load / capacity (5)")
    parser.add_argument("--capacity-seconds", type=float, default=5.0, help="capacity run length (5)")
    parser.add_argument("--connections", type=int, default=128, help="client connections at most (128)")
    parser.add_argument("--extra", default="", help="extra tripwire serve options (space-separated)")
    args = parser.parse_args()
    import httpx

    tmp = tempfile.mkdtemp(prefix="tripwire-overload-")
    port = _free_port()
    env = dict(os.environ, TRIPWIRE_TOKEN=TOKEN)
    server = subprocess.Popen(
        [sys.executable, "-c", "from tripwire.cli import main; main()", "serve", "--port", str(port),
         "--store", f"sqlite:///{tmp}/runs.db", "--log-format", "text", *args.extra.split()],
        env=env, stdout=subprocess.DEVNULL, stderr=open(f"{tmp}/serve.log", "wb"),  # noqa: SIM115
    )
    url = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                got = httpx.get(f"{url}/healthz", timeout=1)
                if got.status_code == 200 and got.json().get("started", True):
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit(f"the receiver did not start; see {tmp}/serve.log")
            time.sleep(0.1)
        tpl = template()
        print(f"receiver pid {server.pid}, RSS at start {rss_mb(server.pid):.0f} MB; requests of {SPANS} spans")
        c0, m0 = cpu_s(server.pid), time.process_time()
        capacity, n = asyncio.run(closed_loop(port, tpl, args.capacity_seconds, 0))
        c1, m1 = cpu_s(server.pid), time.process_time()
        rate_rps = capacity * args.factor / SPANS
        print(f"capacity (closed loop, 2 connections, {args.capacity_seconds:g} s): {capacity:,.0f} spans/s "
              f"= {capacity / SPANS:.1f} requests/s; RSS {rss_mb(server.pid):.0f} MB")
        print(f"offering {args.factor:g}x: {rate_rps:.1f} requests/s = {rate_rps * SPANS:,.0f} spans/s for {args.seconds:g} s")
        result = asyncio.run(open_loop(port, tpl, rate_rps, args.seconds, args.connections, n, server.pid))
        c2, m2 = cpu_s(server.pid), time.process_time()
        print(f"CPU: receiver {(c1 - c0) / args.capacity_seconds:.0%} of a core during the capacity run, "
              f"{(c2 - c1) / float(result['elapsed']):.0%} during the overload; this client "  # type: ignore[arg-type]
              f"{(m1 - m0) / args.capacity_seconds:.0%} and {(m2 - m1) / float(result['elapsed']):.0%}")  # type: ignore[arg-type]
        print(f"{'t (s)':>6} {'RSS MB':>8} {'200s':>7} {'429/503':>8}")
        for t, mb, ok, refused in result["rss"]:  # type: ignore[attr-defined]
            print(f"{t:6.0f} {mb:8.0f} {ok:7d} {refused:8d}")
        time.sleep(1.5)  # the reorder buffer releases the last spans
        text = httpx.get(f"{url}/metrics", headers=auth, timeout=30).text
        codes: dict[str, int] = result["codes"]  # type: ignore[assignment]
        capacity_ok = capacity * args.capacity_seconds  # spans accepted in the capacity run (approx.)
        accepted = metric(text, "tripwire_spans_received_total")
        judged = metric(text, "tripwire_tool_calls_judged_total")
        rss_values = [mb for _, mb, _, _ in result["rss"]]  # type: ignore[attr-defined]
        print(f"answers during the overload: {dict(sorted(codes.items()))}; could not send (all "
              f"{args.connections} connections busy): {result['could_not_send']}; "
              f"429/503 without Retry-After: {result['missing_retry_after']}")
        print(f"accepted during the overload: {codes.get('200', 0) * SPANS:,} spans = "
              f"{codes.get('200', 0) * SPANS / float(result['elapsed']):,.0f} spans/s "  # type: ignore[arg-type]
              f"(capacity {capacity:,.0f} spans/s)")
        print(f"spans accepted in the whole run (/metrics): {accepted:,.0f}; tool calls judged: {judged:,.0f}; "
              f"not judged: {accepted - judged:,.0f}")
        print(f"RSS over the overload: min {min(rss_values):.0f} MB, max {max(rss_values):.0f} MB, "
              f"last {rss_values[-1]:.0f} MB; receiver alive: {server.poll() is None}")
        fell_over = sum(v for k, v in codes.items() if k not in ("200", "429", "503"))
        verdict = (
            "PASS" if fell_over == 0 and result["missing_retry_after"] == 0 and accepted == judged
            and server.poll() is None else "FAIL"
        )
        print(f"{verdict}: other answers/errors {fell_over}, unjudged {accepted - judged:,.0f}")
        del capacity_ok
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    main()
