"""``timeline.png``: per-rank Gantt charts of one iteration on one time axis, ops coloured by
power, hatched pale bars for blocking time (a GPU waiting on a neighbour)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Colormap, Normalize
from matplotlib.patches import Patch

from perseus.dag.graph import FloatArray, IntArray
from perseus.job import PlanningJob
from perseus.plan import PlanPoint
from perseus.report._figure import new_figure, to_png

__all__ = ["Timeline", "build_timeline", "plot_timelines"]

_CMAP = "YlOrRd"
_KIND_LETTERS = "FBW"
#: Most rank rows a panel gives full height (and op letters, and a label each); more ranks share
#: that height, so a 4,096-rank chart stays a few thousand pixels tall, not 400,000.
_MAX_TALL_ROWS = 64


@dataclass(frozen=True, eq=False)
class Timeline:
    """One iteration of one plan, op by op: ``label`` is the panel's title, the arrays are
    indexed by DAG node (``kind``: 0 F, 1 B, 2 W; ``power_w``: the op's average power)."""

    label: str
    time_s: float
    energy_j: float
    blocking_power_w: float
    num_ranks: int
    rank: IntArray
    kind: IntArray
    start_s: FloatArray
    end_s: FloatArray
    power_w: FloatArray


def build_timeline(job: PlanningJob, point: PlanPoint, label: str) -> Timeline:
    """Lay out ``point`` on ``job``'s DAG with the exact evaluator, in O(ops + edges) (PlanError
    if the plan does not fit the job)."""
    flat = job.flat(point)
    time_s, energy_j = job.op_costs(flat)
    ev = job.evaluate(flat)
    return Timeline(
        label=label,
        time_s=ev.time_s,
        energy_j=ev.energy_j,
        blocking_power_w=job.blocking_power_w,
        num_ranks=job.graph.num_ranks,
        rank=job.graph.rank.copy(),
        kind=job.graph.kind.copy(),
        start_s=ev.start_s,
        end_s=ev.end_s,
        power_w=energy_j / np.maximum(time_s, 1e-12),
    )


def _rank_ops(tl: Timeline) -> list[IntArray]:
    """Each rank's op indices in index order: one sort, not a scan of every op per rank."""
    by_rank = np.argsort(tl.rank, kind="stable")
    return np.split(by_rank, np.searchsorted(tl.rank[by_rank], np.arange(1, tl.num_ranks)))


def _idle_segments(tl: Timeline, ids: IntArray) -> list[tuple[float, float]]:
    """(start, width) of every gap in the iteration on the rank that runs the ops ``ids``."""
    order = ids[np.argsort(tl.start_s[ids], kind="stable")]
    # Each op's start, then the iteration's end, against when every op before it has ended.
    starts = np.append(tl.start_s[order], tl.time_s)
    ended = np.concatenate([[0.0], np.maximum.accumulate(tl.end_s[order])])
    gap = starts > ended + 1e-9
    return list(zip(ended[gap].tolist(), (starts - ended)[gap].tolist(), strict=True))


def _draw(ax: Axes, tl: Timeline, cmap: Colormap, norm: Normalize, t_max: float) -> None:
    idle_color = cmap(norm(tl.blocking_power_w))
    # Fixed limits first: autoscaling after each row's bars rescans every bar drawn so far.
    ax.set_ylim(tl.num_ranks - 0.5, -0.5)
    ax.set_xlim(0, t_max * 1.01)
    rank_ops = _rank_ops(tl)
    gaps = [_idle_segments(tl, ids) for ids in rank_ops]
    for r, ids in enumerate(rank_ops):
        row = (r - 0.4, 0.8)
        ax.broken_barh(gaps[r], row, fc=idle_color, ec="0.6", hatch="///", lw=0.3)
        widths = tl.end_s[ids] - tl.start_s[ids]
        bars = list(zip(tl.start_s[ids].tolist(), widths.tolist(), strict=True))
        colors = cmap(norm(tl.power_w[ids]))  # one call per rank, not one per op
        ax.broken_barh(bars, row, facecolors=colors, edgecolor="black", lw=0.3)
        # Letters only where they fit (a glyph needs ~0.8 % of the axis at report size).
        for i in ids if tl.num_ranks <= _MAX_TALL_ROWS else ():
            width = float(tl.end_s[i] - tl.start_s[i])
            if width > 0.008 * t_max:
                x, letter = float(tl.start_s[i]) + width / 2, _KIND_LETTERS[int(tl.kind[i])]
                ax.text(x, r, letter, ha="center", va="center", fontsize=6, color="black")
    idle = sum(w for rank_gaps in gaps for _, w in rank_gaps)
    ax.set_title(
        f"{tl.label}: {tl.time_s:.3f} s, {tl.energy_j / 1e3:.2f} kJ, "
        f"blocking {100 * idle / (tl.num_ranks * tl.time_s):.0f} % of GPU time",
        loc="left",
    )
    labelled = range(0, tl.num_ranks, -(-tl.num_ranks // _MAX_TALL_ROWS))
    ax.set_yticks(labelled, [f"rank {r}" for r in labelled])
    ax.grid(False)


def plot_timelines(timelines: Sequence[Timeline]) -> bytes:
    """Stack the timelines (same time axis, same power colours) and render PNG bytes."""
    cmap = matplotlib.colormaps[_CMAP]
    lo = min(tl.blocking_power_w for tl in timelines)
    hi = max(float(tl.power_w.max()) for tl in timelines)
    norm = Normalize(vmin=lo, vmax=max(hi, lo + 1.0))
    t_max = max(tl.time_s for tl in timelines)
    rows = min(max(tl.num_ranks for tl in timelines), _MAX_TALL_ROWS)
    with new_figure((12.0, 1.2 + 0.42 * rows * len(timelines) + 0.6 * len(timelines))) as fig:
        axes = fig.subplots(len(timelines), 1, sharex=True, squeeze=False)[:, 0]
        for ax, tl in zip(axes, timelines, strict=True):
            _draw(ax, tl, cmap, norm, t_max)
        axes[-1].set_xlabel("Time within one iteration (s)")
        bar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=list(axes), pad=0.01, aspect=30)
        bar.set_label("GPU power (W)")
        op = "op (F forward, B backward, W weight)"
        blocked = f"blocked, waiting at {lo:g} W"
        handles = [
            Patch(facecolor=cmap(norm(hi)), edgecolor="black", label=op),
            Patch(facecolor=cmap(norm(lo)), edgecolor="0.6", hatch="///", label=blocked),
        ]
        where = {"loc": "lower right", "bbox_to_anchor": (1.0, 1.08)}
        axes[0].legend(handles=handles, ncols=2, frameon=False, fontsize=9, **where)
        return to_png(fig)
