"""Emulation on machines without GPUs: stretch each action to the simulated GPU's time.

A rank runs its real (tiny, CPU) computation, then sleeps until the time the simulated GPU
would take for that (stage, kind) at its current clock has passed since the action began.
Energy is the simulated device's business: it draws the op's power while busy and the blocking
power whenever the rank is not inside an action (waiting for P2P, at the iteration barrier),
so a rank's energy over an iteration is ``Σ op energies + P_block · idle``, the same
definition the planner uses.

Accuracy: deadlines are kept with :func:`time.perf_counter`; the last
:data:`SPIN_S` before a deadline are spent spinning rather than sleeping, which keeps each
action within a few tens of microseconds of its target even when the OS sleep overshoots. If
the CPU compute alone is longer than the target, the action cannot be stretched; the first
such action emits one :class:`EmulationOverrunWarning` per stretcher (use a smaller model or a
larger time scale).

Profiles can be scaled in time (:func:`scale_profile`) so that tests run quickly: times and
energies are multiplied by the same factor, which keeps every op's power, and therefore every
relative figure (savings, frontier shape), unchanged.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from perseus.errors import ConfigError
from perseus.profile.model import Profile, build_profile
from perseus.schedule.actions import Action, Kind

__all__ = [
    "SPIN_S",
    "ActionStretcher",
    "EmulatedDevice",
    "EmulationOverrunWarning",
    "OpTiming",
    "VirtualTimeline",
    "scale_profile",
    "sleep_until",
    "take_stages",
]

#: Spin (instead of sleeping) for this long before a deadline.
SPIN_S = 0.0005


class EmulationOverrunWarning(RuntimeWarning):
    """The real CPU compute of an action took longer than the simulated GPU time."""


class EmulatedDevice(Protocol):
    """What the stretcher needs from a simulated GPU (``perseus.device.simulated``)."""

    def begin_op(self, stage_index: int, kind: Kind, start_s: float | None = None) -> float:
        """Mark the GPU busy from now (or from ``start_s``, on the ``time.perf_counter``
        clock, when the stretcher back-dates); return the op's duration at the current clock."""
        ...

    def end_op(self) -> None:
        """Mark the GPU idle (blocking power) from now."""
        ...


def sleep_until(deadline: float) -> None:
    """Sleep until ``time.perf_counter() >= deadline``, spinning for the last :data:`SPIN_S`."""
    remaining = deadline - time.perf_counter()
    if remaining > SPIN_S:
        time.sleep(remaining - SPIN_S)
    while time.perf_counter() < deadline:
        pass


@dataclass
class OpTiming:
    """Timestamps of one stretched action (``time.perf_counter`` seconds).

    Attributes:
        start_s: When the action's window began (before the device call).
        begun_s: When :meth:`EmulatedDevice.begin_op` returned.
        target_s: The simulated duration the device returned.
        deadline_s: When the simulated GPU finishes the action.
        end_s: When the window ended (after the stretch); 0 while running.
        overrun: The CPU compute alone took longer than the target.
    """

    start_s: float
    begun_s: float
    target_s: float
    deadline_s: float = 0.0
    end_s: float = 0.0
    overrun: bool = False


class ActionStretcher:
    """Stretches each action to the simulated GPU's duration and tells the GPU when it is busy.

    Attributes:
        overruns: Actions whose CPU compute exceeded the target.
        late: Actions the host reached after their simulated end (host jitter; not stretched).
        actions: Actions stretched so far.
    """

    def __init__(self, device: EmulatedDevice, *, backdate: bool = False) -> None:
        self._device = device
        # The device accepts begin_op(..., start_s=) on the perf_counter clock.
        self._backdate = backdate
        self._warned = False
        self.overruns = 0
        self.late = 0
        self.actions = 0

    @contextmanager
    def op(self, action: Action, start_s: float | None = None) -> Iterator[OpTiming]:
        """Context manager around one action's real compute.

        Args:
            action: The action (its stage and kind select the simulated cost).
            start_s: When the action's window began. Given (training), the window lasts exactly
                the target from ``start_s``, so the device-call latency is absorbed into the
                action as a real driver call would be hidden behind the kernel. None
                (profiling), the window lasts the target from when the device call returned,
                so the measured duration excludes the emulator's own latency.

        The device is not told when the action ends: it draws the op's power for exactly the
        target duration from :meth:`EmulatedDevice.begin_op`, and the window never ends
        earlier than that, so an ``end_op`` call would only add latency.
        """
        pre = time.perf_counter()
        if start_s is not None and self._backdate:
            target_s = self._device.begin_op(action.stage_index, action.kind, start_s=start_s)
        else:
            target_s = self._device.begin_op(action.stage_index, action.kind)
        begun = time.perf_counter()
        base = begun if start_s is None else start_s
        timing = OpTiming(
            start_s=pre if start_s is None else start_s,
            begun_s=begun,
            target_s=target_s,
            deadline_s=base + target_s,
        )
        try:
            yield timing
        finally:
            deadline = timing.deadline_s
            now = time.perf_counter()
            if now - begun > target_s:
                self.overruns += 1
                timing.overrun = True
                if not self._warned:
                    self._warned = True
                    warnings.warn(
                        f"emulated action {action} took longer on the CPU than the simulated "
                        f"GPU's {1e3 * target_s:.2f} ms; use a smaller model or a larger time "
                        "scale (further overruns are counted, not warned)",
                        EmulationOverrunWarning,
                        stacklevel=3,
                    )
                self._device.end_op()
            elif now > deadline:
                self.late += 1
            else:
                sleep_until(deadline)
            timing.end_s = time.perf_counter()
            self.actions += 1


