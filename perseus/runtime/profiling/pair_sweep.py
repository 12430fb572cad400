"""Online profiling of (SM, memory) clock pairs, on a GPU whose memory clock can be locked.

:class:`PairSweep` measures a coarse grid first (every ``stride``-th SM clock at every memory
clock), then in rounds the unmeasured SM clocks near each op's lower hull
(:mod:`perseus.profile.pair_grid`), one pair per step for the whole rank, until a round adds
nothing or ``max_pairs`` were measured.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence

from perseus.errors import ConfigError
from perseus.plan import PlanOp
from perseus.profile.model import OpOption
from perseus.profile.pair_grid import coarse_pair_grid, next_pairs
from perseus.runtime.profiling.energy_attribution import PowerFit
from perseus.runtime.profiling.sweep import StepSweep, step_row
from perseus.schedule.actions import Kind

__all__ = ["PairProfileRow", "PairSweep"]

#: ``(stage, kind, freq_mhz, time_s, energy_j, mem_freq_mhz)``.
PairProfileRow = tuple[int, Kind, int, float, float, int]

_Pair = tuple[int, int]


class PairSweep(StepSweep):
    """Clock-pair sweep for the (stage, kind) pairs of one rank.

    Args:
        clocks_mhz: The GPU's SM clocks.
        memory_clocks_mhz: Its lockable memory clocks (at least two).
        blocking_power_w: Power while waiting (the hull is taken in (time, energy above it)).
        stride: Every how many SM clocks the coarse grid measures.
        radius: How many SM clocks on either side of a hull vertex a round measures.
        max_pairs: The most pairs measured (default: twice the SM clock count, at most the
            whole grid).

    Raises:
        ConfigError: for empty clock lists, fewer than two memory clocks or bad parameters.
    """

    def __init__(
        self,
        ops: Iterable[tuple[int, Kind]],
        clocks_mhz: Sequence[int],
        memory_clocks_mhz: Sequence[int],
        *,
        blocking_power_w: float,
        stride: int = 4,
        radius: int = 2,
        max_pairs: int | None = None,
    ) -> None:
        sm = tuple(sorted({int(c) for c in clocks_mhz}, reverse=True))
        mem = tuple(sorted({int(m) for m in memory_clocks_mhz}, reverse=True))
        if not sm or len(mem) < 2:
            raise ConfigError(
                f"a clock-pair sweep needs SM clocks and at least two memory clocks, got "
                f"{len(sm)} SM and {list(mem)} memory clocks; sweep SM clocks only"
            )
        if stride < 1 or radius < 1 or (max_pairs is not None and max_pairs < 1):
            raise ConfigError(
                f"stride and radius must be >= 1 and max_pairs >= 1, got {stride}, {radius}, "
                f"{max_pairs}"
            )
        super().__init__(ops)
        self.clocks_mhz = sm
        self.memory_clocks_mhz = mem
        self.blocking_power_w = blocking_power_w
        self.radius = radius
        grid = len(sm) * len(mem)
        self.max_pairs = min(grid, 2 * len(sm) if max_pairs is None else max_pairs)
        grid_pairs = coarse_pair_grid(sm, mem, stride) if self.ops else ()  # nothing to sweep
        self._queue: list[_Pair] = list(grid_pairs)[: self.max_pairs]
        self._index = 0
        self.measured: list[_Pair] = []  # pairs closed, in order
        self.rounds = 0  # refinement rounds started

    @property
    def done(self) -> bool:
        """True when no pair is left to measure."""
        return self._index >= len(self._queue)

    def plan_op_for(self, stage_index: int, kind: Kind) -> PlanOp:
        """The plan op that runs the current step's pair (the highest once done): one phase
        with its memory clock."""
        top = (self.clocks_mhz[0], self.memory_clocks_mhz[0])
        f, m = top if self.done else self._queue[self._index]
        return ((f, m, 0),)

    def _measuring(self, op: tuple[int, Kind]) -> bool:
        return not self.done

    def end_iteration(
        self, power_w: Mapping[Hashable, float] | None = None, fit: PowerFit | None = None
    ) -> None:
        """Close the current pair for every op and move to the next (a refinement round when
        the queue is empty); arguments as in
        :meth:`~perseus.runtime.profiling.sweep.ClockSweep.end_iteration`."""
        if self.done:
            return
        self.iterations += 1
        pair = self._queue[self._index]
        for op in self.ops:
            row = step_row(op, self._times[op], self._energies[op], power_w, fit)
            if row is not None:
                self._rows[op].append((pair, *row))
        self.measured.append(pair)
        self._index += 1
        if self.done:
            self._refine()

    def _refine(self) -> None:
        """Queue the next round: the union over ops of the pairs near their hulls."""
        room = self.max_pairs - len(self.measured)
        if room <= 0:
            return
        seen = set(self.measured)
        wanted: list[_Pair] = []
        for op in self.ops:
            options = [OpOption(f, t, e, m) for (f, m), t, e, _ in self._rows[op]]
            if not options:
                continue
            for pair in next_pairs(options, self.clocks_mhz, self.blocking_power_w, self.radius):
                if pair not in seen:
                    seen.add(pair)
                    wanted.append(pair)
        if wanted:
            self.rounds += 1
            wanted.sort(key=lambda p: (-p[1], -p[0]))
            self._queue.extend(wanted[:room])

    def rows(self) -> list[PairProfileRow]:
        """Measured rows ``(stage, kind, freq_mhz, time_s, energy_j, mem_freq_mhz)``."""
        return [(s, k, f, t, e, m) for s, k, f, m, t, e, _err in self._flat()]
