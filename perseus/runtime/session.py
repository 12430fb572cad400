"""``RankSession``: one pipeline rank's perseus session, for any training engine.

::

    session = RankSession(engine, gpu=gpu, plan="plan.json", options=SessionOptions(...))
    with session:                                 # start(): plan, agent, engine hooks
        for batch in loader:
            with session.iteration():             # one training iteration
                engine_step(batch)                # the engine runs each action in session.op
            evaluate()                            # between iterations: runs untouched
    session.history                               # IterationStats per iteration

The lifecycle and its rules are in ``docs/training.md``. On a real GPU an iteration's figures
are read at the next iteration's end (or by :meth:`RankSession.flush`/:meth:`RankSession.close`);
emulation, the online sweep and ``SessionOptions(wait_for_figures=True)`` read them at once.
Boundaries and op scopes meet the device through a :class:`~perseus.runtime.emulation.DeviceRun`.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, TypeVar

from perseus.device.base import GPU
from perseus.device.clock import clock_of
from perseus.device.presets import blocking_power_for, gpu_identity
from perseus.errors import ConfigError, PlanError
from perseus.job import PlanningJob
from perseus.plan import Frontier
from perseus.profile.model import Profile
from perseus.runtime.agent.op_timing import profiled_op_time_s
from perseus.runtime.agent.rank_agent import RankAgent
from perseus.runtime.agent.timing import CounterMark
from perseus.runtime.drift import DriftMonitor, agree_iteration, ops_to_profile
from perseus.runtime.emulation import DeviceRun, EmulatedGPU, start_emulation
from perseus.runtime.engines.base import EngineAdapter, adapter_for
from perseus.runtime.planning import (
    OnlineProfile,
    PlanContext,
    PlanLike,
    Planned,
    plan_source,
)
from perseus.runtime.profiling.energy_windows import counter_period_s
from perseus.runtime.session_hooks import BoundaryHooks
from perseus.runtime.session_sweep import SessionSweep, clock_control_kept
from perseus.runtime.session_types import (
    BoundaryHook,
    EndedIteration,
    SessionOptions,
    SessionState,
)
from perseus.runtime.summary import IterationStats, RunSummary, summarize
from perseus.schedule.actions import Action, Schedule

__all__ = ["BoundaryHook", "IterationStats", "RankSession", "SessionOptions", "SessionState"]

_log = logging.getLogger(__name__)

_Session = TypeVar("_Session", bound="RankSession")


class RankSession:
    """One pipeline rank's perseus session around an engine.

    The constructor validates and does no I/O; :meth:`start` (or ``with``) attaches the
    engine's hooks, places the simulated GPU (emulation), obtains the plan (collective over the
    pipeline's group: call it on every rank) and starts the agent.

    Args:
        engine: An engine adapter (:mod:`perseus.runtime.engines`: torch pipelining,
            Megatron-Core, DeepSpeed) or a bare schedule whose actions the loop runs inside
            :meth:`op` itself.
        rank: This process's pipeline rank; only with a bare schedule (an adapter knows it).
        gpu: This rank's GPU (an ``NvmlGPU``, or a ``SimulatedGPU``: emulation).
        plan: Where the plan comes from: a plan source
            (:class:`~perseus.runtime.planning.PlanFile`, ``OfflineProfile``,
            ``OnlineProfile``: sweep clocks during the first iterations, then plan), or a
            frontier, its JSON path, or a profile (rank 0 traces the frontier).
        options: Everything else (:class:`SessionOptions`; default: its defaults).

    Raises:
        ConfigError: a ``plan`` of another type; a rank out of range, missing, or not the
            adapter's; ``power_schedule`` with an online sweep; no ``blocking_power_w`` for a
            GPU :func:`~perseus.device.presets.blocking_power_for` does not know.
    """

    def __init__(
        self,
        engine: EngineAdapter | Schedule,
        rank: int | None = None,
        *,
        gpu: GPU,
        plan: PlanLike,
        options: SessionOptions | None = None,
    ) -> None:
        options = options if options is not None else SessionOptions()
        engine = adapter_for(engine, rank, options.group)
        schedule = engine.schedule
        self._emulated = gpu if isinstance(gpu, EmulatedGPU) else None
        self.source = plan_source(plan)
        if isinstance(self.source, OnlineProfile) and options.power_schedule is not None:
            raise ConfigError("power_schedule= needs a frontier: plan= a plan file or a profile")
        self.engine, self.schedule, self.rank = engine, schedule, engine.rank
        self.gpu, self.options, self.emulate = gpu, options, self._emulated is not None
        power_w = options.blocking_power_w  # blocking_power_for's ConfigError names the option
        self.blocking_power_w = float(blocking_power_for(gpu) if power_w is None else power_w)
        self.group = options.group if options.group is not None else engine.group
        self.point_index = options.point_index
        self.power: Any = None  # the PowerRuntime hook (perseus.runtime.power), if any: its
        # cap holds over the other hooks' plans while it is attached
        self.history: list[IterationStats] = []
        self.frontier: Frontier | None = None
        self.job: PlanningJob | None = None
        self.profiled: Profile | None = None
        self.clocks_profiled: dict[tuple[int, Any], int] = {}
        self.summary: RunSummary | None = None
        self._state = SessionState.NEW
        self._boundary = BoundaryHooks(schedule, engine.rank, lambda: self.next_iteration)
        self._agent: RankAgent | None = None
        self._sweep: SessionSweep | None = None
        self._run = DeviceRun()
        self._detach: Callable[[], None] | None = None
        self._pending: tuple[Frontier, int] | None = None
        self._window: tuple[float, int] | CounterMark | None = None
        self._last_mark: tuple[float, int] | CounterMark | None = None  # the last end
        self._ended: deque[EndedIteration] = deque()  # figures not read yet (oldest first)
        self._delivering: EndedIteration | None = None  # whose stats the hooks get now
        self._ran_between = False  # an action ran outside an iteration since the last one
        self._run_start = self._iteration = 0  # the deployed plan's first iteration; the next
        online, period_s = isinstance(self.source, OnlineProfile), counter_period_s(gpu)
        self._drift = DriftMonitor(self.rank, reprofile=online, counter_period_s=period_s)

    # ----------------------------------------------------------------------------------------
    # Lifecycle

    @property
    def state(self) -> SessionState:
        """Where the session is in its lifecycle."""
        return self._state

    @property
    def in_iteration(self) -> bool:
        """True between entering and leaving :meth:`iteration`."""
        return self._state is SessionState.IN_ITERATION

    def start(self: _Session) -> _Session:
        """Start the session (see the class docstring; the power runtime too when the options
        ask for one). Collective over the pipeline's group; idempotent while open.

        Raises:
            ConfigError: after :meth:`close`.
        """
        if self._state is SessionState.CLOSED:
            raise ConfigError("RankSession.start() after close(); create a new session")
        if self._state is not SessionState.NEW:
            return self
        self._state = SessionState.IDLE
        try:
            self._detach = self.engine.attach(self.op, lambda: self.in_iteration)
            if self._emulated is not None:  # this process's own GPU, on the pipeline's timeline
                self.gpu, self._run = start_emulation(
                    self._emulated, self.schedule, self.rank, self.group
                )
            planned = self.source.plan(self._context())
            if planned is None:
                if not isinstance(self.source, OnlineProfile):
                    raise ConfigError(f"{type(self.source).__name__}.plan() returned no plan")
                self._start_sweep(self.source)
            else:
                self._install(planned)
            o = self.options
            if o.power_schedule is not None or o.power_store is not None:
                from perseus.runtime.power.runtime import attach_power

                self.power = attach_power(
                    self,
                    o.power_schedule,
                    o.power_store,
                    forecast=o.power_forecast,
                    realised=o.power_realised,
                    objective=o.power_objective,
                )
        except BaseException:
            self.close()
            raise
        return self

    def _context(self) -> PlanContext:
        gpu = gpu_identity(self.gpu)  # plans and profiles of another GPU are refused
        return PlanContext(self.schedule, self.rank, self.group, self.blocking_power_w, gpu)

    def close(self) -> None:
        """Deliver the last iterations' figures (:meth:`flush`, collective), stop the agent,
        reset the GPU, detach the engine, log the summary (idempotent). Closing inside an
        iteration discards that iteration."""
        self._close(deliver=True)

    def _close(self, deliver: bool) -> None:
        if self._state is SessionState.CLOSED:
            return
        if self._state is SessionState.IN_ITERATION:
            self._abort_iteration()
        try:
            if deliver:
                self._deliver(keep=0)
            self._summarize()  # before the agent stops: a failed GPU reset does not cost it
        finally:
            self._state = SessionState.CLOSED
            self._ended.clear()
            self._shut_down()

    def _summarize(self) -> None:
        if self.frontier is not None:
            since = [s for s in self.history if s.iteration >= self._run_start]
            self.summary = summarize(since, self.frontier, self._drift.energy_window_s)
            if self.summary is not None and self.rank == 0:
                _log.info("%s", self.summary)

    def _shut_down(self) -> None:
        try:
            self._stop_sweep()
            agent, self._agent = self._agent, None
            if agent is not None:
                agent.close()
        finally:
            detach, self._detach = self._detach, None
            if detach is not None:
                detach()

    def __enter__(self: _Session) -> _Session:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        # An error in close() does not mask the loop's; after one, unread figures are dropped
        # (reading them is collective: the other ranks may not be here).
        with contextlib.suppress(Exception) if exc_type else contextlib.nullcontext():
            self._close(deliver=exc_type is None)

    @property
    def next_iteration(self) -> int:
        """The index the next :meth:`iteration` will have in :attr:`history`."""
        return self._iteration

    @property
    def profiling(self) -> bool:
        """True while the online sweep runs."""
        return self._sweep is not None

    @property
    def stats_frontier(self) -> Frontier | None:
        """The frontier that ran the iteration whose stats the boundary hooks get now (None
        while profiling), :attr:`frontier` outside them. On a real GPU the stats come one
        iteration late: a plan of another frontier (:meth:`allmax_plan`) may run already,
        and ``stats.point_index`` indexes the frontier it ran."""
        ended = self._delivering
        return self.frontier if ended is None else ended.frontier

    @property
    def agent(self) -> RankAgent | None:
        """The rank agent running the deployed plan (None before a plan is deployed)."""
        return self._agent

    def add_boundary_hook(self, hook: BoundaryHook) -> None:
        """Call ``hook`` with every iteration's stats as they are read (see
        :data:`BoundaryHook`: on a real GPU one iteration late). A plan it returns while the
        online sweep runs, or from a profiling iteration's stats, is not deployed (as
        :meth:`deploy` refuses then): the sweep sets the clocks it measures. A hook with a
        ``follow_frontier(frontier)`` method (a straggler runtime) gets each plan the session
        makes from its own (re-)profile, on every rank alike. The power hook
        (:attr:`power`) is asked first, so the others' plans go on it, within its cap."""
        self._boundary.add(hook)

    def remove_boundary_hook(self, hook: BoundaryHook) -> None:
        """Stop calling ``hook`` (no error if it was not added)."""
        self._boundary.remove(hook)

    @property
    def emulation_overruns(self) -> int:
        """Actions whose CPU compute exceeded the simulated time (0 when not emulating)."""
        return self._run.overruns

    def deploy(self, frontier: Frontier, point_index: int = 0) -> None:
        """Run ``frontier.points[point_index]`` from the next iteration on (call on every rank).

        Raises:
            PlanError: a frontier of another schedule, an index out of range, a running sweep.
            ConfigError: before :meth:`start` or after :meth:`close`.
        """
        if self._state in (SessionState.NEW, SessionState.CLOSED):
            when = "before start()" if self._state is SessionState.NEW else "after close()"
            raise ConfigError(f"RankSession.deploy() {when}; deploy while the session is open")
        self._boundary.check(frontier, point_index)
        if self._agent is None:
            self._install_frontier(frontier, point_index, sweep=False)
        elif self._sweep is not None:
            raise PlanError("RankSession.deploy() while the online sweep runs; wait for it")
        else:
            self._pending = (frontier, point_index)

    def allmax_plan(self) -> Frontier:
        """A one-point plan running every action at the highest clock (the baseline).

        Raises:
            PlanError: without a planning job (a bare plan file, or still profiling).
        """
        if self.job is None:
            raise PlanError(
                "RankSession.allmax_plan() needs the profile the plan was made for: pass "
                "plan=PlanFile(plan, profile), or wait for the online sweep to finish"
            )
        return self.job.frontier([self.job.point(self.job.allmax())])

    # ----------------------------------------------------------------------------------------
    # Iterations

    @contextmanager
    def iteration(self) -> Iterator[None]:
        """Context manager around one training iteration (one engine step + optimizer step).

        Collective over the pipeline's group on entry and on exit. On a real GPU the stats
        reach :attr:`history` and the hooks at the next exit (see the module docstring). An
        exception inside discards the iteration and leaves the session usable.

        Raises:
            ConfigError: before :meth:`start`, after :meth:`close`, or nested.
            PlanError: at exit, if the iteration ran fewer actions than one engine step.
        """
        if self._state is not SessionState.IDLE:
            raise ConfigError(
                {
                    SessionState.NEW: "RankSession.iteration() before start(); use `with session:`",
                    SessionState.IN_ITERATION: "RankSession.iteration() inside another one; "
                    "leave the first `with session.iteration():` before entering the next",
                    SessionState.CLOSED: "RankSession.iteration() after close()",
                }[self._state]
            )
        self._begin()
        try:
            yield
            if self.in_iteration:  # not closed inside
                self._end()
        except BaseException:  # in the loop, or marking the end (a device error, a signal)
            if self.in_iteration:
                self._abort_iteration()
            raise

    def _begin(self) -> None:
        agent = self._agent
        if self._pending is not None and agent is not None:
            (frontier, index), self._pending = self._pending, None
            # Only a plan not running already (a hook may return its decision every
            # iteration): each re-deploy restarted the summary's stretch and the drift watch.
            if frontier is not agent.plan or index != agent.point_index:
                agent.swap_plan(frontier, index)
                if self._sweep is None:  # a sweep plan is not the deployed frontier
                    self.frontier, self.point_index = frontier, index
                    self._run_start = self._iteration
                    self._drift.reset()
        # Back-to-back iterations share their boundary (counter steps cancel over a run); after
        # anything ran between them or a discarded one, every rank marks a fresh start.
        fresh = 1.0 if (self._ran_between or self._last_mark is None) else 0.0
        self._ran_between = False
        fresh = self._run.agree_start(fresh, self.group)
        last = self._last_mark
        if fresh or last is None:
            self._window = self._mark()
        else:
            self._window = last
            if isinstance(last, tuple):  # emulation: the devices idled since that end
                self._run.resume(last[0])
        self._state = SessionState.IN_ITERATION
        if agent is not None:
            try:
                agent.step_begin()
                self._run.first_clock(agent)
            except BaseException:  # (a counter read failed): no iteration, the session usable
                self._abort_iteration()
                raise

    def _end(self) -> None:
        """The iteration's end: marked on the device, its figures read now or at the next."""
        agent, start = self._agent, self._window
        assert start is not None  # set by _begin
        last_op, end = None, None
        if agent is not None:
            self._check_step(agent)
            last_op = agent.last_op_end_event
            self._run.closing()
            agent.step_close()
            if self._run.defers_start:  # a real GPU: its end is the agent's, read by the worker
                end = self._last_mark = agent.end_mark  # None: host timing, marked when read
        profiling, i = self._sweep is not None, self._iteration
        frontier = None if profiling else self.frontier
        self._ended.append(
            EndedIteration(i, start, end, last_op, profiling, self.point_index, frontier)
        )
        self._iteration = i + 1
        self._window = None
        self._state = SessionState.IDLE
        defer = end is not None and not profiling and not self.options.wait_for_figures
        self._deliver(keep=1 if defer else 0)

    def flush(self) -> None:
        """Deliver every ended iteration's figures now (:attr:`history`, the boundary hooks).
        Collective: call it on every rank, between iterations.

        Raises:
            ConfigError: inside an iteration.
        """
        if self._state is SessionState.IN_ITERATION:
            raise ConfigError("RankSession.flush() inside an iteration; call it between them")
        self._deliver(keep=0)

    def _deliver(self, keep: int) -> None:
        """Read the figures of every ended iteration but the last ``keep``, oldest first."""
        while len(self._ended) > keep:
            ended = self._ended.popleft()
            stats = self._read(ended)
            self._delivering = ended
            try:
                self._after_iteration(stats)
            finally:
                self._delivering = None

    def _read(self, ended: EndedIteration) -> IterationStats:
        """An ended iteration's figures, agreed over the pipeline (collective)."""
        agent = self._agent
        delivery = agent.finish_iteration().clock_delivery if agent is not None else None
        start = ended.start
        t0, e0 = start.resolve() if isinstance(start, CounterMark) else start
        own_end_s = t0 if ended.last_op is None else ended.last_op.device_time_s()
        if ended.end is not None:
            end_s, mj = ended.end.resolve()
        else:  # emulation (the ranks agree on the pipeline's end) or the host's view
            self._run.agree_end(own_end_s, self.group)
            end = self._mark()
            end_s, mj = end.resolve() if isinstance(end, CounterMark) else end
            self._last_mark = (end_s, mj)
        energy_j = (mj - e0) / 1000.0
        times, who = (t0, own_end_s, end_s), (self.rank, self.schedule.num_ranks, self.group)
        overruns = self._run.take_overruns()
        stats = agree_iteration(ended, times, energy_j, delivery, overruns, who)
        self.history.append(stats)
        if len(self.history) >= 2 * self.options.history_kept:  # one cut per `kept` iterations
            del self.history[: -self.options.history_kept]
        return stats

    def _check_step(self, agent: RankAgent) -> None:
        planned = len(agent.planned_clocks_mhz)
        done = agent.ops_done_this_iteration
        if done < planned:
            grid = agent.order_grid("iteration end")  # before the abort forgets where
            self._abort_iteration()
            raise PlanError(
                f"rank {self.rank}: the iteration ran {done} of the {planned} actions of "
                f"{self._one_step()} (evaluation and forward-only passes go between iterations)",
                grid,
            )

    def _one_step(self) -> str:
        call = self.engine.step_call
        return f"one engine step ({call}): run exactly one {call} per `with session.iteration():`"

    def _after_iteration(self, stats: IterationStats) -> None:
        """Advance the sweep or watch for drift, then ask the boundary hooks."""
        if stats.phase == "profile":
            self._sweep_boundary()
        elif (
            self._sweep is None
            and self._drift.update(stats)
            and isinstance(self.source, OnlineProfile)
            and clock_control_kept(self._agent, self.rank, self.group)  # the sweep sets clocks
        ):
            self._start_sweep(self.source)  # what drifted, re-plan: every rank alike
        profiling = self._sweep is not None or stats.phase == "profile"
        decision = self._boundary.decide(stats, self.power, profiling)
        if decision is not None:
            self._pending = decision
        if self._pending is not None and self._sweep is None:  # whichever hook decided last
            self._pending = self._boundary.within_cap(self._pending, self.power)

    def _abort_iteration(self) -> None:
        self._window = None
        self._last_mark = None
        self._state = SessionState.IDLE
        if self._agent is not None:
            self._agent.step_abort()
        if self._sweep is not None:
            self._sweep.discard_iteration()

    def _mark(self) -> tuple[float, int] | CounterMark:
        """A point on the device's timeline: (device time, energy counter in mJ)."""
        agent = self._agent
        events = agent.events if agent is not None else None
        if agent is None or events is None:  # no device timeline: the host's view
            return self.options.clock.now(), int(self.gpu.energy_mj())
        return self._run.mark(agent, events, self.gpu.energy_mj)

    # ----------------------------------------------------------------------------------------
    # Actions

    def op(self, action: Action) -> AbstractContextManager[Any]:
        """The context manager around one compute action (an ``OpContextFactory``).

        Outside an iteration (evaluation, forward-only passes, warm-up) the action runs
        untouched.

        Raises:
            PlanError: inside an iteration, if the action is beyond one engine step.
        """
        if self._state is not SessionState.IN_ITERATION:
            self._ran_between = True
            return contextlib.nullcontext()  # untouched
        agent = self._agent
        if agent is None:
            raise PlanError("RankSession: an action ran before a plan was deployed")
        if agent.ops_done_this_iteration >= len(agent.planned_clocks_mhz):
            raise PlanError(
                f"rank {self.rank}: action {action} is beyond the "
                f"{len(agent.planned_clocks_mhz)} actions of {self._one_step()}; for gradient "
                "accumulation raise the microbatch count instead"
            )
        return self._run.op(agent, action)  # the agent's own scope on a GPU: no extra layer

    # ----------------------------------------------------------------------------------------
    # Planning

    def _install(self, planned: Planned) -> None:
        self.job = planned.job if planned.job is not None else self.job
        if planned.profiled is not None:
            self.profiled = planned.profiled
        self._install_frontier(planned.frontier, self.point_index, sweep=False)

    def _install_frontier(self, frontier: Frontier, point_index: int, sweep: bool) -> None:
        self._boundary.check(frontier, point_index)
        if not sweep:  # a sweep "plan" is not a deployed frontier
            self.frontier, self.point_index = frontier, point_index
        if self._agent is not None:  # the running agent switches at the next iteration
            self._pending = (frontier, point_index)
            return
        o = self.options
        agent = RankAgent(
            frontier,
            self.gpu,
            self.rank,
            point_index=point_index,
            measure_op_energy=False,
            watchdog=o.watchdog,
            handle_signals=o.handle_signals,
            events=o.events,
            clock=clock_of(self.gpu, o.clock),  # the device's timeline, when it has one
            # Times a two-clock op's mid-op switch from the profile the plan was made for.
            op_time_s=profiled_op_time_s(self.job.profile) if self.job is not None else None,
        )
        agent.start()
        self._agent = agent

    def _start_sweep(self, options: OnlineProfile) -> None:
        agent, previous, only = self._agent, self.profiled, None
        if agent is not None and previous is not None:  # profiling again: the ops that drifted
            only = ops_to_profile(agent, self.schedule, previous, self.group)
        sweep = SessionSweep(
            options, self.schedule, self.rank, self.gpu, self.blocking_power_w, only, previous
        )
        self._install_frontier(sweep.sweep_plan(), 0, sweep=True)
        assert self._agent is not None  # just started
        sweep.start(self._agent)
        self._sweep = sweep

    def _stop_sweep(self) -> None:
        sweep, self._sweep = self._sweep, None
        if sweep is not None:
            sweep.close()

    def _sweep_boundary(self) -> None:
        """Advance the sweep; when every rank has finished, plan from the measured profile."""
        sweep, agent = self._sweep, self._agent
        if sweep is None or agent is None:
            return
        advanced = sweep.add_iteration(agent)
        if not sweep.finished_everywhere(self.group):
            if advanced:
                self._pending = (sweep.sweep_plan(), 0)
            return
        self._stop_sweep()
        rows = sweep.measured_rows(self.group)  # every rank refuses together on a poor fit
        self.clocks_profiled = sweep.profiler.clocks_profiled()
        # The options' point, as the first plan: an index a hook or deploy() chose on the
        # frontier replaced names another point of this one, or none (fewer points).
        self.point_index = self.options.point_index
        self._install(sweep.options.plan_measured(self._context(), rows))
        if self.frontier is not None:
            self._boundary.follow(self.frontier)
