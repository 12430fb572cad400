"""One rank's part of a plan point, as the rank agent runs it: op names, the (kind,
microbatch, stage) each op must be, each op's clock(s), and a two-clock op's share of work at
its first clock. Built once per plan (and per :meth:`~perseus.runtime.agent.rank_agent.RankAgent.swap_plan`);
pure: no device, no clock.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from perseus.errors import ConfigError, PlanError
from perseus.plan import Frontier
from perseus.profile.two_clock import build_layer_split, op_clocks
from perseus.schedule.actions import Kind

__all__ = ["RankPlan", "parse_ops"]

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
        freqs_a_mhz: Each op's (first) clock, as planned (not yet snapped to a device).
        freqs_b_mhz: The clock each op ends at (a two-clock op's second; else its only one).
        mid_shares: Two-clock ops: the share of the op's work before the layer boundary
            where the second clock applies (None: a one-clock op).
    """

    plan: Frontier
    point_index: int
    rank: int
    names: tuple[str, ...]
    expected: tuple[tuple[str, int, int], ...]
    freqs_a_mhz: tuple[int, ...]
    freqs_b_mhz: tuple[int, ...]
    mid_shares: tuple[float | None, ...]

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
        clocks = tuple(op_clocks(op) for op in plan.points[point_index].freqs_mhz[rank])
        shares: list[float | None] = [None] * len(clocks)
        if any(c.is_two_clock for c in clocks):
            job = plan.job
            if job.layers_per_stage is None:
                raise PlanError(
                    f"plan rank {rank} has two-clock ops but job.layers_per_stage is not "
                    "set; regenerate the plan with `layers_per_stage`"
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
            for j, c in enumerate(clocks):
                if c.is_two_clock:
                    shares[j] = split.work_before(expected[j][2], c.layers_at_a)
        return cls(
            plan=plan,
            point_index=point_index,
            rank=rank,
            names=names,
            expected=expected,
            freqs_a_mhz=tuple(c.freq_a_mhz for c in clocks),
            freqs_b_mhz=tuple(c.freq_b_mhz for c in clocks),
            mid_shares=tuple(shares),
        )

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
        if j >= n:
            return PlanError(
                f"rank {self.rank}: op {actual!r} is op {j + 1} of iteration {iteration}, "
                f"but the plan has only {n} ops for this rank; call step_end() after the last"
            )
        window = " ".join(self.names[max(0, j - 2) : j + 3])
        return PlanError(
            f"rank {self.rank}: plan expects op {j} of iteration {iteration} to be "
            f"{self.names[j]!r} but the training loop ran {actual!r} (plan ops around it: "
            f"{window}); the plan was computed for another schedule or microbatch count"
        )
