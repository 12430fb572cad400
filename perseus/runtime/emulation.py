"""Emulation on machines without GPUs: the same agent path, a simulated device underneath.

Each rank's simulated GPU runs every action as an op on its own stream; a consumer's op starts
when its inputs were ready on their devices (:class:`VirtualTimeline`, a file shared by the
pipeline's processes), so host overhead overlaps device work as on a GPU. The design and the
time scale (:func:`scale_profile`): ``docs/training.md``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from multiprocessing.util import Finalize
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from perseus.dag.graph import build_dag
from perseus.device.base import GPU, DeviceEvent, EventSource
from perseus.errors import ConfigError
from perseus.job import DEFAULT_BACKWARD_SPLIT
from perseus.profile.model import Profile, build_profile
from perseus.runtime.agent.timing import CounterMark
from perseus.runtime.collectives import (
    all_reduce_max,
    barrier,
    broadcast_object,
    global_rank,
    group_size,
)
from perseus.schedule.actions import Action, Kind, Schedule
from perseus.schedule.dependencies import action_dependencies

if TYPE_CHECKING:
    from perseus.runtime.agent.controller import FrequencyController
    from perseus.runtime.agent.rank_agent import RankAgent

__all__ = [
    "DeviceRun",
    "EmulatedGPU",
    "EmulationOverrunWarning",
    "StreamEmulator",
    "VirtualTimeline",
    "scale_profile",
    "start_emulation",
    "take_stages",
]


class EmulationOverrunWarning(RuntimeWarning):
    """The real CPU compute of an action took longer than the simulated GPU time."""


@runtime_checkable
class EmulatedGPU(GPU, EventSource, Protocol):
    """A device whose stream the host drives op by op (a
    :class:`~perseus.device.simulated.SimulatedGPU`): a session on one always emulates."""

    index: int

    @property
    def explicit_state_dir(self) -> bool: ...

    def launch(self, stage_index: int, kind: Kind, until: float = 1.0) -> None: ...

    def backdate(self, ready_s: float) -> None: ...

    def prices(self, kind: Kind) -> bool: ...

    def placed(
        self,
        *,
        index: int | None = None,
        state_dir: str | Path | None = None,
        backward_split: float | None = None,
    ) -> EmulatedGPU: ...


class DeviceRun:
    """How a session's iteration boundaries and op scopes meet a real GPU (the host enqueues
    ahead of the device); :class:`StreamEmulator` emulates one."""

    overruns = 0
    #: Boundaries are read when the device passes them (a real GPU), not waited for.
    defers_start = True

    def agree_start(self, fresh: float, group: Any) -> float:
        """Agree (collective) whether this start is fresh: 1.0 if so on any rank."""
        (fresh,) = all_reduce_max([fresh], group)  # also a barrier
        return fresh

    def resume(self, last_end_s: float) -> None:
        """Start right after the last iteration's end (no fresh start)."""

    def mark(
        self, agent: RankAgent, events: EventSource, read_mj: Callable[[], int]
    ) -> CounterMark:
        """A boundary on the device's timeline; on a real GPU the worker reads it as the device
        passes it (no wait here)."""
        event = events.record_event()
        if self.defers_start:
            return CounterMark(event, agent.controller, read_mj)
        event.synchronize()  # emulation: the device is idle here, completes at once
        return CounterMark(event, None, read_mj)

    def first_clock(self, agent: RankAgent) -> None:
        """The iteration has begun on ``agent``: settle a new plan's first clock if needed."""

    def closing(self) -> None:
        """The iteration's last op is launched: the end marks recorded next follow it."""

    def agree_end(self, own_end_s: float, group: Any) -> None:
        """Agree (collective) on the iteration's end; ``own_end_s``: this rank's last op."""
        barrier(group)

    def take_overruns(self) -> int:
        """Host overruns since the last call (0 on a GPU)."""
        return 0

    def op(self, agent: RankAgent, action: Action) -> AbstractContextManager[None]:
        """The scope of one measured action."""
        return agent.op(action)


