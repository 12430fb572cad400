"""What ran, against what was asked: the clocks read back inside each op, per iteration.

A clock lock is a request: under a power cap or when hot a GPU runs slower on its own. The
controller's worker reads the SM clock, its event reasons and (where the plan sets one) the
memory clock once inside every op; :func:`clock_delivery` turns an iteration's readings into
the share of op time at the planned clocks and the ops held off them, and
:class:`HeldClockReport` warns (:class:`ClockHeldWarning`) once per new reason. One reading per
op is a sample: its whole time counts as held or not.
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

from perseus.device.nvml_calls import CLOCK_EVENT_REASONS, LIMITING_REASONS
from perseus.schedule.actions import Action

__all__ = [
    "IDLE_REASON",
    "REASON_TEXT",
    "ClockDelivery",
    "ClockHeldWarning",
    "HeldClockReport",
    "HeldOp",
    "OpReading",
    "SharedHolds",
    "clock_delivery",
    "describe_reasons",
]

#: How each limiting reason reads in a warning or summary.
REASON_TEXT = {
    "sw_power_cap": "power cap",
    "hw_power_brake_slowdown": "power brake",
    "sw_thermal_slowdown": "thermal (SW)",
    "hw_thermal_slowdown": "thermal (HW)",
    "hw_slowdown": "HW slowdown",
    "memory_not_locked": "memory clock not locked",
    "no_reason_reported": "no reason reported",
}
#: A memory clock off the plan with no memory lock in force (the driver refused it).
MEMORY_NOT_LOCKED = "memory_not_locked"
#: An op held without a limiting reason set (a change still landing, an unknown limit).
NO_REASON = "no_reason_reported"

#: NVML's "GPU idle" reason: a reading taken while no op ran says nothing about the op's clock.
IDLE_REASON = next(bit for bit, name in CLOCK_EVENT_REASONS if name == "gpu_idle")

#: A reading this far below the asked clock is held (real clocks settle a step or two off).
_TOLERANCE = 0.01

#: Held ops named in one warning (the rest are counted).
_NAMED = 6

#: Held ops and reason sets a :class:`SharedHolds` keeps (then it starts afresh).
_SHARED_LIMIT = 16_384

_V = TypeVar("_V", bound=Hashable)


class ClockHeldWarning(RuntimeWarning):
    """The GPU ran ops off the plan's clocks (power cap, thermal, power brake, a memory
    clock not locked...)."""


@dataclass(frozen=True, slots=True)
class HeldOp:
    """An op that ran off its planned clocks.

    Attributes:
        op: The op (written ``1F0``).
        planned_mhz: The SM clock asked for it.
        applied_mhz: The SM clock the GPU ran (read back inside the op).
        reasons: Why, as NVML names its reasons (``("sw_power_cap",)``), or
            ``("memory_not_locked",)``, or ``("no_reason_reported",)``.
        planned_mem_mhz / applied_mem_mhz: The memory clock asked for and run, when it was
            not the plan's (else None).
    """

    op: Action
    planned_mhz: int
    applied_mhz: int
    reasons: tuple[str, ...]
    planned_mem_mhz: int | None = None
    applied_mem_mhz: int | None = None

    def __str__(self) -> str:
        memory = f", memory planned {self.planned_mem_mhz} MHz, ran {self.applied_mem_mhz} MHz"
        return (
            f"{self.op} planned {self.planned_mhz} MHz, ran {self.applied_mhz} MHz"
            f"{memory if self.applied_mem_mhz is not None else ''} "
            f"({describe_reasons(self.reasons)})"
        )


class OpReading(NamedTuple):
    """One op's clocks read back: per clock (SM, then memory) the plan's for the phase running
    when read, the one applied then (None: none) and the one read (None: not read); the reason
    mask and the op's time."""

    op: Action
    planned_mhz: int
    asked_mhz: int | None
    read_mhz: int | None
    reasons: int
    time_s: float
    planned_mem_mhz: int | None = None
    asked_mem_mhz: int | None = None
    read_mem_mhz: int | None = None


@dataclass(frozen=True, slots=True)
class ClockDelivery:
    """An iteration's clocks as delivered on one rank.

    Attributes:
        share_at_plan: The share of the read ops' time that ran at the planned clocks.
        held: The ops held off them, in op order.
        ops_read: Ops with a reading (ops too short to read, or read before their clock was
            applied, are left out).
        reasons: Every reason the held ops give (worked out once, where the delivery is).
    """

    share_at_plan: float
    held: tuple[HeldOp, ...]
    ops_read: int
    reasons: frozenset[str] = frozenset()


def describe_reasons(reasons: Sequence[str]) -> str:
    """``("sw_power_cap",)`` -> ``"power cap"`` (several joined with ``" + "``)."""
    return " + ".join(REASON_TEXT.get(r, r) for r in reasons) or REASON_TEXT[NO_REASON]


