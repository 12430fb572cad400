"""One short, readable summary of a run: predicted vs measured time, energy and saving (the
whole pipeline's, against the plan's predicted all-max baseline), and why the figures do not
measure the plan when they do not (:attr:`RunSummary.caveat`).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from perseus.plan import Frontier
from perseus.runtime.agent.readback import HeldOp, describe_reasons

__all__ = [
    "DRIFT_TOLERANCE",
    "IterationStats",
    "RunSummary",
    "drift_cause",
    "summarize",
    "waited_share",
]

#: Measured time or energy further than this from the prediction: the run drifts from its plan.
DRIFT_TOLERANCE = 0.05


@dataclass(frozen=True, slots=True)
class IterationStats:
    """One iteration, measured on the device's timeline (``pipeline_*`` and ``held_reasons``,
    ``host_overruns`` and ``time_s``: the same on every rank).

    Attributes:
        iteration: Index since :meth:`~perseus.runtime.session.RankSession.start`.
        phase: ``"profile"`` during the online sweep, else ``"run"``.
        point_index: The deployed frontier point (None while profiling).
        time_s: The pipeline's iteration: the longest of its ranks' windows.
        energy_j: This rank's GPU energy over the iteration.
        compute_time_s: From the start to the end of this rank's last action.
        pipeline_compute_time_s: The longest of its ranks' ``compute_time_s``: ``time_s``
            less the time after the pipeline's last op (the optimizer step, the data-parallel
            all-reduce, waiting for a slower pipeline), which the plan does not predict (None:
            not agreed).
        pipeline_energy_j: All the pipeline's ranks' energy over the iteration.
        predicted_time_s: The deployed point's iteration time (None while profiling).
        predicted_energy_j: The deployed point's energy of the whole pipeline.
        clock_share_at_plan: The share of this rank's op time at the planned clock (None: no
            clock read back).
        held_ops: This rank's ops that ran below their planned clock, with why.
        pipeline_held_ops: Held ops on all the pipeline's ranks.
        held_reasons: Why, over all ranks (NVML's names, ``"sw_power_cap"``).
        host_overruns: Emulation: actions of all ranks whose CPU compute outlasted the
            simulated op.
    """

    iteration: int
    phase: str
    point_index: int | None
    time_s: float
    energy_j: float
    compute_time_s: float
    pipeline_energy_j: float | None = None
    predicted_time_s: float | None = None
    predicted_energy_j: float | None = None
    clock_share_at_plan: float | None = None
    held_ops: tuple[HeldOp, ...] = ()
    pipeline_held_ops: int = 0
    held_reasons: tuple[str, ...] = ()
    host_overruns: int = 0
    pipeline_compute_time_s: float | None = None


@dataclass(frozen=True, slots=True)
class RunSummary:
    """The deployed plan's predicted and measured figures (means over its iterations in the
    session's kept history, ``SessionOptions(history_kept=)``).

    Attributes:
        iterations: Iterations averaged (without the plan's first when there are more: it
            pays the clock changes).
        predicted_saving: ``1 - predicted energy / all-max energy`` (both predicted).
        measured_saving: ``1 - measured energy / predicted all-max energy``.
        caveat: Why these figures do not measure the plan (None: they do).
    """

    iterations: int
    point_index: int
    predicted_time_s: float
    measured_time_s: float
    predicted_energy_j: float
    measured_energy_j: float
    predicted_saving: float
    measured_saving: float
    caveat: str | None = None

    def __str__(self) -> str:
        dt = self.measured_time_s / self.predicted_time_s - 1
        de = self.measured_energy_j / self.predicted_energy_j - 1
        caveat = "" if self.caveat is None else f"; {self.caveat}"
        return (
            f"perseus: plan point {self.point_index}, {self.iterations} iterations: time "
            f"{self.measured_time_s:.4g} s (predicted {self.predicted_time_s:.4g} s, {dt:+.1%}), "
            f"pipeline energy {self.measured_energy_j:.5g} J (predicted "
            f"{self.predicted_energy_j:.5g} J, {de:+.1%}), saving vs all-max "
            f"{self.measured_saving:.2%} (predicted {self.predicted_saving:.2%}){caveat}"
        )


def drift_cause(runs: Sequence[IterationStats]) -> str | None:
    """Why ``runs`` do not measure their plan, or None when they do: clocks held below it;
    else time or energy off beyond :data:`DRIFT_TOLERANCE` on average, put down to host
    overruns in emulation where there were any (overruns alone are no cause), else to another
    GPU or a stale profile. Every rank finds the same."""
    held = [s for s in runs if s.pipeline_held_ops]
    if held:
        reasons = sorted({r for s in held for r in s.held_reasons})
        cause = (
            f"clocks held below the plan ({describe_reasons(reasons)}) in {len(held)} of "
            f"{len(runs)} iterations"
        )
    elif (off := _off_prediction_cause(runs)) is None:
        return None
    elif overruns := sum(s.host_overruns for s in runs):
        cause = (
            f"{overruns} host overruns in emulation (the CPU computes ops slower than the "
            "simulated GPU runs them)"
        )
    elif (after := waited_share(runs)) is not None:
        cause = (
            f"{after:.1%} of the time came after the pipeline's last op (a slower data-parallel "
            "pipeline, or the optimizer step); the ops themselves ran as planned"
        )
    else:
        cause = off
    return "these figures do not measure the plan: " + cause


def waited_share(runs: Sequence[IterationStats]) -> float | None:
    """The mean share of ``runs``' time after the pipeline's last op when its ops' own time
    is on the prediction (within :data:`DRIFT_TOLERANCE`), that share is beyond it and so is
    the time, else None: a pipeline that waits for a straggler is off its plan's time, not
    its plan."""
    own = [
        (
            s.pipeline_compute_time_s / s.predicted_time_s - 1.0,
            1.0 - s.pipeline_compute_time_s / s.time_s,
            s.time_s / s.predicted_time_s - 1.0,
        )
        for s in runs
        if s.predicted_time_s and s.pipeline_compute_time_s is not None and s.time_s > 0
    ]
    if not own or len(own) < len(runs):
        return None
    off = statistics.fmean(o[0] for o in own)
    after = statistics.fmean(o[1] for o in own)
    late = statistics.fmean(o[2] for o in own)  # an energy-only drift is no wait's doing
    waited = abs(off) <= DRIFT_TOLERANCE and min(after, late) > DRIFT_TOLERANCE
    return after if waited else None


def _off_prediction_cause(runs: Sequence[IterationStats]) -> str | None:
    errors = [
        (s.time_s / s.predicted_time_s - 1.0, s.pipeline_energy_j / s.predicted_energy_j - 1.0)
        for s in runs
        if s.predicted_time_s and s.predicted_energy_j and s.pipeline_energy_j is not None
    ]
    if not errors:
        return None
    dt = statistics.fmean(e[0] for e in errors)
    de = statistics.fmean(e[1] for e in errors)
    if abs(dt) <= DRIFT_TOLERANCE and abs(de) <= DRIFT_TOLERANCE:
        return None
    energy = f" and energy {de:+.1%}" if de else ""  # none: not measured, taken as predicted
    return (
        f"time {dt:+.1%}{energy} off the prediction with no clock held "
        "below the plan (another GPU than the profile's, or a stale profile)"
    )


def summarize(
    history: Sequence[IterationStats], frontier: Frontier, energy_window_s: float = 0.0
) -> RunSummary | None:
    """The summary of the last stretch of ``history`` that ran one point of ``frontier``
    (None: none ran). A stretch shorter than ``energy_window_s`` (the time the GPU's energy
    counter needs to measure within the tolerance) is judged on its time alone, and its
    caveat says its energy is not measured (a short run on a 100 ms counter reads 0 J)."""
    runs = _last_stretch(history)
    if not runs:
        return None
    last = runs[-1]
    if last.predicted_time_s is None or last.predicted_energy_j is None:
        return None
    energy = statistics.fmean(float(s.pipeline_energy_j or 0.0) for s in runs)
    baseline_j = frontier.baseline.energy_j
    span_s = math.fsum(s.time_s for s in runs)
    if span_s < energy_window_s:  # energy taken as predicted, as DriftMonitor takes it
        runs = [dataclasses.replace(s, pipeline_energy_j=s.predicted_energy_j) for s in runs]
    caveat = drift_cause(runs)
    if span_s < energy_window_s:
        short = (
            f"the energy is not measured ({len(runs)} iterations span {span_s:.3g} s, under the "
            f"{energy_window_s:.3g} s the GPU's energy counter needs); run longer"
        )
        prefix = "these figures do not measure the plan: "
        caveat = prefix + short if caveat is None else f"{caveat}; {short}"
    return RunSummary(
        iterations=len(runs),
        point_index=int(last.point_index or 0),
        predicted_time_s=last.predicted_time_s,
        measured_time_s=statistics.fmean(s.time_s for s in runs),
        predicted_energy_j=last.predicted_energy_j,
        measured_energy_j=energy,
        predicted_saving=1.0 - last.predicted_energy_j / baseline_j,
        measured_saving=1.0 - energy / baseline_j,
        caveat=caveat,
    )


def _last_stretch(history: Sequence[IterationStats]) -> list[IterationStats]:
    """The last run iterations of one point and prediction, less the first when there are
    more (see :attr:`RunSummary.iterations`)."""
    runs: list[IterationStats] = []
    for stats in reversed(history):
        if stats.phase != "run" or stats.pipeline_energy_j is None:
            break
        if runs and (
            stats.point_index != runs[-1].point_index
            or stats.predicted_time_s != runs[-1].predicted_time_s
        ):
            break
        runs.append(stats)
    runs.reverse()
    return runs[1:] if len(runs) > 1 else runs
