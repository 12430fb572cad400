"""``PerseusPipeline``: energy-aware ``torch.distributed.pipelining`` in a few lines.

::

    from perseus.runtime.session import PerseusPipeline

    pp = PerseusPipeline(schedule, stages, gpu=gpu, blocking_power_w=83.64,
                         plan="plan.json").start()          # or online_profile=True
    for x, y in loader:
        with pp.iteration():
            schedule.step(x, target=y)
            optimizer.step()
    pp.close()

What it does:

* reads the schedule torch will run (:func:`perseus.runtime.torch_pp.schedule_from_torch`);
* wraps the stages' compute calls (:mod:`perseus.runtime.hooks`) so that the rank agent
  (:class:`perseus.runtime.agent.RankAgent`) sets every action's planned clock and checks the
  action order against the plan;
* with ``emulate=True`` (machines without GPUs) stretches every action to the simulated GPU's
  time (:mod:`perseus.runtime.emulation`);
* with ``online_profile=True`` sweeps clocks during the first iterations
  (:mod:`perseus.runtime.online_profile`), saves the profile, computes the frontier once on
  pipeline rank 0, broadcasts it and deploys the chosen point (default: the fastest plan,
  i.e. intrinsic energy bloat removed at no slowdown);
* measures every iteration on every rank: the window between two iteration boundaries (a
  barrier of the pipeline's ranks), its energy, and the compute-bound time (until the rank's
  last action ended, excluding the wait at the data-parallel sync).

Iteration boundaries are where everything changes (plans, profiling clocks, straggler
decisions): all ranks of a pipeline pass the same boundary together, so they never run
different plans.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perseus.dag.graph import build_dag
from perseus.errors import ConfigError, PlanError
from perseus.io.frontier_files import read_frontier
from perseus.io.profile_files import read_profile, write_profile_csv
from perseus.job import PlanningJob, make_job
from perseus.plan import Frontier, JobSpec
from perseus.profile.model import Profile, build_profile
from perseus.runtime.emulation import ActionStretcher, VirtualTimeline
from perseus.runtime.hooks import instrument_stages
from perseus.runtime.online_profile import OnlineProfiler
from perseus.runtime.torch_pp import schedule_from_torch
from perseus.schedule.actions import Action, Schedule
from perseus.schedule.builders import SCHEDULE_NAMES, build_schedule
from perseus.schedule.dependencies import action_dependencies

__all__ = [
    "BoundaryHook",
    "IterationStats",
    "PerseusPipeline",
    "job_for_schedule",
]

#: Called at every iteration boundary with the stats of the iteration that just ended; may
#: return ``(frontier, point_index)`` to deploy from the next iteration on. Every rank of a
#: pipeline must return the same value (hooks decide from data all ranks share).
BoundaryHook = Callable[["IterationStats"], "tuple[Frontier, int] | None"]


@dataclass(frozen=True, slots=True)
class IterationStats:
    """One iteration as this rank saw it.

    Attributes:
        iteration: Index since :meth:`PerseusPipeline.start` (profiling iterations included).
        phase: ``"profile"`` during the online sweep, else ``"run"``.
        point_index: Index of the deployed frontier point (None while profiling).
        time_s: Window between this iteration's boundary and the next one's.
        energy_j: This rank's GPU energy over the window.
        compute_time_s: From the window's start to the end of this rank's last action.
    """

    iteration: int
    phase: str
    point_index: int | None
    time_s: float
    energy_j: float
    compute_time_s: float


def job_for_schedule(
    schedule: Schedule,
    profile: Profile,
    blocking_power_w: float,
    profile_name: str | None = None,
) -> PlanningJob:
    """The planning job of a schedule read from torch.

    When the schedule equals one of perseus's builders (GPipe, 1F1B, interleaved, ZB-H1 with
    the same sizes) the job is :func:`perseus.job.make_job`'s, so plans computed with
    ``perseus frontier`` fit it; otherwise the job is named after the torch class.
    """
    v = schedule.virtual_stages
    for name in SCHEDULE_NAMES:
        try:
            ours = build_schedule(name, schedule.num_stages, schedule.num_microbatches, v)
        except ConfigError:
            continue
        if (
            ours.rank_actions == schedule.rank_actions
            and ours.stage_to_rank == schedule.stage_to_rank
        ):
            return make_job(
                profile,
                name,
                schedule.num_stages,
                schedule.num_microbatches,
                blocking_power_w,
                virtual_stages=v,
                profile_name=profile_name,
            )
    if schedule.has_weight_actions and not profile.has_weight:
        profile = profile.split_backward(0.5)
    spec = JobSpec(
        schedule=schedule.name,
        ranks=schedule.num_ranks,
        stages=schedule.num_stages,
        microbatches=schedule.num_microbatches,
        virtual_stages=v,
        blocking_power_w=blocking_power_w,
        profile_sha256=profile.sha256,
        profile_name=profile_name,
    )
    return PlanningJob(spec, schedule, profile, build_dag(schedule))


def _energy_j(gpu: Any) -> float:
    exact = getattr(gpu, "exact_energy_j", None)
    if exact is not None:
        return float(exact())
    return float(gpu.energy_mj()) / 1000.0


class PerseusPipeline:
    """One rank's perseus session around a torch pipeline schedule.

    Args:
        torch_schedule: The torch schedule object the training loop steps.
        stages: This rank's ``PipelineStage`` objects.
        gpu: This rank's GPU (a :class:`~perseus.device.simulated.SimulatedGPU` when
            emulating).
        blocking_power_w: GPU power while waiting; used for planning and profiling.
        plan: A plan/frontier (object or JSON path) to deploy; its point ``point_index`` runs.
        profile: Without ``plan``: plan offline from this profile (frontier computed on
            pipeline rank 0 at start and broadcast). With ``plan``: the profile the plan was
            computed for, checked against the plan and used for :meth:`allmax_plan`.
        online_profile: Sweep clocks during the first iterations, then plan from the sweep.
        profile_cache: CSV path where the online profile is saved; if it exists, profiling is
            skipped and the saved profile is used.
        point_index: Which frontier point to deploy (0: the fastest).
        emulate: Stretch actions to the simulated GPU's time (``gpu`` must be simulated).
        group: The pipeline's process group (default: the stages' group).
        patience: Online profiling early stop (see :class:`OnlineProfiler`).
        timeline: Emulation only: a file shared by the pipeline's processes (same path on
            every rank) through which actions start when their inputs are ready on the
            simulated GPUs rather than when the host got to them (see
            :class:`~perseus.runtime.emulation.VirtualTimeline`).
        agent_options: Extra keyword arguments for :class:`~perseus.runtime.agent.RankAgent`.

    Raises:
        ConfigError: if no plan source is given, online profiling is combined with a plan or
            profile, or asked for without emulation (real-GPU per-op profiling is not
            implemented here).
        PlanError: if ``plan`` was computed for another schedule.
    """

    def __init__(
        self,
        torch_schedule: Any,
        stages: Sequence[Any],
        *,
        gpu: Any,
        blocking_power_w: float,
        plan: Frontier | str | Path | None = None,
        profile: Profile | None = None,
        online_profile: bool = False,
        profile_cache: str | Path | None = None,
        point_index: int = 0,
        emulate: bool = False,
        group: Any = None,
        patience: int = 5,
        timeline: str | Path | None = None,
        agent_options: dict[str, Any] | None = None,
    ) -> None:
        if online_profile and (plan is not None or profile is not None):
            raise ConfigError("online_profile=True measures the profile; drop plan= and profile=")
        if not (online_profile or plan is not None or profile is not None):
            raise ConfigError("PerseusPipeline needs plan=, profile= or online_profile=True")
        if online_profile and not emulate:
            raise ConfigError(
                "online profiling is implemented for emulated GPUs only; profile real GPUs "
                "offline and pass profile= or plan="
            )
        self.torch_schedule = torch_schedule
        self.stages = list(stages)
        self.gpu = gpu
        self.blocking_power_w = float(blocking_power_w)
        self.schedule = schedule_from_torch(torch_schedule)
        self.rank = int(self.stages[0].group_rank)
        self.group = group if group is not None else getattr(self.stages[0], "group", None)
        self.emulate = emulate
        self.point_index = point_index
        self.history: list[IterationStats] = []
        self.frontier: Frontier | None = None
        self.job: PlanningJob | None = None
        self.profiled: Profile | None = None
        self._plan_arg = plan
        self._profile_arg = profile
        self._online = online_profile
        self._cache = Path(profile_cache) if profile_cache is not None else None
        self._patience = patience
        self._agent_options = dict(agent_options or {})
        self._hooks: list[BoundaryHook] = []
        self._agent: Any = None
        self._profiler: OnlineProfiler | None = None
        self._timeline_path = Path(timeline) if (emulate and timeline is not None) else None
        self._stretcher = (
            ActionStretcher(gpu, backdate=self._timeline_path is not None) if emulate else None
        )
        self._timeline: VirtualTimeline | None = None
        self._restore: Callable[[], None] | None = None
        self._pending: tuple[Frontier, int] | None = None
        self._clock_mhz: int | None = None
        self._plan_clocks: dict[Action, int] = {}
        self._window: tuple[float, float] | None = None
        self._last_op_end = 0.0
        self._iteration = 0
        self.clocks_profiled: dict[tuple[int, Any], int] = {}

    # ----------------------------------------------------------------------------------------
    # Lifecycle

    def start(self) -> PerseusPipeline:
        """Instrument the stages, obtain a plan (file, offline frontier, cache or sweep)."""
        self._restore = instrument_stages(self.stages, self._op)
        if self._timeline_path is not None:
            if self.rank == 0:
                VirtualTimeline.create(
                    self._timeline_path, sum(map(len, self.schedule.rank_actions))
                )
            self._barrier()
            graph = build_dag(self.schedule)
            num_stages = self.schedule.num_stages
            self._timeline = VirtualTimeline(
                self._timeline_path, graph.node_of, lambda a: action_dependencies(a, num_stages)
            )
        if self._plan_arg is not None:
            frontier = (
                self._plan_arg
                if isinstance(self._plan_arg, Frontier)
                else read_frontier(self._plan_arg)
            )
            if self._profile_arg is not None:
                self.job = job_for_schedule(self.schedule, self._profile_arg, self.blocking_power_w)
                self.job.check_frontier(frontier, source=str(self._plan_arg)[:200])
            self._install(frontier, self.point_index)
        elif self._profile_arg is not None:
            self._plan_from_profile(self._profile_arg)
        elif self._cache is not None and self._cache.exists():
            self._plan_from_profile(read_profile(self._cache), profiled=True)
        else:
            ops = {(a.stage_index, a.kind) for a in self.schedule.rank_actions[self.rank]}
            self._profiler = OnlineProfiler(
                ops, self.gpu.supported_clocks_mhz(), patience=self._patience
            )
        return self

    def close(self) -> None:
        """End the last window (if open), restore the stages, reset the GPU (idempotent)."""
        if self._window is not None:
            self._boundary(final=True)
        if self._restore is not None:
            self._restore()
            self._restore = None
        if self._agent is not None:
            self._agent.close()
            self._agent = None
        if self.emulate and self._clock_mhz is not None:
            self.gpu.reset_locked_clock()
            self._clock_mhz = None

    def __enter__(self) -> PerseusPipeline:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def next_iteration(self) -> int:
        """The index the next :meth:`iteration` will have in :attr:`history`."""
        return self._iteration + (1 if self._window is not None else 0)

    @property
    def profiling(self) -> bool:
        """True while the online sweep runs."""
        return self._profiler is not None

    def add_boundary_hook(self, hook: BoundaryHook) -> None:
        """Call ``hook`` at every iteration boundary (see :data:`BoundaryHook`)."""
        self._hooks.append(hook)

    def remove_boundary_hook(self, hook: BoundaryHook) -> None:
        """Stop calling ``hook`` (no error if it was not added)."""
        if hook in self._hooks:
            self._hooks.remove(hook)

    @property
    def emulation_overruns(self) -> int:
        """Actions whose CPU compute exceeded the simulated time (0 when not emulating)."""
        return self._stretcher.overruns if self._stretcher is not None else 0

    def deploy(self, frontier: Frontier, point_index: int = 0) -> None:
        """Run ``frontier.points[point_index]`` from the next iteration on (call on every rank).

        Raises:
            PlanError: if the frontier belongs to another schedule or the index is out of range.
        """
        self._check(frontier, point_index)
        if self._agent is None:
            self._install(frontier, point_index)
        else:
            self._pending = (frontier, point_index)

    def allmax_plan(self) -> Frontier:
        """A one-point plan running every action at the highest clock (the baseline)."""
        job = self._require_job()
        return job.frontier([job.point(job.allmax())])

    # ----------------------------------------------------------------------------------------
    # Iterations

    @contextmanager
    def iteration(self) -> Iterator[None]:
        """Context manager around one training iteration (step + optimizer)."""
        self._boundary(final=False)
        try:
            yield
        except BaseException:
            self._window = None
            raise

    def _barrier(self) -> None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.barrier(group=self.group)

    def _boundary(self, final: bool) -> None:
        self._barrier()
        now, energy = time.perf_counter(), _energy_j(self.gpu)
        stats = None
        if self._window is not None:
            t0, e0 = self._window
            stats = IterationStats(
                iteration=self._iteration,
                phase="profile" if self.profiling else "run",
                point_index=None if self.profiling else self.point_index,
                time_s=now - t0,
                energy_j=energy - e0,
                compute_time_s=max(0.0, self._last_op_end - t0),
            )
            self.history.append(stats)
            self._iteration += 1
            if self._agent is not None and not self.profiling:
                self._agent.step_end()
        self._window = None
        if final:
            return
        extra = False
        if self._profiler is not None and stats is not None:
            extra = self._profile_boundary()
        if stats is not None:
            for hook in self._hooks:
                decision = hook(stats)
                extra = True
                if decision is not None:
                    self._check(*decision)
                    self._pending = decision
        if self._pending is not None and self._agent is not None:
            frontier, index = self._pending
            self._pending = None
            if frontier is not self.frontier:
                self.frontier = frontier
            self._agent.swap_plan(frontier, index)
            self._set_table(frontier, index)
            self.point_index = index
        if extra:
            self._barrier()
        if self._agent is not None and not self.profiling:
            self._agent.step_begin()
        self._last_op_end = time.perf_counter()
        self._window = (time.perf_counter(), _energy_j(self.gpu))
        if self._timeline is not None:
            self._timeline.begin_iteration(self._window[0])

    # ----------------------------------------------------------------------------------------
    # Actions

    @contextmanager
    def _op(self, action: Action) -> Iterator[None]:
        start = time.perf_counter()
        if self._profiler is not None:
            yield from self._profiled_op(action)
        elif self._agent is None:
            raise PlanError("PerseusPipeline: an action ran before a plan was deployed")
        else:
            with self._agent.op(action.kind, action.microbatch_index, action.stage_index):
                if self._stretcher is None:
                    yield
                else:
                    freq = self._plan_clocks[action]
                    if freq != self._clock_mhz:
                        self._clock_mhz = self.gpu.set_locked_clock(freq)
                    timeline = self._timeline
                    if timeline is not None:
                        start = timeline.start_of(action, start)
                    with self._stretcher.op(action, start_s=start) as timing:
                        yield
                    if timeline is not None:
                        # The simulated GPU finishes at the deadline even when the host got
                        # there late (host jitter is an artefact of sharing CPUs between
                        # emulated GPUs, not something the modelled GPU would see).
                        timeline.finish(
                            action, timing.end_s if timing.overrun else timing.deadline_s
                        )
        self._last_op_end = time.perf_counter()

    def _profiled_op(self, action: Action) -> Iterator[None]:
        profiler, stretcher = self._profiler, self._stretcher
        if profiler is None or stretcher is None:  # guarded in __init__
            raise ConfigError("online profiling needs emulation")
        freq = profiler.clock_for(action.stage_index, action.kind)
        if freq != self._clock_mhz:
            self._clock_mhz = self.gpu.set_locked_clock(freq)
        e_pre = _energy_j(self.gpu)
        with stretcher.op(action) as timing:
            yield
        e_end = _energy_j(self.gpu)
        # The op's time is measured on the device's timeline, like a CUDA event pair on the
        # stream: from the device call's return to the simulated completion (the deadline),
        # or to the real end when the CPU compute overran. A host that wakes up late (CPUs
        # shared between emulated GPUs) does not lengthen the op; its wait, like the device
        # call itself, is blocking time and is taken out of the energy.
        end_s = timing.end_s if timing.overrun else min(timing.end_s, timing.deadline_s)
        time_s = end_s - timing.begun_s
        blocked_s = (timing.end_s - timing.start_s) - time_s
        energy_j = e_end - e_pre - self.blocking_power_w * blocked_s
        profiler.record(action.stage_index, action.kind, time_s, energy_j)

    # ----------------------------------------------------------------------------------------
    # Planning

    def _require_job(self) -> PlanningJob:
        if self.job is None:
            raise PlanError("PerseusPipeline: no job yet (still profiling?)")
        return self.job

    def _check(self, frontier: Frontier, point_index: int) -> None:
        if frontier.stage_ops != self.schedule.stage_ops():
            raise PlanError(
                "plan's stage_ops differ from the schedule torch runs; compute the plan for "
                f"{self.schedule.name} with {self.schedule.num_stages} stages and "
                f"{self.schedule.num_microbatches} microbatches"
            )
        if not 0 <= point_index < len(frontier.points):
            raise PlanError(f"point {point_index} is out of range ({len(frontier.points)} points)")

    def _install(self, frontier: Frontier, point_index: int) -> None:
        from perseus.runtime.agent import RankAgent

        self._check(frontier, point_index)
        self.frontier = frontier
        self.point_index = point_index
        # Emulation sets clocks synchronously from the plan table below: the simulated GPU
        # has no set latency to hide, and a clock that is not applied before begin_op would
        # price the op at the wrong clock. The agent still checks the order and measures.
        options: dict[str, Any] = {
            "watchdog": False,
            "handle_signals": False,
            "measure_op_energy": False,
            "enabled": not self.emulate,
        }
        options.update(self._agent_options)
        self._agent = RankAgent(frontier, self.gpu, self.rank, point_index=point_index, **options)
        self._agent.start()
        self._set_table(frontier, point_index)

    def _set_table(self, frontier: Frontier, point_index: int) -> None:
        freqs = frontier.points[point_index].one_clock_mhz(self.rank)
        self._plan_clocks = dict(zip(self.schedule.rank_actions[self.rank], freqs, strict=True))

    def _plan_from_profile(self, profile: Profile, profiled: bool = False) -> None:
        """Compute the frontier on pipeline rank 0, broadcast it, deploy the chosen point."""
        import torch.distributed as dist

        from perseus.solver import trace_frontier

        if profiled:
            self.profiled = profile
        payload: list[Any] = [None]
        if self.rank == 0 or not dist.is_initialized():
            self.job = job_for_schedule(self.schedule, profile, self.blocking_power_w)
            payload = [trace_frontier(self.job).model_dump_json()]
        if dist.is_initialized():
            src = dist.get_global_rank(self.group, 0) if self.group is not None else 0
            dist.broadcast_object_list(payload, src=src, group=self.group)
        frontier = Frontier.model_validate_json(payload[0])
        if self.job is None:
            self.job = job_for_schedule(self.schedule, profile, self.blocking_power_w)
        self._install(frontier, self.point_index)

    def _profile_boundary(self) -> bool:
        """Advance the sweep; when every rank has finished, plan from the measured profile."""
        import torch
        import torch.distributed as dist

        profiler = self._profiler
        if profiler is None:
            return False
        profiler.end_iteration()
        busy = torch.tensor([0.0 if profiler.done else 1.0])
        if dist.is_initialized():
            dist.all_reduce(busy, op=dist.ReduceOp.MAX, group=self.group)
        if busy.item() > 0:
            return True
        rows = profiler.rows()
        if dist.is_initialized():
            gathered: list[Any] = [None] * dist.get_world_size(self.group)
            dist.all_gather_object(gathered, rows, group=self.group)
            rows = [r for part in gathered for r in part]
        profile = build_profile(rows, source="online profile")
        self.clocks_profiled = profiler.clocks_profiled()
        self._profiler = None
        self._clock_mhz = None
        if self._cache is not None and self.rank == 0:
            self._cache.parent.mkdir(parents=True, exist_ok=True)
            write_profile_csv(profile, self._cache)
        self._plan_from_profile(profile, profiled=True)
        return True
