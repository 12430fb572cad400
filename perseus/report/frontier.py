"""``frontier.png``: iteration time vs energy, the frontier below every baseline, with the
savings at T_min (no slowdown) and at T* written on the plot."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.axes import Axes

from perseus.plan import Baseline, Frontier, PlanPoint
from perseus.profile.pareto import pareto_indices
from perseus.report._figure import new_figure, to_png
from perseus.report.summary import MeasuredRun, summarize

__all__ = ["BASELINE_LABELS", "plot_frontier"]

_KJ = 1e-3

#: Display names of the baselines returned by ``perseus.solver.baseline_plans``.
BASELINE_LABELS = {
    "all-max": "All-max (every clock at maximum)",
    "global-clock": "Global clock (one clock for all GPUs)",
    "per-stage": "Per-stage clock (one clock per stage)",
    "envpipe": "EnvPipe-style (slow non-critical stages)",
}
#: Marker and colour of each baseline but all-max (drawn as the frontier's star).
_LOOKS = {
    "global-clock": ("s", "tab:gray"),
    "per-stage": ("D", "tab:purple"),
    "envpipe": ("^", "tab:green"),
}


def plot_frontier(
    frontier: Frontier,
    baselines: Mapping[str, PlanPoint] | None = None,
    *,
    global_clock: Sequence[PlanPoint] = (),
    measured: MeasuredRun | None = None,
) -> bytes:
    """Render the time–energy plot as PNG bytes: the frontier and its all-max baseline, other
    ``baselines`` by name (keys of :data:`BASELINE_LABELS`, others allowed), the one-clock-for-all
    plans of ``global_clock``, and a ``measured`` run's predicted and measured points."""
    with new_figure() as fig:
        ax = fig.add_subplot()
        if global_clock:
            _draw_global_clock(ax, global_clock)
        _draw_plans(ax, frontier, baselines or {})
        if measured is not None:
            _draw_measured(ax, measured)
        _annotate_savings(ax, frontier)
        ax.set_xlabel("Iteration time (s)")
        ax.set_ylabel("Energy per iteration, all GPUs (kJ)")
        ax.set_title(_default_title(frontier))
        ax.legend(loc="upper right", framealpha=0.9)
        return to_png(fig)


def _xy(points: Sequence[Baseline | PlanPoint]) -> tuple[list[float], list[float]]:
    return [p.time_s for p in points], [p.energy_j * _KJ for p in points]


def _draw_global_clock(ax: Axes, global_clock: Sequence[PlanPoint]) -> None:
    # Every setting as a dot; the line joins only the efficient ones (on power-capped GPUs
    # many clocks run equally fast, and a line through all of them zigzags).
    gc = sorted(global_clock, key=lambda p: (p.time_s, p.energy_j))
    ax.plot(*_xy(gc), ".", color="tab:gray", ms=5, zorder=2)
    # Each setting cheaper than every faster one.
    keep = pareto_indices([p.time_s for p in gc], [p.energy_j for p in gc], 0.0)
    efficient = [gc[i] for i in keep.tolist()]
    label = "Global clock, every setting (line: efficient ones)"
    ax.plot(*_xy(efficient), "--", color="tab:gray", marker=".", lw=1.2, label=label, zorder=2)


def _draw_plans(ax: Axes, frontier: Frontier, baselines: Mapping[str, PlanPoint]) -> None:
    """The frontier up to T*, the all-max star and the other baselines."""
    t_star = frontier.min_energy.time_s  # once: it scans every point
    useful = [p for p in frontier.points if p.time_s <= t_star]
    label = f"Perseus frontier ({len(useful)} plans)"
    ax.plot(*_xy(useful), "-o", color="tab:blue", ms=3, lw=2.2, label=label, zorder=4)
    label = BASELINE_LABELS["all-max"]
    ax.plot(*_xy([frontier.baseline]), "*", color="black", ms=16, label=label, zorder=6)
    for name, p in baselines.items():
        if name != "all-max":
            marker, color = _LOOKS.get(name, ("o", "tab:brown"))
            label = BASELINE_LABELS.get(name, name)
            ax.plot(*_xy([p]), marker, color=color, ms=10, mec="white", label=label, zorder=5)


def _annotate_savings(ax: Axes, frontier: Frontier) -> None:
    """T_min and T* as lines, and the energy saved at each written under the frontier."""
    base, fastest, slowest = frontier.baseline, frontier.fastest, frontier.min_energy
    ymin, ymax = ax.get_ylim()
    ymin -= 0.18 * (ymax - ymin)  # room for the annotations under the frontier
    for t, name in ((fastest.time_s, "T_min"), (slowest.time_s, "T*")):
        ax.axvline(t, color="tab:red", ls=":", lw=1.2, zorder=1)
        ax.text(t, ymax, f" {name} = {t:.3f} s", color="tab:red", va="top", ha="left", fontsize=10)
    figures = summarize(frontier)
    save_fast, star = figures.fastest.energy_saving, figures.min_energy
    xmin, xmax = ax.get_xlim()
    # The no-slowdown saving as a vertical gap: all-max star down to the fastest plan.
    arrow = {"arrowstyle": "-|>", "color": "tab:blue", "lw": 2, "shrinkA": 9, "shrinkB": 3}
    base_xy = (base.time_s, base.energy_j * _KJ)
    ax.annotate("", xy=(fastest.time_s, fastest.energy_j * _KJ), xytext=base_xy, arrowprops=arrow)
    # Below a convex decreasing frontier the lower-left and lower-right corners are empty.
    box = {"boxstyle": "round,pad=0.3", "fc": "white", "ec": "tab:blue", "alpha": 0.9}
    style: dict[str, Any] = {"fontsize": 12, "fontweight": "bold", "color": "tab:blue"}
    labels = (
        (f"−{100 * save_fast:.1f} % energy\nat no slowdown", fastest, 0.06 * (xmax - xmin)),
        (
            f"−{100 * star.energy_saving:.1f} % energy at T*\n(+{100 * star.slowdown:.1f} % time)",
            slowest,
            0.30 * (xmax - slowest.time_s),
        ),
    )
    for text, point, dx in labels:
        ax.annotate(
            text,
            xy=(point.time_s, point.energy_j * _KJ),
            xytext=(point.time_s + dx, ymin + 0.03 * (ymax - ymin)),
            va="bottom",
            bbox=box,
            arrowprops={"arrowstyle": "->", "color": "tab:blue", "lw": 1.5},
            **style,
        )
    ax.set_ylim(ymin, ymax)
    ax.set_xlim(xmin, xmax)


def _draw_measured(ax: Axes, run: MeasuredRun) -> None:
    for i, (name, pred, meas) in enumerate(run.pairs):
        x, y = meas.time_s, meas.energy_j * _KJ
        ax.plot([pred.time_s, x], [pred.energy_j * _KJ, y], "-", color="tab:orange", lw=1, zorder=6)
        label = "Measured run (X) vs its prediction" if i == 0 else None
        ax.plot([x], [y], "X", color="tab:orange", ms=11, mec="black", label=label, zorder=7)
        offset: dict[str, Any] = {"xytext": (6, -12), "textcoords": "offset points"}
        ax.annotate(f"measured {name}", (x, y), fontsize=9, color="tab:orange", **offset)


def _default_title(frontier: Frontier) -> str:
    j = frontier.job
    who = j.profile_name or "profile"
    return (
        f"Time–energy frontier: {who}, {j.schedule}, {j.stages} stages × "
        f"{j.microbatches} microbatches on {j.ranks} GPUs"
    )
