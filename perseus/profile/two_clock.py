"""Phased ops: an op that runs its first layers at one clock (pair) and later ones at others.

An op of ``L`` layers may switch clocks at layer boundaries. A :class:`Phase` is an (SM,
memory) clock pair and the first layer it runs; a two-clock op is two phases, a one-clock op
one. Each layer does a fixed share of the op's work (even, or ``layer_time_fractions``);
:func:`phased_cost` is the one place a switch is priced (docs/memory-clocks.md, "Pricing a
switch"). Pure; O(phases) per op.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import NamedTuple, cast

from perseus.errors import ConfigError, PlanError
from perseus.profile.model import OpOption
from perseus.validate import JOB_DEFAULTS, MAX_LAYER_WEIGHT, show_value

__all__ = [
    "AnyPlanOp",
    "LayerSplit",
    "Phase",
    "TwoClockOp",
    "build_layer_split",
    "check_phases",
    "op_clocks",
    "op_phases",
    "phased_cost",
    "phases_op",
]


class Phase(NamedTuple):
    """One phase of an op: from layer ``first_layer`` on, SM clock ``freq_mhz`` and memory
    clock ``mem_freq_mhz`` (``None``: the GPU's default memory clock)."""

    freq_mhz: int
    mem_freq_mhz: int | None
    first_layer: int


#: A plan op in any of its forms (see :func:`op_phases`).
AnyPlanOp = int | Sequence[int] | Sequence[Sequence[int | None]]


def op_phases(op: AnyPlanOp) -> tuple[Phase, ...]:
    """A plan op (a clock, ``(freq_a_mhz, freq_b_mhz, layers_at_a)`` or a sequence of
    ``(freq_mhz, mem_freq_mhz, first_layer)`` phases) as its phases, equal neighbours merged.

    Raises:
        PlanError: if a phase list is empty or its layers do not start at 0 and increase.
    """
    if isinstance(op, int):
        return (Phase(op, None, 0),)
    items: list[object] = list(op)
    if items and all(isinstance(x, int) for x in items):
        a, b, k = op_clocks(cast("list[int]", items))
        return (Phase(a, None, 0), Phase(b, None, k)) if k > 0 else (Phase(a, None, 0),)
    phases: list[Phase] = []
    for item in items:
        phase = _phase(op, item, phases[-1] if phases else None)
        if not phases or phases[-1][:2] != phase[:2]:  # the same clocks go on: no switch
            phases.append(phase)
    if not phases:
        raise PlanError("plan op []: give at least one phase [freq_mhz, mem_freq_mhz, 0]")
    return tuple(phases)


def _phase(op: object, item: object, previous: Phase | None) -> Phase:
    """One item of a phase-list op, checked against the phase before it."""
    if not isinstance(item, Sequence) or len(item) != 3:
        raise PlanError(f"plan op {_show(op)}: a phase is [freq_mhz, mem_freq_mhz, first_layer]")
    f, m, first = item
    if not isinstance(f, int) or not isinstance(first, int):
        raise PlanError(f"plan op {_show(op)}: a phase needs its SM clock and first layer")
    if m is not None and not isinstance(m, int):
        raise PlanError(f"plan op {_show(op)}: a memory clock is an integer or null")
    if previous is None and first != 0:
        raise PlanError(f"plan op {_show(op)}: the first phase must start at layer 0")
    if previous is not None and first <= previous.first_layer:
        raise PlanError(
            f"plan op {_show(op)}: phases must start at increasing layers, got "
            f"{previous.first_layer} then {first}"
        )
    return Phase(f, m, first)


def phases_op(
    phases: Sequence[Phase],
) -> int | tuple[int, int, int] | tuple[tuple[int, int | None, int], ...]:
    """The canonical plan-file form of an op's phases: a clock for one phase at the default
    memory clock, ``(a, b, k)`` for two such phases, otherwise the phase list."""
    if all(p.mem_freq_mhz is None for p in phases):
        if len(phases) == 1:
            return phases[0].freq_mhz
        if len(phases) == 2:
            return (phases[0].freq_mhz, phases[1].freq_mhz, phases[1].first_layer)
    return tuple((p.freq_mhz, p.mem_freq_mhz, p.first_layer) for p in phases)


def _show(op: object) -> str:
    return str(list(op) if isinstance(op, tuple) else op).replace("(", "[").replace(")", "]")


class TwoClockOp(NamedTuple):
    """Layers ``0..layers_at_a-1`` at ``freq_a_mhz``, the rest at ``freq_b_mhz`` (``(f, f, 0)``:
    one clock)."""

    freq_a_mhz: int
    freq_b_mhz: int
    layers_at_a: int

    @property
    def is_two_clock(self) -> bool:
        return self.layers_at_a > 0 and self.freq_a_mhz != self.freq_b_mhz


def op_clocks(op: AnyPlanOp) -> TwoClockOp:
    """A plan op of SM clocks only as a :class:`TwoClockOp`: what a runtime sets per op
    (``freq_a_mhz`` before it and, if ``is_two_clock``, ``freq_b_mhz`` at layer ``layers_at_a``).

    Raises:
        PlanError: for an op that sets a memory clock or has more than two phases (read it
            with :func:`op_phases`).
    """
    if isinstance(op, int):
        return TwoClockOp(op, op, 0)
    items = list(op)
    if not all(isinstance(x, int) for x in items):
        phases = op_phases(cast("list[Sequence[int | None]]", items))
        if len(phases) > 2 or any(p.mem_freq_mhz is not None for p in phases):
            raise PlanError(
                f"plan op {_show(op)} sets memory clocks or more than two phases; this "
                "consumer runs SM clocks only: plan with SM clocks (one or two per op)"
            )
        return TwoClockOp(phases[0].freq_mhz, phases[-1].freq_mhz, phases[-1].first_layer)
    a, b, k = (int(cast("int", x)) for x in items)
    return TwoClockOp(a, a, 0) if k == 0 or a == b else TwoClockOp(a, b, k)


@dataclass(frozen=True)
class LayerSplit:
    """How two-clock ops are priced for one job.

    Attributes:
        layer_fractions: Per stage, each layer's share of the op's work (sums to 1).
        switch_latency_s: Time the old clock keeps running after a mid-op switch is requested.
        switch_energy_j: Extra energy per mid-op switch.
        switch_stall_s: Time an op makes no progress per switch (at the new phase's power).
    """

    layer_fractions: tuple[tuple[float, ...], ...]
    switch_latency_s: float = JOB_DEFAULTS.switch_latency_s
    switch_energy_j: float = JOB_DEFAULTS.switch_energy_j
    switch_stall_s: float = JOB_DEFAULTS.switch_stall_s

    def num_layers(self, stage_index: int) -> int:
        return len(self.layer_fractions[stage_index])

    def work_before(self, stage_index: int, layers_at_a: int) -> float:
        """Share of the op's work in its first ``layers_at_a`` layers."""
        return math.fsum(self.layer_fractions[stage_index][:layers_at_a])


def build_layer_split(
    layers_per_stage: Sequence[int],
    num_stages: int,
    layer_time_fractions: Sequence[Sequence[float]] | None = None,
    switch_latency_s: float = JOB_DEFAULTS.switch_latency_s,
    switch_energy_j: float = JOB_DEFAULTS.switch_energy_j,
    switch_stall_s: float = JOB_DEFAULTS.switch_stall_s,
) -> LayerSplit:
    """Validate and build a :class:`LayerSplit`.

    Args:
        layers_per_stage: One number for every stage, or one per stage.
        layer_time_fractions: Per stage, one relative weight per layer (normalised here);
            replaces the even split.
        switch_latency_s: See :class:`LayerSplit`; also ``switch_energy_j``, ``switch_stall_s``.

    Raises:
        ConfigError: on a bad count, weight or cost, naming the field and the fix.
    """
    layers = list(layers_per_stage)
    if len(layers) == 1:
        layers = layers * num_stages
    if len(layers) != num_stages:
        raise ConfigError(
            f"layers_per_stage has {len(layers)} entries but the job has {num_stages} stages; "
            "give one number or one per stage"
        )
    if any(n < 1 for n in layers):
        raise ConfigError(f"layers_per_stage must be >= 1 for every stage, got {layers}")
    costs = {
        "switch_latency_s": switch_latency_s,
        "switch_energy_j": switch_energy_j,
        "switch_stall_s": switch_stall_s,
    }
    for name, value in costs.items():
        if not (math.isfinite(value) and value >= 0):
            raise ConfigError(f"{name} must be a finite number >= 0, got {value}")
    fractions = _fractions(layer_time_fractions, layers)
    return LayerSplit(
        fractions, float(switch_latency_s), float(switch_energy_j), float(switch_stall_s)
    )


def _rows(value: object) -> bool:
    """Whether ``value`` is a sequence of sequences (a list of lists, not a string)."""
    return (
        isinstance(value, Collection)
        and not isinstance(value, str | bytes)
        and all(isinstance(row, Collection) and not isinstance(row, str | bytes) for row in value)
    )


def _real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _fractions(
    layer_time_fractions: Sequence[Sequence[float]] | None, layers: list[int]
) -> tuple[tuple[float, ...], ...]:
    """Per-layer weights normalised per stage (one in (0, max] per layer), or the even split."""
    if layer_time_fractions is None:
        return tuple(tuple(1.0 / n for _ in range(n)) for n in layers)
    if not _rows(layer_time_fractions):
        raise ConfigError(
            f"`layer_time_fractions` must be a list of per-layer weight lists, one per stage, "
            f"got {show_value(layer_time_fractions)}"
        )
    if len(layer_time_fractions) != len(layers):
        raise ConfigError(
            f"layer_time_fractions has {len(layer_time_fractions)} stages, the job has "
            f"{len(layers)}; give one list of per-layer weights per stage"
        )
    rows = []
    for s, (weights, n) in enumerate(zip(layer_time_fractions, layers, strict=True)):
        if (
            not _rows([weights])
            or len(weights) != n
            or any(not _real(w) or not 0 < w <= MAX_LAYER_WEIGHT for w in weights)
        ):
            raise ConfigError(
                f"layer_time_fractions[{s}] must hold {n} weights in (0, "
                f"{MAX_LAYER_WEIGHT:g}] (one per layer of stage {s}), got "
                f"{show_value(list(weights), 120)}"
            )
        total = math.fsum(weights)
        rows.append(tuple(w / total for w in weights))
    return tuple(rows)


def phased_cost(
    options: Sequence[OpOption], work_before: Sequence[float], split: LayerSplit
) -> tuple[float, float]:
    """Time and energy of an op that runs phase ``i`` at ``options[i]`` from the share
    ``work_before[i - 1]`` of its work on. Each switch moves its boundary later by the set
    latency over the old phase's time (the old clocks run until the call returns) and adds the
    stall and the switch energy. O(phases).
    """
    x = 0.0
    time_s = 0.0
    energy_j = 0.0
    for i, o in enumerate(options):
        end = 1.0
        if i + 1 < len(options):
            end = min(1.0, max(x, work_before[i] + split.switch_latency_s / o.time_s))
        time_s += (end - x) * o.time_s
        energy_j += (end - x) * o.energy_j
        x = end
    energy_j += (len(options) - 1) * split.switch_energy_j
    for o in options[1:]:  # adding a zero stall leaves both sums exactly as they are
        time_s += split.switch_stall_s
        energy_j += split.switch_stall_s * o.energy_j / o.time_s
    return time_s, energy_j


def check_phases(phases: Sequence[Phase], stage_index: int, split: LayerSplit | None) -> None:
    """Raise :class:`PlanError` unless every phase of a multi-phase op starts at a layer of
    ``stage_index`` (a job without ``layers_per_stage`` runs one phase per op)."""
    if len(phases) == 1:
        return
    two = len(phases) == 2 and all(p.mem_freq_mhz is None for p in phases)
    shown = [phases[0].freq_mhz, phases[1].freq_mhz, phases[1].first_layer]
    if split is None:
        what = f"a two-clock op {shown}" if two else f"an op with {len(phases)} phases"
        raise PlanError(
            f"plan has {what} but the job has no layers_per_stage; "
            "give layers_per_stage or use a one-clock plan"
        )
    n = split.num_layers(stage_index)
    if two and not 0 < phases[1].first_layer < n:
        raise PlanError(
            f"two-clock op {shown} on stage {stage_index}: layers_at_a must be in 1..{n - 1} "
            f"(the stage has {n} layers)"
        )
    if phases[-1].first_layer >= n:
        raise PlanError(
            f"op phases {[list(p) for p in phases]} on stage {stage_index}: a phase starts at "
            f"layer {phases[-1].first_layer} but the stage has {n} layers (0..{n - 1})"
        )
