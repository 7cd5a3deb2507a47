"""Model prices from the maintained ``genai-prices`` table (no hand-written price list).

One pricing function for every entry point: :class:`Pricer` turns a model call's model name
and tokens into USD with a price function (``genai-prices`` by default), and says once per
model, never per call, when it cannot (:class:`CostNotFoundWarning`, and a log line), never
counting an unknown model as $0 silently. The guard, the span processor's engine and the OTLP
receiver all price through it. Needs the ``prices`` extra: ``pip install 'tripwire[prices]'``.
"""

from __future__ import annotations

import logging
import math
import threading
import warnings
from collections.abc import Callable
from typing import Final

__all__ = ["CostNotFoundWarning", "PriceFn", "Pricer", "genai_price", "usable_cost"]

logger = logging.getLogger("tripwire.prices")

PriceFn = Callable[[str, "str | None", int, int], "float | None"]
"""``(model, provider, input_tokens, output_tokens) -> USD`` or ``None`` when not known."""

_MAX_WARNED: Final = 256
"""How many distinct model names one pricer remembers having warned about (bounded: a fleet
with endless model names must not grow memory; past it, warnings may repeat)."""
_MAX_NAME: Final = 200
"""Model names are clipped to this many characters in messages and in the warned set."""


class CostNotFoundWarning(UserWarning):
    """No price is known for a model, so its calls add nothing to the cost counter and
    ``max_cost_usd`` cannot be enforced for them. Report ``cost_usd`` yourself, or check the
    model name against the ``genai-prices`` table."""


def genai_price(
    model: str, provider: str | None, input_tokens: int, output_tokens: int
) -> float | None:
    """The price in USD of one model call, from ``genai-prices``; ``None`` when unknown.

    Raises:
        ImportError: when the ``prices`` extra is not installed (:class:`Pricer` turns this
            into a :class:`CostNotFoundWarning`).
    """
    try:
        from genai_prices import Usage, calc_price
    except ImportError as exc:
        raise ImportError(
            "pricing model calls needs genai-prices: pip install 'tripwire[prices]'"
        ) from exc
    try:
        result = calc_price(
            Usage(input_tokens=input_tokens, output_tokens=output_tokens),
            model_ref=model,
            provider_id=provider,
        )
    except LookupError:
        return None
    return float(result.total_price)


def usable_cost(value: object) -> float | None:
    """``value`` as a cost in USD when it is a finite number ``>= 0`` (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        cost = float(value)
    except OverflowError:  # an int too large for a float
        return None
    if not math.isfinite(cost) or cost < 0:
        return None
    return cost


class Pricer:
    """Prices model calls with one price function and warns once per model when it cannot.

    Thread-safe. :meth:`cost` never raises: a price function that raises, returns something
    that is not a finite number ``>= 0``, or is missing (``prices=None``, or the ``prices``
    extra not installed) leaves the call unpriced (``None``), which the caller counts as an
    unpriced call; the first time for each model it issues a :class:`CostNotFoundWarning`
    (``warn=True``) and logs one line.

    Args:
        prices: the price function; default the ``genai-prices`` table; ``None`` prices
            nothing (callers then report ``cost_usd`` themselves).
        warn: issue :class:`CostNotFoundWarning` through :mod:`warnings` (the guard, called
            from the user's code); with ``False`` only the log line is written (the span
            processor, on the thread that ends a span).
    """

    __slots__ = ("_lock", "_prices", "_warn", "_warned")

    def __init__(self, prices: PriceFn | None = genai_price, *, warn: bool = True) -> None:
        self._prices = prices
        self._warn = warn
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        """False when the pricer has no price function (every call is unpriced)."""
        return self._prices is not None

    def cost(
        self,
        model: str | None,
        provider: str | None,
        input_tokens: int,
        output_tokens: int,
        *,
        why_it_matters: str = "max_cost_usd cannot be enforced for them",
    ) -> float | None:
        """The call's cost in USD, or ``None`` when it has no usable price (warned once).

        Args:
            model: the model name (``None``: no model name was recorded).
            provider: the provider id, when known (helps ``genai-prices`` find the model).
            input_tokens: input (prompt) tokens of the call.
            output_tokens: output (completion) tokens of the call.
            why_it_matters: the end of the warning's sentence (what an unpriced call costs the
                user); the guard only warns when it has a cost limit.
        """
        prices = self._prices
        if model is None or prices is None:
            self._once(
                "<no model name>" if model is None else model,
                "a model call has no price ("
                + ("no model name was recorded" if model is None else "pricing is off")
                + f"): its cost is not counted and {why_it_matters}; pass cost_usd=... "
                "(or report a cost attribute such as operation.cost)",
            )
            return None
        try:
            price = prices(model, provider, input_tokens, output_tokens)
        except ImportError as exc:
            self._once(model, f"{exc}; the cost of {_clip(model)!r} calls is not counted")
            return None
        except Exception as exc:
            # The agent-facing boundary: a price table is third-party code running on the
            # agent's thread; a failure leaves the call unpriced (documented), logged once.
            self._once(
                "<error>" + model,
                f"pricing model {_clip(model)!r} failed ({type(exc).__name__}); its calls are "
                f"counted as unpriced and {why_it_matters}",
            )
            return None
        if price is None:
            self._once(
                model,
                f"no price known for model {_clip(model)!r}"
                + (f" (provider {_clip(provider)!r})" if provider else "")
                + f": its calls add nothing to cost_usd and {why_it_matters}; pass "
                "cost_usd=..., or check the model name against genai-prices",
            )
            return None
        cost = usable_cost(price)
        if cost is None:
            self._once(
                "<value>" + model,
                f"the price function returned an unusable price for {_clip(model)!r} "
                f"({type(price).__name__}); its calls are counted as unpriced",
            )
        return cost

    def _once(self, key: str, message: str) -> None:
        key = _clip(key)
        with self._lock:
            if key in self._warned:
                return
            if len(self._warned) >= _MAX_WARNED:
                self._warned.clear()
            self._warned.add(key)
        logger.warning("%s", message)
        if self._warn:
            warnings.warn(CostNotFoundWarning(message), stacklevel=4)


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_NAME else text[:_MAX_NAME] + "…"
