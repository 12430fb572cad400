"""Does the run measure its plan? Judged every iteration, the same on every rank: the ranks
agree on an iteration's figures in one all-reduce (:func:`agree_iteration`), :class:`DriftMonitor`
reports a drift that lasts, and an online-profiled session profiles the drifted ops again
(:func:`ops_to_profile`).
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
from collections import defaultdict, deque
from typing import Any

import numpy as np

from perseus.profile.model import Profile
from perseus.runtime.agent.op_timing import profiled_op_time_s
from perseus.runtime.agent.rank_agent import RankAgent
from perseus.runtime.agent.readback import REASON_TEXT, ClockDelivery
from perseus.runtime.collectives import all_reduce_max, all_reduce_sum
from perseus.runtime.session_types import EndedIteration
from perseus.runtime.summary import DRIFT_TOLERANCE, IterationStats, drift_cause, waited_share
from perseus.schedule.actions import Kind, Schedule

__all__ = [
    "ENERGY_WINDOW_PERIODS",
    "PATIENCE",
    "DriftMonitor",
    "agree_iteration",
    "ops_to_profile",
]

_log = logging.getLogger("perseus.runtime.session")

#: Iterations in a row beyond the tolerance before the drift is reported.
PATIENCE = 3

#: The limiting reasons counted across ranks, in a fixed order (plus "no reason reported").
_REASONS = tuple(REASON_TEXT)


def agree_iteration(
    ended: EndedIteration,
    span_s: tuple[float, float, float],
    energy_j: float,
    delivery: ClockDelivery | None,
    host_overruns: int,
    ranks: tuple[int, int, Any],
) -> IterationStats:
    """An ended iteration's figures, agreed over the pipeline in one all-reduce: energy, held
    ops (by reason) and host overruns summed, the longest rank's window as the pipeline's time
    and the longest compute time as its ops' own (each rank's in its own slot of the sum). ``span_s``: this rank's start, last op's end and
    end; ``ranks``: this rank, the pipeline's ranks and its group."""
    rank, num_ranks, group = ranks
    start_s, own_end_s, end_s = span_s
    held = delivery.held if delivery is not None else ()
    by_reason = [float(sum(1 for h in held if r in h.reasons)) for r in _REASONS]
    windows = [0.0] * (2 * num_ranks)  # per rank: its window, then its compute time
    windows[rank] = float(end_s - start_s)
    compute_s = windows[num_ranks + rank] = max(0.0, own_end_s - start_s)
    energy, held_sum, overruns, *rest = all_reduce_sum(
        [float(energy_j), float(len(held)), float(host_overruns), *by_reason, *windows], group
    )
    reasons, spans = rest[: len(_REASONS)], rest[len(_REASONS) :]
    point = ended.frontier.points[ended.point_index] if ended.frontier is not None else None
    return IterationStats(
        iteration=ended.iteration,
        phase="profile" if ended.profiling else "run",
        point_index=None if ended.profiling else ended.point_index,
        time_s=max(spans[:num_ranks]),
        energy_j=energy_j,
        compute_time_s=compute_s,
        pipeline_energy_j=energy,
        predicted_time_s=None if point is None else point.time_s,
        predicted_energy_j=None if point is None else point.energy_j,
        clock_share_at_plan=None if delivery is None else delivery.share_at_plan,
        held_ops=held,
        pipeline_held_ops=round(held_sum),
        held_reasons=tuple(r for r, n in zip(_REASONS, reasons, strict=True) if n > 0),
        host_overruns=round(overruns),
        pipeline_compute_time_s=max(spans[num_ranks:]),
    )


def _beyond(stats: IterationStats, energy: float | None) -> bool:
    """Whether ``stats`` (its pipeline energy as judged: ``energy``) is off the plan."""
    if stats.phase != "run" or not stats.predicted_time_s or not stats.predicted_energy_j:
        return False
    dt = stats.time_s / stats.predicted_time_s - 1.0
    de = 0.0 if energy is None else energy / stats.predicted_energy_j - 1.0
    return abs(dt) > DRIFT_TOLERANCE or abs(de) > DRIFT_TOLERANCE


#: An energy counter is judged over windows of at least this many of its publish periods
#: (one period of error in 20 is 5 %, the tolerance; an H100's 100 ms counter: 2 s windows).
ENERGY_WINDOW_PERIODS = 20


