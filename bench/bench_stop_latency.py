"""Stop latency: how many tool bodies an agent runs after the call ``tripwire serve`` flags.

A real ``tripwire serve`` process (SQLite store, no spool) and, for each run, an agent in a
process of its own: the plain loop of docs/serve.md, ``tripwire.check()`` before each model
call and before each tool body, the same tool call every step (``search_docs`` with the same
arguments and result), 30 steps at most, each model call taking ``--speeds`` seconds. Its
local policy is too loose to trip (``threshold``, ``same_result``, ``revisit`` 40): only the service's flag stops it. The
service flags the 4th identical call; the figure is the tool bodies run after it (0 is the
best possible: the 5th body is refused), median over ``--runs`` runs, and the time from the
end of the 4th body to the flag in the agent's cache.

Exporter settings compared:

- ``default``: the SDK's ``BatchSpanProcessor(OTLPSpanExporter(...))`` as its docs show it
  (a span waits up to 5 s before it is sent), wrapped by ``tripwire.otel.instrument(inner=...)``;
- ``recommended``: ``tripwire.otel.instrument(endpoint=URL, token=TOKEN)`` (a span waits at
  most ``EXPORT_DELAY_MS``);
- ``fast``: the same settings wired by hand (``BatchSpanProcessor(exporter,
  schedule_delay_millis=25)``), for a tripwire older than ``instrument(endpoint=...)``: run the
  bench with ``PYTHONPATH`` at an older ``src`` to measure the baseline (the URL channel polled
  every 0.5 s before ``POST /api/flags/wait``).

Channels: ``http`` (``tripwire.remote.connect(url=...)``: the long poll
``POST /api/flags/wait``) and ``redis`` (``connect(redis_url=...)``: pub/sub). The service runs
with its default ``--reorder-ms`` (200) and with ``--reorder-ms 0``.

Then the channel alone: an operator's Kill (``POST /api/runs/{id}/kill``) to the flag in an
agent's cache, over each channel, and a flag raised in Redis to the cache (pub/sub).

Only loopback addresses; Redis on 127.0.0.1:6379 (the keys it writes are deleted). The machine
is shared: timings are noisy.

Run: ``python bench/bench_stop_latency.py [--runs 3] [--speeds 0,0.2,0.5,2]
[--channels http,redis] [--exports default,recommended] [--reorder 200,0]``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

TOKEN = "bench-token-0123456789abcdef0123"
REDIS_URL = os.environ.get("TRIPWIRE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
STEPS = 30
FLAGGED = 4
"""The call the service flags: the 4th identical one (the default loop policy). The flag the
agent holds may say more hits: a stuck run that repeats itself has its flag raised again."""


# -- the agent (its own process) -----------------------------------------------------------


def agent(url: str, channel: str, export: str, model_s: float) -> dict[str, Any]:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    import tripwire
    import tripwire.otel
    import tripwire.remote
    from tripwire.errors import RunStopped

    if channel == "http":
        remote = tripwire.remote.connect(url=url, token=TOKEN)
    else:
        remote = tripwire.remote.connect(redis_url=channel)
    provider = TracerProvider()
    # The local policy never trips on 30 calls: only the service stops the run.
    loose = {"threshold": 40, "window": 64, "same_result": 40, "same_error": 40, "revisit": 40}
    if export in ("default", "fast"):
        exporter = OTLPSpanExporter(endpoint=f"{url}/v1/traces", headers={"Authorization": f"Bearer {TOKEN}"})
        delay = {"schedule_delay_millis": 25} if export == "fast" else {}
        tripwire.otel.instrument(provider=provider, inner=BatchSpanProcessor(exporter, **delay), **loose)
    else:
        tripwire.otel.instrument(provider=provider, endpoint=url, token=TOKEN, **loose)
    tracer = provider.get_tracer("bench-agent")
    bodies = model_calls = 0
    body_ended: list[float] = []
    flag_at: list[float] = []
    ended = "finished"
    with tracer.start_as_current_span(
        "invoke_agent looper",
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "looper"},
    ) as root:
        tid = f"{root.get_span_context().trace_id:032x}"
        done = threading.Event()

        def watch() -> None:  # when the flag reaches this process's cache
            while not done.is_set():
                if remote.flagged(tid) is not None:
                    flag_at.append(time.monotonic())
                    return
                time.sleep(0.0005)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        began = time.monotonic()
        try:
            for step in range(STEPS):
                tripwire.check()  # before the model call
                model_calls += 1
                with tracer.start_as_current_span(
                    "chat fake-model",
                    attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": "fake-model"},
                ):
                    if model_s:
                        time.sleep(model_s)
                tripwire.check()  # before the tool body
                with tracer.start_as_current_span(
                    "execute_tool search_docs",
                    attributes={
                        "gen_ai.operation.name": "execute_tool",
                        "gen_ai.tool.name": "search_docs",
                        "gen_ai.tool.call.id": f"call_{step}",
                        "gen_ai.tool.call.arguments": json.dumps({"query": "refund policy"}),
                        "gen_ai.tool.call.result": "No results.",
                    },
                ):
                    bodies += 1
                body_ended.append(time.monotonic())
        except RunStopped as exc:
            ended = f"stopped:{exc.reason.value}"
        loop_s = time.monotonic() - began
        # Give a flag that comes after the last step a moment to arrive (the latency column).
        deadline = time.monotonic() + 8
        while not flag_at and time.monotonic() < deadline:
            time.sleep(0.005)
        done.set()
    flag = remote.flagged(tid) or {}
    provider.shutdown()
    hits = int(flag.get("hits") or 0)
    if flag and hits < FLAGGED:
        raise SystemExit(f"the service flagged the run at call {hits}, not {FLAGGED}: {flag}")
    latency = (flag_at[0] - body_ended[FLAGGED - 1]) if flag_at and len(body_ended) >= FLAGGED else None
    return {
        "trace_id": tid, "bodies": bodies, "model_calls": model_calls, "ended": ended,
        "flag_hits": hits, "after": bodies - FLAGGED, "model_calls_after": model_calls - FLAGGED,
        "body_ms": [round((t - began) * 1000, 1) for t in body_ended],
        "loop_ms": round(loop_s * 1000, 1),
        "latency_ms": None if latency is None else round(latency * 1000, 1),
    }


def openai_loop_agent(url: str, channel: str, export: str, model_s: float) -> dict[str, Any]:
    """The same agent on ``tripwire.integrations.loop.run_openai`` with an offline fake client
    (each model call takes ``model_s``, and asks for the same ``search_docs`` call again); the
    tool function sends its ``execute_tool`` span, as an instrumentation would. No
    ``tripwire.check()`` written by hand: the adapter checks the fleet before each model call
    and each tool body, keyed by the current span's trace id."""
    from openai.types.chat import ChatCompletion
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    import tripwire.otel
    import tripwire.remote
    from tripwire.integrations import StoppedRun
    from tripwire.integrations.loop import run_openai

    if channel == "http":
        tripwire.remote.connect(url=url, token=TOKEN)
    else:
        tripwire.remote.connect(redis_url=channel)
    provider = TracerProvider()
    loose = {"threshold": 40, "window": 64, "same_result": 40, "same_error": 40, "revisit": 40}
    if export in ("default", "fast"):
        exporter = OTLPSpanExporter(endpoint=f"{url}/v1/traces", headers={"Authorization": f"Bearer {TOKEN}"})
        delay = {"schedule_delay_millis": 25} if export == "fast" else {}
        tripwire.otel.instrument(provider=provider, inner=BatchSpanProcessor(exporter, **delay), **loose)
    else:
        tripwire.otel.instrument(provider=provider, endpoint=url, token=TOKEN, **loose)
    tracer = provider.get_tracer("bench-agent")
    events: list[str] = []

    class Completions:
        def create(self, *, model: str, messages: Any, **kw: Any) -> Any:
            n = len(events)
            events.append("model")
            with tracer.start_as_current_span("chat fake-model", attributes={"gen_ai.operation.name": "chat"}):
                if model_s:
                    time.sleep(model_s)
            call = {"id": f"call_{n}", "type": "function",
                    "function": {"name": "search_docs", "arguments": json.dumps({"query": "refund policy"})}}
            return ChatCompletion.model_validate({
                "id": f"chatcmpl-{n}", "object": "chat.completion", "created": 0, "model": model,
                "choices": [{"index": 0, "finish_reason": "tool_calls",
                             "message": {"role": "assistant", "content": None, "tool_calls": [call]}}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13},
            })

    class Client:
        def __init__(self) -> None:
            self.chat = type("Chat", (), {"completions": Completions()})()

    def search_docs(query: str) -> str:
        with tracer.start_as_current_span("execute_tool search_docs", attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search_docs",
            "gen_ai.tool.call.id": f"call_{len(events)}",
            "gen_ai.tool.call.arguments": json.dumps({"query": query}),
            "gen_ai.tool.call.result": "No results.",
        }):
            events.append("tool")
        return "No results."

    with tracer.start_as_current_span(
        "invoke_agent looper",
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "looper"},
    ) as root:
        tid = f"{root.get_span_context().trace_id:032x}"
        out = run_openai(
            Client(), model="gpt-4o-mini", messages=[{"role": "user", "content": "refund policy?"}],
            tools=[{"type": "function", "function": {"name": "search_docs"}}],
            functions={"search_docs": search_docs}, loop_policy=None, max_turns=STEPS,
        )
    provider.shutdown()
    tools_seen = 0
    after_models = None
    for i, kind in enumerate(events):
        tools_seen += kind == "tool"
        if kind == "tool" and tools_seen == FLAGGED:
            after_models = sum(1 for k in events[i + 1:] if k == "model")
            break
    return {
        "trace_id": tid, "bodies": events.count("tool"), "model_calls": events.count("model"),
        "ended": f"stopped:{out.reason.value}" if isinstance(out, StoppedRun) else "finished",
        "after": events.count("tool") - FLAGGED, "model_calls_after": after_models, "latency_ms": None,
    }


