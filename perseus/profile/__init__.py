"""Time/energy profiles per (stage, kind, clock), Pareto filtering, two-clock ops (pure)."""

from perseus.profile.model import OpOption, OpProfile, Profile, build_profile
from perseus.profile.pareto import pareto_indices, pareto_options
from perseus.profile.two_clock import LayerSplit, TwoClockOp, build_layer_split, op_clocks

__all__ = [
    "LayerSplit",
    "OpOption",
    "OpProfile",
    "Profile",
    "TwoClockOp",
    "build_layer_split",
    "build_profile",
    "op_clocks",
    "pareto_indices",
    "pareto_options",
]
