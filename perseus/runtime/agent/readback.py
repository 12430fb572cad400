"""What ran, against what was asked: the clocks read back inside each op, per iteration.

A clock lock is a request. Under a power cap an H100 runs the highest clock whose power fits
(the SW power cap reason set), and a hot or power-braked GPU slows down on its own; a plan
whose clocks are not delivered predicts time and energy it will not measure. The controller's
worker reads the GPU's SM clock and clock event reasons once inside every op, off the training
thread (:class:`~perseus.device.base.ClockReadbackGPU`; the readings sit on the op's
:class:`~perseus.runtime.agent.boundary.Boundary`). At the iteration's end
:func:`clock_delivery` turns them into the share of op time that ran at the planned clock and
the ops held below it, and :class:`HeldClockReport` warns once (:class:`ClockHeldWarning`) when
clocks are held, again only when they are held for another reason.

One reading per op is a sample: an op counts as run at its clock when the reading is, and its
whole time counts as held otherwise.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

from perseus.device.nvml import CLOCK_EVENT_REASONS, LIMITING_REASONS

__all__ = [
    "IDLE_REASON",
    "REASON_TEXT",
    "ClockDelivery",
    "ClockHeldWarning",
    "HeldClockReport",
    "HeldOp",
    "clock_delivery",
    "describe_reasons",
    "limiting_reasons",
]

#: How each limiting reason reads in a warning or summary.
REASON_TEXT = {
    "sw_power_cap": "power cap",
    "hw_power_brake_slowdown": "power brake",
    "sw_thermal_slowdown": "thermal (SW)",
    "hw_thermal_slowdown": "thermal (HW)",
    "hw_slowdown": "HW slowdown",
    "no_reason_reported": "no reason reported",
}
#: An op held without a limiting reason set (a change still landing, an unknown limit).
NO_REASON = "no_reason_reported"

#: NVML's "GPU idle" reason: a reading taken while no op ran says nothing about the op's clock.
IDLE_REASON = next(bit for bit, name in CLOCK_EVENT_REASONS if name == "gpu_idle")

#: A reading this far below the asked clock is held (real clocks settle a step or two off).
_TOLERANCE = 0.01

#: Held ops named in one warning (the rest are counted).
_NAMED = 6


class ClockHeldWarning(RuntimeWarning):
    """The GPU ran ops below the plan's clocks (power cap, thermal, power brake...)."""


@dataclass(frozen=True, slots=True)
class HeldOp:
    """An op that ran below its planned clock.

    Attributes:
        name: The op (``"1F0"``).
        planned_mhz: The clock asked for it.
        applied_mhz: The clock the GPU ran (read back inside the op).
        reasons: Why, as NVML names its reasons (``("sw_power_cap",)``), or
            ``("no_reason_reported",)``.
    """

    name: str
    planned_mhz: int
    applied_mhz: int
    reasons: tuple[str, ...]

    def __str__(self) -> str:
        return (
            f"{self.name} planned {self.planned_mhz} MHz, ran {self.applied_mhz} MHz "
            f"({describe_reasons(self.reasons)})"
        )


@dataclass(frozen=True, slots=True)
class ClockDelivery:
    """An iteration's clocks as delivered on one rank.

    Attributes:
        share_at_plan: The share of the read ops' time that ran at the planned clock.
        held: The ops held below it, in op order.
        ops_read: Ops with a reading (ops too short to read, or read before their clock was
            applied, are left out).
    """

    share_at_plan: float
    held: tuple[HeldOp, ...]
    ops_read: int


def limiting_reasons(mask: int) -> tuple[str, ...]:
    """The names of the limiting reasons (power, thermal) set in an NVML reason mask."""
    return tuple(
        name for bit, name in CLOCK_EVENT_REASONS if mask & bit and name in LIMITING_REASONS
    )


def describe_reasons(reasons: Sequence[str]) -> str:
    """``("sw_power_cap",)`` -> ``"power cap"`` (several joined with ``" + "``)."""
    return " + ".join(REASON_TEXT.get(r, r) for r in reasons) or REASON_TEXT[NO_REASON]


def clock_delivery(
    readings: Sequence[tuple[str, int, int | None, int | None, int, float]],
) -> ClockDelivery | None:
    """An iteration's delivery from its ops' readings (None: no op was read).

    Args:
        readings: Per op ``(name, planned_mhz, asked_mhz, read_mhz, reasons, time_s)``: the
            plan's (snapped) clock, the clock applied when the worker read (a reading taken
            while another clock was applied, a change not issued yet, says nothing about the
            op's and is left out), the clock read (None: not read) and the reason mask (a
            reading with the idle reason, taken in a gap, is left out too).

    Complexity: O(len(readings)).
    """
    at_plan_s = total_s = 0.0
    ops_read = 0
    held: list[HeldOp] = []
    for name, planned, asked, read, mask, time_s in readings:
        if read is None or asked != planned or mask & IDLE_REASON:
            continue
        ops_read += 1
        total_s += time_s
        if read >= planned * (1.0 - _TOLERANCE):
            at_plan_s += time_s
        else:
            held.append(HeldOp(name, planned, read, limiting_reasons(mask) or (NO_REASON,)))
    if not ops_read:
        return None
    share = at_plan_s / total_s if total_s > 0 else float(not held)
    return ClockDelivery(share, tuple(held), ops_read)


class HeldClockReport:
    """Warns when a rank's clocks are held below the plan: once, then only when they are held
    for another reason (the held clock wanders under a cap, and which ops one reading per op
    catches varies: neither is news). Once every op read runs at its planned clock again, the
    next hold is reported afresh."""

    def __init__(self, rank: int, gpu_name: str) -> None:
        self._rank = rank
        self._gpu_name = gpu_name
        self._reported: set[str] = set()

    def update(self, delivery: ClockDelivery | None, iteration: int) -> str | None:
        """Warn (:class:`ClockHeldWarning`) when clocks are held for a new reason; returns the
        message."""
        if delivery is None:
            return None
        reasons = {r for h in delivery.held for r in h.reasons}
        if not reasons:
            self._reported.clear()  # delivered again
            return None
        if reasons <= self._reported:
            return None
        self._reported |= reasons
        held = delivery.held
        named = "; ".join(str(h) for h in held[:_NAMED])
        more = f"; and {len(held) - _NAMED} more" if len(held) > _NAMED else ""
        message = (
            f"perseus: rank {self._rank}, iteration {iteration}: {self._gpu_name} ran "
            f"{len(held)} of {delivery.ops_read} ops below the plan's clock "
            f"({describe_reasons(sorted(reasons))}; {delivery.share_at_plan:.0%} of op time at the "
            f"planned clock): {named}{more}. The plan's time and energy will not hold; "
            "lift the limit or plan for the clocks the GPU delivers"
        )
        warnings.warn(message, ClockHeldWarning, stacklevel=3)
        return message
