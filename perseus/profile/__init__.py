"""Time/energy profiles per (stage, kind, clock) (pure)."""

from perseus.profile.model import OpOption, OpProfile, Profile, build_profile
from perseus.profile.pareto import pareto_options

__all__ = ["OpOption", "OpProfile", "Profile", "build_profile", "pareto_options"]
