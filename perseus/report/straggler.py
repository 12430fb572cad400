"""``straggler.png``: job-level energy saving vs the straggler's slowdown factor, against
all-max everywhere and against the fastest Perseus plan everywhere; T′ = T* is marked."""

from __future__ import annotations

from collections.abc import Sequence

from perseus.plan import Frontier
from perseus.report._figure import new_figure, to_png
from perseus.runtime.straggler.sweep import StragglerCase

__all__ = ["plot_straggler"]


def plot_straggler(cases: Sequence[StragglerCase], frontier: Frontier, pipelines: int) -> bytes:
    """Render the saving-vs-slowdown plot as PNG bytes (``cases`` from one sweep)."""
    xs = [c.factor for c in cases]
    total = [100 * c.saving_vs_allmax for c in cases]
    extrinsic = [100 * c.saving_vs_fastest for c in cases]
    s_star = frontier.min_energy.time_s / frontier.fastest.time_s
    with new_figure() as fig:
        ax = fig.add_subplot()
        label = "vs all-max everywhere (Perseus total)"
        ax.plot(xs, total, "-o", color="tab:blue", lw=2.2, ms=5, label=label)
        label = "vs fastest Perseus plan everywhere (from slowing non-stragglers)"
        ax.plot(xs, extrinsic, "--s", color="tab:green", lw=1.8, ms=4, label=label)
        if xs[0] <= s_star <= xs[-1]:
            ax.axvline(s_star, color="tab:red", ls=":", lw=1.2)
            text = f" T′ = T* (s = {s_star:.2f})"
            ax.text(s_star, max(total) * 1.02, text, color="tab:red", va="bottom", fontsize=10)
        best = max(cases, key=lambda c: c.saving_vs_allmax)
        ax.annotate(
            f"peak {100 * best.saving_vs_allmax:.1f} % at s = {best.factor:g}",
            xy=(best.factor, 100 * best.saving_vs_allmax),
            xytext=(0, -40),
            textcoords="offset points",
            ha="center",
            fontsize=12,
            fontweight="bold",
            color="tab:blue",
            arrowprops={"arrowstyle": "->", "color": "tab:blue"},
        )
        ax.set_ylim(0, max(total) * 1.15 + 0.5)
        ax.set_xlabel("Straggler slowdown factor s (straggler time T′ = s × T_min)")
        ax.set_ylabel("Job energy saving per iteration (%)")
        j = frontier.job
        ax.set_title(
            f"One straggler among {pipelines} pipelines × {j.ranks} GPUs "
            f"({j.schedule}, {j.microbatches} microbatches)"
        )
        ax.legend(loc="lower right")
        return to_png(fig)