def scale_profile(profile: Profile, factor: float) -> Profile:
    """A copy of ``profile`` with every time and energy multiplied by ``factor`` (power kept).

    Raises:
        ConfigError: if ``factor`` is not positive.
    """
    if not factor > 0:
        raise ConfigError(f"time scale must be > 0, got {factor}")
    if factor == 1.0:
        return profile
    rows = [
        (stage, kind, o.freq_mhz, o.time_s * factor, o.energy_j * factor)
        for (stage, kind), op in profile.ops.items()
        for o in op.options
    ]
    return build_profile(rows, source=f"{profile.source} (time x{factor:g})")


def take_stages(profile: Profile, num_stages: int) -> Profile:
    """A ``num_stages``-stage profile cut from a deeper one: its first ``num_stages - 1``
    stages and its last stage, renumbered (e.g. a 4-stage job from the 8-stage A100 profile
    keeps the heavier last stage, where the language-model head sits, as real models do).
    ``num_stages >= profile.num_stages`` returns the profile unchanged.

    Raises:
        ConfigError: if ``num_stages`` is below 1.
    """
    if num_stages < 1:
        raise ConfigError(f"stage count must be >= 1, got {num_stages}")
    if num_stages >= profile.num_stages:
        return profile
    last = profile.num_stages - 1
    keep = {s: s for s in range(num_stages - 1)} | {last: num_stages - 1}
    rows = [
        (keep[stage], kind, o.freq_mhz, o.time_s, o.energy_j)
        for (stage, kind), op in profile.ops.items()
        if stage in keep
        for o in op.options
    ]
    return build_profile(rows, source=f"{profile.source} (stages {sorted(keep)})")


class VirtualTimeline:
    """When each action may start on its simulated GPU, shared by a pipeline's processes.

    On a real GPU the host enqueues kernels ahead of time: the GPU starts an action as soon as
    the previous action on that GPU has finished and its input has arrived, and the host's own
    overhead (Python, hooks, P2P bookkeeping) overlaps GPU work. On the CPU the host *is* the
    GPU, so that overhead would add up along the critical path. The timeline restores the GPU
    semantics: every rank publishes each action's end time (its deadline) in a small
    memory-mapped file (one float per action, indexed by DAG node id), and an action's window
    starts at ``max(previous action's end on this rank, ends of the actions it depends on)``
    instead of when the CPU got to it. The real data still flows through torch's P2P; a
    producer publishes its end before torch sends, so the consumer always reads a fresh value.

    Clocks are :func:`time.perf_counter` (``CLOCK_MONOTONIC`` on Linux: one clock for all
    processes of a machine).

    Args:
        path: The shared file (created by :meth:`create`).
        node_of: Maps an action to its DAG node id.
        dependencies: Maps an action to the actions it needs (data edges).
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
        self._previous_end = 0.0

    @staticmethod
    def create(path: str | Path, num_nodes: int) -> None:
        """Create the shared file for ``num_nodes`` actions (once per pipeline)."""
        ends = np.memmap(path, dtype=np.float64, mode="w+", shape=(max(1, num_nodes),))
        ends[:] = 0.0
        ends.flush()

    def begin_iteration(self, start_s: float) -> None:
        """The rank's GPU is free from ``start_s`` (the iteration boundary)."""
        self._previous_end = start_s

    def start_of(self, action: Action, arrived_s: float) -> float:
        """When ``action`` starts: its predecessors' ends, never later than the CPU's arrival."""
        start = self._previous_end
        for dep in self._dependencies(action):
            start = max(start, float(self._ends[self._node_of(dep)]))
        return min(start, arrived_s)

    def finish(self, action: Action, end_s: float) -> None:
        """Publish ``action``'s end (call before torch sends its output)."""
        self._ends[self._node_of(action)] = end_s
        self._previous_end = end_s
