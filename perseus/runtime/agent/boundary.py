"""The hand-off between the training thread and the clock worker, one op at a time.

The agent posts a :class:`Boundary` as the host enters an op: its :class:`OpRequest` (frozen:
what the worker is asked to do) and, once the host leaves the op, its end event (written once,
by the agent). The worker writes only the boundary's :class:`OpReport` (what it did and read),
and the agent reads the report after the controller's ``flush()``: each field has one writer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
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
    """What the agent asks of the worker for one op on the device's timeline (never changed
    once posted).

    Attributes:
        start: Event recorded on the compute stream just before the op.
        freq_next_mhz: Clock of the next op (None: last op of the iteration, or no change).
        expected_s: Expected device time of this op (None: unknown, wait for its end event).
        mem_next_mhz: Memory clock of the next op (None: not set by the plan).
        mids: Phased op: the changes inside the op, in order (empty: one phase).
        gap_s: Expected idle device time between this op's end and the next op's start
            (waiting for its input); the change may land anywhere in it.
        stamp: Read the counter at ``start`` even when the controller does not stamp ops (an
            iteration's first event: its reading is taken there, off the training thread).
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
            first (a late worker, or an op shorter than predicted).
        aim_s / ready_s / issue_s / return_s: On the device's clock, for the next op's
            change: when the worker meant to issue it (None: at the end event), was ready to
            wait for that, issued it and saw the call return (``benchmarks/clock_timing.py``).
        asked_mhz / read_mhz / read_reasons: The clock read back inside the op
            (:mod:`perseus.runtime.agent.readback`): the SM clock applied then, the clock the
            GPU ran and its event reasons (None: not read).
        asked_mem_mhz / read_mem_mhz: Where the plan sets memory clocks, the memory lock in
            force when read (None: none, refused) and the memory clock the GPU ran.
        read_phase: The op's phase running when read (a phased op's later phases are set
            before the read).
        observed: Read observe-only: no clock of ours was applied, the driver chose it; the
            reading is held against the plan's clock (below it with a limiting reason: the
            plan cannot be delivered here either).
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


#: The report of a boundary no worker has taken yet (read-only: nothing read, nothing done);
#: the worker gives each boundary its own as it takes it, off the training thread.
NO_REPORT = OpReport()


class Boundary:
    """One op on the device's timeline, posted by the agent when the host enters it.

    Args:
        request: What the worker is asked to do (frozen).
        end: The op's end event, when already recorded; else the agent sets :attr:`end` once,
            as the host leaves the op.
        then: Run by the worker once it has handled the boundary, before anyone waiting for
            it is told (an iteration's end: its figures are worked out there, off the training
            thread).
    """

    __slots__ = ("end", "report", "request", "then")

    def __init__(
        self,
        request: OpRequest,
        end: DeviceEvent | None = None,
        then: Callable[[], None] | None = None,
    ) -> None:
        self.request = request
        self.end = end
        self.then = then
        self.report = NO_REPORT  # the worker gives the boundary its own as it takes it

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
