"""A :class:`~perseus.runtime.session.RankSession`'s value types: its options, its lifecycle
states and its boundary hooks."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from perseus.device.base import DeviceEvent, EventSource
from perseus.device.clock import REAL_CLOCK, Clock
from perseus.errors import ConfigError
from perseus.plan import Frontier
from perseus.runtime.agent.timing import CounterMark
from perseus.runtime.summary import IterationStats

if TYPE_CHECKING:
    from perseus.runtime.power.replan import Realised, SignalSource

__all__ = ["BoundaryHook", "EndedIteration", "SessionOptions", "SessionState"]

#: Called with every iteration's stats as they are read (on a real GPU at the next iteration's
#: end); may return ``(frontier, point_index)`` to deploy from the next iteration to start on,
#: the same value on every rank of a pipeline.
BoundaryHook = Callable[[IterationStats], "tuple[Frontier, int] | None"]


class EndedIteration(NamedTuple):
    """An iteration a session ended on the host whose figures it has not read yet."""

    iteration: int
    start: tuple[float, int] | CounterMark  # (device time, counter mJ), or read later
    end: CounterMark | None  # a real GPU's end (None: marked when read)
    last_op: DeviceEvent | None  # its last op's end
    profiling: bool
    point_index: int
    frontier: Frontier | None  # the deployed frontier (None while profiling)


class SessionState(enum.Enum):
    """Where a :class:`RankSession` is in its lifecycle."""

    NEW = "new"
    IDLE = "idle"
    IN_ITERATION = "in iteration"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class SessionOptions:
    """How a :class:`RankSession` runs, besides its engine, GPU and plan.

    Args:
        blocking_power_w: GPU power while waiting, for planning and profiling (None: the
            device's own, :func:`~perseus.device.presets.blocking_power_for`).
        point_index: Which frontier point to deploy (0: the fastest).
        group: The pipeline's process group (default: the adapter's, else the default group).
        watchdog: Start the watchdog process that resets the GPU if this process dies.
        handle_signals: Reset the GPU when SIGTERM/SIGINT ends the process (the previous
            handler runs first and decides whether it does).
        events: The agent's device event source (default: the GPU's own; ``CudaEventSource``
            on a real GPU).
        power_schedule: A plan schedule JSON (``perseus plan schedule``) over the plan's
            frontier, followed from the first iteration (:mod:`perseus.runtime.power`).
        power_store: The job's store, read for run-time power caps (``perseus power set``).
        power_forecast: The signal ``power_schedule`` was made from (a CSV path or a ``Signal``).
        power_realised: Its realised values (a signal file or ``k -> value``): a change re-plans.
        power_objective: The series of both signals to use (default: the first).
        clock: The host's clock, read where the device has no timeline of its own.
        wait_for_figures: Read each iteration's figures at its own end, waiting for the
            device there (default on a real GPU: one iteration later).
        history_kept: Iterations kept in the session's ``history`` (``docs/training.md``,
            Results); the agent caps its own records (``RankAgent(max_op_records=)``).

    Raises:
        ConfigError: a negative ``blocking_power_w``/``point_index``, ``history_kept`` below
            1; ``power_realised`` alone.
    """

    blocking_power_w: float | None = None
    point_index: int = 0
    group: Any = None
    watchdog: bool = True
    handle_signals: bool = True
    events: EventSource | None = None
    power_schedule: str | Path | None = None
    power_store: Any = None
    power_forecast: SignalSource | None = None
    power_realised: SignalSource | Realised | None = None
    power_objective: str | None = None
    clock: Clock = REAL_CLOCK
    wait_for_figures: bool = False
    history_kept: int = 100_000

    def __post_init__(self) -> None:
        if self.blocking_power_w is not None and not self.blocking_power_w >= 0:
            raise ConfigError(f"blocking_power_w must be >= 0 W, got {self.blocking_power_w}")
        if self.point_index < 0:
            raise ConfigError(f"point_index must be >= 0, got {self.point_index}")
        if self.history_kept < 1:
            raise ConfigError(f"history_kept must be >= 1 iteration, got {self.history_kept}")
        if self.power_realised is not None and None in (self.power_forecast, self.power_schedule):
            raise ConfigError("power_realised= needs power_schedule= and its power_forecast=")