class SharedHolds:
    """One object for each held op, reason set and delivery that iterations repeat, shared
    by every record holding it (all are frozen): under a steady power cap, made afresh per
    iteration, they cost over 1 GB per rank in 100,000 iteration records.

    At most :data:`_SHARED_LIMIT` are kept (then afresh); safe from two threads (a race at
    worst makes an equal second object).
    """

    def __init__(self) -> None:
        self._kept: dict[Hashable, Hashable] = {}
        self._last: ClockDelivery | None = None

    def __len__(self) -> int:
        return len(self._kept)

    def one(self, value: _V) -> _V:
        """The object kept equal to ``value`` (``value`` itself, kept, when none is)."""
        kept = self._kept
        found = kept.get(value)
        if found is not None:
            return found  # type: ignore[return-value]  # equal, so of the same type
        if len(kept) >= _SHARED_LIMIT:
            kept.clear()
        return kept.setdefault(value, value)  # type: ignore[return-value]

    def delivery(
        self, share: float, held: tuple[HeldOp, ...], ops_read: int, reasons: frozenset[str]
    ) -> ClockDelivery:
        """A delivery of these figures (the previous one, or its held ops, where equal)."""
        last = self._last
        if last is not None and held == last.held:  # its ops shared: compared by identity
            held = last.held
        delivery = ClockDelivery(share, held, ops_read, self.one(reasons))
        if delivery == last:
            return last
        self._last = delivery
        return delivery


def clock_delivery(
    readings: Sequence[OpReading], shared: SharedHolds | None = None
) -> ClockDelivery | None:
    """An iteration's delivery from its ops' readings (None: no op was read).

    Readings taken while another clock was applied, or with the idle reason, are left out.
    An op is held when its SM clock ran below the plan's or its memory clock is not the
    plan's (``memory_not_locked`` when no memory lock was in force); one run above the plan
    (observe-only) is neither held nor at the plan.
    """
    at_plan_s = total_s = 0.0
    ops_read = 0
    held: list[HeldOp] = []
    for r in readings:
        if r.read_mhz is None or r.asked_mhz != r.planned_mhz or r.reasons & IDLE_REASON:
            continue
        if r.asked_mem_mhz is not None and r.asked_mem_mhz != r.planned_mem_mhz:
            continue
        ops_read += 1
        total_s += r.time_s
        op = _held(r, r.read_mhz)
        if op is not None:
            held.append(op if shared is None else shared.one(op))
        elif r.read_mhz <= r.planned_mhz * (1.0 + _TOLERANCE):
            at_plan_s += r.time_s  # above the plan (observe-only, the driver's clock) is not
    if not ops_read:
        return None
    share = at_plan_s / total_s if total_s > 0 else float(not held)
    held_ops = tuple(held)
    reasons = frozenset(r for h in held for r in h.reasons)
    if shared is not None and held:
        return shared.delivery(share, held_ops, ops_read, reasons)
    return ClockDelivery(share, held_ops, ops_read, reasons)


def _held(r: OpReading, read_mhz: int) -> HeldOp | None:
    sm_held = read_mhz < r.planned_mhz * (1.0 - _TOLERANCE)
    plan_mem, read_mem = r.planned_mem_mhz, r.read_mem_mhz
    mem_held = (
        plan_mem is not None
        and read_mem is not None
        and abs(read_mem - plan_mem) > plan_mem * _TOLERANCE
    )
    if not (sm_held or mem_held):
        return None
    reasons = tuple(
        name for bit, name in CLOCK_EVENT_REASONS if r.reasons & bit and name in LIMITING_REASONS
    )
    if mem_held and r.asked_mem_mhz is None:
        reasons += (MEMORY_NOT_LOCKED,)
    mem = (plan_mem, read_mem) if mem_held else (None, None)
    return HeldOp(r.op, r.planned_mhz, read_mhz, reasons or (NO_REASON,), *mem)


class HeldClockReport:
    """Warns when a rank's clocks are held off the plan: once, then only for a new reason;
    after clocks are delivered again, the next hold is reported afresh."""

    def __init__(self, rank: int, gpu_name: str) -> None:
        self._rank = rank
        self._gpu_name = gpu_name
        self._reported: set[str] = set()

    def update(self, delivery: ClockDelivery | None, iteration: int) -> str | None:
        """Warn (:class:`ClockHeldWarning`) when held for a new reason; the message."""
        if delivery is None:
            return None
        reasons = delivery.reasons
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
            f"{len(held)} of {delivery.ops_read} ops off the plan's clocks "
            f"({describe_reasons(sorted(reasons))}; {delivery.share_at_plan:.0%} of op time at the "
            f"planned clocks): {named}{more}. The plan's time and energy will not hold; "
            "lift the limit or plan for the clocks the GPU delivers"
        )
        warnings.warn(message, ClockHeldWarning, stacklevel=3)
        return message
