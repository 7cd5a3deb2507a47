"""The service rule of conftest: skip loudly on a laptop, fail under CI=true."""

from __future__ import annotations

import pytest

from .conftest import _service_missing


def test_missing_service_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception):
        _service_missing("PostgreSQL", ConnectionRefusedError("refused"))


def test_missing_service_skips_loudly_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception) as info:
        _service_missing("PostgreSQL", ConnectionRefusedError("refused"))
    assert "NOT TESTED" in str(info.value)