# -- the bench ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_service(tmp: Path, reorder_ms: int, redis: bool) -> tuple[subprocess.Popen[bytes], str]:
    import httpx

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIPWIRE_")}
    env.update(TRIPWIRE_TOKEN=TOKEN, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    args = [
        "serve", "--port", str(port), "--store", f"sqlite:///{tmp / f'runs-{port}.db'}",
        "--spool", "off", "--reorder-ms", str(reorder_ms), "--log-format", "text",
    ]
    if redis:
        args += ["--redis", REDIS_URL]
    proc = subprocess.Popen(
        [sys.executable, "-c", "from tripwire.cli import main; main()", *args],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("tripwire serve did not start")


def run_agent(url: str, channel: str, export: str, model_s: float, kind: str = "loop") -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env = {k: v for k, v in env.items() if not k.startswith("TRIPWIRE_") or k == "TRIPWIRE_NO_EXTENSIONS"}
    done = subprocess.run(
        [sys.executable, __file__, "--agent", url, channel, export, str(model_s), kind],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"agent failed: {done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _median(values: list[Any]) -> Any:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def stops(args: argparse.Namespace, tmp: Path) -> None:
    print("| agent | --reorder-ms | channel | exporter | per model call | tool bodies after the flagged call (runs) | median | flag reached the agent (median, after the flagged body ended) |")
    print("|---|---|---|---|---|---|---|---|")
    for reorder in args.reorder:
        for channel in args.channels:
            proc, url = start_service(tmp, reorder, channel == "redis")
            try:
                for kind, export, model_s in (
                    (k, e, m) for k in args.agents for e in args.exports for m in args.speeds
                ):
                    results = [
                        run_agent(url, REDIS_URL if channel == "redis" else "http", export, model_s, kind)
                        for _ in range(args.runs)
                    ]
                    after = [r["after"] for r in results]
                    latency = _median([r["latency_ms"] for r in results])
                    print(
                        f"| {kind} | {reorder} | {channel} | {export} | {model_s:g} s | "
                        f"{', '.join(str(a) for a in after)} | {_median(after)} | "
                        f"{'-' if latency is None else f'{latency:.0f} ms'} |",
                        flush=True,
                    )
            finally:
                proc.terminate()
                proc.wait(timeout=30)


def channel_only(args: argparse.Namespace, tmp: Path) -> None:
    """An operator's Kill to the agent's cache, and a Redis flag to the cache (pub/sub)."""
    import httpx
    import redis

    import tripwire.remote as remote_mod
    from tripwire.serve.killchannel import KEY_PREFIX, RedisKillChannel, flag_payload

    print()
    print("| path | samples | median | p95 | max |")
    print("|---|---|---|---|---|")

    def report(name: str, samples: list[float]) -> None:
        ordered = sorted(samples)
        p95 = ordered[max(0, int(len(ordered) * 0.95) - 1)]
        print(f"| {name} | {len(samples)} | {statistics.median(samples) * 1000:.1f} ms | "
              f"{p95 * 1000:.1f} ms | {ordered[-1] * 1000:.1f} ms |", flush=True)

    def until_flagged(watcher: remote_mod.RemoteKill, tid: str, t0: float) -> float:
        deadline = t0 + 10
        while watcher.flagged(tid) is None:
            if time.monotonic() > deadline:
                raise SystemExit("no flag within 10 s")
            time.sleep(0.0002)
        return time.monotonic() - t0

    n = 20
    for channel in ("http", "redis"):
        proc, url = start_service(tmp, 200, channel == "redis")
        headers = {"Authorization": f"Bearer {TOKEN}"}
        watcher = (
            remote_mod.RemoteKill(url=url, token=TOKEN) if channel == "http"
            else remote_mod.RemoteKill(redis_url=REDIS_URL)
        )
        samples: list[float] = []
        try:
            for i in range(n):
                tid = os.urandom(16).hex()
                body = {"resourceSpans": [{"scopeSpans": [{"spans": [{
                    "traceId": tid, "spanId": os.urandom(8).hex(), "name": "invoke_agent a",
                    "startTimeUnixNano": str(time.time_ns()),
                    "endTimeUnixNano": str(time.time_ns() + 1000),
                    "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}}],
                    "parentSpanId": os.urandom(8).hex(),
                }]}]}]}
                httpx.post(f"{url}/v1/traces", json=body, headers=headers).raise_for_status()
                deadline = time.monotonic() + 10
                while httpx.get(f"{url}/api/runs/{tid}", headers=headers).status_code != 200:
                    if time.monotonic() > deadline:
                        raise SystemExit("the run never reached the store")
                    time.sleep(0.05)
                watcher.check(tid)
                time.sleep(0.3)  # the channel watches it (the long poll is asked again)
                t0 = time.monotonic()
                httpx.post(f"{url}/api/runs/{tid}/kill", headers=headers).raise_for_status()
                samples.append(until_flagged(watcher, tid, t0))
                if i == 0:
                    samples.clear()  # the first: connections warm up
                    continue
        finally:
            watcher.close()
            proc.terminate()
            proc.wait(timeout=30)
        report(f"operator Kill (the API call included) → agent cache, {channel}", samples)

    client = redis.Redis.from_url(REDIS_URL)
    channel_ = RedisKillChannel(client)
    watcher = remote_mod.RemoteKill(redis_url=REDIS_URL)
    samples = []
    try:
        time.sleep(0.3)
        for _ in range(n):
            tid = os.urandom(16).hex()
            watcher.check(tid)
            t0 = time.monotonic()
            channel_.raise_flag(flag_payload(tid, None, at=time.time()), 60)
            samples.append(until_flagged(watcher, tid, t0))
            client.delete(KEY_PREFIX + tid)
    finally:
        watcher.close()
    report("a flag raised in Redis (SET + PUBLISH) → agent cache (pub/sub)", samples)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--agent":
        url, channel, export, model_s = sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5])
        kind = sys.argv[6] if len(sys.argv) > 6 else "loop"
        run = agent if kind == "loop" else openai_loop_agent
        print(json.dumps(run(url, channel, export, model_s)))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--speeds", default="0,0.2,0.5,2")
    parser.add_argument("--channels", default="http,redis")
    parser.add_argument("--exports", default="default,recommended")
    parser.add_argument("--reorder", default="200,0")
    parser.add_argument("--agents", default="loop", help="loop (tripwire.check() by hand), openai-loop (run_openai)")
    parser.add_argument("--only", default="stops,channel")
    args = parser.parse_args()
    args.speeds = [float(s) for s in args.speeds.split(",")]
    args.channels = args.channels.split(",")
    args.exports = args.exports.split(",")
    args.reorder = [int(r) for r in args.reorder.split(",")]
    args.agents = args.agents.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        if "stops" in args.only:
            stops(args, Path(tmp))
        if "channel" in args.only:
            channel_only(args, Path(tmp))


if __name__ == "__main__":
    main()
