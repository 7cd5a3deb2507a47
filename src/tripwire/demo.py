"""A small simulated fleet played through the core, for ``tripwire demo``.

Each :class:`Scenario` is a scripted agent run (tool calls with times, errors, results and
evidence) and the policy it runs under. :func:`play` feeds it to a
:class:`~tripwire.detector.LoopWatcher` with the kill switch on (the run stops at the first
``stuck`` verdict) and, for comparison, to a flat ``max_iterations`` cap.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from tripwire.core.events import Lease, ToolCall
from tripwire.core.policy import DEFAULT_POLICY, LoopPolicy, RetryPolicy
from tripwire.core.reasons import Verdict
from tripwire.core.signature import DEFAULT_NORMALIZER
from tripwire.detector import LoopWatcher

__all__ = ["Outcome", "Scenario", "play", "scenarios"]


@dataclass(frozen=True, slots=True)
class Scenario:
    """A scripted agent run."""

    name: str
    """What the agent does."""
    calls: tuple[ToolCall, ...]
    """Every call it would make if nothing stopped it."""
    useful: bool
    """True when every call is useful work (a stop is a cut-off), False when it loops."""
    policy: LoopPolicy = DEFAULT_POLICY
    """The loop policy it runs under."""
    lease: Lease | None = None
    """A run-level dependency lease, if any."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What each approach did to one scenario."""

    scenario: Scenario
    cap_stop: int | None
    """Call at which ``max_iterations`` stopped the run (``None`` = it finished)."""
    tripwire_stop: int | None
    """Call at which tripwire's kill switch stopped the run (``None`` = it finished)."""
    verdict: Verdict
    """tripwire's verdict at the end (or at the stop)."""
    reason: str
    """Why, in one sentence."""

    @property
    def planned(self) -> int:
        return len(self.scenario.calls)

    def wasted(self, stop: int | None) -> int:
        """Looping calls made after tripwire could tell the run was stuck."""
        if self.scenario.useful or self.tripwire_stop is None:
            return 0
        made = self.planned if stop is None else stop
        return max(0, made - self.tripwire_stop)

    def cut_off(self, stop: int | None) -> int:
        """Useful calls that a stop prevented."""
        if not self.scenario.useful or stop is None:
            return 0
        return self.planned - stop


def _result(text: str) -> str:
    return DEFAULT_NORMALIZER.result_digest(text)


def scenarios() -> tuple[Scenario, ...]:
    """The demo fleet."""
    t = 0.0

    def at(step: float) -> float:
        nonlocal t
        t += step
        return t

    research = tuple(
        ToolCall(
            tool="fetch_page" if i % 2 else "search_web",
            arguments={"url": f"https://example.org/paper/{i}"} if i % 2 else {"query": f"topic {i}"},
            result_digest=_result(f"content of source {i}"),
        )
        for i in range(80)
    )
    stuck = tuple(
        ToolCall(
            tool="search_docs",
            arguments={"query": "refund policy", "request_id": f"r{i}"},
            result_digest=_result("No results for 'refund policy'."),
        )
        for i in range(47)
    )
    oscillation = tuple(
        ToolCall(
            tool=tool,
            arguments={"query": "billing"} if tool == "search" else {"doc": "billing.md"},
            result_digest=_result(f"{tool} output"),
        )
        for _ in range(12)
        for tool in ("search", "read")
    )
    catalog = tuple(
        ToolCall(
            tool="list_catalog",
            arguments={"cursor": "next"},
            result_digest=_result(f"items page {chr(65 + i)}"),
            progress=f"items-seen-{(i + 1) * 25}",
        )
        for i in range(4)
    )
    t = 0.0
    retry_calls = []
    for attempt, delay in enumerate((0.0, 2.0, 4.0, 8.0), start=1):
        start = at(delay)
        failed = attempt < 4
        retry_calls.append(
            ToolCall(
                tool="charge_card",
                arguments={"order": "A-1001", "amount": 42},
                start_s=start,
                end_s=at(0.05),
                error_type="rate_limited" if failed else None,
                retryable=True if failed else None,
                attempt=attempt,
            )
        )
    retry_policy = DEFAULT_POLICY.evolve(
        name="demo-retry",
        retry_per_tool={
            "charge_card": RetryPolicy(
                errors=frozenset({"rate_limited"}), max_attempts=5, interval_s=2.0, backoff_rate=2.0,
                tolerance_s=0.1,
            )
        },
    )
    waiting = tuple(
        ToolCall(
            tool="check_approval",
            arguments={"ticket": "FIN-7"},
            start_s=float(i * 30),
            end_s=float(i * 30) + 0.1,
            result_digest=_result("pending"),
        )
        for i in range(6)
    )
    writes = tuple(ToolCall(tool="write_record", arguments={"id": 7, "status": "synced"}) for _ in range(6))
    return (
        Scenario("deep research: 80 distinct useful calls", research, useful=True),
        Scenario('stuck: search_docs("refund policy") again and again', stuck, useful=False),
        Scenario("oscillating: search / read / search / read…", oscillation, useful=False),
        Scenario("paginated catalog: same call, new page each time", catalog, useful=True),
        Scenario(
            "rate-limited charge retried after 2 s, 4 s, 8 s", tuple(retry_calls), useful=True,
            policy=retry_policy,
        ),
        Scenario(
            "polling an approval owned by finance (deadline in 1 h)", waiting, useful=True,
            lease=Lease(owner="finance-team", deadline_s=3600.0),
        ),
        Scenario(
            "repeated writes, no evidence, evidence required", writes, useful=True,
            policy=DEFAULT_POLICY.evolve(name="demo-evidence", require_evidence=True),
        ),
    )


def play(scenario: Scenario, max_iterations: int = 10) -> Outcome:
    """Run ``scenario`` under tripwire (kill switch on ``stuck``) and under a flat cap."""
    watcher = LoopWatcher(scenario.policy)
    watcher.set_lease(scenario.lease)
    stop: int | None = None
    seen: list[Verdict] = []
    for index, call in enumerate(scenario.calls, start=1):
        event = watcher.observe(call)
        if event is not None:
            seen.append(event.verdict)
        if watcher.verdict is Verdict.STUCK:
            stop = index
            break
    current = watcher.current
    # Show the most telling verdict the run reached (a retry that later succeeded was
    # "retrying", not merely "working").
    telling = next((v for v in reversed(seen) if v is not Verdict.WORKING), watcher.verdict)
    reason = "no loop rule tripped: every call differs"
    if current is not None and current.rule is not None:
        reason = current.reason
    cap_stop = max_iterations if len(scenario.calls) > max_iterations else None
    return Outcome(scenario, cap_stop, stop, telling, reason)


def play_all(max_iterations: int = 10) -> Iterator[Outcome]:
    """Play every scenario."""
    for scenario in scenarios():
        yield play(scenario, max_iterations)
