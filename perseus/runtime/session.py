"""``RankSession``: one pipeline rank's perseus session, for any training engine.

::

    session = RankSession(schedule, rank, gpu=gpu, blocking_power_w=83.64, plan="plan.json")
    with session:
        for batch in loader:
            with session.iteration():             # one training iteration
                for action in engine_actions:     # however the engine runs them
                    with session.op(action):
                        run(action)
    session.history                               # IterationStats per iteration

The engine adapter's only jobs are to give the session the schedule it runs (a perseus
:class:`~perseus.schedule.Schedule`) and to run every compute action inside ``session.op``
(an :data:`~perseus.runtime.engines.torch_hooks.OpContextFactory`); :class:`~perseus.runtime.pipeline.
PerseusPipeline` does that for ``torch.distributed.pipelining``.

The session obtains a plan (:mod:`perseus.runtime.planning`) and runs it through the rank
agent (:class:`~perseus.runtime.agent.rank_agent.RankAgent`: clocks on the device's timeline, op order,
measurement; watchdog and signal handling on by default). An online sweep
(:mod:`perseus.runtime.profiling.sweep`) runs through the same agent: each sweep step is a
plan of the clocks to measure, op times come from the agent's device events, and op energy
from the GPU's energy counter read on a background thread
(:mod:`perseus.runtime.profiling.energy_windows`): each (stage, kind)'s power is fitted to the windows
between the counter's publishes from the share of each window its ops covered
(:mod:`perseus.runtime.profiling.energy_attribution`). A step is repeated for further iterations until
its ops span enough windows (``min_windows``, 20 by default: ~2 s at NVML's 100 ms period).
With ``emulate=True`` the very same path runs on a simulated GPU; the session only launches each
action's op on its stream and holds the host until the op's output exists
(:mod:`perseus.runtime.emulation`).

Iteration figures are on the device's timeline: at a boundary the session waits for this
rank's last op (one event wait per iteration), passes a barrier of the pipeline's ranks, then
marks the boundary with a device event and reads the energy counter there. In emulation the
boundary is the moment the last device of the pipeline finished (an all-reduce of the ranks'
last op end times), so a host that stalls at the barrier does not stretch the iteration.

Iteration boundaries are where everything changes (plans, profiling clocks, straggler
decisions): all ranks of a pipeline pass the same boundary together (a barrier), so they never
run different plans. A failed iteration (an exception inside :meth:`RankSession.iteration`)
is discarded and the session stays usable.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from perseus.dag.graph import build_dag
from perseus.device.base import MemoryClockGPU
from perseus.device.private_dir import check_private_file
from perseus.errors import ConfigError, PlanError, ProfileError
from perseus.io.profile_files import read_profile, write_profile_csv
from perseus.job import PlanningJob
from perseus.plan import Baseline, Frontier, JobSpec, PlanPoint
from perseus.profile.model import Profile
from perseus.runtime.agent.rank_agent import RankAgent
from perseus.runtime.collectives import all_reduce_max, barrier
from perseus.runtime.emulation import StreamEmulator, VirtualTimeline
from perseus.runtime.planning import (
    check_frontier,
    gather_profile,
    job_for_schedule,
    load_frontier,
    plan_from_profile,
    sweep_finished_everywhere,
)
from perseus.runtime.profiling.energy_attribution import DEFAULT_RIDGE, OpSpan, SweepWindow
from perseus.runtime.profiling.energy_windows import CounterSampler, sample_period_for
from perseus.runtime.profiling.pair_sweep import PairSweep
from perseus.runtime.profiling.sweep import MAX_FIT_ERROR, OnlineProfiler, check_fit
from perseus.schedule.actions import Action, Kind, Schedule
from perseus.schedule.dependencies import action_dependencies

__all__ = ["BoundaryHook", "IterationStats", "RankSession"]

_log = logging.getLogger(__name__)

#: Online profiling's energy-window options and their defaults (``profile_options``).
_PROFILE_OPTIONS: dict[str, Any] = {
    "min_windows": 20,
    "sample_period_s": None,
    "max_step_iterations": 200,
    "ridge": DEFAULT_RIDGE,
}

#: Called at every iteration boundary with the stats of the iteration that just ended; may
#: return ``(frontier, point_index)`` to deploy from the next iteration on. Every rank of a
#: pipeline must return the same value (hooks decide from data all ranks share).
BoundaryHook = Callable[["IterationStats"], "tuple[Frontier, int] | None"]


@dataclass(frozen=True, slots=True)
class IterationStats:
    """One iteration as this rank saw it.

    Attributes:
        iteration: Index since :meth:`RankSession.start` (profiling iterations included).
        phase: ``"profile"`` during the online sweep, else ``"run"``.
        point_index: Index of the deployed frontier point (None while profiling).
        time_s: Window between this iteration's boundary and the next one's.
        energy_j: This rank's GPU energy over the window.
        compute_time_s: From the window's start to the end of this rank's last action.
        predicted_time_s: The deployed point's predicted iteration time (None while profiling).
        predicted_energy_j: The deployed point's predicted energy of the whole pipeline (all
            ranks; None while profiling).
    """

    iteration: int
    phase: str
    point_index: int | None
    time_s: float
    energy_j: float
    compute_time_s: float
    predicted_time_s: float | None = None
    predicted_energy_j: float | None = None


class _NullScope:
    """The context of an op that runs outside an iteration (eval, warm-up): untouched."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_OUTSIDE = _NullScope()


