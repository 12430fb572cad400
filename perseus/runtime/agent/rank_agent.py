"""The rank agent: runs one rank's part of a frequency plan inside the training loop.

::

    with RankAgent(plan, gpu, rank=rank) as agent:
        for batch in loader:
            agent.step_begin()
            for action in my_actions:                      # the schedule's order
                with agent.op(action):
                    run(action)
            record = agent.step_end()                     # time_s, energy_j of the iteration

Ops must arrive in the plan's order (else
:class:`~perseus.runtime.agent.rank_plan.OpOrderError`); they are timed on the device's
timeline or the host's (:mod:`perseus.runtime.agent.timing`). :class:`NullAgent` does nothing.
"""

from __future__ import annotations

import contextlib
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from perseus.device.base import GPU, DeviceEvent, EventSource, ObserveOnlyGPU
from perseus.device.clock import Clock, clock_of
from perseus.errors import DeviceError, PlanError
from perseus.plan import Frontier
from perseus.runtime.agent.controller import FrequencyController
from perseus.runtime.agent.events import CudaEventSource, event_source_for
from perseus.runtime.agent.gpu_probe import (
    lockable_memory_clocks,
    reset_clocks,
    warn_no_memory_clocks,
    warn_observe_only,
)
from perseus.runtime.agent.rank_plan import OpPhase, OpTimeFn, RankPlan
from perseus.runtime.agent.readback import HeldClockReport
from perseus.runtime.agent.records import AgentRecords, IterationRecord, NullAgent, OpRecord
from perseus.runtime.agent.timing import CounterMark, DeviceTiming, HostTiming, OpRow
from perseus.runtime.safety.guard import GpuClaim
from perseus.schedule.actions import Action, Kind

__all__ = ["NullAgent", "RankAgent", "make_agent"]


def _no_energy() -> int:  # no GPU, or per-op reads off: no counter read
    return 0


@dataclass(slots=True, eq=False)
class _OpScope:
    """The context manager ``agent.op(...)`` returns; one instance reused for every op."""

    _agent: RankAgent

    def __enter__(self) -> None:
        self._agent._enter_op()

    def __exit__(self, *exc: object) -> None:
        self._agent._exit_op()


