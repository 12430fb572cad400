"""Per-op cost curves: measured options, their Pareto set and lower convex hull.

Per (stage, kind) ("type"): the **options**, the Pareto measured clocks (or clock pairs) in
(time, effective cost ``e − P·t``), time ascending, and the **hull**, their lower convex hull:
the LP relaxation in which an op mixes neighbouring clocks, whose slopes are the walk's cut
capacities. With ``max_clocks_per_op`` ≥ 2 the options also hold every phased op over
neighbouring hull vertices (:mod:`perseus.profile.two_clock`), so fractional plans round to
real plans at most one layer step off the hull. Complexity: O(K log K) per type for K clocks.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from perseus.dag.graph import FloatArray, IntArray
from perseus.errors import ConfigError
from perseus.job import PlanningJob
from perseus.plan import PlanOp
from perseus.profile.model import OpOption
from perseus.profile.pareto import lower_hull, pareto_indices, pareto_options
from perseus.profile.two_clock import LayerSplit, Phase, phased_cost, phases_op
from perseus.schedule.actions import Kind

__all__ = ["MAX_PHASES_PER_OP", "CostModel", "build_cost_model", "lower_hull"]


@dataclass(frozen=True, eq=False)
class CostModel:
    """Padded per-type tables (one type per (stage, kind)) and per-node type ids.

    Attributes:
        node_type: (N,) type id of each node.
        opt_time_s, opt_energy_j, opt_cost_j: (K, W) Pareto options per type, time ascending,
            padded with ``inf`` time / last value.
        opt_freq_mhz, opt_freq_b_mhz: (K, W) the first and second clock (equal for one clock).
        opt_layers_at_a: (K, W) layers run at the first clock (0 for one-clock options).
        opt_phases: Per type, per real option, its phases (the plan's op).
        num_opts: (K,) real options per type.
        hull_time_s, hull_cost_j: (K, H) hull vertices, time ascending, padded with ``inf``.
        hull_slope: (K, H) cost saved per second of slowing from vertex ``j`` to ``j+1``
            (positive, non-increasing); 0 past the last segment.
        num_hull: (K,) real hull vertices per type.
        blocking_power_w: P used for effective cost.
    """

    node_type: IntArray
    opt_time_s: FloatArray
    opt_energy_j: FloatArray
    opt_cost_j: FloatArray
    opt_freq_mhz: IntArray
    opt_freq_b_mhz: IntArray
    opt_layers_at_a: IntArray
    num_opts: IntArray
    opt_phases: tuple[tuple[tuple[Phase, ...], ...], ...]
    hull_time_s: FloatArray
    hull_cost_j: FloatArray
    hull_slope: FloatArray
    num_hull: IntArray
    blocking_power_w: float

    def plan_ops(self, option_index: IntArray) -> IntArray | list[PlanOp]:
        """Per-node ``(freq_a_mhz, freq_b_mhz, layers_at_a)`` rows (N, 3) of option indices;
        where any option has more than two phases or a memory clock, per-node plan ops instead
        (:func:`~perseus.profile.two_clock.phases_op`: phase lists where a clock pair cannot
        say it)."""
        t = self.node_type
        phases = (ph for t_ph in self.opt_phases for ph in t_ph)
        if any(len(ph) > 2 or ph[0].mem_freq_mhz is not None for ph in phases):
            return [
                phases_op(self.opt_phases[ty][ix])
                for ty, ix in zip(t.tolist(), np.asarray(option_index).tolist(), strict=True)
            ]
        return np.stack(
            [
                self.opt_freq_mhz[t, option_index],
                self.opt_freq_b_mhz[t, option_index],
                self.opt_layers_at_a[t, option_index],
            ],
            axis=1,
        ).astype(np.int64)


def _thin_hull(time_s: FloatArray, hull: IntArray, min_gap_fraction: float) -> IntArray:
    """Drop hull vertices closer than ``min_gap_fraction`` of the fastest time to the last kept
    one (both ends kept): a coarser convex model of real clocks, with fewer breakpoints."""
    if min_gap_fraction <= 0 or len(hull) <= 2:
        return hull
    gap = min_gap_fraction * time_s[hull[0]]
    kept = [int(hull[0])]
    for v in hull[1:-1]:
        if time_s[v] - time_s[kept[-1]] >= gap:
            kept.append(int(v))
    if time_s[hull[-1]] - time_s[kept[-1]] < gap and len(kept) > 1:
        kept.pop()
    kept.append(int(hull[-1]))
    return np.array(kept, dtype=np.int64)


# option (time/energy of the mix; its clocks are the first phase's), and the op's phases
_Labelled = tuple[OpOption, tuple[Phase, ...]]

#: The most phases per op the option tables enumerate.
MAX_PHASES_PER_OP = 4
#: The most phased options a job's tables price (8-16 µs each on a 2-core VM: ~15 s).
MAX_PHASED_OPTIONS = 1_000_000


def _phased_count(hull_size: int, layers: int, max_phases: int) -> int:
    """How many phased options :func:`_phased_options` prices for one op."""
    return sum(
        max(0, hull_size - p + 1) * 2 * math.comb(layers - 1, p - 1)
        for p in range(2, max_phases + 1)
    )


def _one(o: OpOption) -> _Labelled:
    return o, (Phase(o.freq_mhz, o.mem_freq_mhz, 0),)


def _phased_options(
    opts: tuple[OpOption, ...],
    hull: IntArray,
    stage: int,
    split: LayerSplit,
    power: float,
    max_phases: int,
) -> list[_Labelled]:
    """The one-clock options and every phased op over 2..``max_phases`` consecutive hull
    vertices (either order, every increasing set of layer boundaries), Pareto-filtered in
    (time, effective cost), time ascending (one-clock options win ties).

    Complexity: O(H·C(L-1, p-1)) per ``p`` phases for H hull vertices and L layers.
    """
    every: list[_Labelled] = [_one(o) for o in opts]
    n_layers = split.num_layers(stage)
    vertices = hull.tolist()
    for phases in range(2, max_phases + 1):
        for start in range(len(vertices) - phases + 1):
            run = vertices[start : start + phases]
            for order in (run, run[::-1]):
                chosen = [opts[v] for v in order]
                for bounds in itertools.combinations(range(1, n_layers), phases - 1):
                    work = [split.work_before(stage, b) for b in bounds]
                    t, e = phased_cost(chosen, work, split)
                    labels = tuple(
                        Phase(o.freq_mhz, o.mem_freq_mhz, first)
                        for o, first in zip(chosen, (0, *bounds), strict=True)
                    )
                    every.append(
                        (OpOption(chosen[0].freq_mhz, t, e, chosen[0].mem_freq_mhz), labels)
                    )
    keep = pareto_indices(
        [o.time_s for o, _ in every], [o.energy_j - power * o.time_s for o, _ in every], 0.0
    )
    return [every[i] for i in keep.tolist()]


def build_cost_model(
    job: PlanningJob, min_vertex_gap_fraction: float = 0.0, max_clocks_per_op: int = 1
) -> CostModel:
    """Pareto options and convex hulls of every (stage, kind) the job's DAG uses.

    Args:
        min_vertex_gap_fraction: Thin each hull so consecutive vertices are at least this
            fraction of the op's fastest time apart (0 keeps the exact hull).
        max_clocks_per_op: 1; 2 for two-clock options; up to :data:`MAX_PHASES_PER_OP` for
            phased ops (2 or more need ``layers_per_stage``).

    Raises:
        ConfigError: if ``max_clocks_per_op`` is out of range, or above 1 without layers.
    """
    if not 1 <= max_clocks_per_op <= MAX_PHASES_PER_OP:
        raise ConfigError(
            f"max clocks per op must be 1..{MAX_PHASES_PER_OP}, got {max_clocks_per_op}"
        )
    if max_clocks_per_op >= 2 and job.layer_split is None:
        raise ConfigError(
            "two clocks per op need the job's `layers_per_stage`; "
            "give it or use `max_clocks_per_op`=1"
        )
    graph, power = job.graph, job.blocking_power_w
    # One type per (stage, kind), numbered in that order.
    codes, node_type = np.unique(graph.stage * len(Kind) + graph.kind, return_inverse=True)
    keys = [divmod(code, len(Kind)) for code in codes.tolist()]
    options, hulls = _type_options(job, keys, min_vertex_gap_fraction, max_clocks_per_op)
    tables = _option_tables(options, power)
    hull_t, hull_c, slope = _hull_tables(tables["opt_time_s"], tables["opt_cost_j"], hulls)
    return CostModel(
        node_type=node_type,
        **tables,
        num_opts=np.array([len(o) for o in options], dtype=np.int64),
        opt_phases=tuple(tuple(ph for _, ph in labelled) for labelled in options),
        hull_time_s=hull_t,
        hull_cost_j=hull_c,
        hull_slope=slope,
        num_hull=np.array([len(h) for h in hulls], dtype=np.int64),
        blocking_power_w=power,
    )


def _type_options(
    job: PlanningJob,
    keys: list[tuple[int, int]],
    min_vertex_gap_fraction: float,
    max_clocks_per_op: int,
) -> tuple[list[list[_Labelled]], list[IntArray]]:
    """Per (stage, kind): its labelled options and the indices of its (thinned) hull's
    vertices among them."""
    kinds, power = list(Kind), job.blocking_power_w
    split = job.layer_split if max_clocks_per_op >= 2 else None  # None: one clock per op
    types = []
    for stage, kind in keys:
        opts = pareto_options(job.profile.op(stage, kinds[kind]).options, power)
        t = np.array([o.time_s for o in opts])
        c = np.array([o.energy_j - power * o.time_s for o in opts])
        true_hull = lower_hull(t, c)
        types.append((stage, opts, true_hull, _thin_hull(t, true_hull, min_vertex_gap_fraction)))
    if split is not None:
        _check_phased_size([(s, len(h)) for s, _, h, _ in types], split, max_clocks_per_op)
    options: list[list[_Labelled]] = []
    hulls: list[IntArray] = []
    for stage, opts, true_hull, thinned in types:
        if split is not None:
            labelled = _phased_options(opts, true_hull, stage, split, power, max_clocks_per_op)
            # Hull vertices are one-clock options, all kept by the filter: re-index them.
            where = {o.clocks: i for i, (o, ph) in enumerate(labelled) if len(ph) == 1}
            thinned = np.array([where[opts[v].clocks] for v in thinned], dtype=np.int64)
        else:
            labelled = [_one(o) for o in opts]
        options.append(labelled)
        hulls.append(thinned)
    return options, hulls


def _check_phased_size(hulls: list[tuple[int, int]], split: LayerSplit, max_phases: int) -> None:
    """Refuse tables of over :data:`MAX_PHASED_OPTIONS` phased options (``hulls``: each
    type's stage and hull size) before any is priced."""
    total = sum(_phased_count(size, split.num_layers(s), max_phases) for s, size in hulls)
    if total > MAX_PHASED_OPTIONS:
        layers = max(split.num_layers(s) for s, _ in hulls)
        raise ConfigError(
            f"`max_clocks_per_op`={max_phases} with up to {layers} layers per stage: {total:,} "
            f"phased options to price, over the {MAX_PHASED_OPTIONS:,} a job may (about 15 s "
            "per million); use fewer clocks per op or fewer layers per stage"
        )


def _option_tables(options: list[list[_Labelled]], power_w: float) -> dict[str, npt.NDArray[Any]]:
    """The per-type option tables of :class:`CostModel` (its ``opt_*`` fields), each row
    padded with its last value (times with ``inf``)."""
    columns: dict[str, list[list[Any]]] = {}
    for labelled in options:
        for name, values in _option_row(labelled, power_w).items():
            columns.setdefault(name, []).append(list(values))
    width = max(len(o) for o in options)
    dtypes = {"opt_time_s": float, "opt_energy_j": float, "opt_cost_j": float}
    tables: dict[str, npt.NDArray[Any]] = {}
    for name, rows in columns.items():
        out = np.zeros((len(rows), width), dtype=dtypes.get(name, np.int64))
        for k, values in enumerate(rows):
            out[k, : len(values)] = values
            out[k, len(values) :] = np.inf if name == "opt_time_s" else values[-1]
        tables[name] = out
    return tables


def _option_row(labelled: list[_Labelled], power_w: float) -> dict[str, Any]:
    """One type's ``opt_*`` columns, unpadded."""
    time_s = np.array([o.time_s for o, _ in labelled])
    energy_j = np.array([o.energy_j for o, _ in labelled])
    first = [ph[0] for _, ph in labelled]
    second = [ph[min(1, len(ph) - 1)] for _, ph in labelled]
    return {
        "opt_time_s": time_s,
        "opt_energy_j": energy_j,
        "opt_cost_j": energy_j - power_w * time_s,
        "opt_freq_mhz": [p.freq_mhz for p in first],
        "opt_freq_b_mhz": [p.freq_mhz for p in second],
        "opt_layers_at_a": [ph[1].first_layer if len(ph) > 1 else 0 for _, ph in labelled],
    }


def _hull_tables(
    opt_t: FloatArray, opt_c: FloatArray, hulls: list[IntArray]
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Per type: hull vertex times (``inf``-padded), costs (padded with the last) and segment
    slopes (zero-padded)."""
    hwidth = max(len(h) for h in hulls)
    hull_t = np.full((len(hulls), hwidth), np.inf)
    hull_c = np.zeros((len(hulls), hwidth))
    slope = np.zeros((len(hulls), hwidth))
    for k, hull in enumerate(hulls):
        h = len(hull)
        hull_t[k, :h] = opt_t[k, hull]
        hull_c[k, :h] = opt_c[k, hull]
        hull_c[k, h:] = hull_c[k, h - 1]
        if h > 1:
            slope[k, : h - 1] = -np.diff(hull_c[k, :h]) / np.diff(hull_t[k, :h])
    return hull_t, hull_c, slope
