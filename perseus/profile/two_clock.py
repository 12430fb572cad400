"""Two-clock ops: an op that runs its first layers at one clock and the rest at another.

An op (one forward or backward of one stage on one microbatch) runs ``L`` layers one after
another. Setting the clock once at a layer boundary lets it run layers ``0..k-1`` at clock
``a`` and ``k..L-1`` at clock ``b``, which is exactly what the LP relaxation of the planning
problem allows (each op mixing two neighbouring clocks), rounded to layer fractions.

**Cost model** (the one place it is written down; the exact evaluator and the solver's option
tables both call :func:`two_clock_cost`):

* *Layer split.* Layer ``j`` of a stage does a fixed share ``w_j`` of the op's work at any
  clock (``Σ w_j = 1``), so the first ``k`` layers are a fraction ``W_k = w_0 + … + w_{k-1}``
  of the op's time and energy at that clock. Without a per-layer profile the layers of a stage
  cost the same (``w_j = 1/L``, the *even-split assumption*; true for a transformer stage whose
  layers are identical, the embedding and head aside). A per-layer profile replaces it.
* *Switch cost.* The clock change is requested at the boundary and takes effect after the set
  latency, during which the old clock keeps running: the op runs a fraction
  ``x = min(1, W_k + latency / t_a)`` of its work at ``a``. Time and energy are then the mix
  ``x·(t_a, e_a) + (1 − x)·(t_b, e_b)``, plus a transition energy per switch. Defaults: 5 ms
  latency (the median ``nvmlDeviceSetGpuLockedClocks`` call, docs/hardware.md#sim-defaults)
  and 0 J transition energy (no measurement says otherwise); both are job parameters.

Pure: no I/O. Complexity O(1) per op.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from perseus.errors import ConfigError, PlanError
from perseus.profile.model import OpOption

__all__ = [
    "DEFAULT_SWITCH_ENERGY_J",
    "DEFAULT_SWITCH_LATENCY_S",
    "LayerSplit",
    "TwoClockOp",
    "build_layer_split",
    "check_op",
    "op_clocks",
    "two_clock_cost",
]

#: Median latency of a locked-clock set call (docs/hardware.md#sim-defaults).
DEFAULT_SWITCH_LATENCY_S = 0.005
#: Extra energy per mid-op clock switch (none measured).
DEFAULT_SWITCH_ENERGY_J = 0.0


class TwoClockOp(NamedTuple):
    """An op's clocks: layers ``0..layers_at_a-1`` at ``freq_a_mhz``, the rest at ``freq_b_mhz``.

    A one-clock op is ``TwoClockOp(f, f, 0)``.
    """

    freq_a_mhz: int
    freq_b_mhz: int
    layers_at_a: int

    @property
    def is_two_clock(self) -> bool:
        return self.layers_at_a > 0 and self.freq_a_mhz != self.freq_b_mhz


def op_clocks(op: int | Sequence[int]) -> TwoClockOp:
    """A plan op (an int clock, or ``(freq_a_mhz, freq_b_mhz, layers_at_a)``) as a
    :class:`TwoClockOp`: the two clocks and the layer boundary at which the second one is set.

    This is what a runtime needs per op: set ``freq_a_mhz`` before the op and, if
    ``is_two_clock``, ``freq_b_mhz`` when layer ``layers_at_a`` starts.
    """
    if isinstance(op, int):
        return TwoClockOp(op, op, 0)
    a, b, k = (int(x) for x in op)
    if k == 0 or a == b:
        return TwoClockOp(a, a, 0)
    return TwoClockOp(a, b, k)


@dataclass(frozen=True)
class LayerSplit:
    """How two-clock ops are priced for one job.

    Attributes:
        layer_fractions: Per stage, each layer's share of the op's work (sums to 1).
        switch_latency_s: Time the old clock keeps running after a mid-op switch is requested.
        switch_energy_j: Extra energy per mid-op switch.
    """

    layer_fractions: tuple[tuple[float, ...], ...]
    switch_latency_s: float = DEFAULT_SWITCH_LATENCY_S
    switch_energy_j: float = DEFAULT_SWITCH_ENERGY_J

    def num_layers(self, stage_index: int) -> int:
        return len(self.layer_fractions[stage_index])

    def work_before(self, stage_index: int, layers_at_a: int) -> float:
        """Share of the op's work in its first ``layers_at_a`` layers."""
        return math.fsum(self.layer_fractions[stage_index][:layers_at_a])