class StreamEmulator(DeviceRun):
    """Launches actions on a simulated GPU and holds the host until their outputs exist: a
    session's :class:`DeviceRun` when it emulates.

    Args:
        timeline: The pipeline's shared timeline (None: a single process).
        data_parallel: Other pipelines reduce their gradients with this one every iteration:
            an iteration ends when the last of them ends.

    Attributes:
        overruns: Actions whose CPU compute outlasted the simulated op.
        actions: Actions emulated so far.
    """

    _taken = 0  # overruns already counted by take_overruns()
    defers_start = False

    def __init__(
        self, gpu: EmulatedGPU, timeline: VirtualTimeline | None = None, data_parallel: bool = False
    ) -> None:
        self._gpu = gpu
        self._timeline = timeline
        self._data_parallel = data_parallel
        self._warned = False
        self.overruns = 0
        self.actions = 0

    def before(self, action: Action) -> None:
        """Start the action when its inputs exist and this stream is free, even if the host
        gets there later (a GPU's host would have launched it)."""
        ready_s = self._timeline.ready_s(action) if self._timeline is not None else 0.0
        self._gpu.backdate(ready_s)

    def launch(self, action: Action) -> None:
        """Queue the action's op (returns at once, like kernel launches)."""
        self._gpu.launch(action.stage_index, action.kind)

    def finish(
        self, action: Action, end: DeviceEvent | None, controller: FrequencyController | None = None
    ) -> None:
        """Hold the host until the op's end event, then publish its device time (an inline
        ``controller`` first does the op's clock work)."""
        self.actions += 1
        if end is None:
            end = self._gpu.record_event()
        if end.query():  # done before the host even left the op: the CPU was slower
            self._overrun(action)
        if controller is not None and not controller.threaded:
            controller.flush()
        end.synchronize()
        if self._timeline is not None:
            self._timeline.finish(action, end.device_time_s())

    def take_overruns(self) -> int:
        new, self._taken = self.overruns - self._taken, self.overruns
        return new

    def agree_start(self, fresh: float, group: Any) -> float:
        # A fresh start is at the latest host's arrival, on every device.
        at_s, fresh = all_reduce_max([self._gpu.timeline_now_s(), fresh], group)
        self._gpu.backdate(at_s)
        return fresh

    def resume(self, last_end_s: float) -> None:
        # The devices idled since then; on GPUs the hosts would have queued ahead.
        self._gpu.backdate(last_end_s)

    def first_clock(self, agent: RankAgent) -> None:
        ctl, freqs = agent.controller, agent.planned_clocks_mhz
        if not (agent.device_timed and freqs and ctl is not None and not ctl.observe_only):
            return
        if ctl.setter.done_mhz != freqs[0]:
            # A new plan's first clock (in steady state the last op's boundary set it): no op
            # may run before it.
            agent.wait_for_clock(5.0)
            self._gpu.record_event()  # nothing may start before now

    def closing(self) -> None:
        # Right behind the last op, as a GPU's host would have enqueued it, not at the host's
        # (maybe late) arrival.
        self._gpu.backdate(0.0)

    def agree_end(self, own_end_s: float, group: Any) -> None:
        # When the pipeline's last device finished (with data-parallel pipelines, the last
        # one's: their gradient all-reduce waits for it).
        (at_s,) = all_reduce_max([own_end_s], None if self._data_parallel else group)
        self._gpu.backdate(at_s)

    @contextmanager
    def op(self, agent: RankAgent, action: Action) -> Iterator[None]:
        ctl = agent.controller
        threaded = ctl is not None and ctl.threaded
        with contextlib.ExitStack() as held:
            if ctl is not None and threaded:
                # The op starts once its clock is set: a host slower than its simulated GPU
                # also starves the clock worker, whose lateness would then be the host's, not
                # the plan's or the GPU's (the wait is host time: the op is backdated). No
                # clock may land between the op's start event and its launch: backdated to
                # its start, the op would run at a clock the worker set for later.
                agent.wait_for_clock(1.0)
                held.enter_context(ctl.device_lock)
            self.before(action)
            with agent.op(action):
                # A phased op runs each phase at its clock however late the worker: its work
                # up to a switch, then (host time again) the rest once that clock is set.
                for i, share in enumerate(agent.switch_shares() if threaded else (), 1):
                    self._gpu.launch(action.stage_index, action.kind, share)
                    held.close()  # the worker may set the next phase's clock now
                    agent.wait_for_clock(1.0, phase=i)
                    self._gpu.backdate(0.0)
                self.launch(action)
                held.close()
                agent.mark_op_end()  # the op is enqueued; the CPU compute below is host work
                yield
        self.finish(action, agent.last_op_end_event, agent.controller)

    def _overrun(self, action: Action) -> None:
        self.overruns += 1
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"emulated action {action}: the host fell behind the simulated GPU (measured "
                "times may come out long): slow it down with SimulatedGPU.from_profile("
                "perseus.runtime.emulation.scale_profile(profile, k), blocking_power_w=..., "
                "set_latency_s=0.005 * k, publish_interval_s=0.1 * k) "
                "for some k > 1 (savings are unchanged), or use a smaller model; further cases "
                "are counted, not warned",
                EmulationOverrunWarning,
                stacklevel=4,
            )


def scale_profile(profile: Profile, factor: float) -> Profile:
    """A copy of ``profile`` with every time and energy multiplied by ``factor`` (power kept).

    Raises:
        ConfigError: if ``factor`` is not positive.
    """
    if not factor > 0:
        raise ConfigError(f"time scale must be > 0, got {factor}")
    if factor == 1.0:
        return profile
    return _rebuilt(profile, f"{profile.source} (time x{factor:g})", {}, factor)


