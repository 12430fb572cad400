"""GPU backends behind one Protocol: NVML (real GPUs) and a simulated GPU.

Nothing here imports ``pynvml`` at import time; the NVML backend imports it lazily.
"""

from perseus.device.base import GPU, ManagedGPU, ObserveOnlyWarning
from perseus.device.presets import PRESETS, GPUPreset, get_preset
from perseus.device.simulated import SimulatedGPU, sim_uuid

__all__ = [
    "GPU",
    "PRESETS",
    "GPUPreset",
    "ManagedGPU",
    "ObserveOnlyWarning",
    "SimulatedGPU",
    "get_preset",
    "sim_uuid",
]
