"""Benchmark: the fleet service's receiver (``tripwire serve``), next to a plain receiver.

Prints, in one run, spans per second for:

1. decode only (the plain receiver: the OTLP decoder of ``tripwire.spans.otlp``, its compiled
   wire scanner for protobuf and its compiled fast path for JSON unless
   ``TRIPWIRE_NO_EXTENSIONS=1``, else the Python twin and msgspec) and
   decode + detection (the fleet: mapping, signatures, the loop watcher, run records) on
   batches of 512 GenAI tool spans in 64 traces, no HTTP; targets 150,000 spans/s (protobuf)
   and 130,000 spans/s (JSON) per core;
2. end to end over HTTP on loopback: a ``tripwire serve`` process (in-memory state, SQLite
   store) fed by a client process on the same machine, next to a plain receiver on the same
   stack (Starlette on uvicorn) that only decodes; target 50,000 spans/s per receiver process;
   and the Redis-state figure. Each also as the server's CPU time per span, which a busy
   machine changes less than the rate.

Both sides run with the garbage collector as ``tripwire serve`` sets it
(``tripwire.serve.tune_gc``): start-up frozen, the youngest generation collected every 50,000
allocations.

Every load loop is bounded in count and time, and sends only to 127.0.0.1.

Run: ``python bench/bench_serve.py [--batches 40] [--http-seconds 5] [--no-http]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_PB = 150_000
TARGET_JSON = 130_000
TARGET_HTTP = 50_000
_WORDS = (
    "billing", "shipping", "returns", "warranty", "invoices", "accounts", "refunds", "orders",
    "taxes", "pricing", "status", "privacy", "terms", "contact", "careers", "press", "support",
    "api", "limits", "regions", "backup", "export", "import", "teams", "roles", "audit",
)


def _call_prefix(seed: int) -> str:
    """The call ids' prefix in request ``seed`` (fixed width: the HTTP client rewrites it)."""
    return f"call_{seed:08d}_"


def _request(seed: int, spans: int = 512, traces: int = 64) -> bytes:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    rng = random.Random(seed)
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    kv = rs.resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", "bench-agent"
    ss = rs.scope_spans.add()
    ss.scope.name = "bench"
    base = 1_700_000_000_000_000_000 + seed * 10**12
    for i in range(spans):
        t = i % traces
        span = ss.spans.add()
        span.trace_id = (t + 1).to_bytes(16, "big")  # the same runs go on over the requests
        span.span_id = (seed * 10**6 + i + 1).to_bytes(8, "big")
        span.parent_span_id = (t + 1).to_bytes(8, "big")
        span.name = "execute_tool search_docs"
        span.start_time_unix_nano = base + i * 1_000_000
        span.end_time_unix_nano = span.start_time_unix_nano + 500_000
        looping = t % 4 == 0
        query = "refund policy" if looping else " ".join(rng.choice(_WORDS) for _ in range(3))
        for key, value in (
            ("gen_ai.operation.name", "execute_tool"),
            ("gen_ai.tool.name", "search_docs"),
            ("gen_ai.tool.call.id", f"{_call_prefix(seed)}{i}"),
            ("gen_ai.tool.call.arguments", json.dumps({"query": query})),
            ("gen_ai.tool.call.result", "No results." if looping else f"page about {query} " * 4),
            ("thread.id", "1"),
            ("code.function", "search_docs"),
        ):
            a = span.attributes.add()
            a.key, a.value.string_value = key, value
    return req.SerializeToString()


