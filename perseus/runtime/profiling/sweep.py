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
with one all-reduce per iteration (:func:`perseus.runtime.planning.sweep_finished_everywhere`).

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perseus.errors import ConfigError
from perseus.profile.model import Profile, build_profile
from perseus.schedule.actions import Kind

__all__ = [
    "OnlineProfiler",
    "OpSweep",
    "ProfileRow",
    "profile_cache_key",
    "profile_cache_path",
    "profile_from_rows",
]

ProfileRow = tuple[int, Kind, int, float, float]


@dataclass
class OpSweep:
    """The sweep state of one (stage, kind).

    Attributes:
        clocks_mhz: Clocks to sweep, highest first.
        index: Position of the clock being measured.
        rows: ``(freq_mhz, time_s, energy_j)`` measured so far, in sweep order.
        rising: Consecutive clocks whose energy exceeded the lowest measured before them.
        stopped: No more clocks to measure.
    """

    clocks_mhz: tuple[int, ...]
    index: int = 0
    rows: list[tuple[int, float, float]] = field(default_factory=list)
    rising: int = 0
    stopped: bool = False
    _times: list[float] = field(default_factory=list)
    _energies: list[float] = field(default_factory=list)

    @property
    def clock_mhz(self) -> int:
        """The clock to run at now (the highest clock once stopped: keep iterations fast)."""
        return self.clocks_mhz[0] if self.stopped else self.clocks_mhz[self.index]


class OnlineProfiler:
    """Clock sweep for the (stage, kind) pairs of one rank.

    Args:
        ops: The rank's (stage_index, kind) pairs.
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
        self.patience = patience
        self.min_fraction = min_fraction
        self.sweeps = {
            op: OpSweep(clocks) for op in sorted(set(ops), key=lambda o: (o[0], o[1].value))
        }
        self.iterations = 0  # sweep steps closed (each may span several iterations)

    @property
    def done(self) -> bool:
        """True when every local op has stopped."""
        return all(s.stopped for s in self.sweeps.values())

    def clock_for(self, stage_index: int, kind: Kind) -> int:
        """The clock the next op of (stage, kind) should run at."""
        return self.sweeps[(stage_index, kind)].clock_mhz

    def record(
        self, stage_index: int, kind: Kind, time_s: float, energy_j: float | None = None
    ) -> None:
        """Add one op's measured device time (and energy, when measured per op) at the
        current clock. Energy usually comes per step instead, as a fitted power passed to
        :meth:`end_iteration` (:mod:`perseus.runtime.profiling.energy_attribution`)."""
        sweep = self.sweeps[(stage_index, kind)]
        if sweep.stopped or not time_s > 0:
            return
        sweep._times.append(time_s)
        # A non-positive energy is a counter that did not move over the op (its update
        # period is longer than the op): no information, not a zero.
        if energy_j is not None and energy_j > 0:
            sweep._energies.append(energy_j)

    def discard_iteration(self) -> None:
        """Drop the current sweep step's samples (an iteration failed: the step restarts at the
        same clocks)."""
        for sweep in self.sweeps.values():
            sweep._times.clear()
            sweep._energies.clear()

    def end_iteration(self, power_w: Mapping[Hashable, float] | None = None) -> None:
        """Close the current clock of every op and advance the sweep.

        Args:
            power_w: Fitted mean power per (stage, kind) over this step's ops: the row's
                energy is that power times the median op time. Ops without one use the
                median of their per-op energies; ops with neither skip the clock.
        """
        self.iterations += 1
        for op, sweep in self.sweeps.items():
            if sweep.stopped:
                continue
            power = None if power_w is None else power_w.get(op)
            if power is not None and not power > 0:
                power = None  # a group the fit could not see: no information
            if not sweep._times or (power is None and not sweep._energies):
                # nothing usable measured at this clock: move on
                sweep._times.clear()
                sweep._energies.clear()
                sweep.index += 1
                sweep.stopped = sweep.index >= len(sweep.clocks_mhz)
                continue
            # Medians: a sample delayed by the host (scheduling jitter) must not move the row.
            time_s = statistics.median(sweep._times)
            energy_j = power * time_s if power is not None else statistics.median(sweep._energies)
            sweep._times.clear()
            sweep._energies.clear()
            best = min((r[2] for r in sweep.rows), default=math.inf)
            if energy_j > best:
                sweep.rising += 1
            else:
                sweep.rising = 0
            sweep.rows.append((sweep.clock_mhz, time_s, energy_j))
            sweep.index += 1
            n = len(sweep.clocks_mhz)
            past_floor = sweep.index >= self.min_fraction * n
            if sweep.index >= n or (past_floor and sweep.rising >= self.patience):
                sweep.stopped = True

    def rows(self) -> list[ProfileRow]:
        """Measured rows ``(stage, kind, freq_mhz, time_s, energy_j)``."""
        return [
            (stage, kind, freq, t, e)
            for (stage, kind), sweep in self.sweeps.items()
            for freq, t, e in sweep.rows
        ]

    def clocks_profiled(self) -> dict[tuple[int, Kind], int]:
        """How many clocks each op measured (vs ``len(clocks_mhz)`` without early stop)."""
        return {op: len(s.rows) for op, s in self.sweeps.items()}


def profile_from_rows(rows: Iterable[ProfileRow], source: str) -> Profile:
    """A profile from measured rows of all ranks (see :func:`perseus.profile.build_profile`)."""
    return build_profile(list(rows), source=source)


def profile_cache_key(**config: Any) -> str:
    """A short, stable key of a configuration (model name, schedule, sizes, GPU, world)."""
    text = json.dumps(config, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def profile_cache_path(cache_dir: str | Path, **config: Any) -> Path:
    """Where the profile of ``config`` is saved: ``<cache_dir>/profile-<key>.csv``."""
    return Path(cache_dir) / f"profile-{profile_cache_key(**config)}.csv"
