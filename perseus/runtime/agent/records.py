"""What the rank agent measures (per-op and per-iteration records) and the agent that does
nothing (:class:`NullAgent`, for runs without a GPU or with perseus disabled)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from perseus.device.base import GPU
from perseus.plan import Frontier
from perseus.runtime.agent.readback import ClockDelivery
from perseus.schedule.actions import Action, Kind

__all__ = ["AgentRecords", "IterationRecord", "NullAgent", "OpRecord"]


@dataclass(frozen=True, slots=True)
class OpRecord:
    """One op as measured on this rank: device time between its events (host time with
    ``timing="host"``), energy from the counter at those points (as granular as the counter:
    100 ms on NVML; 0 when not read)."""

    iteration: int
    index: int
    op: Action
    freq_mhz: int
    time_s: float
    energy_j: float
    #: Two-clock op: the clock set mid-op at its layer boundary (None: no mid-op switch).
    mid_freq_mhz: int | None = None
    #: Device-timeline start and end (``timing="host"``: host ``perf_counter`` times).
    start_s: float | None = None
    end_s: float | None = None


@dataclass(frozen=True, slots=True)
class IterationRecord:
    """One iteration on this rank: device time between step_begin/step_end and GPU energy."""

    iteration: int
    point_index: int
    time_s: float
    energy_j: float
    num_ops: int
    planned_time_s: float
    #: Mid-op clock changes issued in this iteration (phased ops; a three-phase op has two).
    mid_op_switches: int = 0
    #: Mid-op clock changes not issued because their op ended first (a late worker, or an op
    #: shorter than predicted): each one ran its later layers at the earlier phase's clock.
    mid_op_switches_missed: int = 0
    #: The clocks read back inside its ops (None: not read; see
    #: :mod:`perseus.runtime.agent.readback`).
    clock_delivery: ClockDelivery | None = None


@dataclass(frozen=True, slots=True)
class AgentRecords:
    """Everything an agent measured lately (per-op and iteration records are each capped at
    ``max_op_records``, the oldest dropped)."""

    ops: tuple[OpRecord, ...]
    iterations: tuple[IterationRecord, ...]


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
        self,
        kind: Action | Kind | str,
        microbatch_index: int | None = None,
        stage_index: int | None = None,
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
