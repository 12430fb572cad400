"""The hand-off between the training thread and the clock worker, one op at a time.

The agent posts a :class:`Boundary` as the host enters an op and writes its end event once;
the worker writes only its :class:`OpReport`: each field has one writer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from perseus.device.base import DeviceEvent

__all__ = ["Boundary", "MidSwitch", "OpReport", "OpRequest"]


class MidSwitch(NamedTuple):
    """A clock change inside an op: at ``at_s`` of device time after the op's start (None:
    unknown, skipped), SM clock ``freq_mhz`` and memory clock ``mem_freq_mhz`` (None: left
    as it is)."""

    at_s: float | None
    freq_mhz: int
    mem_freq_mhz: int | None = None


@dataclass(slots=True)  # not frozen: a frozen init costs ~5 us on the training thread
class OpRequest:
    """What the agent asks of the worker for one op (never changed once posted).

    Attributes:
        start: Event recorded on the compute stream just before the op.
        freq_next_mhz: Clock of the next op (None: last op of the iteration, or no change).
        expected_s: Expected device time of this op (None: unknown, wait for its end event).
        mem_next_mhz: Memory clock of the next op (None: not set by the plan).
        mids: Phased op: the changes inside the op, in order (empty: one phase).
        gap_s: Expected idle device time after this op's end (the change may land in it).
        stamp: Read the counter at ``start`` even when the controller does not stamp ops.
    """

    start: DeviceEvent
    freq_next_mhz: int | None
    expected_s: float | None
    mem_next_mhz: int | None = None
    mids: tuple[MidSwitch, ...] = ()
    gap_s: float = 0.0
    stamp: bool = False


@dataclass(slots=True)
class OpReport:
    """What the worker did and read for one op (written by the worker only).

    Attributes:
        start_mj / end_mj: The energy counter at the op's events.
        mids_issued / mids_missed: Mid-op changes issued, and skipped because the op ended
            first.
        aim_s / ready_s / issue_s / return_s: On the device's clock, for the next op's
            change: when the worker meant to issue it (None: at the end event), was ready,
            issued it and saw the call return (``benchmarks/clock_timing.py``).
        asked_mhz / read_mhz / read_reasons: The clock read back inside the op: the SM clock
            applied then, the one the GPU ran and its event reasons (None: not read).
        asked_mem_mhz / read_mem_mhz: The memory lock in force when read (None: none) and
            the memory clock the GPU ran.
        read_phase: The op's phase running when read.
        observed: Read observe-only (the driver chose the clock).
    """

    start_mj: int | None = None
    end_mj: int | None = None
    mids_issued: int = 0
    mids_missed: int = 0
    aim_s: float | None = None
    ready_s: float | None = None
    issue_s: float | None = None
    return_s: float | None = None
    asked_mhz: int | None = None
    read_mhz: int | None = None
    read_reasons: int = 0
    asked_mem_mhz: int | None = None
    read_mem_mhz: int | None = None
    read_phase: int = 0
    observed: bool = False


#: The report of a boundary no worker has taken yet (read-only; the worker gives each its own).
NO_REPORT = OpReport()


@dataclass(slots=True, eq=False)
class Boundary:
    """One op on the device's timeline, posted by the agent when the host enters it.

    Attributes:
        request: What the worker is asked to do.
        end: The op's end event, when already recorded (else the agent sets it once).
        then: Run by the worker once it has handled the boundary, before waiters are told.
        report: The worker's (:data:`NO_REPORT` until it takes the boundary).
    """

    request: OpRequest
    end: DeviceEvent | None = None
    then: Callable[[], None] | None = None
    report: OpReport = field(default_factory=lambda: NO_REPORT, init=False)

    @property
    def start(self) -> DeviceEvent:
        return self.request.start

    @property
    def mid_freq_mhz(self) -> int | None:
        """The SM clock of the first mid-op change, when one was issued (else None)."""
        mids = self.request.mids
        return mids[0].freq_mhz if mids and self.report.mids_issued else None

    def energy_j(self) -> float | None:
        """The op's energy from the counter at its boundaries, when both were read."""
        start_mj, end_mj = self.report.start_mj, self.report.end_mj
        if start_mj is None or end_mj is None:
            return None
        return (end_mj - start_mj) / 1000.0
