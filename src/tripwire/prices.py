"""Model prices from the maintained ``genai-prices`` table (no hand-written price list).

An unknown model has no price: :func:`genai_price` returns ``None`` and the guard warns once
per model with :class:`CostNotFoundWarning`, never counting it as $0 silently. Needs the
``prices`` extra: ``pip install 'tripwire[prices]'``.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["CostNotFoundWarning", "PriceFn", "genai_price"]

PriceFn = Callable[[str, "str | None", int, int], "float | None"]
"""``(model, provider, input_tokens, output_tokens) -> USD`` or ``None`` when not known."""


class CostNotFoundWarning(UserWarning):
    """No price is known for a model, so its calls add nothing to the cost counter and
    ``max_cost_usd`` cannot be enforced for them. Report ``cost_usd`` yourself, or check the
    model name against the ``genai-prices`` table."""


def genai_price(
    model: str, provider: str | None, input_tokens: int, output_tokens: int
) -> float | None:
    """The price in USD of one model call, from ``genai-prices``; ``None`` when unknown.

    Raises:
        ImportError: when the ``prices`` extra is not installed (the guard turns this into a
            :class:`CostNotFoundWarning`).
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
