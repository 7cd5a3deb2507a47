"""The public surface: ``tripwire.__all__`` is exactly what the package exports."""

from __future__ import annotations

from types import ModuleType

import tripwire


def test_all_names_resolve() -> None:
    for name in tripwire.__all__:
        assert getattr(tripwire, name) is not None, name


def test_all_is_locked() -> None:
    expected = {
        "ABSENT", "DEFAULT_POLICY", "SEED_POLICY", "Advisory", "Approval", "ArgsKind",
        "Assessment", "BudgetExceeded", "ConfigError", "EndKind", "Guard", "Health",
        "HealthState", "InputError", "KeyMode", "Lease", "Level", "Limits", "LoopDetected",
        "LoopDetector", "LoopPolicy", "LoopWatcher", "ModelCall", "Normalizer",
        "OutcomeReceipt", "RetryPolicy", "Rule", "RunStopped", "Signature", "StopReason",
        "StopReceipt", "ToolCall", "ToolResult", "TripwireError", "Verdict", "__version__",
        "check", "classify", "idempotent", "instrument", "signature_of",
    }
    assert set(tripwire.__all__) == expected
    # Submodules (imported as a side effect) and typing helpers are not part of the surface.
    public = {
        n
        for n, v in vars(tripwire).items()
        if not n.startswith("_") and not isinstance(v, ModuleType)
    } - {"annotations", "Any"}
    assert public <= expected


def test_unknown_attribute_raises_attribute_error() -> None:
    try:
        tripwire.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("expected AttributeError")
