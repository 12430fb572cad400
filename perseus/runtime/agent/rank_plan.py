"""One rank's part of a plan point, as the rank agent runs it: each op's action and phases
(a clock pair from a share of its work on; :func:`perseus.profile.op_phases`). Pure: no device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from perseus.device.base import nearest_clock_mhz
from perseus.errors import ConfigError, PlanError
from perseus.plan import Frontier
from perseus.profile.two_clock import build_layer_split, check_phases, op_phases
from perseus.schedule.actions import Action, Kind, format_grid

__all__ = ["OpOrderError", "OpPhase", "OpTimeFn", "RankPlan"]

#: Predicted device time of one whole op: ``(stage_index, kind, freq_mhz) -> time_s``, with
#: the memory clock as a fourth argument for a phase that sets one.
OpTimeFn = Callable[..., float]


class OpPhase(NamedTuple):
    """One phase of an op as the agent runs it: SM clock ``freq_mhz`` and memory clock
    ``mem_freq_mhz`` (None: the GPU's default, never set) from ``start_share`` of the op's
    work on (0 for the first phase)."""

    freq_mhz: int
    mem_freq_mhz: int | None
    start_share: float


class OpOrderError(PlanError):
    """The training loop ran another op than the plan's next (or none was due).

    Attributes:
        planned: The op the plan expected (None: none was due: outside an iteration, or past
            the rank's last op).
        ran: The op the training loop ran.
    """

    def __init__(self, message: str, planned: Action | None, ran: Action, detail: str = "") -> None:
        super().__init__(message, detail)
        self.planned = planned
        self.ran = ran


@dataclass(frozen=True, slots=True)
class RankPlan:
    """Rank ``rank``'s ops at point ``point_index`` of ``plan``.

    Attributes:
        actions: The ops in the order the training loop must run them.
        phases: Each op's phases, as planned (not yet snapped to a device).
    """

    plan: Frontier
    point_index: int
    rank: int
    actions: tuple[Action, ...]
    phases: tuple[tuple[OpPhase, ...], ...]

    @property
    def uses_memory_clocks(self) -> bool:
        """True when some op of this rank sets a memory clock."""
        return any(ph.mem_freq_mhz is not None for p in self.phases for ph in p)

    @classmethod
    def of(cls, plan: Frontier, point_index: int, rank: int) -> RankPlan:
        """Raises:
        PlanError: for a point or rank out of range, or two-clock ops without
            ``job.layers_per_stage`` (or with a layer split the job cannot build, or a phase
            starting at a layer its stage lacks: naming the rank, the op and the limit).
        """
        if not 0 <= point_index < len(plan.points):
            raise PlanError(
                f"point_index {point_index} is out of range: the plan has {len(plan.points)} points"
            )
        if not 0 <= rank < len(plan.stage_ops):
            raise PlanError(
                f"rank {rank} is out of range: the plan has {len(plan.stage_ops)} ranks"
            )
        actions = plan.rank_actions[rank]
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
                raise PlanError(f"plan job: {e.message}", e.detail) from None
            for j, op in enumerate(planned):
                if len(op) > 1:
                    stage = actions[j].stage_index
                    try:  # a switch at or past the last layer would land at the op's end
                        check_phases(op, stage, split)
                    except PlanError as e:
                        raise PlanError(
                            f"plan rank {rank} op {j} ({plan.op_name(actions[j])}): {e}"
                        ) from None
                    phases[j] = tuple(
                        OpPhase(p.freq_mhz, p.mem_freq_mhz, split.work_before(stage, p.first_layer))
                        for p in op
                    )
        return cls(plan, point_index, rank, actions, tuple(phases))

    def snapped(
        self, clocks: tuple[int, ...], mem_clocks: tuple[int, ...]
    ) -> tuple[tuple[OpPhase, ...], ...]:
        """The phases on a GPU's ascending clock lists: each clock the nearest (SM unchanged
        while the list is unknown; memory: the highest where unset, None without a list)."""

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
        """Predicted device time from op ``j``'s start to its phase ``i``'s (``phases``: as
        run): each earlier phase's share of work times the whole op's time at its clocks."""
        stage, kind = self.actions[j].stage_index, self.actions[j].kind
        planned = self.phases[j]
        total = 0.0
        for k in range(i):
            mem = planned[k].mem_freq_mhz if phases[k].mem_freq_mhz is not None else None
            f = phases[k].freq_mhz
            t = op_time_s(stage, kind, f) if mem is None else op_time_s(stage, kind, f, mem)
            total += (phases[k + 1].start_share - phases[k].start_share) * t
        return total

    def order_error(
        self,
        j: int,
        kind: Kind | str,
        microbatch_index: int,
        stage_index: int | None,
        *,
        in_step: bool,
        iteration: int,
    ) -> PlanError:
        """The error for the op the training loop ran as op ``j`` (``stage_index`` None: not
        given, taken as the planned op's): an :class:`OpOrderError`, or a plain
        :class:`~perseus.errors.PlanError` when ``kind`` is none of F, B, W."""
        try:
            kind = Kind(kind)
        except ValueError:
            return PlanError(f"rank {self.rank}: op kind {kind!r} is not one of F, B, W")
        n = len(self.actions)
        near = self.actions[min(j, n - 1)].stage_index if n else self.rank
        ran = Action(near if stage_index is None else stage_index, kind, microbatch_index)
        actual = repr(ran.op_name(stage_index is not None))
        if not in_step:
            text = f"op {actual} ran outside an iteration; call step_begin() first"
            return OpOrderError(f"rank {self.rank}: {text}", None, ran)
        if j >= n:
            text = (
                f"op {actual} is op {j + 1} of iteration {iteration}, but the plan has only {n} "
                "ops for this rank; call step_end() after the last"
            )
            return OpOrderError(f"rank {self.rank}: {text}", None, ran, self.order_grid(j, ran))
        planned = self.actions[j]
        window = " ".join(map(self.plan.op_name, self.actions[max(0, j - 2) : j + 3]))
        text = (
            f"plan expects op {j} of iteration {iteration} to be {self.plan.op_name(planned)!r} "
            f"but the training loop ran {actual} (plan ops around it: {window}); the plan was "
            "computed for another schedule or microbatch count"
        )
        return OpOrderError(f"rank {self.rank}: {text}", planned, ran, self.order_grid(j, ran))

    def order_grid(self, j: int, ran: Action | str) -> str:
        """This rank's planned ops as a grid, op ``j`` and what ran in its place marked."""
        ran_col: list[Action | str | None] = [None] * j + [ran]
        labels = (f"Rank {self.rank} planned", "ran")
        return format_grid((self.actions, ran_col), [(0, j), (1, j)], labels=labels, window=3)
