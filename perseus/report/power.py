"""``power.png``: each frontier plan's average (and peak) summed power against its time (left),
and the summed power of all GPUs over one iteration for chosen plans (right,
:func:`perseus.solver.power.power_timeline`), each plan's average dashed."""

from __future__ import annotations

from collections.abc import Sequence

from perseus.job import PlanningJob
from perseus.plan import Frontier, PlanPoint
from perseus.report._figure import new_figure, to_png
from perseus.solver.power import power_timeline

__all__ = ["plot_power"]


def plot_power(
    frontier: Frontier, job: PlanningJob | None = None, plans: Sequence[tuple[str, PlanPoint]] = ()
) -> bytes:
    """Render the power panels as PNG bytes: the frontier's plans (left) and, given their job,
    the summed power over one iteration of each ``(label, plan)`` in ``plans`` (right)."""
    pts = frontier.points
    times = [p.time_s for p in pts]
    with new_figure() as fig:
        right = job is not None and bool(plans)
        axes = fig.subplots(1, 2 if right else 1, squeeze=False)[0]
        ax = axes[0]
        label = "Perseus plans: average power"
        ax.plot(times, [p.avg_power_w for p in pts], "-o", color="tab:blue", ms=3, label=label)
        peaks = [p.power.peak_power_w for p in pts if p.power is not None]
        if len(peaks) == len(pts):
            ax.plot(times, peaks, ":", color="tab:red", label="peak summed power")
        base = frontier.baseline
        ax.plot(
            [base.time_s], [base.energy_j / base.time_s], "*", color="black", ms=12, label="All-max"
        )
        ax.set_xlabel("Iteration time (s)")
        ax.set_ylabel("Pipeline power (W)")
        ax.set_title("Frontier in (time, power)")
        ax.legend(loc="upper right")
        if right and job is not None:
            ax2 = axes[1]
            colors = ["black", "tab:blue", "tab:green", "tab:orange"]
            for k, (label, point) in enumerate(plans):
                tl = power_timeline(job, point)
                color = colors[k % len(colors)]
                ax2.stairs(tl.power_w, tl.times_s, color=color, lw=1.4, label=label)
                ax2.axhline(point.avg_power_w, color=color, ls="--", lw=0.9)
            ax2.set_xlabel("Time in the iteration (s)")
            ax2.set_ylabel("Summed power of all GPUs (W)")
            ax2.set_title("Power over one iteration (dashed: average)")
            ax2.legend(loc="lower right")
        s = frontier.job
        fig.suptitle(f"{s.schedule}, {s.stages} stages x {s.microbatches} microbatches: power")
        return to_png(fig)
