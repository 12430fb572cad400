"""Plots of a trace replay (imports matplotlib; import this module only to plot): cumulative
cost per policy, and the batch size each run of the optimizer chose.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from perseus.io.atomic import atomic_write_bytes
from perseus.recurring.replay import WorkloadSummary
from perseus.report._figure import new_figure, to_png

__all__ = ["plot_batch_sizes", "plot_cumulative_cost", "plot_paths", "write_plots"]

_COLOURS = {"optimizer": "tab:green", "default": "tab:red", "oracle": "tab:blue"}


def plot_cumulative_cost(summary: WorkloadSummary, gpu: str) -> bytes:
    """Cumulative cost vs recurrence, mean over seeds with the min-max band, as PNG bytes."""
    with new_figure() as fig:
        ax = fig.add_subplot()
        x = np.arange(1, summary.recurrences + 1)
        for policy, runs in summary.runs.items():
            costs = np.stack([r.cum_cost for r in runs])
            ax.plot(x, costs.mean(axis=0), color=_COLOURS[policy], lw=2, label=policy)
            ax.fill_between(
                x, costs.min(axis=0), costs.max(axis=0), color=_COLOURS[policy], alpha=0.15, lw=0
            )
        ax.set_xlabel("recurrence")
        ax.set_ylabel("cumulative cost (J)")
        ax.set_title(f"{summary.workload} on {gpu}: cumulative cost over {len(runs)} seeds")
        ax.legend(loc="upper left")
        return to_png(fig)


def plot_batch_sizes(summary: WorkloadSummary, gpu: str, seed_index: int = 0) -> bytes:
    """Batch size of every optimizer run (one seed), oracle's as a line, as PNG bytes."""
    runs = summary.runs["optimizer"][seed_index].runs
    with new_figure() as fig:
        ax = fig.add_subplot()
        xs = np.arange(1, len(runs) + 1)
        ok = np.array([r.reached for r in runs], dtype=bool)
        bs = np.array([r.batch_size for r in runs])
        ax.scatter(xs[ok], bs[ok], color="tab:green", s=18, label="reached target")
        label = "failed / stopped early"
        ax.scatter(xs[~ok], bs[~ok], s=30, facecolors="none", edgecolors="tab:red", label=label)
        ax.axhline(summary.oracle_config[0], color="tab:blue", ls=":", label="oracle batch size")
        ax.set_yscale("log", base=2)
        ax.set_xlabel("run")
        ax.set_ylabel("batch size")
        ax.set_title(f"{summary.workload} on {gpu}: batch size chosen per run")
        ax.legend(loc="upper right")
        return to_png(fig)


def plot_paths(workload: str, out_dir: Path) -> list[Path]:
    """The PNGs :func:`write_plots` writes for ``workload``."""
    stem = workload.replace("/", "_")
    return [out_dir / f"{stem}_{suffix}.png" for suffix in ("cost", "batch_size")]


def write_plots(summary: WorkloadSummary, gpu: str, out_dir: Path) -> list[Path]:
    """Write ``<workload>_cost.png`` and ``<workload>_batch_size.png`` into ``out_dir``
    (atomically, never following a link in their place)."""
    cost_png, sizes_png = plot_paths(summary.workload, out_dir)
    atomic_write_bytes(cost_png, plot_cumulative_cost(summary, gpu))
    atomic_write_bytes(sizes_png, plot_batch_sizes(summary, gpu))
    return [cost_png, sizes_png]
