"""Loop detection for one run: the two-line :class:`LoopDetector` and the richer :class:`LoopWatcher`.

``LoopDetector`` is for the hand-written tool loop that wants a kill switch and nothing else::

    detector = LoopDetector()
    for call in agent_calls:
        detector.observe(call.name, call.arguments)   # raises LoopDetected at the trip

``LoopWatcher`` takes full call events (times, errors, results, progress, leases), applies the
evidence / retry / lease logic, and returns an :class:`~tripwire.core.watch.Assessment` only
when the verdict changes.

Both are thin stateful shells around :mod:`tripwire.core.watch`; neither is thread-safe (one
per run, fed from the run's own thread or task).
"""

from __future__ import annotations

from typing import Any, Final

from tripwire.core.events import Lease, ToolCall
from tripwire.core.policy import DEFAULT_POLICY, KeyMode, LoopPolicy
from tripwire.core.reasons import Verdict
from tripwire.core.signature import ABSENT, DEFAULT_NORMALIZER, Normalizer
from tripwire.core.watch import Assessment, RunState, evaluate_hashed
from tripwire.errors import ConfigError

__all__ = ["LoopDetector", "LoopWatcher"]


class LoopWatcher:
    """Watches one run's tool calls and says when its verdict changes.

    Args:
        policy: the loop policy (default :data:`~tripwire.core.policy.DEFAULT_POLICY`).
        normalizer: the signature normalizer (default: the built-in volatile keys, 16 KiB cap).
    """

    __slots__ = ("normalizer", "policy", "state")

    def __init__(
        self, policy: LoopPolicy = DEFAULT_POLICY, normalizer: Normalizer = DEFAULT_NORMALIZER
    ) -> None:
        if not isinstance(policy, LoopPolicy):
            raise ConfigError("policy", policy, "a LoopPolicy")
        if not isinstance(normalizer, Normalizer):
            raise ConfigError("normalizer", normalizer, "a Normalizer")
        self.policy = policy
        self.normalizer = normalizer
        self.state = RunState.new(policy)

    def observe(self, call: ToolCall, *, now_s: float | None = None) -> Assessment | None:
        """Record a finished tool call; return an assessment only if the verdict changed.

        Raises:
            ConfigError: ``call`` is not a :class:`ToolCall`, or its tool is not a string.
        """
        if type(call) is not ToolCall:
            raise ConfigError("call", call, "a ToolCall")
        normalizer = self.normalizer
        digest = call.result_digest
        # evaluate(), one call less: 0 marks "no result"; a digest hashing to 0 counts as 1.
        return evaluate_hashed(
            self.state,
            call,
            normalizer.signature(call.tool, call.arguments),
            (hash(digest) or 1) if digest is not None else 0,
            self.policy,
            normalizer,
            now_s,
        )

    def call(self, tool: str, arguments: Any = ABSENT, **fields: Any) -> Assessment | None:
        """Shorthand for ``observe(ToolCall(tool=tool, arguments=arguments, **fields))``."""
        return self.observe(ToolCall(tool=tool, arguments=arguments, **fields))

    def set_lease(self, lease: Lease | None) -> None:
        """Set (or clear) a run-level dependency lease; a call's own lease takes precedence."""
        self.state.lease = lease

    @property
    def current(self) -> Assessment | None:
        """The verdict in force (``None`` before the first call)."""
        return self.state.current

    @property
    def verdict(self) -> Verdict:
        """The verdict in force (``working`` before the first call)."""
        current = self.state.current
        return Verdict.WORKING if current is None else current.verdict

    @property
    def calls(self) -> int:
        """How many calls were observed."""
        return self.state.calls


class LoopDetector:
    """The two-line integration: ``observe(tool, args)`` raises :class:`LoopDetected` on a loop.

    It applies the repetition rule (the same signature ``threshold`` times within the last
    ``window`` calls) and the period rule (a cycle of 2..``max_period`` calls repeated
    ``min_repeats`` times); no evidence, retry or lease logic. It raises at the call where a
    rule trips and at every further call while the rule still holds.

    Args:
        window: calls the repetition rule looks back over (default 10).
        threshold: identical calls within the window that trip it (default 4).
        key: ``"tool+args"`` (default) or ``"tool"`` (name only).
        max_period: longest cycle for the period rule (default 3; ``None`` = off).
        min_repeats: cycle repetitions that trip it (default 3).
        normalizer: the signature normalizer.
    """

    __slots__ = ("_policy", "_state", "normalizer")

    def __init__(
        self,
        window: int = 10,
        threshold: int = 4,
        *,
        key: KeyMode | str = KeyMode.TOOL_ARGS,
        max_period: int | None = 3,
        min_repeats: int = 3,
        normalizer: Normalizer = DEFAULT_NORMALIZER,
    ) -> None:
        try:
            key = KeyMode(key)
        except ValueError:
            raise ConfigError("key", key, "'tool+args' or 'tool'") from None
        if not isinstance(normalizer, Normalizer):
            raise ConfigError("normalizer", normalizer, "a Normalizer")
        self._policy = LoopPolicy(
            name="detector",
            window=window,
            threshold=threshold,
            key=key,
            max_period=max_period,
            min_repeats=min_repeats,
            # The two rules only: observe() takes no errors and no results, and the calibrated
            # extras are off so that the policy (and its version) says so.
            same_error=None,
            same_result=None,
            revisit=None,
            revisit_share=None,
            failure_share=None,
            mute_failures=None,
            result_evidence="off",  # type: ignore[arg-type]
            name_only="stuck",
        )
        self.normalizer = normalizer
        self._state = RunState.new(self._policy)

    @property
    def policy(self) -> LoopPolicy:
        """The equivalent :class:`LoopPolicy` (for its version string)."""
        return self._policy

    @property
    def calls(self) -> int:
        """How many calls were observed."""
        return self._state.calls

    def observe(self, tool: str, arguments: Any = ABSENT) -> None:
        """Record a call; raise :class:`LoopDetected` if a loop rule holds at this call.

        Raises:
            LoopDetected: with ``rule``, ``tool``, ``hits``, ``window``, ``period`` and
                ``call_index`` (1-based) of this call.
        """
        normalizer = self.normalizer
        signature = normalizer.signature(tool, arguments)  # ConfigError unless tool is a str
        # The watcher reads a call's tool and evidence, never its arguments once signed: one
        # bare ToolCall per tool name serves every call of it.
        call = _BARE_CALLS.get(tool)
        if call is None:
            call = _bare_call(tool)
        state = self._state
        evaluate_hashed(state, call, signature, 0, self._policy, normalizer, None)  # no result
        current = state.current
        if current is not None and current.verdict is _STUCK and current.call_index == state.calls:
            raise current.exception()

    def reset(self) -> None:
        """Forget every call (start a new run)."""
        self._state = RunState.new(self._policy)


_STUCK: Final = Verdict.STUCK

_BARE_CALLS: Final[dict[str, ToolCall]] = {}
"""``ToolCall(tool=name)`` by tool name, for :meth:`LoopDetector.observe` (a pure cache: at most
:data:`_BARE_CALLS_MAX` names of at most :data:`_BARE_NAME_MAX` characters, emptied when full)."""
_BARE_CALLS_MAX: Final = 1024
_BARE_NAME_MAX: Final = 256


def _bare_call(tool: str) -> ToolCall:
    call = ToolCall(tool=tool)
    if type(tool) is str and len(tool) <= _BARE_NAME_MAX:
        if len(_BARE_CALLS) >= _BARE_CALLS_MAX:
            _BARE_CALLS.clear()
        _BARE_CALLS[tool] = call
    return call
