"""One rank's part of a plan point, as the rank agent runs it: op names, the (kind,
microbatch, stage) each op must be, and each op's phases: its clock pair (SM clock, memory
clock or None for the default) from a share of its work on (one phase for a one-clock op,
up to four for a phased op, :func:`perseus.profile.op_phases`). Built once per plan (and per :meth:`~perseus.runtime.agent.rank_agent.RankAgent.swap_plan`);
pure: no device, no clock.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from perseus.device.base import nearest_clock_mhz
from perseus.errors import ConfigError, PlanError
from perseus.plan import Frontier
from perseus.profile.two_clock import build_layer_split, op_phases
from perseus.schedule.actions import Action, Kind, format_grid

__all__ = ["OpPhase", "OpTimeFn", "RankPlan", "parse_ops"]

#: Predicted device time of one whole op: ``(stage_index, kind, freq_mhz) -> time_s``; called
#: with a fourth argument, the memory clock, for a phase that sets one
#: (``(stage_index, kind, freq_mhz, mem_freq_mhz) -> time_s``).
OpTimeFn = Callable[..., float]


class OpPhase(NamedTuple):
    """One phase of an op as the agent runs it: SM clock ``freq_mhz`` and memory clock
    ``mem_freq_mhz`` (None: the GPU's default, never set) from ``start_share`` of the op's
    work on (0 for the first phase)."""

    freq_mhz: int
    mem_freq_mhz: int | None
    start_share: float


_OP_RE = re.compile(r"^([FBW])(\d+)(?:@(\d+))?$")


def parse_ops(ops: tuple[str, ...], rank: int) -> tuple[tuple[str, int, int], ...]:
    """``("F0", "B0@3", ...)`` as ``(kind, microbatch, stage)`` (stage defaults to ``rank``).

    Raises:
        PlanError: for a malformed op name.
    """
    parsed = []
    for j, name in enumerate(ops):
        m = _OP_RE.match(name)
        if m is None:
            raise PlanError(
                f"plan stage_ops[{rank}][{j}] = {name!r} is not an op name like 'F3' or 'F3@5'"
            )
        stage = int(m.group(3)) if m.group(3) is not None else rank
        parsed.append((m.group(1), int(m.group(2)), stage))
    return tuple(parsed)


@dataclass(frozen=True, slots=True)
class RankPlan:
    """Rank ``rank``'s ops at point ``point_index`` of ``plan``.

    Attributes:
        names: Op names in the order the training loop must run them.
        expected: ``(kind, microbatch, stage)`` per op.
        phases: Each op's phases, as planned (not yet snapped to a device).
    """

    plan: Frontier
    point_index: int
    rank: int
    names: tuple[str, ...]
    expected: tuple[tuple[str, int, int], ...]
    phases: tuple[tuple[OpPhase, ...], ...]

    @property
    def uses_memory_clocks(self) -> bool:
        """True when some op of this rank sets a memory clock."""
        return any(ph.mem_freq_mhz is not None for p in self.phases for ph in p)

    @classmethod
    def of(cls, plan: Frontier, point_index: int, rank: int) -> RankPlan:
        """Raises:
        PlanError: for a point or rank out of range, a malformed op name, or two-clock ops
            without ``job.layers_per_stage``.
        """
        if not 0 <= point_index < len(plan.points):
            raise PlanError(
                f"point_index {point_index} is out of range: the plan has {len(plan.points)} points"
            )
        if not 0 <= rank < len(plan.stage_ops):
            raise PlanError(
                f"rank {rank} is out of range: the plan has {len(plan.stage_ops)} ranks"
            )
        names = plan.stage_ops[rank]
        expected = parse_ops(names, rank)
        planned = tuple(op_phases(op) for op in plan.points[point_index].freqs_mhz[rank])
        phases: list[tuple[OpPhase, ...]] = [
            (OpPhase(p[0].freq_mhz, p[0].mem_freq_mhz, 0.0),) for p in planned
        ]
        if any(len(p) > 1 for p in planned):
            job = plan.job
            if job.layers_per_stage is None:
                raise PlanError(
                    f"plan rank {rank} has two-clock (phased) ops but job.layers_per_stage is "
                    "not set; regenerate the plan with `layers_per_stage`"
                )
            try:
                split = build_layer_split(
                    job.layers_per_stage,
                    job.stages,
                    job.layer_time_fractions,
                    job.switch_latency_s,
                    job.switch_energy_j,
                )
            except ConfigError as e:
                raise PlanError(f"plan job: {e}") from None
            for j, op in enumerate(planned):
                if len(op) > 1:
                    stage = expected[j][2]
                    phases[j] = tuple(
                        OpPhase(p.freq_mhz, p.mem_freq_mhz, split.work_before(stage, p.first_layer))
                        for p in op
                    )
        return cls(
            plan=plan,
            point_index=point_index,
            rank=rank,
            names=names,
            expected=expected,
            phases=tuple(phases),
        )

    def snapped(
        self, clocks: tuple[int, ...], mem_clocks: tuple[int, ...]
    ) -> tuple[tuple[OpPhase, ...], ...]:
        """The phases on a GPU's ascending clock lists: each SM clock the nearest (unchanged
        while the list is unknown, before start); each memory clock the nearest, a phase
        without one at the highest (None when ``mem_clocks`` is empty: not set)."""

        def snap(p: OpPhase) -> OpPhase:
            freq, mem = p.freq_mhz, p.mem_freq_mhz
            return OpPhase(
                nearest_clock_mhz(clocks, freq) if clocks else freq,
                nearest_clock_mhz(mem_clocks, mem or mem_clocks[-1]) if mem_clocks else None,
                p.start_share,
            )

        return tuple(tuple(snap(p) for p in op) for op in self.phases)

    def phase_start_s(
        self, j: int, i: int, phases: tuple[OpPhase, ...], op_time_s: OpTimeFn
    ) -> float:
        """Predicted device time from op ``j``'s start to its phase ``i``'s (``phases``: the
        op's phases as run): each earlier phase's share of work times the whole op's time at
        its clocks (the planned memory clock where one is set)."""
        kind, _mb, stage = self.expected[j]
        planned = self.phases[j]
        total = 0.0
        for k in range(i):
            mem = planned[k].mem_freq_mhz if phases[k].mem_freq_mhz is not None else None
            f = phases[k].freq_mhz
            t = (
                op_time_s(stage, Kind(kind), f)
                if mem is None
                else op_time_s(stage, Kind(kind), f, mem)
            )
            total += (phases[k + 1].start_share - phases[k].start_share) * t
        return total

    def order_error(
        self, j: int, op: tuple[Any, int, int | None], in_step: bool, iteration: int
    ) -> PlanError:
        """The error for op ``op`` = ``(kind, microbatch, stage)`` run as op ``j``."""
        kind, mb, stage = op
        k = kind.value if isinstance(kind, Kind) else str(kind)
        actual = f"{k}{mb}" + (f"@{stage}" if stage is not None else "")
        if not in_step:
            return PlanError(
                f"rank {self.rank}: op {actual!r} ran outside an iteration; call step_begin() first"
            )
        n = len(self.names)
        st = stage if stage is not None or not n else self.expected[min(j, n - 1)][2]
        ran = Action(st, Kind(k), mb) if k in ("F", "B", "W") and st is not None else actual
        if j >= n:
            return PlanError(
                f"rank {self.rank}: op {actual!r} is op {j + 1} of iteration {iteration}, "
                f"but the plan has only {n} ops for this rank; call step_end() after the last\n"
                + self.order_grid(j, ran)
            )
        window = " ".join(self.names[max(0, j - 2) : j + 3])
        return PlanError(
            f"rank {self.rank}: plan expects op {j} of iteration {iteration} to be "
            f"{self.names[j]!r} but the training loop ran {actual!r} (plan ops around it: "
            f"{window}); the plan was computed for another schedule or microbatch count\n"
            + self.order_grid(j, ran)
        )

    def order_grid(self, j: int, ran: Action | str) -> str:
        """This rank's planned ops as a grid, op ``j`` and what ran in its place marked."""
        planned = [Action(stage, Kind(k), mb) for k, mb, stage in self.expected]
        ran_col: list[Action | str | None] = [None] * j + [ran]
        labels = (f"Rank {self.rank} planned", "ran")
        return format_grid((planned, ran_col), [(0, j), (1, j)], labels=labels, window=3)
