"""The result-evidence cases of issue 15 (and issue 39's: failures with nothing to say, a
compiler error after each edit, a silent check between edits), as plain data: each is judged through the public API
(``LoopWatcher``, ``Guard``) and through replayed OTLP spans, and must come out as written here.

A case is a list of tool calls (tool, arguments, the result text, the time in seconds) and what
the defaults must say: the first call at which the run is ``stuck`` (``None``: never) and, for
the declared poll, the calls that are ``waiting``. ``bench/quality.py`` reads them too: a
setting its cross-validation may choose must keep the table right (:func:`table_holds`). Nothing here uses tripwire's digest or rules:
the results are the texts a tool would return.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field
from typing import Any

from tripwire.core.events import ToolCall
from tripwire.core.policy import LoopPolicy, Poll
from tripwire.core.signature import DEFAULT_NORMALIZER
from tripwire.detector import LoopWatcher

POLL_INTERVAL_S = 10.0
POLL_MAX_WAIT_S = 60.0


@dataclass(frozen=True)
class Step:
    tool: str
    args: dict[str, Any]
    result: str
    at: float
    """Seconds since the run started."""
    error: str | None = None
    """The error class when the call failed (its result is then the failure's text)."""


@dataclass(frozen=True)
class Case:
    name: str
    steps: tuple[Step, ...]
    stuck_at: int | None
    """The 1-based call at which the verdict first becomes ``stuck`` (``None``: never)."""
    waiting: tuple[int, ...] = ()
    """Calls at which the verdict is ``waiting``."""
    polls: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Declared polls: tool -> (interval_s, max_wait_s)."""
    reason_has: tuple[str, ...] = ()
    """Phrases the verdict's reason must hold at ``stuck_at``."""
    table_call: bool = False
    """The issue's table names the call itself ("stuck at the 4th call"): ``stuck_at`` holds for
    any setting that keeps the table right, not only for the defaults (``bench/quality.py``
    tunes only among such settings)."""


def _steps(rows: list[tuple[str, dict[str, Any], str]], gap: float = 1.0) -> tuple[Step, ...]:
    return tuple(Step(tool, args, result, i * gap) for i, (tool, args, result) in enumerate(rows))


def _uuid(i: int) -> str:
    return str(uuid.UUID(int=(0x9E3779B97F4A7C15 * (i + 1)) % (1 << 128)))


def _letter_uuid(i: int) -> str:
    """A uuid whose first group is all letters (``abcdefab-…``): it starts with a letter and has
    no digit before the first dash."""
    text = str(uuid.UUID(bytes=hashlib.sha256(b"%d" % i).digest()[:16]))
    return "".join("abcdef"[int(c, 16) % 6] for c in text[:8]) + text[8:]


def _mute_steps() -> tuple[Step, ...]:
    """javac, mvn, gradle, java, each "command not found", three calls that worked after each."""
    out: list[Step] = []
    for i, tool in enumerate(("javac", "mvn", "gradle", "java")):
        out.append(Step(tool, {"command": f"{tool} Foo"}, f"/bin/bash: line {i + 1}: {tool}: command not found", len(out), "command_not_found"))
        for j in range(3 if i < 3 else 0):
            out.append(Step("open", {"path": f"src/F{i}{j}.java"}, f"class F{i}{j} {{ int x = {i + j}; }}", len(out)))
    return tuple(out)


def cases() -> list[Case]:
    poll = [("job_status", {"job": "build-7"}, "state: pending") for _ in range(10)]
    out = [
        Case(
            "12 pages that differ only in their numbers",
            _steps([("fetch_page", {"page": i}, f"page {i} of 12: rows {10 * i - 9}-{10 * i}") for i in range(1, 13)]),
            None,
        ),
        Case(
            "30 lookups of different orders, all shipped",
            _steps([("get_order", {"order_id": f"A-{100 + i}"}, "shipped") for i in range(30)]),
            None,
        ),
        Case(
            "a poll whose progress figure changes",
            _steps([("job_status", {"job": "build-7"}, f"running, {5 * i}% done") for i in range(1, 13)], gap=POLL_INTERVAL_S),
            None,
        ),
        Case(
            "a declared poll returning the identical result",
            _steps(poll, gap=POLL_INTERVAL_S),
            # calls at t = 0, 10, …: the repetition rule trips at call 4 (t=30); the same result
            # for at most 60 s is waiting (calls 4..7), past it (call 8, t=70) stuck
            8,
            waiting=(4, 5, 6, 7),
            polls={"job_status": (POLL_INTERVAL_S, POLL_MAX_WAIT_S)},
            reason_has=("declared poll", "maximum wait of 60 s"),
        ),
        Case(
            "the same poll, undeclared",
            _steps(poll, gap=POLL_INTERVAL_S),
            4,
            reason_has=("declare it", "Poll(interval_s=10, max_wait_s=600)", "[policy.polls.job_status]"),
        ),
        Case(
            "8 different searches, all with an empty result",
            _steps([("search_docs", {"query": f"topic {i}"}, "No matches found" if i % 2 else "[]") for i in range(8)]),
            6,
            reason_has=("found nothing",),
        ),
        Case(
            "search_docs(refund policy) again and again, the same empty result",
            _steps([("search_docs", {"query": "refund policy"}, "No results for 'refund policy'.") for _ in range(6)]),
            4,
            table_call=True,
        ),
        Case(
            "a timestamp changing in every result of an identical call",
            _steps([("get_status", {"id": 7}, f"ok at 2026-12-01T10:{i:02d}:{i * 7 % 60:02d}Z") for i in range(6)]),
            4,
        ),
        Case(
            "a duration changing in every result of an identical call",
            _steps([("run_check", {"name": "lint"}, f"check failed after {0.1 + i * 0.37:.2f}s") for i in range(6)]),
            4,
        ),
        Case(
            "a fresh uuid in every result of an identical call",
            _steps([("create_ticket", {"title": "refund"}, f"created ticket {_uuid(i)}") for i in range(6)]),
            4,
        ),
        Case(
            "a fresh request id in every result of an identical call",
            _steps([("send_query", {"q": "balance"}, f"accepted, request req{7 * i + 1}Q{i}x8ZpK3mW{9 - i}T2LbN4") for i in range(6)]),
            4,
        ),
        Case(
            "a fresh long numeric id in every result of an identical call",
            _steps([("create_order", {"sku": "A-1"}, f"order {1000 + 17 * i} created") for i in range(6)]),
            4,
        ),
        Case(
            "a fresh hex id in every result of an identical call",
            _steps([("deploy", {"env": "prod"}, f"deploy queued as {0xA1B2C3D4E5 + 977 * i:x}") for i in range(6)]),
            4,
        ),
        Case(
            "a fresh hex id that starts with a letter in every result of an identical call",
            _steps([("create_job", {"kind": "export"}, f"job {_letter_uuid(i)} queued") for i in range(6)]),
            4,
        ),
        Case(
            "a fresh all-letter hex id in every result of an identical call",
            _steps([("deploy", {"env": "staging"}, f"release {'deadbeefcafe'[i:] + 'deadbeefcafe'[:i]} is live") for i in range(6)]),
            4,
        ),
        Case(
            "a clock time and a compound duration changing in every result of an identical call",
            _steps([("run_suite", {"name": "e2e"}, f"[12:0{i}:1{i}] suite failed after {i + 1}m{10 + i}s") for i in range(6)]),
            4,
        ),
        Case(
            "a request id written out in every result of an identical call",
            _steps([("charge", {"card": "visa"}, f"declined (request id: {0x3A7F + 7919 * i:x}-{i}b)") for i in range(6)]),
            4,
        ),
        Case(
            "30 writes to 30 different files, each confirmed with the same text",
            _steps([("write_file", {"path": f"out/part-{i}.txt", "text": f"chunk {i}"}, "write complete") for i in range(30)]),
            None,
        ),
        Case(
            "20 messages to different recipients, each confirmed with the same text",
            _steps([("send_message", {"to": f"user{i}@example.com", "body": "Your refund is on its way."}, "sent") for i in range(20)]),
            None,
        ),
        Case(
            "a poll whose output advances only in numbers",
            _steps([("tail_log", {"file": "build.log"}, f"line {i}") for i in range(12)], gap=POLL_INTERVAL_S),
            None,
        ),
        Case(
            "four different commands not found within twenty calls, whatever the tools",
            _mute_steps(),
            13,
            reason_has=("failed with nothing to say",),
        ),
        Case(
            "a compiler error after each of six different edits",
            tuple(
                step
                for i in range(6)
                for step in (
                    Step("edit", {"line": i, "text": f"fix {i}"}, f"File updated at line {i}.", 2.0 * i),
                    Step("javac", {"file": "Foo.java"}, f"Foo.java:{i + 3}: error: ';' expected", 2.0 * i + 1, "compile_error"),
                )
            ),
            None,
        ),
        Case(
            "a script that prints nothing, rerun after each of four different edits",
            tuple(
                step
                for i in range(5)
                for step in (
                    Step("edit", {"line": i, "text": f"fix {i}"}, f"File updated at line {i}.", 2.0 * i),
                    Step("python", {"command": "python reproduce.py"}, "", 2.0 * i + 1),
                )
            )[1:],
            None,
        ),
        Case(
            "a 15-file batch done twice, each write confirmed",
            _steps([("write_file", {"path": f"src/f{i % 15}.py", "text": "x"}, "write complete") for i in range(30)]),
            None,
        ),
    ]
    return out


def table_holds(verdicts: list[str], case: Case) -> bool:
    """True when a run's verdicts (one per call, ``Verdict`` values) say what the issue's table
    says of ``case``, under any settings: stuck or never stuck, at the call the table names,
    and a declared poll waiting before it is stuck."""
    stuck = [i for i, v in enumerate(verdicts, 1) if v == "stuck"]
    if (case.stuck_at is None) != (not stuck):
        return False
    if case.table_call and stuck[0] != case.stuck_at:
        return False
    if case.waiting:
        waiting = [i for i, v in enumerate(verdicts, 1) if v == "waiting"]
        return bool(waiting) and (not stuck or waiting[0] < stuck[0])
    return True


def replay_case(case: Case, policy: LoopPolicy | None = None) -> list[tuple[str, str]]:
    """The verdict (its value) and reason after each call of ``case``, judged through the public
    API by a :class:`LoopWatcher` with ``policy`` (default: the defaults) and the case's polls."""
    policy = policy or LoopPolicy()
    if case.polls:
        policy = policy.evolve(
            polls={t: Poll(interval_s=i, max_wait_s=w) for t, (i, w) in case.polls.items()}
        )
    watcher = LoopWatcher(policy)
    out = []
    for step in case.steps:
        watcher.observe(
            ToolCall(
                tool=step.tool,
                arguments=step.args,
                start_s=step.at,
                end_s=step.at + 0.1,
                result_digest=DEFAULT_NORMALIZER.result_digest(step.result),
                error_type=step.error,
            )
        )
        current = watcher.current
        out.append((watcher.verdict.value, current.reason if current is not None else ""))
    return out