class RankAgent:
    """Applies one rank's clocks from a plan and measures the rank's ops and iterations.

    The constructor validates and does no I/O: :meth:`start` (or ``with``) does.

    Args:
        plan: A plan (a frontier with one point) or a frontier.
        gpu: The rank's GPU, or None to only check the op order and time it.
        rank: This process's pipeline rank (index into ``plan.stage_ops``).
        point_index: Which point of ``plan`` to run.
        enabled: False measures time and energy but never changes clocks (no ownership).
        watchdog: Start the watchdog process (needs a GPU with ``watchdog_spec``).
        handle_signals: Install SIGTERM/SIGINT handlers (main thread only) besides atexit.
        measure_op_energy: Host timing: read the energy counter around each op (off: per-op
            energy 0). Device timing ignores it (``FrequencyController(stamp_ops=)``).
        max_op_records: Per-op records kept, and as many iteration records (oldest first out).
        timing: ``"device"`` (clocks and times on device events when the GPU has them) or
            ``"host"`` (the host's view; :mod:`perseus.runtime.agent.timing`).
        events: The event source (default: :func:`~perseus.runtime.agent.events.event_source_for`).
        op_time_s: :data:`~perseus.runtime.agent.rank_plan.OpTimeFn`, to time a phased op's
            mid-op switches (without it: from earlier iterations; the first runs two-clock
            ops at their first clock only).
        clock: Where host times are read and the clock worker sleeps (default: the GPU's
            own). A virtual one runs the worker inline, on the training thread (tests).

    Raises:
        PlanError: if ``rank`` or ``point_index`` is out of range, ``timing`` is neither, or
            the plan has two-clock ops without ``job.layers_per_stage``.
    """

    def __init__(
        self,
        plan: Frontier,
        gpu: GPU | None,
        rank: int,
        *,
        point_index: int = 0,
        enabled: bool = True,
        watchdog: bool = True,
        handle_signals: bool = True,
        measure_op_energy: bool = True,
        max_op_records: int = 100_000,
        timing: str = "device",
        events: EventSource | None = None,
        op_time_s: OpTimeFn | None = None,
        clock: Clock | None = None,
    ) -> None:
        if timing not in ("device", "host"):
            raise PlanError(f"timing must be 'device' or 'host', got {timing!r}")
        self.rank = rank
        self.gpu = gpu
        self.enabled = enabled and gpu is not None
        self._use_watchdog = watchdog
        self._handle_signals = handle_signals
        # Bound once: the hot path makes one call and no branch.
        self._energy_iter: Callable[[], int] = gpu.energy_mj if gpu is not None else _no_energy
        self._energy_mj: Callable[[], int] = (
            gpu.energy_mj if measure_op_energy and gpu is not None else _no_energy
        )
        self._clock = clock if clock is not None else clock_of(gpu)
        self._controller: FrequencyController | None = None
        self._claim: GpuClaim | None = None  # ownership, watchdog, exit hooks
        self._started = False
        self._clocks: tuple[int, ...] = ()  # ascending
        self._mem_clocks: tuple[int, ...] = ()  # lockable memory clocks, ascending (or none)
        self._mem_warned = False
        self._scope = _OpScope(self)
        self._op_args: tuple[Kind | str, int, int | None] = (Kind.F, 0, None)
        self._ops: deque[OpRow] = deque(maxlen=max_op_records)
        self._op_time_fn = op_time_s
        self._iterations: deque[IterationRecord] = deque(maxlen=max_op_records)
        self._iteration = 0
        self._cursor = 0
        self._in_step = False
        self._pending_plan: RankPlan | None = None
        self._closed: deque[tuple[int, int, int, float]] = deque()  # unread: it, point, ops, T
        self.end_mark: CounterMark | None = None  # the last end on the device (None: host)
        self._timing = timing
        self._events: EventSource | None = events
        self._device_timed = False
        self._stamp_ops = True
        self._mode: DeviceTiming | HostTiming = self._host_timing()
        self._held_report: HeldClockReport | None = None
        self._set_plan(RankPlan.of(plan, point_index, rank))

    # -----------------------------------------------------------------------------------------
    # Plan handling

    def _set_plan(self, rank_plan: RankPlan) -> None:
        self.plan = rank_plan.plan
        self.point_index = rank_plan.point_index
        self._rank_plan = rank_plan
        self._actions = rank_plan.actions
        self._snap_plan()

    def _snap_plan(self) -> None:
        rank_plan = self._rank_plan
        mem = self._mem_clocks if rank_plan.uses_memory_clocks else ()
        if rank_plan.uses_memory_clocks and self._clocks and self.enabled and not mem:
            if not self._mem_warned:
                warn_no_memory_clocks(self.rank, self.gpu)
            self._mem_warned = True
        self._mode.set(self._actions, rank_plan.snapped(self._clocks, mem))

    def _host_timing(self) -> HostTiming:
        return HostTiming(
            self._controller,
            self._clock,
            self._energy_mj,
            self._energy_iter,
            record_op=self._ops.append,
            rank=self.rank,
        )

    @property
    def planned_clocks_mhz(self) -> tuple[int, ...]:
        """This rank's SM clock per op (a phased op's first), snapped once started."""
        return self._mode.freqs

    @property
    def planned_phases(self) -> tuple[tuple[OpPhase, ...], ...]:
        """Each op's phases as run: clocks snapped (memory None: not set or not lockable)."""
        return self._mode.phases

    def _mid_time_s(self, j: int, i: int) -> float | None:
        phases = self._mode.phases[j]
        if self._op_time_fn is not None:
            return self._rank_plan.phase_start_s(j, i, phases, self._op_time_fn)
        mode = self._mode
        if not isinstance(mode, DeviceTiming):
            return None
        return mode.history.phase_start_s(j, phases, i)

    def swap_plan(self, plan: Frontier, point_index: int = 0) -> None:
        """Run ``plan`` from the next :meth:`step_begin` on (safe from another thread).

        Raises:
            PlanError: if the new plan's ops for this rank differ from the current ones (a plan
                for another schedule) or ``point_index`` is out of range.
        """
        rank_plan = RankPlan.of(plan, point_index, self.rank)
        if rank_plan.actions != self._actions:
            raise PlanError(
                f"rank {self.rank}: the new plan's ops differ from the running plan's; swap only "
                "between plans of the same job"
            )
        self._pending_plan = rank_plan

    # -----------------------------------------------------------------------------------------
    # Lifecycle

    @property
    def observe_only(self) -> bool:
        """True when clocks are not being changed (disabled, no privilege, unsupported)."""
        return not self.enabled or (self._controller is not None and self._controller.observe_only)

    @property
    def controller(self) -> FrequencyController | None:
        return self._controller

    def start(self) -> RankAgent:
        """Take ownership of the GPU and start the clock worker, watchdog and exit hooks.

        Raises:
            DeviceBusyError: if another agent owns the GPU.
            DeviceError: if the watchdog cannot start or the GPU cannot be read.
        """
        if self._started:
            return self
        gpu = self.gpu
        if gpu is not None:
            self._probe(gpu)
        if self.enabled and gpu is not None:
            self._claim = GpuClaim(
                gpu,
                watchdog=self._use_watchdog,
                handle_signals=self._handle_signals,
                on_exit=self._emergency_close,
            ).acquire()
            try:
                if self._controller is None:
                    self._controller = self._new_controller(gpu, control=True)
                self._controller.start()
            except BaseException:
                self._teardown(reset=False)
                raise
            # No clock is set before step_begin(): set-up runs at the GPU's default clock.
        elif gpu is not None and self._device_timed:
            # Observe-only: no ownership, no watchdog; the worker only reads (the counter, and
            # the clocks the driver chose where the GPU reads them back).
            self._controller = self._new_controller(gpu, control=False)
            self._controller.start()
        self._install_mode()
        self._started = True
        return self

    def _probe(self, gpu: GPU) -> None:
        self._clocks = tuple(sorted(gpu.supported_clocks_mhz()))  # opens an NVML device
        reason = gpu.observe_only_reason if isinstance(gpu, ObserveOnlyGPU) else None
        if self.enabled and reason is not None:
            warn_observe_only(gpu, reason)
            self.enabled = False
        if self._timing == "device" and self._events is None:
            self._events = event_source_for(gpu)
        self._device_timed = self._timing == "device" and self._events is not None
        # CUDA events carry no counter reading; NVML's is too coarse to read per op
        self._stamp_ops = not isinstance(self._events, CudaEventSource)
        self._mem_clocks = lockable_memory_clocks(gpu) if self.enabled else ()
        self._held_report = HeldClockReport(self.rank, gpu.name)
        self._snap_plan()

    def _new_controller(self, gpu: GPU, *, control: bool) -> FrequencyController:
        return FrequencyController(
            gpu,
            events=self._events if self._device_timed else None,
            control=control,
            stamp_ops=self._stamp_ops,
            clock=self._clock,
        )

    def _install_mode(self) -> None:
        mode: DeviceTiming | HostTiming
        if self._device_timed:
            events = self._events
            assert events is not None
            mode = DeviceTiming(
                events,
                self._controller,
                self._energy_iter,
                stamp_ops=self._stamp_ops,
                mid_time_s=self._mid_time_s,
                record_ops=self._ops.extend,
                recycle=events.recycle if isinstance(events, CudaEventSource) else None,
            )
            if isinstance(self._mode, DeviceTiming):
                mode.history = self._mode.history  # a restart keeps what it learnt
        else:
            mode = self._mode if isinstance(self._mode, HostTiming) else self._host_timing()
            mode.controller = self._controller
        mode.set(self._actions, self._mode.phases)
        self._mode = mode

    def close(self) -> None:
        """Reset the GPU's clock, stop the worker and watchdog, release ownership (idempotent).
        Closing inside an iteration discards that iteration (a restart begins afresh).

        Raises:
            DeviceError: if the reset failed for a reason other than missing privilege (the
                agent is fully shut down anyway).
        """
        if not self._started:
            return
        if self._in_step:  # the loop raised inside it: `with agent:` closes here
            self.step_abort()
        # Started until torn down: a close() cut short (a signal, KeyboardInterrupt) before
        # its reset leaves the exit hooks (and a second close) to reset the GPU.
        error = self._teardown(reset=True)
        self._started = False
        if error is not None:
            raise error

    def _emergency_close(self) -> None:
        """atexit / signal path: close() that never raises nor takes a lock the interrupted
        thread may hold."""
        if self._started:
            self._started = False
            with contextlib.suppress(Exception):
                self._teardown(reset=True, emergency=True)

    def _teardown(self, reset: bool, emergency: bool = False) -> DeviceError | None:
        """Stop the worker, reset the clocks (``reset``), release the claim; the reset's error."""
        ctl = self._controller
        if ctl is not None:
            if emergency:
                ctl.close_nowait()
            else:
                ctl.close()
        error = None
        if reset and self.enabled and self.gpu is not None and self._claim is not None:
            error = reset_clocks(self.gpu, ctl)
        self._controller = None
        if self._claim is not None:
            self._claim.release()
            self._claim = None
        return error

    def __enter__(self) -> RankAgent:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        # Do not mask the training loop's exception with a reset error.
        with contextlib.suppress(DeviceError) if exc_type else contextlib.nullcontext():
            self.close()

    def wait_for_clock(self, timeout_s: float = 1.0, phase: int = 0) -> bool:
        """Block until the current op's clock (the next op's between ops; ``phase``: that
        phase's, of a phased op) is applied (tests, doctor, emulation); True if it was."""
        ctl = self._controller
        if ctl is None:
            return True
        if not self._device_timed:
            return ctl.flush(timeout_s)
        phases = self._mode.phases
        if not phases or (not self._in_step and self._iteration == 0):
            return True  # no clock is set before the first step_begin()
        j = min(self._cursor, len(phases) - 1) if self._in_step else 0
        return ctl.wait_applied(phases[j][phase].freq_mhz, timeout_s)

    def switch_shares(self) -> tuple[float, ...]:
        """Inside a device-timed phased op: the shares of its work at which the clock worker
        sets its later phases' clocks (empty: none, or the op's end is recorded)."""
        mode = self._mode
        return mode.switch_shares() if isinstance(mode, DeviceTiming) else ()

    # -----------------------------------------------------------------------------------------
    # Per-iteration and per-op hooks (hot path)

    def step_begin(self) -> None:
        """Start an iteration; a plan passed to :meth:`swap_plan` takes effect here.

        Raises:
            PlanError: if the previous iteration was not ended.
            DeviceError: if the energy counter cannot be read here (host timing, or no clock
                worker). The clock worker's errors are not raised: they turn it observe-only
                (or drop memory clocks), with a warning.
        """
        if self._in_step:
            raise PlanError(
                f"rank {self.rank}: step_begin() called twice; call step_end() after each iteration"
            )
        pending = self._pending_plan
        if pending is not None:
            self._pending_plan = None
            self._set_plan(pending)
        self._cursor = 0
        self._mode.begin(self._iteration)  # may raise: the iteration has not begun then
        self._in_step = True

    def step_end(self) -> IterationRecord:
        """End the iteration and return its record (reading first any left unread before it);
        raises as :meth:`step_close`."""
        self.step_close()
        return [self.finish_iteration() for _ in range(len(self._closed))][-1]

    def step_close(self) -> None:
        """End the iteration without waiting: its end is marked on the device (``end_mark``;
        the worker reads the counter there); :meth:`finish_iteration` returns its record.

        Raises:
            PlanError: if the iteration ran fewer ops than the plan has for this rank.
        """
        if not self._in_step:
            raise PlanError(f"rank {self.rank}: step_end() without step_begin()")
        self._in_step = False
        n = len(self._actions)
        if self._cursor != n:
            self._mode.abort()
            nxt = self.plan.op_name(self._actions[self._cursor])
            raise PlanError(
                f"rank {self.rank}: iteration {self._iteration} ended after {self._cursor} of {n} "
                f"planned ops; the next planned op was {nxt!r}",
                self.order_grid("step_end()"),
            )
        self.end_mark = self._mode.close(self._iteration)
        planned_time_s = self.plan.points[self.point_index].time_s
        self._closed.append((self._iteration, self.point_index, n, planned_time_s))
        self._iteration += 1

    def finish_iteration(self) -> IterationRecord:
        """The oldest unread record of :meth:`step_close`; waits for the worker to pass its end.

        Raises:
            PlanError: when every ended iteration was read already.
        """
        if not self._closed:
            raise PlanError(f"rank {self.rank}: finish_iteration() with no iteration left unread")
        iteration, point_index, n, planned_time_s = self._closed.popleft()
        time_s, energy_j, mid_switches, mid_missed, delivery = self._mode.finish()
        if self._held_report is not None:
            self._held_report.update(delivery, iteration)
        record = IterationRecord(
            iteration=iteration,
            point_index=point_index,
            time_s=time_s,
            energy_j=energy_j,
            num_ops=n,
            planned_time_s=planned_time_s,
            mid_op_switches=mid_switches,
            mid_op_switches_missed=mid_missed,
            clock_delivery=delivery,
        )
        self._iterations.append(record)
        return record

    @property
    def last_op_end_event(self) -> DeviceEvent | None:
        """The end event of the op the host left last (device timing only)."""
        return self._mode.last_end_event

    @property
    def events(self) -> EventSource | None:
        """The device-event source in use (None: host timing)."""
        return self._events if self._device_timed else None

    @property
    def clock(self) -> Clock:
        """Where host times are read and the clock worker waits."""
        return self._clock

    @property
    def device_timed(self) -> bool:
        """True when clocks and op times follow device events."""
        return self._device_timed

    def step_abort(self) -> None:
        """Discard the current iteration (the loop raised inside it; no-op outside one)."""
        self._in_step = False
        self._cursor = 0
        self._mode.abort()

    def order_grid(self, ran: str) -> str:
        """This rank's planned ops as a grid, the next one due and ``ran`` in its place
        marked (an iteration cut short: ``ran`` says where it ended)."""
        return self._rank_plan.order_grid(self._cursor, ran)

    @property
    def ops_done_this_iteration(self) -> int:
        """Ops of the current iteration entered so far."""
        return self._cursor

    def op(
        self,
        kind: Action | Kind | str,
        microbatch_index: int | None = None,
        stage_index: int | None = None,
    ) -> _OpScope:
        """Context manager around one op: checks it is the planned op and times it.

        Args:
            kind: The op (an :class:`~perseus.schedule.Action`, its stage checked) or its kind
                (``"F"``, ``"B"``, ``"W"`` or a :class:`Kind`).
            microbatch_index: The op's microbatch (with a kind).
            stage_index: The op's stage; checked when given.

        Raises:
            TypeError: for a kind without a microbatch.
            PlanError: on entering, if this is not the op the plan expects next.
        """
        if isinstance(kind, Action):
            self._op_args = (kind.kind, kind.microbatch_index, kind.stage_index)
        elif microbatch_index is None:
            raise TypeError("op() takes an Action, or a kind and a microbatch_index")
        else:
            self._op_args = (kind, microbatch_index, stage_index)
        return self._scope

    def _enter_op(self) -> None:
        kind, mb, stage = self._op_args
        j = self._cursor
        if not self._in_step or j >= len(self._actions):
            self._op_order_error(j)
        a = self._actions[j]
        if kind != a.kind or mb != a.microbatch_index or stage not in (None, a.stage_index):
            self._op_order_error(j)
        self._mode.enter(j)

    def mark_op_end(self) -> None:
        """Record the current op's end event now, before the host leaves the op (emulation:
        the op is fully launched). A no-op under host timing."""
        self._mode.mark_end()

    def _exit_op(self) -> None:
        j = self._cursor
        self._mode.exit(j)
        self._cursor = j + 1

    def _op_order_error(self, j: int) -> None:
        raise self._rank_plan.order_error(
            j, *self._op_args, in_step=self._in_step, iteration=self._iteration
        )

    # -----------------------------------------------------------------------------------------
    # Results

    @property
    def records(self) -> AgentRecords:
        """Per-op and per-iteration records so far."""
        return AgentRecords(
            ops=tuple(OpRecord(*r) for r in self._ops), iterations=tuple(self._iterations)
        )

    def recent_ops(self, count: int) -> tuple[OpRecord, ...]:
        """The last ``count`` per-op records, oldest first (without building :attr:`records`)."""
        rows = list(itertools.islice(reversed(self._ops), count))
        return tuple(OpRecord(*r) for r in reversed(rows))

    @property
    def iteration(self) -> int:
        """Number of completed iterations."""
        return self._iteration


def make_agent(
    plan: Frontier | None, gpu: GPU | None, rank: int, *, enabled: bool = True, **kwargs: Any
) -> RankAgent | NullAgent:
    """A :class:`RankAgent`, or a :class:`NullAgent` when there is no plan, no GPU or
    ``enabled`` is False."""
    if plan is None or gpu is None or not enabled:
        return NullAgent(plan, gpu, rank)
    return RankAgent(plan, gpu, rank, **kwargs)
