"""Shared fixtures. Services: Redis on 127.0.0.1:6379.

Service rule: when a service is unreachable, tests that need it are skipped with a loud
reason locally, and FAIL under ``CI=true`` (CI must never pass by skipping).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

REDIS_URL = os.environ.get("TRIPWIRE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def _service_missing(what: str, exc: BaseException) -> None:
    message = f"{what} is unreachable ({type(exc).__name__}: {exc})"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message}; CI=true requires it", pytrace=False)
    pytest.skip(f"SKIPPED, NEEDS A SERVICE: {message}")


@pytest.fixture
def redis_client() -> Iterator[Any]:
    """A client of the real Redis at REDIS_URL (skip locally / fail in CI when it is down)."""
    try:
        import redis
    except ImportError as exc:
        _service_missing("the redis client package", exc)
        raise
    client = redis.Redis.from_url(REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
    try:
        client.ping()
    except (redis.RedisError, OSError) as exc:
        _service_missing(f"Redis at {REDIS_URL}", exc)
    yield client
    client.close()


@pytest.fixture
def redis_prefix(redis_client: Any) -> Iterator[str]:
    """A unique key prefix; every key under it is deleted after the test."""
    prefix = f"tripwire-test:{uuid.uuid4().hex}"
    yield prefix
    keys = list(redis_client.scan_iter(match=f"{prefix}*", count=1000))
    if keys:
        redis_client.delete(*keys)


#: The frameworks CI must run for real (issue 3): a module of each, importable when the
#: ``frameworks`` extra is installed.
CI_FRAMEWORKS = {
    "pydantic-ai": "pydantic_ai",
    "LangChain": "langchain",
    "LangChain OpenInference instrumentation": "openinference.instrumentation.langchain",
    "LangGraph": "langgraph.prebuilt",
    "LangChain OpenLLMetry instrumentation": "opentelemetry.instrumentation.langchain",
    "OpenAI client (tool-loop tests)": "openai",
    "Anthropic client (tool-loop tests)": "anthropic",
    "OpenAI Agents SDK": "agents",
    "OpenAI Agents OpenInference bridge": "openinference.instrumentation.openai_agents",
    "Google ADK": "google.adk",
    "smolagents": "smolagents",
}


def pytest_sessionstart(session: pytest.Session) -> None:
    """Under ``CI=true``, refuse to run when a framework the adapter tests need is missing.

    Locally those tests skip (``importorskip``); in CI a skip would hide a missing install step.
    """
    if os.environ.get("CI", "").lower() != "true":
        return
    import importlib.util

    missing = []
    for name, module in CI_FRAMEWORKS.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            missing.append(name)
    if missing:
        raise pytest.UsageError(
            "CI=true but these frameworks are not installed: "
            + ", ".join(missing)
            + "; install them with: pip install -e '.[test,frameworks]'"
        )
