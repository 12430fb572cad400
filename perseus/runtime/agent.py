"""The rank agent: runs one rank's part of a frequency plan inside the training loop.

::

    with RankAgent(plan, gpu, rank=rank) as agent:
        for batch in loader:
            agent.step_begin()
            for action in my_actions:                      # the schedule's order
                with agent.op(action.kind, action.microbatch_index):
                    run(action)
            record = agent.step_end()                     # time_s, energy_j of the iteration

Before each op the agent posts the op's planned clock to a :class:`FrequencyController`
(worker thread; the training thread never waits on the driver), and after it posts the next
op's clock so the change overlaps the gap between ops. It checks that the ops arrive in the
order of ``plan.stage_ops[rank]`` and raises :class:`~perseus.errors.PlanError` naming the
expected and actual op otherwise; it records each op's and each iteration's time and energy
from the device counter. :meth:`RankAgent.swap_plan` changes the plan at the next iteration
boundary. Safety (one owner per GPU, reset on exit, signals and owner death) is in
:mod:`perseus.runtime.safety`.

:class:`NullAgent` has the same surface and does nothing, for runs without a GPU or with
perseus disabled.
"""

from __future__ import annotations

import contextlib
import re
import time
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from perseus.device.base import GPU, ManagedGPU, ObserveOnlyWarning
from perseus.device.sim_state import default_lock_dir, owner_lock_path
from perseus.errors import DeviceError, DevicePermissionError, PlanError
from perseus.plan import Frontier
from perseus.runtime.controller import FrequencyController
from perseus.runtime.safety import ExitGuard, GpuOwnership, Watchdog
from perseus.schedule.actions import Kind

__all__ = ["AgentRecords", "IterationRecord", "NullAgent", "OpRecord", "RankAgent", "make_agent"]


def _no_energy() -> int:
    return 0


_OP_RE = re.compile(r"^([FBW])(\d+)(?:@(\d+))?$")


@dataclass(frozen=True, slots=True)
class OpRecord:
    """One op as measured on this rank (energy from the device counter, 100 ms granular)."""

    iteration: int
    index: int
    name: str
    freq_mhz: int
    time_s: float
    energy_j: float


@dataclass(frozen=True, slots=True)
class IterationRecord:
    """One iteration on this rank: wall time between step_begin/step_end and GPU energy."""

    iteration: int
    point_index: int
    time_s: float
    energy_j: float
    num_ops: int
    planned_time_s: float


@dataclass(frozen=True, slots=True)
class AgentRecords:
    """Everything an agent measured (per-op records are capped at ``max_op_records``)."""

    ops: tuple[OpRecord, ...]
    iterations: tuple[IterationRecord, ...]


class _OpScope:
    """The context manager ``agent.op(...)`` returns; one instance reused for every op."""

    __slots__ = ("_agent",)

    def __init__(self, agent: RankAgent) -> None:
        self._agent = agent

    def __enter__(self) -> None:
        self._agent._enter_op()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._agent._exit_op()


def _parse_ops(ops: tuple[str, ...], rank: int) -> tuple[tuple[str, int, int], ...]:
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