def _json(body: bytes) -> bytes:
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    req = ExportTraceServiceRequest()
    req.ParseFromString(body)
    message = MessageToDict(req)
    import base64

    for rs in message["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    span[key] = base64.b64decode(span[key]).hex()
    return json.dumps(message).encode()


def _rate(fn, bodies: list[bytes], kind: str, rounds: int = 5) -> float:  # type: ignore[no-untyped-def]
    rates = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        n = fn(bodies, kind)
        rates.append(n / (time.perf_counter() - t0))
    return statistics.median(rates)


def _decode_only(bodies: list[bytes], kind: str) -> int:
    from tripwire.serve.otlp import decode_request

    return sum(len(decode_request(b, kind).views) for b in bodies)


def _decode_detect(bodies: list[bytes], kind: str) -> int:
    from tripwire.serve.fleet import Fleet
    from tripwire.serve.otlp import decode_request

    fleet = Fleet(reorder_s=0, max_traces=10**6)
    n = 0
    for b in bodies:
        views = decode_request(b, kind).views
        n += len(views)
        fleet.process(views, 1.0)
    return n


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _http(bodies: list[bytes], seconds: float, extra: list[str]) -> tuple[float, float]:
    """Spans/s through one ``tripwire serve`` process, fed by a client process, and the
    server's CPU time per span in µs (what a busy machine changes least)."""
    port = _free_port()
    tmp = tempfile.mkdtemp()
    env = dict(os.environ, TRIPWIRE_TOKEN="bench-token-0123456789abcdef")
    command = (
        [__file__, "--plain-server", str(port)]
        if extra == ["--plain"]
        else ["-c", "from tripwire.cli import main; main()", "serve", "--port", str(port),
              "--store", f"sqlite:///{tmp}/runs.db", "--reorder-ms", "0", *extra]
    )
    server = subprocess.Popen(
        [sys.executable, *command], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        import httpx

        deadline = time.monotonic() + 30
        while True:
            try:
                got = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                if got.status_code == 200 and got.json().get("started", True):
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the bench server did not start")
            time.sleep(0.1)
        path = Path(tmp) / "bodies.bin"
        with path.open("wb") as fh:
            for b in bodies:
                fh.write(len(b).to_bytes(4, "big") + b)
        cpu0 = _cpu_s(server.pid)
        client = subprocess.run(
            [sys.executable, __file__, "--client", str(port), str(path), str(seconds)],
            capture_output=True, text=True, check=True, env=env, timeout=seconds + 60,
        )
        rate, spans = (float(x) for x in client.stdout.strip().splitlines()[-1].split())
        return rate, (_cpu_s(server.pid) - cpu0) / max(spans, 1) * 1e6
    finally:
        server.terminate()
        server.wait(timeout=20)


def _client(port: int, path: str, seconds: float) -> None:
    """The load client: POST the bodies round and round for ``seconds`` (two connections)."""
    import threading

    import httpx

    data = Path(path).read_bytes()
    bodies = []
    i = 0
    while i < len(data):
        n = int.from_bytes(data[i : i + 4], "big")
        bodies.append(data[i + 4 : i + 4 + n])
        i += 4 + n
    spans_per = 512
    sent = [0, 0]
    stop = time.monotonic() + seconds
    headers = {"Content-Type": "application/x-protobuf", "Authorization": "Bearer bench-token-0123456789abcdef"}

    # Bodies of an earlier run are not sent again (a --state redis receiver remembers requests
    # it applied, in Redis, for a while): each run numbers its requests from its own offset.
    offset = random.randrange(1, 900) * 100_000

    def worker(k: int) -> None:
        with httpx.Client(timeout=30) as c:
            j = k
            while time.monotonic() < stop and j < 100_000:
                # Every request new: the bodies come round again with fresh call ids (a body
                # sent twice is a retried export, acknowledged without being judged again;
                # its calls sent again are duplicates of calls already counted).
                seed = j % len(bodies)
                body = bodies[seed].replace(_call_prefix(seed).encode(), _call_prefix(offset + j).encode())
                r = c.post(f"http://127.0.0.1:{port}/v1/traces", content=body, headers=headers)
                if r.status_code == 200:
                    sent[k] += spans_per
                j += 2

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(sum(sent) / (time.monotonic() - t0), sum(sent))


def _plain_server(port: int) -> None:
    """The plain receiver over HTTP: the same ASGI stack (Starlette on uvicorn), a route that
    only decompresses and decodes, and the empty ``ExportTraceServiceResponse``."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from tripwire.spans.otlp import decode_request, decompress

    async def traces(request: Request) -> Response:
        body = decompress(await request.body(), request.headers.get("content-encoding"), max_bytes=64 << 20)
        decode_request(body, request.headers.get("content-type"))
        return Response(b"", media_type="application/x-protobuf")

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    from tripwire.serve import tune_gc

    app = Starlette(routes=[Route("/v1/traces", traces, methods=["POST"]), Route("/healthz", healthz)])
    tune_gc()  # the settings tripwire serve runs with: the same for the baseline
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def _forget_bench_traces(url: str) -> None:
    """Delete the shared logs of the bench's own traces (``_request``'s trace ids 1 to 64), and
    nothing else of that Redis."""
    import redis

    from tripwire.serve.shared_state import LOG_PREFIX

    client = redis.Redis.from_url(url)
    try:
        client.delete(*[f"{LOG_PREFIX}{t + 1:032x}" for t in range(64)])
    finally:
        client.close()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        _client(int(sys.argv[2]), sys.argv[3], float(sys.argv[4]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--plain-server":
        _plain_server(int(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=40, help="requests of 512 spans (default 40)")
    parser.add_argument("--http-seconds", type=float, default=5.0, help="length of each HTTP run")
    parser.add_argument("--no-http", action="store_true", help="skip the end-to-end HTTP runs")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0", help="Redis for the Redis-state run")
    args = parser.parse_args()
    from tripwire.serve.otlp import protobuf_backend
    from tripwire.spans.otlp import _JSON_SCAN, scanner

    bodies = [_request(seed) for seed in range(args.batches)]
    jbodies = [_json(b) for b in bodies]
    scan = scanner()
    json_reader = "the compiled fast path" if _JSON_SCAN is not None else "msgspec"
    print(f"protobuf scanner: {scan.__module__}.{scan.__name__} (protobuf backend: {protobuf_backend()}); "
          f"JSON: {json_reader}; {args.batches} requests of 512 GenAI tool spans, 64 traces each")
    from tripwire.serve import GC_YOUNG, tune_gc

    tune_gc()  # the garbage collector as tripwire serve sets it, for both sides of the rows below
    print(f"garbage collector as in tripwire serve: start-up frozen, youngest generation every {GC_YOUNG:,} allocations")
    print(f"{'case':44} {'plain (decode)':>16} {'tripwire':>12} {'target':>9}")
    for label, kind, data, target in (
        ("protobuf: decode + detection, no HTTP", "application/x-protobuf", bodies, TARGET_PB),
        ("OTLP/JSON: decode + detection, no HTTP", "application/json", jbodies, TARGET_JSON),
    ):
        plain = _rate(_decode_only, data, kind)
        ours = _rate(_decode_detect, data, kind)
        print(f"{label:44} {plain:>14,.0f}/s {ours:>10,.0f}/s {target:>8,}")
    if not args.no_http:
        plain, plain_cpu = _http(bodies, args.http_seconds, ["--plain"])
        ours, ours_cpu = _http(bodies, args.http_seconds, ["--no-auth"])
        _forget_bench_traces(args.redis)  # a fresh start: earlier runs' logs would be replayed first
        redis, redis_cpu = _http(bodies, args.http_seconds, ["--no-auth", "--redis", args.redis, "--state", "redis"])
        _forget_bench_traces(args.redis)
        cpu = f"server CPU per span: plain {plain_cpu:.1f} µs"
        print(f"{'HTTP end to end, in-memory state':44} {plain:>14,.0f}/s {ours:>10,.0f}/s {TARGET_HTTP:>8,}"
              f"   ({cpu}, tripwire {ours_cpu:.1f} µs)")
        print(f"{'HTTP end to end, state in Redis':44} {plain:>14,.0f}/s {redis:>10,.0f}/s {'':>8}"
              f"   ({cpu}, tripwire {redis_cpu:.1f} µs)")


if __name__ == "__main__":
    main()
