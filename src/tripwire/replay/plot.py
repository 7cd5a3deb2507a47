"""Draw a calibration: catch rate vs false-alarm rate (``pip install 'tripwire[plot]'``)."""

from __future__ import annotations

import os
from typing import Any

from tripwire.errors import TripwireError
from tripwire.replay.calibrate import Calibration

__all__ = ["PlotUnavailable", "plot_calibration"]


class PlotUnavailable(TripwireError):
    """matplotlib is not installed."""

    def __init__(self) -> None:
        super().__init__(
            "--plot needs matplotlib, which is not installed: pip install 'tripwire[plot]'"
        )


def plot_calibration(result: Calibration, path: str | os.PathLike[str]) -> None:
    """Write a scatter of every policy (x: false-alarm rate, y: catch rate) to ``path``.

    The Pareto front is drawn as a highlighted step line, the recommendation as a star, and
    the false-alarm cap as a dashed vertical line.

    Raises:
        PlotUnavailable: matplotlib is missing.
        OSError: the file cannot be written.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailable() from None

    scores = result.scores
    fig: Any
    ax: Any
    fig, ax = plt.subplots(figsize=(7, 5), dpi=120)
    try:
        xs = [s.false_alarm_rate * 100 for s in scores]
        ys = [s.catch_rate * 100 for s in scores]
        ax.scatter(xs, ys, s=14, color="#9aa5b1", label="policy", zorder=2)
        front = sorted((s for s in scores if s.pareto), key=lambda s: (s.false_alarm_rate, s.catch_rate))
        if front:
            ax.plot(
                [s.false_alarm_rate * 100 for s in front],
                [s.catch_rate * 100 for s in front],
                "-o", color="#d1495b", markersize=5, linewidth=1.8, label="Pareto front", zorder=3,
            )
        if result.recommended is not None:
            rec = scores[result.recommended]
            p = rec.policy
            mp = "off" if p.max_period is None else p.max_period
            ax.scatter(
                [rec.false_alarm_rate * 100], [rec.catch_rate * 100], marker="*", s=260,
                color="#edae49", edgecolor="black", zorder=4,
                label=f"recommended: {p.key.value} w={p.window} t={p.threshold} period={mp}",
            )
        ax.axvline(result.max_false_alarms * 100, linestyle="--", color="#00798c", linewidth=1,
                   label=f"false-alarm cap {result.max_false_alarms:.1%}")
        ax.set_xlabel("healthy traces flagged (false alarms), %")
        ax.set_ylabel("incidents caught, %")
        ax.set_title("tripwire calibrate: catches vs false alarms")
        ax.set_ylim(0, min(100.0, max(ys, default=0.0) * 1.1 + 3))
        ax.set_xlim(left=-0.5)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
        fig.tight_layout()
        fig.savefig(os.fspath(path))
    finally:
        plt.close(fig)
