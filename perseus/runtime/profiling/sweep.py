"""Online (just-in-time) profiling: measure every (stage, kind) at each clock during training.

The first iterations of a job double as the profiling run. In sweep step ``i`` every op of
a (stage, kind) runs at that op's ``i``-th clock (clocks from high to low); the median device
time of its ops and their fitted mean power (from the energy counter's publish windows over
the step, :mod:`perseus.runtime.profiling.energy_attribution`; a step lasts as many iterations as the
windows need) become the profile row for that clock: energy = power x median time. An op stops
early once, past the first ``min_fraction`` of the clock list, its energy has stayed above the
lowest energy measured so far for ``patience`` consecutive clocks: below the energy-optimal
clock both time and energy grow, so those clocks can never be on the frontier. Comparing with
the best so far rather than with the previous clock makes the rule robust to measurement noise
(measured energies wiggle by a few tenths of a percent between neighbouring clocks, which
resets a "strictly increasing" streak: on the bundled A100 data that rule never fires). The sweep ends when every op on every rank has stopped, which the ranks agree on
with one all-reduce per iteration
(:meth:`perseus.runtime.session_sweep.SessionSweep.finished_everywhere`).

The result is a profile in the standard CSV format (``stage,instruction,frequency,time,energy``)
saved under a key of the model, schedule and world configuration (:func:`profile_cache_path`),
so that the next run with the same configuration skips profiling.

This module holds the sweep logic; `perseus.runtime.session` wires it into the hooks.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perseus.errors import ConfigError, ProfileError
from perseus.runtime.profiling.energy_attribution import PowerFit
from perseus.schedule.actions import Kind

__all__ = [
    "MAX_FIT_ERROR",
    "ClockSweep",
    "OpSweep",
    "ProfileRow",
    "StepSweep",
    "check_fit",
    "profile_cache_path",
    "step_row",
]

ProfileRow = tuple[int, Kind, int, float, float]

#: The largest energy uncertainty (two standard errors of the fitted power, relative) a row of
#: a deployed online profile may have (:func:`check_fit`).
MAX_FIT_ERROR = 0.04


@dataclass
class OpSweep:
    """Where one (stage, kind) is in the SM-clock sweep.

    Attributes:
        clocks_mhz: Clocks to sweep, highest first.
        index: Position of the clock being measured.
        rising: Consecutive clocks whose energy exceeded the lowest measured before them.
        stopped: No more clocks to measure.
    """

    clocks_mhz: tuple[int, ...]
    index: int = 0
    rising: int = 0
    stopped: bool = False

    @property
    def clock_mhz(self) -> int:
        """The clock to run at now (the highest clock once stopped: keep iterations fast)."""
        return self.clocks_mhz[0] if self.stopped else self.clocks_mhz[self.index]


#: One measured row of a sweep: ``((freq_mhz, mem_freq_mhz; 0 when not set), time_s,
#: energy_j, relative uncertainty of the energy)``.
_Row = tuple[tuple[int, int], float, float, float]


class StepSweep:
    """What both sweeps share (this one and the clock-pair
    :class:`~perseus.runtime.profiling.pair_sweep.PairSweep`): each op's samples at the
    current sweep step, the rows closed so far and the figures read from them.

    Args:
        ops: The rank's (stage_index, kind) pairs to sweep.
    """

    def __init__(self, ops: Iterable[tuple[int, Kind]]) -> None:
        self.ops = tuple(sorted(set(ops), key=lambda o: (o[0], o[1].value)))
        self._times: dict[tuple[int, Kind], list[float]] = {op: [] for op in self.ops}
        self._energies: dict[tuple[int, Kind], list[float]] = {op: [] for op in self.ops}
        self._rows: dict[tuple[int, Kind], list[_Row]] = {op: [] for op in self.ops}
        self.iterations = 0  # sweep steps closed (each may span several iterations)

    def _measuring(self, op: tuple[int, Kind]) -> bool:
        """Whether ``op`` takes samples now."""
        raise NotImplementedError

    def record(
        self, stage_index: int, kind: Kind, time_s: float, energy_j: float | None = None
    ) -> None:
        """Add one op's measured device time (and energy, when measured per op) at the
        current step (an op not swept, or no longer, is ignored). Energy usually comes per
        step instead, as a fitted power passed to ``end_iteration``
        (:mod:`perseus.runtime.profiling.energy_attribution`)."""
        op = (stage_index, kind)
        if op not in self._times or not self._measuring(op) or not time_s > 0:
            return
        self._times[op].append(time_s)
        # A non-positive energy is a counter that did not move over the op (its update
        # period is longer than the op): no information, not a zero.
        if energy_j is not None and energy_j > 0:
            self._energies[op].append(energy_j)

    def discard_iteration(self) -> None:
        """Drop the current sweep step's samples (an iteration failed: the step restarts at the
        same clocks)."""
        for samples in (*self._times.values(), *self._energies.values()):
            samples.clear()

    def fit_errors(self) -> list[tuple[int, Kind, int, float]]:
        """Per measured row: ``(stage, kind, freq_mhz, relative uncertainty of its energy)``."""
        return [
            (stage, kind, clocks[0], err)
            for (stage, kind), rows in self._rows.items()
            for clocks, _t, _e, err in rows
        ]

    def worst_fit_error(self) -> float:
        """The largest row uncertainty so far (0 without rows)."""
        return max((e[3] for e in self.fit_errors()), default=0.0)

    def clocks_profiled(self) -> dict[tuple[int, Kind], int]:
        """How many clocks (or pairs) each op measured."""
        return {op: len(rows) for op, rows in self._rows.items()}


class ClockSweep(StepSweep):
    """Clock sweep for the (stage, kind) pairs of one rank.

    Args:
        ops: The rank's (stage_index, kind) pairs to sweep (may be empty: nothing to measure;
            the rank's other ops run at the step's clock).
        clocks_mhz: The GPU's clocks to sweep (any order; swept highest first).
        patience: Stop after this many consecutive clocks above the lowest energy so far ...
        min_fraction: ... once at least this fraction of the clock list has been measured.

    Raises:
        ConfigError: for an empty clock list or bad parameters.
    """

    def __init__(
        self,
        ops: Iterable[tuple[int, Kind]],
        clocks_mhz: Sequence[int],
        *,
        patience: int = 5,
        min_fraction: float = 1 / 3,
    ) -> None:
        clocks = tuple(sorted(set(int(c) for c in clocks_mhz), reverse=True))
        if not clocks:
            raise ConfigError("online profiling needs the GPU's clock list; it is empty")
        if patience < 1 or not 0 <= min_fraction <= 1:
            raise ConfigError(
                f"patience must be >= 1 and min_fraction in [0, 1], got {patience}, {min_fraction}"
            )
        super().__init__(ops)
        self.patience = patience
        self.min_fraction = min_fraction
        self.clocks_mhz = clocks
        self.sweeps = {op: OpSweep(clocks) for op in self.ops}

    @property
    def done(self) -> bool:
        """True when every local op has stopped."""
        return all(s.stopped for s in self.sweeps.values())

    def clock_for(self, stage_index: int, kind: Kind) -> int:
        """The clock the next op of (stage, kind) should run at.

        One clock per sweep step for the whole rank: an op whose sweep stopped runs at the
        clock the others measure (the highest once all stopped). A rank running two clocks in
        one iteration changes its clock between ops, and a change that lands early or late
        (a set call's random latency; in emulation, a host that fell behind the simulated
        device) runs part of an op at the other op's clock. The fit then mixes clocks: the
        rows of a four-rank run whose backward sweep had stopped (backward at the top clock,
        forward still sweeping) came out 5-65 % low in energy (benchmarks/online_profile.py
        ``--ranks 4``). With one clock per step no change happens inside an iteration.
        """
        sweep = self.sweeps.get((stage_index, kind))  # None: an op not swept (kept rows)
        if sweep is not None and not sweep.stopped:
            return sweep.clock_mhz
        return self.step_clock_mhz()

    def plan_op_for(self, stage_index: int, kind: Kind) -> int:
        """The plan op that runs the current step for (stage, kind): its clock."""
        return self.clock_for(stage_index, kind)

    def step_clock_mhz(self) -> int:
        """The clock of the current sweep step: the clock the unstopped ops measure (they
        advance together), else the highest."""
        for sweep in self.sweeps.values():
            if not sweep.stopped:
                return sweep.clock_mhz
        return self.clocks_mhz[0]

    def _measuring(self, op: tuple[int, Kind]) -> bool:
        return not self.sweeps[op].stopped

    def end_iteration(
        self, power_w: Mapping[Hashable, float] | None = None, fit: PowerFit | None = None
    ) -> None:
        """Close the current clock of every op and advance the sweep.

        Args:
            power_w: Fitted mean power per (stage, kind) over this step's ops: the row's
                energy is that power times the median op time. Ops without one use the
                median of their per-op energies; ops with neither skip the clock.
            fit: The fit ``power_w`` came from: each row keeps its uncertainty
                (:func:`check_fit`).
        """
        self.iterations += 1
        for op, sweep in self.sweeps.items():
            if sweep.stopped:
                continue
            row = step_row(op, self._times[op], self._energies[op], power_w, fit)
            if row is not None:
                self._close_clock(op, *row)
            else:  # nothing usable measured at this clock: move on
                sweep.index += 1
                sweep.stopped = sweep.index >= len(sweep.clocks_mhz)

    def _close_clock(
        self, op: tuple[int, Kind], time_s: float, energy_j: float, error: float
    ) -> None:
        """One op's row at its current clock; stop its sweep at the last clock, or once its
        energy has risen ``patience`` clocks in a row past the floor."""
        sweep, rows = self.sweeps[op], self._rows[op]
        best = min((r[2] for r in rows), default=math.inf)
        sweep.rising = sweep.rising + 1 if energy_j > best else 0
        rows.append(((sweep.clock_mhz, 0), time_s, energy_j, error))
        sweep.index += 1
        n = len(sweep.clocks_mhz)
        past_floor = sweep.index >= self.min_fraction * n
        if sweep.index >= n or (past_floor and sweep.rising >= self.patience):
            sweep.stopped = True

    def rows(self) -> list[ProfileRow]:
        """Measured rows ``(stage, kind, freq_mhz, time_s, energy_j)``."""
        return [
            (stage, kind, clocks[0], t, e)
            for (stage, kind), rows in self._rows.items()
            for clocks, t, e, _ in rows
        ]


def step_row(
    op: Hashable,
    times_s: list[float],
    energies_j: list[float],
    power_w: Mapping[Hashable, float] | None,
    fit: PowerFit | None,
) -> tuple[float, float, float] | None:
    """One op's figures at a sweep step, its samples cleared: ``(time_s, energy_j, relative
    uncertainty of the energy)``, None when nothing usable was measured.

    The time is the median sample (a sample delayed by the host must not move the row); the
    energy the fitted power times it, else the median per-op energy (uncertainty 0).
    """
    power = None if power_w is None else power_w.get(op)
    if power is not None and not power > 0:
        power = None  # a group the fit could not see: no information
    row = None
    if times_s and (power is not None or energies_j):
        time_s = statistics.median(times_s)
        if power is None:
            row = (time_s, statistics.median(energies_j), 0.0)
        else:
            row = (time_s, power * time_s, fit.relative_error(op) if fit else math.inf)
    times_s.clear()
    energies_j.clear()
    return row


def check_fit(profilers: Any, max_error: float = MAX_FIT_ERROR) -> None:
    """Refuse an online profile with a row whose energy fit is poor.

    ``profilers``: one sweep or a sequence of them (:class:`ClockSweep` or
    :class:`~perseus.runtime.profiling.pair_sweep.PairSweep`: anything with ``fit_errors()``).

    Raises:
        ProfileError: naming the worst row, its uncertainty and what to do, when a row's
            energy is more uncertain than ``max_error`` (two standard errors, relative).
    """
    if not isinstance(profilers, Sequence):  # one sweep (SM clocks or clock pairs)
        profilers = [profilers]
    rows: list[tuple[int, Kind, int, float]] = [row for p in profilers for row in p.fit_errors()]
    if not rows:
        return
    stage, kind, freq, err = max(rows, key=lambda r: r[3])
    if err <= max_error:
        return
    bad = sum(1 for r in rows if r[3] > max_error)
    raise ProfileError(
        f"online profile refused: {bad} of {len(rows)} rows have an energy fit worse than "
        f"{max_error:.0%} (worst: stage {stage} {kind.value} at {freq} MHz, "
        f"{'unknown' if math.isinf(err) else f'{err:.1%}'}); the energy counter's windows "
        "disagree with the ops' device times (a stalled host, a clock outside perseus's "
        "control): profile again on a quieter machine with more windows per step "
        "(`OnlineProfile(min_windows=40)`; the default is 20), or pass profile= a measured profile"
    )


def profile_cache_path(cache_dir: str | Path, **config: Any) -> Path:
    """Where the profile of ``config`` (model name, schedule, sizes, GPU, world) is saved:
    ``<cache_dir>/profile-<a short, stable key of config>.csv``."""
    key = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()
    return Path(cache_dir) / f"profile-{key[:16]}.csv"
