"""Time/energy profiles per (stage, kind, clock pair), Pareto filtering, phased ops (pure)."""

from perseus.profile.model import OpOption, OpProfile, Profile, build_profile
from perseus.profile.pareto import pareto_indices, pareto_options
from perseus.profile.two_clock import (
    LayerSplit,
    Phase,
    TwoClockOp,
    build_layer_split,
    op_clocks,
    op_phases,
    phases_op,
)

__all__ = [
    "LayerSplit",
    "OpOption",
    "OpProfile",
    "Phase",
    "Profile",
    "TwoClockOp",
    "build_layer_split",
    "build_profile",
    "op_clocks",
    "op_phases",
    "pareto_indices",
    "pareto_options",
    "phases_op",
]