class RankAgent:
    """Applies one rank's clocks from a plan and measures the rank's ops and iterations.

    The constructor validates and does no I/O; :meth:`start` (or ``with``) takes ownership of
    the GPU, starts the watchdog and the clock worker, and installs exit hooks.

    Args:
        plan: A plan (a frontier with one point) or a frontier.
        gpu: The rank's GPU, or None to only check the op order and time it.
        rank: This process's pipeline rank (index into ``plan.stage_ops``).
        point_index: Which point of ``plan`` to run.
        controller: A controller to use instead of a fresh :class:`FrequencyController`.
        enabled: False measures time and energy but never changes clocks (no ownership).
        watchdog: Start the watchdog process (needs a GPU with ``watchdog_spec``).
        handle_signals: Install SIGTERM/SIGINT handlers (main thread only) besides atexit.
        measure_op_energy: Read the energy counter around each op (two cheap reads).
        prefetch: Post the next op's clock when an op ends.
        max_op_records: Per-op records kept (oldest dropped first).

    Raises:
        PlanError: if ``rank`` or ``point_index`` is out of range or an op name is malformed.
    """

    def __init__(
        self,
        plan: Frontier,
        gpu: GPU | None,
        rank: int,
        *,
        point_index: int = 0,
        controller: FrequencyController | None = None,
        enabled: bool = True,
        watchdog: bool = True,
        handle_signals: bool = True,
        measure_op_energy: bool = True,
        prefetch: bool = True,
        max_op_records: int = 100_000,
    ) -> None:
        if not 0 <= rank < len(plan.stage_ops):
            raise PlanError(
                f"rank {rank} is out of range: the plan has {len(plan.stage_ops)} ranks"
            )
        self.rank = rank
        self.gpu = gpu
        self.enabled = enabled and gpu is not None
        self._use_watchdog = watchdog
        self._handle_signals = handle_signals
        # Bound once so the hot path makes one call and no branch.
        self._energy_iter: Callable[[], int] = gpu.energy_mj if gpu is not None else _no_energy
        self._energy_mj: Callable[[], int] = (
            gpu.energy_mj if measure_op_energy and gpu is not None else _no_energy
        )
        self._prefetch = prefetch
        self._controller = controller if self.enabled else None
        self._own_controller = controller is None
        self._ownership: GpuOwnership | None = None
        self._watchdog: Watchdog | None = None
        self._guard: ExitGuard | None = None
        self._started = False
        self._clocks: tuple[int, ...] = ()
        self._snap_cache: dict[int, int] = {}
        self._scope = _OpScope(self)
        self._op_args: tuple[Any, int, int | None] = (Kind.F, 0, None)
        self._ops: deque[tuple[int, int, str, int, float, float]] = deque(maxlen=max_op_records)
        self._iterations: list[IterationRecord] = []
        self._iteration = 0
        self._cursor = 0
        self._in_step = False
        self._t_step = 0.0
        self._e_step = 0
        self._t_op = 0.0
        self._e_op = 0
        self._pending_plan: tuple[Frontier, int] | None = None
        self._set_plan(plan, point_index)

    # -----------------------------------------------------------------------------------------
    # Plan handling

    def _set_plan(self, plan: Frontier, point_index: int) -> None:
        if not 0 <= point_index < len(plan.points):
            raise PlanError(
                f"point_index {point_index} is out of range: the plan has {len(plan.points)} points"
            )
        ops = plan.stage_ops[self.rank]
        self.plan = plan
        self.point_index = point_index
        self._names = ops
        self._expected = _parse_ops(ops, self.rank)
        self._planned_mhz = plan.points[point_index].freqs_mhz[self.rank]
        self._freqs = tuple(self._snap(f) for f in self._planned_mhz)

    def _snap(self, freq_mhz: int) -> int:
        if not self._clocks:
            return freq_mhz
        hit = self._snap_cache.get(freq_mhz)
        if hit is None:
            hit = min(self._clocks, key=lambda c: (abs(c - freq_mhz), -c))
            self._snap_cache[freq_mhz] = hit
        return hit

    @property
    def planned_clocks_mhz(self) -> tuple[int, ...]:
        """This rank's clock per op, snapped to the GPU's supported list once started."""
        return self._freqs

    def swap_plan(self, plan: Frontier, point_index: int = 0) -> None:
        """Run ``plan`` from the next :meth:`step_begin` on (safe from another thread).

        Raises:
            PlanError: if the new plan's ops for this rank differ from the current ones (a plan
                for another schedule) or ``point_index`` is out of range.
        """
        if len(plan.stage_ops) <= self.rank or plan.stage_ops[self.rank] != self._names:
            raise PlanError(
                f"rank {self.rank}: the new plan's ops differ from the running plan's; swap only "
                "between plans of the same job"
            )
        if not 0 <= point_index < len(plan.points):
            raise PlanError(
                f"point_index {point_index} is out of range: the plan has {len(plan.points)} points"
            )
        self._pending_plan = (plan, point_index)

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
            self._clocks = gpu.supported_clocks_mhz()  # opens an NVML device
            self._freqs = tuple(self._snap(f) for f in self._planned_mhz)
            reason = getattr(gpu, "observe_only_reason", None)
            if self.enabled and reason is not None:
                # Known before any set call (privilege probe, pre-Volta): say it once, and
                # neither own the GPU nor start a watchdog for clocks we cannot change.
                warnings.warn(
                    f"perseus: cannot lock clocks on {gpu.name}; observe-only mode (time and "
                    f"energy are still measured): {reason}",
                    ObserveOnlyWarning,
                    stacklevel=2,
                )
                self.enabled = False
                self._controller = None
        if self.enabled and gpu is not None:
            managed = gpu if isinstance(gpu, ManagedGPU) else None
            if managed is not None:
                lock_path = managed.owner_lock_path()
            else:
                lock_path = owner_lock_path(default_lock_dir(), gpu.uuid)
            self._ownership = GpuOwnership(gpu.uuid, lock_path)
            self._ownership.acquire()
            try:
                if self._use_watchdog and managed is not None:
                    self._watchdog = Watchdog(managed.watchdog_spec(), lock_path)
                    self._watchdog.start()
                self._guard = ExitGuard(
                    self._emergency_close,
                    signals=ExitGuard.DEFAULT_SIGNALS if self._handle_signals else (),
                )
                self._guard.install()
                if self._controller is None:
                    self._controller = FrequencyController(gpu)
                self._controller.start()
            except BaseException:
                self._teardown(reset=False)
                raise
        self._started = True
        return self

    def close(self) -> None:
        """Reset the GPU's clock, stop the worker and watchdog, release ownership (idempotent).

        Raises:
            DeviceError: if the reset failed for a reason other than missing privilege (the
                agent is fully shut down anyway).
        """
        if not self._started:
            return
        self._started = False
        self._teardown(reset=True)

    def _emergency_close(self) -> None:
        """atexit / signal path: like close() but never raises."""
        if self._started:
            self._started = False
            with contextlib.suppress(Exception):
                self._teardown(reset=True)

    def _teardown(self, reset: bool) -> None:
        error: DeviceError | None = None
        ctl = self._controller
        if ctl is not None:
            ctl.close()
        if reset and self.enabled and self.gpu is not None and self._ownership is not None:
            lock = ctl.device_lock if ctl is not None else None
            acquired = lock.acquire(timeout=2.0) if lock is not None else False
            try:
                self.gpu.reset_locked_clock()
            except DevicePermissionError:
                pass  # observe-only: nothing was locked by us
            except DeviceError as e:
                error = e
            finally:
                if acquired and lock is not None:
                    lock.release()
        if self._own_controller and self.enabled:
            self._controller = None
        if self._watchdog is not None:
            self._watchdog.stop()
            self._watchdog = None
        if self._ownership is not None:
            self._ownership.release()
            self._ownership = None
        if self._guard is not None:
            self._guard.uninstall()
            self._guard = None
        if error is not None:
            raise error

    def __enter__(self) -> RankAgent:
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
            # Do not mask the training loop's exception with a reset error.
            with contextlib.suppress(DeviceError):
                self.close()

    def wait_for_clock(self, timeout_s: float = 1.0) -> bool:
        """Block until the last posted clock is applied (tests, emulation); True if it was."""
        if self._controller is None:
            return True
        return self._controller.flush(timeout_s)

    # -----------------------------------------------------------------------------------------
    # Per-iteration and per-op hooks (hot path)

    def step_begin(self) -> None:
        """Start an iteration; a plan passed to :meth:`swap_plan` takes effect here.

        Raises:
            PlanError: if the previous iteration was not ended.
            DeviceError: an error the clock worker hit since the last call.
        """
        if self._in_step:
            raise PlanError(
                f"rank {self.rank}: step_begin() called twice; call step_end() after each iteration"
            )
        pending = self._pending_plan
        if pending is not None:
            self._pending_plan = None
            self._set_plan(*pending)
        self._cursor = 0
        self._in_step = True
        if self._controller is not None and self._freqs:
            self._controller.request(self._freqs[0])
        self._e_step = self._energy_iter()
        self._t_step = time.perf_counter()

    def step_end(self) -> IterationRecord:
        """End the iteration and return its record.

        Raises:
            PlanError: if the iteration ran fewer ops than the plan has for this rank.
        """
        t = time.perf_counter()
        e = self._energy_iter()
        if not self._in_step:
            raise PlanError(f"rank {self.rank}: step_end() without step_begin()")
        self._in_step = False
        n = len(self._names)
        if self._cursor != n:
            raise PlanError(
                f"rank {self.rank}: iteration {self._iteration} ended after {self._cursor} of "
                f"{n} planned ops; the next planned op was {self._names[self._cursor]!r}"
            )
        record = IterationRecord(
            iteration=self._iteration,
            point_index=self.point_index,
            time_s=t - self._t_step,
            energy_j=(e - self._e_step) / 1000.0,
            num_ops=n,
            planned_time_s=self.plan.points[self.point_index].time_s,
        )
        self._iterations.append(record)
        self._iteration += 1
        return record

    def step_abort(self) -> None:
        """Discard the current iteration (the training loop raised inside it); no record.

        The next :meth:`step_begin` starts afresh; a no-op outside an iteration.
        """
        self._in_step = False
        self._cursor = 0

    @property
    def ops_done_this_iteration(self) -> int:
        """Ops of the current iteration entered so far."""
        return self._cursor

    def op(
        self, kind: Kind | str, microbatch_index: int, stage_index: int | None = None
    ) -> _OpScope:
        """Context manager around one op: sets its clock first, checks it is the planned op.

        Args:
            kind: ``"F"``, ``"B"``, ``"W"`` or a :class:`Kind`.
            microbatch_index: The op's microbatch.
            stage_index: The op's stage; checked when given (needed only to tell apart ops of
                ranks holding several stages, which the microbatch order already does).

        Raises:
            PlanError: on entering, if this is not the op the plan expects next.
        """
        self._op_args = (kind, microbatch_index, stage_index)
        return self._scope

    def _enter_op(self) -> None:
        kind, mb, stage = self._op_args
        j = self._cursor
        if not self._in_step or j >= len(self._expected):
            self._op_order_error(j)
        exp_kind, exp_mb, exp_stage = self._expected[j]
        if kind != exp_kind or mb != exp_mb or (stage is not None and stage != exp_stage):
            self._op_order_error(j)
        if self._controller is not None:
            self._controller.request(self._freqs[j])
        self._e_op = self._energy_mj()
        self._t_op = time.perf_counter()

    def _exit_op(self) -> None:
        t = time.perf_counter()
        e = self._energy_mj()
        j = self._cursor
        self._ops.append(
            (
                self._iteration,
                j,
                self._names[j],
                self._freqs[j],
                t - self._t_op,
                (e - self._e_op) / 1000.0,
            )
        )
        self._cursor = j + 1
        if self._prefetch and self._controller is not None and j + 1 < len(self._freqs):
            self._controller.request(self._freqs[j + 1])

    def _op_order_error(self, j: int) -> None:
        kind, mb, stage = self._op_args
        k = kind.value if isinstance(kind, Kind) else str(kind)
        actual = f"{k}{mb}" + (f"@{stage}" if stage is not None else "")
        if not self._in_step:
            raise PlanError(
                f"rank {self.rank}: op {actual!r} ran outside an iteration; call step_begin() first"
            )
        n = len(self._names)
        if j >= n:
            raise PlanError(
                f"rank {self.rank}: op {actual!r} is op {j + 1} of iteration {self._iteration}, "
                f"but the plan has only {n} ops for this rank; call step_end() after the last"
            )
        window = " ".join(self._names[max(0, j - 2) : j + 3])
        raise PlanError(
            f"rank {self.rank}: plan expects op {j} of iteration {self._iteration} to be "
            f"{self._names[j]!r} but the training loop ran {actual!r} (plan ops around it: "
            f"{window}); the plan was computed for another schedule or microbatch count"
        )

    # -----------------------------------------------------------------------------------------
    # Results

    @property
    def records(self) -> AgentRecords:
        """Per-op and per-iteration records so far."""
        return AgentRecords(
            ops=tuple(OpRecord(*r) for r in self._ops), iterations=tuple(self._iterations)
        )

    @property
    def iteration(self) -> int:
        """Number of completed iterations."""
        return self._iteration


