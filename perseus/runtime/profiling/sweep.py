"""Online (just-in-time) profiling: measure every (stage, kind) at each clock during training
(``docs/timing.md``; :mod:`perseus.runtime.session_sweep` wires it into a session).

An op stops once, past the first ``min_fraction`` of its clocks, its energy stayed above the
lowest so far for ``patience`` clocks in a row (below the energy-optimal clock nothing can be
on the frontier). :func:`profile_cache_path` names the file that spares the next run its sweep.
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

#: The largest relative energy uncertainty (two standard errors) of a deployed online profile's
#: rows (:func:`check_fit`).
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
    """What :class:`ClockSweep` and the clock-pair
    :class:`~perseus.runtime.profiling.pair_sweep.PairSweep` share: each op's samples at the
    current step and the rows closed so far."""

    def __init__(self, ops: Iterable[tuple[int, Kind]]) -> None:
        self.ops = tuple(sorted(set(ops), key=lambda o: (o[0], o[1].value)))
        self._times: dict[tuple[int, Kind], list[float]] = {op: [] for op in self.ops}
        self._energies: dict[tuple[int, Kind], list[float]] = {op: [] for op in self.ops}
        self._rows: dict[tuple[int, Kind], list[_Row]] = {op: [] for op in self.ops}
        self.iterations = 0  # sweep steps closed (each may span several iterations)

    def _measuring(self, op: tuple[int, Kind]) -> bool:
        raise NotImplementedError

    def record(
        self, stage_index: int, kind: Kind, time_s: float, energy_j: float | None = None
    ) -> None:
        """Add one op's device time (and energy, when measured per op) at the current step;
        an op not swept, or no longer, is ignored."""
        op = (stage_index, kind)
        if op not in self._times or not self._measuring(op) or not time_s > 0:
            return
        self._times[op].append(time_s)
        # A non-positive energy is a counter that did not move over the op: no information.
        if energy_j is not None and energy_j > 0:
            self._energies[op].append(energy_j)

    def discard_iteration(self) -> None:
        """Drop the current step's samples (a failed iteration: the step restarts)."""
        for samples in (*self._times.values(), *self._energies.values()):
            samples.clear()

    def _flat(self) -> list[tuple[int, Kind, int, int, float, float, float]]:
        """Every row: ``(stage, kind, freq_mhz, mem_freq_mhz, time_s, energy_j, error)``."""
        return [
            (*op, f, m, t, e, err) for op, rows in self._rows.items() for (f, m), t, e, err in rows
        ]

    def fit_errors(self) -> list[tuple[int, Kind, int, float]]:
        """Per measured row: ``(stage, kind, freq_mhz, relative uncertainty of its energy)``."""
        return [(s, k, f, err) for s, k, f, _m, _t, _e, err in self._flat()]

    def worst_fit_error(self) -> float:
        """The largest row uncertainty so far (0 without rows)."""
        return max((e[3] for e in self.fit_errors()), default=0.0)

    def clocks_profiled(self) -> dict[tuple[int, Kind], int]:
        """How many clocks (or pairs) each op measured."""
        return {op: len(rows) for op, rows in self._rows.items()}


class ClockSweep(StepSweep):
    """Clock sweep for the (stage, kind) pairs of one rank.

    Args:
        ops: The rank's (stage_index, kind) pairs to sweep (may be empty).
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
        """The clock the next op of (stage, kind) should run at: the step's, one for the whole
        rank (docs/timing.md), so no change happens inside an iteration."""
        return self.step_clock_mhz()

    #: The plan op that runs the current step for (stage, kind): its clock.
    plan_op_for = clock_for

    def step_clock_mhz(self) -> int:
        """The clock the unstopped ops measure (they advance together), else the highest."""
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
            power_w: Fitted mean power per (stage, kind) (see :func:`step_row`); ops with no
                usable sample skip the clock.
            fit: The fit ``power_w`` came from, for each row's uncertainty.
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
        return [(s, k, f, t, e) for s, k, f, _m, t, e, _err in self._flat()]


def step_row(
    op: Hashable,
    times_s: list[float],
    energies_j: list[float],
    power_w: Mapping[Hashable, float] | None,
    fit: PowerFit | None,
) -> tuple[float, float, float] | None:
    """One op's ``(time_s, energy_j, relative energy uncertainty)`` at a step (None when
    nothing usable was measured), its samples cleared: the median time, times the fitted
    power, else the median per-op energy."""
    power = None if power_w is None else power_w.get(op)
    row = None
    if times_s and power is not None and power > 0:  # else a group the fit could not see
        time_s = statistics.median(times_s)
        row = (time_s, power * time_s, fit.relative_error(op) if fit else math.inf)
    elif times_s and energies_j:
        row = (statistics.median(times_s), statistics.median(energies_j), 0.0)
    times_s.clear()
    energies_j.clear()
    return row


def check_fit(profilers: Any, max_error: float = MAX_FIT_ERROR) -> None:
    """Refuse an online profile with a row whose energy fit is poor.

    Args:
        profilers: One sweep or a sequence of them (anything with ``fit_errors()``).
        max_error: The largest relative uncertainty (two standard errors) allowed.

    Raises:
        ProfileError: naming the worst row, its uncertainty and what to do.
    """
    sweeps = profilers if isinstance(profilers, Sequence) else [profilers]
    rows: list[tuple[int, Kind, int, float]] = [row for p in sweeps for row in p.fit_errors()]
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