class DriftMonitor:
    """Predicted against measured, every iteration; one report per deployed plan (logged on
    rank 0).

    Time is judged per iteration; energy over the latest iterations that span
    :data:`ENERGY_WINDOW_PERIODS` counter periods, taken as predicted until that is full.

    Args:
        reprofile: Answer the first drift that neither held clocks nor host overruns explain
            by profiling again (once): the plan comes from an online profile.
        counter_period_s: How often the GPU's energy counter publishes (0: every iteration
            judged alone).
    """

    def __init__(
        self, rank: int, *, reprofile: bool = False, counter_period_s: float = 0.0
    ) -> None:
        self._rank = rank
        self._reprofile = reprofile
        self._window_s = ENERGY_WINDOW_PERIODS * counter_period_s
        # The energy window: (time, measured and predicted pipeline energy) per iteration.
        self._recent: deque[np.ndarray] = deque()
        self._totals = np.zeros(3)  # their sums
        # The latest iterations beyond the tolerance in a row (judged together), and the first.
        self._streak: deque[IterationStats] = deque(maxlen=PATIENCE)
        self._streak_from = 0
        self._reported = False

    @property
    def energy_window_s(self) -> float:
        """The time over which the GPU's energy counter measures within the tolerance."""
        return self._window_s

    def reset(self) -> None:
        """A new plan runs: watch it afresh."""
        self._streak.clear()
        self._recent.clear()
        self._totals = np.zeros(3)
        self._reported = False

    def _judged(self, stats: IterationStats) -> float | None:
        """``stats``'s pipeline energy as the latest full window measured it."""
        energy_j, predicted_j = stats.pipeline_energy_j, stats.predicted_energy_j
        if self._window_s <= 0 or energy_j is None or not predicted_j:
            return energy_j
        recent = self._recent
        recent.append(np.array((stats.time_s, energy_j, predicted_j)))
        totals = self._totals + recent[-1]  # kept, not summed again: every iteration
        while len(recent) > 1 and totals[0] - recent[0][0] >= self._window_s:
            totals = totals - recent.popleft()  # the window stays full without its oldest iteration
        self._totals = totals
        time_s, measured_j, planned_j = (float(x) for x in totals)
        return predicted_j * measured_j / planned_j if time_s >= self._window_s else predicted_j

    def update(self, stats: IterationStats) -> bool:
        """Take one iteration; say so the first time the drift persisted. True when the
        session should profile again."""
        energy_j = self._judged(stats) if stats.phase == "run" else stats.pipeline_energy_j
        if not _beyond(stats, energy_j):
            self._streak.clear()
            return False
        if self._reported:  # said once per plan: nothing kept while it drifts on
            return False
        if energy_j != stats.pipeline_energy_j:
            stats = dataclasses.replace(stats, pipeline_energy_j=energy_j)
        if not self._streak:
            self._streak_from = stats.iteration
        self._streak.append(stats)
        if len(self._streak) < PATIENCE:
            return False
        cause = drift_cause(self._streak)
        if cause is None:
            return False
        self._reported = True
        stale = not any(s.pipeline_held_ops or s.host_overruns for s in self._streak)
        stale = stale and waited_share(self._streak) is None  # a straggler: not the profile
        reprofile = stale and self._reprofile
        self._reprofile = self._reprofile and not reprofile  # a re-plan's drift is not chased
        if self._rank == 0:
            _log.warning(
                "perseus: iterations %d-%d: %s%s",
                self._streak_from,
                stats.iteration,
                cause,
                "; profiling again to re-plan" if reprofile else "",
            )
        return reprofile


def ops_to_profile(
    agent: RankAgent, schedule: Schedule, profile: Profile, group: Any
) -> frozenset[tuple[int, Kind]]:
    """The ops (stage, kind) to profile again, the same on every rank (one all-reduce):
    those whose median time over the last :data:`PATIENCE` iterations is off the ``profile``'s
    beyond the tolerance (two-clock ops not judged), else every op. Reads only the agent's
    last records (those iterations and the one under way), not all it keeps."""
    op_time_s = profiled_op_time_s(profile)
    ratios: defaultdict[tuple[int, Kind], list[float]] = defaultdict(list)
    per_iteration = len(schedule.rank_actions[agent.rank])
    for op in agent.recent_ops((PATIENCE + 1) * per_iteration):
        if op.iteration >= agent.iteration - PATIENCE and op.mid_freq_mhz is None:
            key = (op.op.stage_index, op.op.kind)
            ratios[key].append(op.time_s / op_time_s(*key, op.freq_mhz))
    drifted = {k for k, r in ratios.items() if abs(statistics.median(r) - 1) > DRIFT_TOLERANCE}
    ops = sorted({(a.stage_index, a.kind) for acts in schedule.rank_actions for a in acts})
    flags = all_reduce_max([1.0 if op in drifted else 0.0 for op in ops], group)
    return frozenset(op for op, flag in zip(ops, flags, strict=True) if flag) or frozenset(ops)