def take_stages(profile: Profile, num_stages: int) -> Profile:
    """A ``num_stages``-stage profile cut from a deeper one: its first ``num_stages - 1``
    stages and its last (heavier: the language-model head), renumbered; unchanged when it has
    no more stages than that.

    Raises:
        ConfigError: if ``num_stages`` is below 1.
    """
    if num_stages < 1:
        raise ConfigError(f"stage count must be >= 1, got {num_stages}")
    if num_stages >= profile.num_stages:
        return profile
    keep = {s: s for s in range(num_stages - 1)} | {profile.num_stages - 1: num_stages - 1}
    return _rebuilt(profile, f"{profile.source} (stages {sorted(keep)})", keep)


def _rebuilt(profile: Profile, source: str, stages: dict[int, int], factor: float = 1.0) -> Profile:
    """``profile``'s rows of ``stages`` (old -> new index; empty: all), times and energies
    multiplied by ``factor``."""
    rows = [
        (stages.get(s, s), kind, o.freq_mhz, o.time_s * factor, o.energy_j * factor, o.mem_freq_mhz)
        for (s, kind), op in profile.ops.items()
        if not stages or s in stages
        for o in op.options
    ]
    return build_profile(rows, source=source)


class VirtualTimeline:
    """When each action's inputs exist on the simulated GPUs, shared by a pipeline's processes.

    Every rank publishes each action's device end time (one float per DAG node, ``node_of``)
    in a memory-mapped file (made by :meth:`create`) before torch sends the output, so a
    consumer reads a fresh value.
    """

    def __init__(
        self,
        path: str | Path,
        node_of: Callable[[Action], int],
        dependencies: Callable[[Action], tuple[Action, ...]],
    ) -> None:
        self._ends = np.memmap(path, dtype=np.float64, mode="r+")
        self._node_of = node_of
        self._dependencies = dependencies

    @staticmethod
    def create(path: str | Path, num_nodes: int) -> None:
        """Create the shared file for ``num_nodes`` actions (once per pipeline)."""
        ends = np.memmap(path, dtype=np.float64, mode="w+", shape=(max(1, num_nodes),))
        ends[:] = 0.0
        ends.flush()

    def ready_s(self, action: Action) -> float:
        """The latest device end time among ``action``'s inputs (0 when it has none)."""
        ends = (float(self._ends[self._node_of(dep)]) for dep in self._dependencies(action))
        return max(ends, default=0.0)

    def finish(self, action: Action, end_s: float) -> None:
        """Publish ``action``'s device end time (call before torch sends its output)."""
        self._ends[self._node_of(action)] = end_s


def start_emulation(
    gpu: EmulatedGPU, schedule: Schedule, rank: int, group: Any
) -> tuple[EmulatedGPU, StreamEmulator]:
    """Place this process's simulated GPU and join its pipeline's timeline (collective): the
    placed GPU and the emulator that launches actions on it.

    Each process gets its own simulated GPU (index = its global rank) in the job's directory
    unless ``gpu`` has its own, its backward split into ``B`` and ``W`` (the default split)
    where the schedule needs it. At exit each process removes its files, the last one out the
    directory.
    """
    index = global_rank()
    made = tempfile.mkdtemp(prefix="perseus-job-") if index == 0 else None
    job_dir = Path(made) if made is not None else None
    mine: list[str] = []  # this process's files in the job's directory, named before made
    try:
        job_dir = Path(broadcast_object(made, 0, None))
        split = schedule.has_weight_actions and not gpu.prices(Kind.W)
        explicit = gpu.explicit_state_dir
        if index != gpu.index or not explicit or split:
            gpu = gpu.placed(
                index=index,
                state_dir=None if explicit else job_dir,
                backward_split=DEFAULT_BACKWARD_SPLIT if split else None,
            )
        if not explicit:  # placed in the job's directory
            mine += [f"{gpu.uuid}{suffix}" for suffix in (".state", ".owner", ".info.json")]
        # One timeline per pipeline (a job may run several data-parallel pipelines).
        path = job_dir / f"timeline-{index}.bin" if rank == 0 else None
        path = broadcast_object(path, 0, group)
        if rank == 0:
            mine.append(path.name)
            VirtualTimeline.create(path, sum(map(len, schedule.rank_actions)))
        barrier(group)
        graph = build_dag(schedule)
        num_stages = schedule.num_stages
        timeline = VirtualTimeline(
            path, graph.node_of, lambda a: action_dependencies(a, num_stages)
        )
    except BaseException:  # no cleanup registered yet: what was made goes now
        if job_dir is not None:
            _remove_job_files(job_dir, mine)
        raise
    # After the agent's exit reset (multiprocessing's atexit hook was registered first), and
    # also in a fork-started worker, which never runs atexit.
    Finalize(None, _remove_job_files, args=(job_dir, mine), exitpriority=0)
    return gpu, StreamEmulator(gpu, timeline, data_parallel=group_size() > group_size(group))


def _remove_job_files(job_dir: Path, names: list[str]) -> None:
    """Remove ``names`` from ``job_dir``, then the directory if empty."""
    for name in names:
        with contextlib.suppress(OSError):
            os.unlink(job_dir / name)
    with contextlib.suppress(OSError):
        os.rmdir(job_dir)