class NullAgent:
    """The agent to use without a GPU or with perseus disabled: every hook does nothing."""

    rank: int
    observe_only = True
    enabled = False

    def __init__(
        self, plan: Frontier | None = None, gpu: GPU | None = None, rank: int = 0, **_kwargs: Any
    ) -> None:
        self.rank = rank
        self.plan = plan
        self.gpu = gpu

    def start(self) -> NullAgent:
        return self

    def close(self) -> None:
        pass

    def __enter__(self) -> NullAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def step_begin(self) -> None:
        pass

    def step_end(self) -> None:
        return None

    def op(
        self, kind: Kind | str, microbatch_index: int, stage_index: int | None = None
    ) -> contextlib.nullcontext[None]:
        return _NULL_SCOPE

    def swap_plan(self, plan: Frontier, point_index: int = 0) -> None:
        pass

    def wait_for_clock(self, timeout_s: float = 1.0) -> bool:
        return True

    @property
    def records(self) -> AgentRecords:
        return AgentRecords((), ())

    @property
    def iteration(self) -> int:
        return 0


_NULL_SCOPE: contextlib.nullcontext[None] = contextlib.nullcontext()


def make_agent(
    plan: Frontier | None, gpu: GPU | None, rank: int, *, enabled: bool = True, **kwargs: Any
) -> RankAgent | NullAgent:
    """A :class:`RankAgent`, or a :class:`NullAgent` when there is no plan, no GPU or
    ``enabled`` is False."""
    if plan is None or gpu is None or not enabled:
        return NullAgent(plan, gpu, rank)
    return RankAgent(plan, gpu, rank, **kwargs)