def _op_time_fn(profile: Profile) -> Callable[[int, Kind, int], float]:
    """An op's profiled time at a clock (the nearest profiled clock when not profiled)."""

    def op_time_s(stage_index: int, kind: Kind, freq_mhz: int) -> float:
        options = profile.op(stage_index, kind).options
        return min(options, key=lambda o: (abs(o.freq_mhz - freq_mhz), -o.freq_mhz)).time_s

    return op_time_s


class RankSession:
    """One pipeline rank's perseus session around an engine's schedule.

    The constructor validates and does no I/O; :meth:`start` (or ``with``) obtains the plan
    (collective over ``group``: call it on every rank of the pipeline) and starts the agent.

    Args:
        schedule: The schedule the engine runs (every rank's compute actions, in order).
        rank: This process's pipeline rank (index into ``schedule.rank_actions``).
        gpu: This rank's GPU (a :class:`~perseus.device.simulated.SimulatedGPU` when
            emulating).
        blocking_power_w: GPU power while waiting; used for planning and profiling.
        plan: A plan/frontier (object or JSON path) to deploy; its point ``point_index`` runs.
        profile: Without ``plan``: plan offline from this profile (frontier computed on
            pipeline rank 0 at start and broadcast). With ``plan``: the profile the plan was
            computed for, checked against the plan and used for :meth:`allmax_plan`.
        online_profile: Sweep clocks during the first iterations, then plan from the sweep
            (op time from device events, energy fitted to the counter's publish windows).
        profile_cache: CSV path where the online profile is saved; if it exists, profiling is
            skipped and the saved profile is used.
        point_index: Which frontier point to deploy (0: the fastest).
        emulate: Run on a simulated GPU (``gpu`` a
            :class:`~perseus.device.simulated.SimulatedGPU`): launch every action's op on its
            stream and hold the host until the op's output exists on the device.
        group: The pipeline's process group (None: the default group, or no distribution).
        watchdog: Start the watchdog process that resets the GPU if this process dies.
        handle_signals: Reset the GPU on SIGTERM/SIGINT (previous handlers still run).
        patience: Online profiling early stop (see :class:`OnlineProfiler`).
        timeline: Emulation only: a file shared by the pipeline's processes (same path on
            every rank) through which actions start when their inputs are ready on the
            simulated GPUs (see :class:`~perseus.runtime.emulation.VirtualTimeline`).
        agent_options: Extra keyword arguments for :class:`~perseus.runtime.agent.rank_agent.RankAgent`.
        job_options: Extra keyword arguments for :func:`perseus.job.make_job` when planning
            here (``layers_per_stage=12`` plans two-clock ops; ``switch_latency_s``...).
        profile_options: Online profiling's energy windows: ``min_windows`` (counter windows
            per sweep step, default 20), ``sample_period_s`` (time between counter reads,
            default :func:`~perseus.runtime.profiling.energy_windows.sample_period_for`),
            ``max_step_iterations`` (default 200) and ``ridge`` (default 0.002; see
            :func:`~perseus.runtime.profiling.energy_attribution.fit_group_power`).
        power_schedule: A plan schedule JSON (``perseus plan schedule``) over ``plan``'s
            frontier, followed from the first iteration (:mod:`perseus.runtime.power`).
        power_store: The job's store, read for run-time power caps (``perseus power set``).

    Raises:
        ConfigError: if no plan source is given, online profiling is combined with a plan or
            profile, or ``emulate`` is asked of a GPU that is not simulated.
    """

    def __init__(
        self,
        schedule: Schedule,
        rank: int,
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
        watchdog: bool = True,
        handle_signals: bool = True,
        patience: int = 5,
        timeline: str | Path | None = None,
        agent_options: dict[str, Any] | None = None,
        job_options: dict[str, Any] | None = None,
        profile_options: dict[str, Any] | None = None,
        power_schedule: str | Path | None = None,
        power_store: Any = None,
    ) -> None:
        unknown = set(profile_options or {}) - set(_PROFILE_OPTIONS)
        if unknown:
            raise ConfigError(
                f"profile_options: unknown key(s) {sorted(unknown)}; use {list(_PROFILE_OPTIONS)}"
            )
        if online_profile and power_schedule is not None:
            raise ConfigError("power_schedule= needs plan= (its frontier); drop online_profile")
        if online_profile and (plan is not None or profile is not None):
            raise ConfigError("online_profile=True measures the profile; drop plan= and profile=")
        if not (online_profile or plan is not None or profile is not None):
            raise ConfigError("RankSession needs plan=, profile= or online_profile=True")
        if not 0 <= rank < schedule.num_ranks:
            raise ConfigError(
                f"rank {rank} is out of range: the schedule has {schedule.num_ranks} ranks"
            )
        if emulate and not hasattr(gpu, "launch"):
            raise ConfigError(
                f"emulate=True needs a simulated GPU (SimulatedGPU), got {type(gpu).__name__}"
            )
        self.schedule = schedule
        self.rank = rank
        self.gpu = gpu
        self.blocking_power_w = float(blocking_power_w)
        self.group = group
        self.emulate = emulate
        self.point_index = point_index
        self.history: list[IterationStats] = []
        self.frontier: Frontier | None = None
        self.job: PlanningJob | None = None
        self.profiled: Profile | None = None
        self.clocks_profiled: dict[tuple[int, Any], int] = {}
        self._plan_arg = plan
        self._profile_arg = profile
        self._online = online_profile
        self._cache = Path(profile_cache) if profile_cache is not None else None
        self._patience = patience
        self._job_options = dict(job_options or {})
        self._profile_options = {**_PROFILE_OPTIONS, **(profile_options or {})}
        self._agent_options: dict[str, Any] = {
            "watchdog": watchdog,
            "handle_signals": handle_signals,
            **(agent_options or {}),
        }
        self._hooks: list[BoundaryHook] = []
        self._agent: RankAgent | None = None
        self._profiler: OnlineProfiler | PairSweep | None = None
        self._sampler: CounterSampler | None = None
        self._step: SweepWindow | None = None
        self._warned_observe_only = False
        self._timeline_path = Path(timeline) if (emulate and timeline is not None) else None
        self._emulator: StreamEmulator | None = None
        self._pending: tuple[Frontier, int] | None = None
        self._window: tuple[float, int] | None = None  # (device time, counter mJ) at start
        self._last_op_end: Any = None
        self._iteration = 0
        self._started = False
        self._power_args = (power_schedule, power_store)
        self.power: Any = None  # the PowerRuntime hook (perseus.runtime.power), if any

    # ----------------------------------------------------------------------------------------
    # Lifecycle

    def start(self) -> RankSession:
        """Obtain a plan (file, offline frontier, cache or sweep) and start the agent.

        Collective over the pipeline's group. Idempotent.
        """
        if self._started:
            return self
        self._started = True
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        timeline = None
        if self._timeline_path is not None:
            # Mapped read-write by every rank: a directory of ours, never a planted link.
            check_private_file(self._timeline_path, what="emulation timeline")
            if self.rank == 0:
                VirtualTimeline.create(
                    self._timeline_path, sum(map(len, self.schedule.rank_actions))
                )
            barrier(self.group)
            graph = build_dag(self.schedule)
            num_stages = self.schedule.num_stages
            timeline = VirtualTimeline(
                self._timeline_path, graph.node_of, lambda a: action_dependencies(a, num_stages)
            )
        if self.emulate:
            self._emulator = StreamEmulator(self.gpu, timeline)
        if self._plan_arg is not None:
            frontier = load_frontier(self._plan_arg)
            if self._profile_arg is not None:
                self.job = job_for_schedule(
                    self.schedule,
                    self._profile_arg,
                    self.blocking_power_w,
                    job_options=self._job_options,
                )
                self.job.check_frontier(frontier, source=str(self._plan_arg)[:200])
            self._install(frontier, self.point_index)
        elif self._profile_arg is not None:
            self._plan_from_profile(self._profile_arg)
        elif self._cache is not None and check_private_file(
            self._cache, what="profile cache", create_dir=False
        ):
            self._plan_from_profile(read_profile(self._cache), profiled=True)
        else:
            ops = {(a.stage_index, a.kind) for a in self.schedule.rank_actions[self.rank]}
            gpu = self.gpu
            if isinstance(gpu, MemoryClockGPU) and gpu.memory_clock_control() is None:
                # A lockable memory clock: sweep (SM, memory) pairs (docs/memory-clocks.md).
                self._profiler = PairSweep(
                    ops,
                    self.gpu.supported_clocks_mhz(),
                    gpu.supported_memory_clocks_mhz(),
                    blocking_power_w=self.blocking_power_w,
                )
            else:
                self._profiler = OnlineProfiler(
                    ops, self.gpu.supported_clocks_mhz(), patience=self._patience
                )
            self._install(self._sweep_plan(), 0, sweep=True)
            if self._agent is not None and self._agent.observe_only:
                raise ConfigError(
                    f"online profiling needs to set clocks on {self.gpu.name}, but the agent is "
                    "observe-only (no privilege, or unsupported): run `perseus doctor`, or "
                    "profile where clocks can be locked and pass profile= or plan="
                )
            self._start_sampler()
        if self._power_args != (None, None):
            from perseus.runtime.power.runtime import attach_power

            self.power = attach_power(self, *self._power_args)

    def _start_sampler(self) -> None:
        """Start reading the energy counter for the sweep (on the agent's device timeline)."""
        agent = self._agent
        events = agent.events if agent is not None else None
        now_s = events.timeline_now_s if events is not None else time.perf_counter
        opts = self._profile_options
        period = opts["sample_period_s"]
        self._sampler = CounterSampler(
            self.gpu.energy_mj,
            now_s,
            period_s=sample_period_for(self.gpu) if period is None else float(period),
        )
        self._step = SweepWindow(
            self._sampler,
            min_intervals=int(opts["min_windows"]),
            max_iterations=int(opts["max_step_iterations"]),
            idle_power_w=self.blocking_power_w,
            ridge=float(opts["ridge"]),
        )
        self._sampler.start()

    def _stop_sampler(self) -> None:
        sampler, self._sampler = self._sampler, None
        self._step = None
        if sampler is not None:
            sampler.close()

    def close(self) -> None:
        """End the last window (if open), stop the agent, reset the GPU (idempotent)."""
        if not self._started:
            return
        self._started = False
        try:
            if self._window is not None:
                self._boundary(final=True)
        finally:
            self._stop_sampler()
            agent, self._agent = self._agent, None
            if agent is not None:
                agent.close()

    def __enter__(self) -> RankSession:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            with contextlib.suppress(Exception):  # do not mask the training loop's error
                self.close()

    @property
    def next_iteration(self) -> int:
        """The index the next :meth:`iteration` will have in :attr:`history`."""
        return self._iteration + (1 if self._window is not None else 0)

    @property
    def profiling(self) -> bool:
        """True while the online sweep runs."""
        return self._profiler is not None

    @property
    def agent(self) -> RankAgent | None:
        """The rank agent running the deployed plan (None before a plan is deployed)."""
        return self._agent

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
        return self._emulator.overruns if self._emulator is not None else 0

    def deploy(self, frontier: Frontier, point_index: int = 0) -> None:
        """Run ``frontier.points[point_index]`` from the next iteration on (call on every rank).

        Raises:
            PlanError: if the frontier belongs to another schedule or the index is out of range.
        """
        check_frontier(self.schedule, frontier, point_index)
        if self._agent is None:
            self._install(frontier, point_index)
        elif self._profiler is not None:
            raise PlanError("RankSession.deploy() while the online sweep runs; wait for it")
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
        """Context manager around one training iteration (all its actions + optimizer step).

        An exception inside discards the iteration (no stats) and leaves the session usable.
        """
        if not self._started:
            raise ConfigError("RankSession.iteration() before start(); use `with session:`")
        self._boundary(final=False)
        try:
            yield
        except BaseException:
            self._abort_iteration()
            raise

    def _abort_iteration(self) -> None:
        self._window = None
        if self._agent is not None:
            self._agent.step_abort()
        if self._profiler is not None:
            self._profiler.discard_iteration()
        if self._step is not None:
            self._step.reset()  # the failed iteration's ops are unknown: restart the step

    def _mark(self, at_s: float | None = None) -> tuple[float, int]:
        """A boundary on the device's timeline: (device time, energy counter in mJ).

        ``at_s`` (emulation): the boundary is when the whole pipeline's devices finished,
        not when the hosts got through the barrier (host stalls are an artefact of CPUs
        shared between emulated GPUs).
        """
        agent = self._agent
        events = agent.events if agent is not None else None
        if events is None:  # no device timeline (a GPU without events): the host's view
            return time.perf_counter(), int(self.gpu.energy_mj())
        if at_s is not None and self._emulator is not None:
            self.gpu.backdate(at_s)
        event = events.record_event()
        event.synchronize()  # the device is idle here: completes at once
        mj = event.energy_mj
        if mj is None and agent is not None:
            # The agent read the counter as the iteration ended, moments ago (the counter is
            # published every 100 ms; a read costs ~3 ms): the same boundary, no second read.
            mj = agent.take_end_counter_mj()
        return event.device_time_s(), int(self.gpu.energy_mj() if mj is None else mj)

    def _boundary(self, final: bool) -> None:
        agent = self._agent
        last_end = None
        if self._window is not None and agent is not None:
            last_end = agent.last_op_end_event
            agent.step_end()  # waits for this rank's last op on the device
        at_s = None
        if self._emulator is not None and self._window is not None:
            own = last_end.device_time_s() if last_end is not None else self._window[0]
            (at_s,) = all_reduce_max([own], self.group)  # also a barrier
        else:
            barrier(self.group)
        now_s, mj = self._mark(at_s)
        stats = None
        if self._window is not None:
            t0, e0 = self._window
            profiling = self.profiling
            point = None
            if not profiling and self.frontier is not None:
                point = self.frontier.points[self.point_index]
            end_s = last_end.device_time_s() if last_end is not None else t0
            stats = IterationStats(
                iteration=self._iteration,
                phase="profile" if profiling else "run",
                point_index=None if profiling else self.point_index,
                time_s=now_s - t0,
                energy_j=(mj - e0) / 1000.0,
                compute_time_s=max(0.0, end_s - t0),
                predicted_time_s=None if point is None else point.time_s,
                predicted_energy_j=None if point is None else point.energy_j,
            )
            self.history.append(stats)
            self._iteration += 1
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
                    check_frontier(self.schedule, *decision)
                    self._pending = decision
        if self._pending is not None and self._agent is not None:
            frontier, index = self._pending
            self._pending = None
            self._agent.swap_plan(frontier, index)
            if self._profiler is None:  # a sweep plan is not the deployed frontier
                self.frontier = frontier
                self.point_index = index
        if extra:
            barrier(self.group)
            now_s, mj = self._mark(now_s if self._emulator is not None else None)
        if self._agent is not None:
            self._agent.step_begin()
            if self._emulator is not None and self._agent.first_clock_pending():
                # A new plan (or sweep step) starts: its first clock is applied in real time,
                # so the device must not run this iteration's first op before it (the
                # boundary was dated back to when the pipeline finished).
                self._agent.wait_for_clock(5.0)
                self.gpu.record_event()  # nothing may start before now
        self._window = (now_s, mj)

    # ----------------------------------------------------------------------------------------
    # Actions

    def op(self, action: Action) -> AbstractContextManager[Any]:
        """The context manager around one compute action (an ``OpContextFactory``).

        Outside an iteration (evaluation, warm-up runs) the action runs untouched.

        Raises:
            PlanError: inside an iteration, if the action is not the one the plan expects next
                (another schedule, or several engine steps in one iteration).
        """
        if self._window is None:
            return _OUTSIDE
        return self._op(action)

    @contextmanager
    def _op(self, action: Action) -> Iterator[None]:
        agent = self._agent
        if agent is None:
            raise PlanError("RankSession: an action ran before a plan was deployed")
        if agent.ops_done_this_iteration >= len(agent.planned_clocks_mhz):
            raise PlanError(
                f"rank {self.rank}: action {action} is beyond the "
                f"{len(agent.planned_clocks_mhz)} actions of one iteration: run exactly one "
                "engine step (e.g. schedule.step) per session.iteration(); for gradient "
                "accumulation raise the microbatch count instead"
            )
        emulator = self._emulator
        if emulator is None:
            with agent.op(action.kind, action.microbatch_index, action.stage_index):
                yield
            return
        emulator.before(action)
        with agent.op(action.kind, action.microbatch_index, action.stage_index):
            emulator.launch(action)
            agent.mark_op_end()  # the op is enqueued; the CPU compute below is host work
            yield
        emulator.finish(action, agent.last_op_end_event)

    # ----------------------------------------------------------------------------------------
    # Planning

    def _require_job(self) -> PlanningJob:
        if self.job is None:
            raise PlanError("RankSession: no job yet (still profiling?)")
        return self.job

    def _install(self, frontier: Frontier, point_index: int, sweep: bool = False) -> None:
        check_frontier(self.schedule, frontier, point_index)
        if self._agent is not None:  # the sweep's agent runs the plan from the next iteration
            self._pending = (frontier, point_index)
            self.frontier = frontier
            self.point_index = point_index
            return
        if not sweep:  # a sweep "plan" is not a deployed frontier
            self.frontier = frontier
            self.point_index = point_index
        options: dict[str, Any] = {"measure_op_energy": False}
        if self.job is not None:
            # Times a two-clock op's mid-op switch from the profile the plan was made for.
            options["op_time_s"] = _op_time_fn(self.job.profile)
        options.update(self._agent_options)
        agent = RankAgent(frontier, self.gpu, self.rank, point_index=point_index, **options)
        agent.start()
        self._agent = agent

    def _sweep_plan(self) -> Frontier:
        """A one-point "plan" running every op at the clock the sweep measures next."""
        profiler = self._profiler
        assert profiler is not None
        schedule = self.schedule
        top = max(self.gpu.supported_clocks_mhz())
        freqs = tuple(
            tuple(
                profiler.plan_op_for(a.stage_index, a.kind) if r == self.rank else top
                for a in actions
            )
            for r, actions in enumerate(schedule.rank_actions)
        )
        spec = JobSpec(
            schedule=schedule.name,
            ranks=schedule.num_ranks,
            stages=schedule.num_stages,
            microbatches=schedule.num_microbatches,
            virtual_stages=schedule.virtual_stages,
            blocking_power_w=self.blocking_power_w,
            profile_sha256="0" * 64,
        )
        return Frontier(
            job=spec,
            stage_ops=schedule.stage_ops(),
            baseline=Baseline(time_s=1.0, energy_j=1.0),
            points=(PlanPoint(time_s=1.0, energy_j=1.0, freqs_mhz=freqs),),
        )

    def _plan_from_profile(self, profile: Profile, profiled: bool = False) -> None:
        if profiled:
            self.profiled = profile
        self.job, frontier = plan_from_profile(
            self.schedule, profile, self.blocking_power_w, self.rank, self.group, self._job_options
        )
        self._install(frontier, self.point_index)

    def _profile_boundary(self) -> bool:
        """Feed the sweep the last iteration's ops; once the step's ops span enough counter
        windows, fit their power and advance the sweep; when every rank has finished, plan
        from the measured profile."""
        profiler, agent, step = self._profiler, self._agent, self._step
        if profiler is None or agent is None or step is None:
            return False
        if agent.observe_only and not self._warned_observe_only:
            self._warned_observe_only = True
            _log.warning(
                "rank %d: clock control was lost during online profiling; the rows measured "
                "from now on are at the GPU's own clock, not the swept one",
                self.rank,
            )
        actions = self.schedule.rank_actions[self.rank]
        last = agent.iteration - 1
        spans = []
        for op in agent.records.ops[-len(actions) :]:
            if op.iteration == last:
                action = actions[op.index]
                profiler.record(action.stage_index, action.kind, op.time_s)
                if op.start_s is not None and op.end_s is not None:
                    key = (action.stage_index, action.kind)
                    spans.append(OpSpan(key, op.start_s, op.end_s))
        step.add_iteration(spans)
        advanced = False
        if step.ready():
            fit = step.fit()
            if fit is not None:
                _log.debug(
                    "rank %d: sweep step %d: %d windows over %d iterations, residual %.1f W",
                    self.rank,
                    profiler.iterations,
                    fit.intervals,
                    step.iterations,
                    fit.residual_w,
                )
            profiler.end_iteration(power_w=None if fit is None else fit.power_w, fit=fit)
            step.reset()
            advanced = True
        if not sweep_finished_everywhere(profiler, self.group):
            if advanced:
                self._pending = (self._sweep_plan(), 0)
            return True
        self._stop_sampler()
        # Every rank refuses together when any rank's energy fit is poor (one all-reduce).
        (worst,) = all_reduce_max([profiler.worst_fit_error()], self.group)
        if worst > MAX_FIT_ERROR:
            check_fit(profiler)  # raises here, naming this rank's worst row
            raise ProfileError(
                f"online profile refused: another rank's energy fit is worse than "
                f"{MAX_FIT_ERROR:.0%} (its error names the row)"
            )
        profile = gather_profile(profiler.rows(), self.group)
        self.clocks_profiled = profiler.clocks_profiled()
        self._profiler = None
        if self._cache is not None and self.rank == 0:
            check_private_file(self._cache, what="profile cache")  # a directory of ours
            write_profile_csv(profile, self._cache)
        self._plan_from_profile(profile, profiled=True)
        return True