def build_layer_split(
    layers_per_stage: Sequence[int],
    num_stages: int,
    layer_time_fractions: Sequence[Sequence[float]] | None = None,
    switch_latency_s: float = DEFAULT_SWITCH_LATENCY_S,
    switch_energy_j: float = DEFAULT_SWITCH_ENERGY_J,
) -> LayerSplit:
    """Validate and build a :class:`LayerSplit`.

    Args:
        layers_per_stage: One number for every stage, or one per stage.
        num_stages: The job's stage count.
        layer_time_fractions: Optional per-layer profile: per stage, one relative weight per
            layer (normalised here); replaces the even split.
        switch_latency_s, switch_energy_j: The switch cost (see the module docstring).

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
    if not (math.isfinite(switch_latency_s) and switch_latency_s >= 0):
        raise ConfigError(f"switch_latency_s must be a finite number >= 0, got {switch_latency_s}")
    if not (math.isfinite(switch_energy_j) and switch_energy_j >= 0):
        raise ConfigError(f"switch_energy_j must be a finite number >= 0, got {switch_energy_j}")
    if layer_time_fractions is None:
        fractions = tuple(tuple(1.0 / n for _ in range(n)) for n in layers)
    else:
        if len(layer_time_fractions) != num_stages:
            raise ConfigError(
                f"layer_time_fractions has {len(layer_time_fractions)} stages, the job has "
                f"{num_stages}; give one list of per-layer weights per stage"
            )
        rows = []
        for s, (weights, n) in enumerate(zip(layer_time_fractions, layers, strict=True)):
            if len(weights) != n or any(not (math.isfinite(w) and w > 0) for w in weights):
                raise ConfigError(
                    f"layer_time_fractions[{s}] must hold {n} positive weights (one per layer "
                    f"of stage {s}), got {list(weights)}"
                )
            total = math.fsum(weights)
            rows.append(tuple(w / total for w in weights))
        fractions = tuple(rows)
    return LayerSplit(fractions, float(switch_latency_s), float(switch_energy_j))


def two_clock_cost(
    a: OpOption, b: OpOption, work_at_a: float, split: LayerSplit
) -> tuple[float, float]:
    """Time and energy of an op that runs a share ``work_at_a`` of its work (its first
    layers) at option ``a`` and switches to ``b`` (see the module docstring).

    ``work_at_a`` is :meth:`LayerSplit.work_before` of the layer boundary; the switch latency
    moves the effective boundary later.
    """
    x = min(1.0, work_at_a + split.switch_latency_s / a.time_s)
    time_s = x * a.time_s + (1.0 - x) * b.time_s
    energy_j = x * a.energy_j + (1.0 - x) * b.energy_j + split.switch_energy_j
    return time_s, energy_j


def check_op(op: TwoClockOp, stage_index: int, split: LayerSplit | None) -> None:
    """Raise :class:`PlanError` unless ``op``'s layer boundary exists on ``stage_index``."""
    if not op.is_two_clock:
        return
    if split is None:
        raise PlanError(
            f"plan has a two-clock op {list(op)} but the job has no layers_per_stage; "
            "give layers_per_stage or use a one-clock plan"
        )
    n = split.num_layers(stage_index)
    if not 0 < op.layers_at_a < n:
        raise PlanError(
            f"two-clock op {list(op)} on stage {stage_index}: layers_at_a must be in 1..{n - 1} "
            f"(the stage has {n} layers)"
        )
