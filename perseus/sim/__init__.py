"""Emulation and what-if models of whole jobs (no GPUs, no processes)."""

from perseus.sim.straggler_sweep import StragglerCase, parse_factors, straggler_sweep

__all__ = ["StragglerCase", "parse_factors", "straggler_sweep"]
