"""GPU presets: clock lists, fitted power/time models and blocking power for known GPUs.

Figures come from ``docs/hardware.md``: the A100 model is fitted to the Perseus GPT-3 A100 data
(rmse 4.8 W), the A40 one to the bundled A40 profile (rmse 0.9 W); the H100 row is an estimate
(``estimated=True``). Also blocking power per GPU family (:data:`BLOCKING_POWER`) and
clock-switch costs per architecture (:data:`SWITCH_COSTS`), each with its source.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field, replace
from typing import Protocol, TypeVar, runtime_checkable

from perseus.device.base import GPU
from perseus.device.power_model import MemoryModel, PowerModel, TimeModel
from perseus.errors import ConfigError
from perseus.identity import GpuIdentity
from perseus.schedule.actions import Kind

__all__ = [
    "A40_MEMORY",
    "BLOCKING_POWER",
    "PRESETS",
    "SWITCH_COSTS",
    "BlockingPower",
    "DeclaresBlockingPower",
    "GPUPreset",
    "SwitchCost",
    "blocking_power_for",
    "blocking_power_of_name",
    "get_preset",
    "gpu_identity",
    "preset_for_name",
    "switch_cost_for",
]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class BlockingPower:
    """A GPU family's (``"A100 SXM4"``) power while blocked on P2P/collectives, in watts, and
    its source; ``estimated`` when nobody measured it (``perseus doctor`` does)."""

    family: str
    power_w: float
    source: str
    estimated: bool = False


_A100_BLOCKING = BlockingPower(
    "A100 SXM4",
    83.64,
    "measured: Perseus SOSP'24 artifact on A100 SXM4 80GB (docs/hardware.md#clocks: 83.6-85 W)",
)
_A40_BLOCKING = BlockingPower("A40", 70.38, "measured: Perseus SOSP'24 artifact on A40")
_H100_BLOCKING = BlockingPower(
    "H100 SXM",
    120.0,
    "estimate: not measured (docs/hardware.md#clocks: idle 67-73 W, 112-117 W with a live context)",
    estimated=True,
)

#: Blocking power by GPU family: (device name pattern, figure); the first match wins. PCIe and
#: NVL boards have other power envelopes.
BLOCKING_POWER: tuple[tuple[str, BlockingPower], ...] = (
    (r"\bA100[- ]SXM4?\b", _A100_BLOCKING),
    (r"\bA40\b", _A40_BLOCKING),
    (r"\bH100\b(?!.*\b(?:PCIe|NVL)\b)", _H100_BLOCKING),
)


def _clocks(low_mhz: int, high_mhz: int) -> tuple[int, ...]:
    return tuple(range(high_mhz, low_mhz - 1, -15))


@dataclass(frozen=True, slots=True)
class GPUPreset:
    """Everything the simulator needs to model one GPU type.

    Attributes:
        key: Short name used on the command line (``a100``).
        name: The name NVML would report.
        clocks_mhz: Supported SM clocks, highest first.
        time: Op-time model (reference: the highest clock).
        power_cap_w: Default enforced power limit (None: uncapped).
        activity: Default activity ``u`` of a forward/backward op.
        op_time_s: Uncapped time of one op of each kind at the highest clock.
        idle_clock_mhz: Clock reported while idle and unlocked.
        estimated: True when the numbers are not yet checked on hardware.
        memory: Lockable memory clocks and their model (GDDR boards; None: HBM).
        architecture: The NVML architecture name (``Ampere``, ``Hopper``).
    """

    key: str
    name: str
    clocks_mhz: tuple[int, ...]
    power: PowerModel
    time: TimeModel
    power_cap_w: float | None
    activity: float
    op_time_s: dict[Kind, float] = field(default_factory=dict)
    idle_clock_mhz: int = 210
    estimated: bool = False
    memory: MemoryModel | None = None
    architecture: str = "Ampere"

    def identity(self) -> GpuIdentity:
        """The GPU this preset models."""
        return GpuIdentity(
            name=self.name,
            architecture=self.architecture,
            clocks_mhz=self.clocks_mhz,
            default_power_limit_w=self.power_cap_w,
        )


@dataclass(frozen=True, slots=True)
class SwitchCost:
    """What one clock change costs on an architecture (``"ampere"``), and its source.

    Attributes:
        latency_s: Median length of a locked-clock set call; the old clocks run meanwhile.
        estimated: True when nobody measured it.
    """

    architecture: str
    latency_s: float
    source: str
    estimated: bool = False


#: Clock-switch latency per architecture: a plan charges it per mid-op switch as time at the
#: old clock and, where the runtime waits for the call, as a stall (``switch_stall_s``).
SWITCH_COSTS: dict[str, SwitchCost] = {
    "ampere": SwitchCost(
        "ampere",
        0.005,
        "measured: median nvmlDeviceSetGpuLockedClocks call 5 ms (p90 7.5, p99 12, max 15 ms) "
        "in a public V100-class DVFS latency report used for A100/A40 (GPU-backend notes §5.1, "
        "S5); Velicka et al., arXiv:2502.20075, measure A100 switching latencies by the same "
        "method",
    ),
    "hopper": SwitchCost(
        "hopper",
        0.005,
        "estimate: the Ampere figure (GPU-backend notes §5.1 'same [E]'); arXiv:2502.20075 "
        "measures a GH200 and reports latencies that vary strongly with the target clock",
        estimated=True,
    ),
    "blackwell": SwitchCost(
        "blackwell",
        0.0005,
        "estimate: a tenth of Hopper's, standing for 'reported far lower' on Blackwell; no "
        "public measurement was found; measure it before relying on it",
        estimated=True,
    ),
}


def switch_cost_for(architecture: str) -> SwitchCost:
    """The :data:`SWITCH_COSTS` entry of ``architecture`` (case-insensitive).

    Raises:
        ConfigError: naming the known architectures.
    """
    return _entry(SWITCH_COSTS, architecture, "GPU architecture")


def _entry(table: dict[str, _T], key: str, what: str) -> _T:
    try:
        return table[key.lower()]
    except KeyError:
        raise ConfigError(
            f"unknown {what} {key!r}; choose one of {', '.join(sorted(table))}"
        ) from None


#: The A40's GDDR6 memory clocks and model, all estimates: GA102's clock list, 60 W of memory
#: power (30 % static), and memory-bound shares splitting the part of an op's time the A40 SM
#: model does not scale with the SM clock (1 - alpha = 0.58).
A40_MEMORY = MemoryModel(
    clocks_mhz=(7251, 5001, 810, 405),
    power_at_max_w=60.0,
    static_share=0.3,
    memory_bound_share={Kind.F: 0.20, Kind.B: 0.15, Kind.W: 0.10},
    source="estimate: GA102 memory clock list; 60 W GDDR6 power; shares from the A40 time fit",
)


def _power(
    base_w: float, c: float, knee_mhz: float, v_max: float, max_mhz: float, idle_w: float, b: float
) -> PowerModel:
    """A fitted :class:`PowerModel` (``C`` = ``c``, ``v_min`` 0.70 V, blocking power ``b``)."""
    return PowerModel(base_w, c, 0.70, knee_mhz, v_max, max_mhz, idle_w, b)


_A100 = GPUPreset(
    key="a100",
    name="NVIDIA A100-SXM4-80GB",
    clocks_mhz=_clocks(210, 1410),
    power=_power(37.0, 470.0, 1095.0, 0.83, 1410.0, 60.0, _A100_BLOCKING.power_w),
    time=TimeModel(ref_mhz=1410.0),
    power_cap_w=400.0,
    activity=0.75,
    op_time_s={Kind.F: 0.050, Kind.B: 0.095, Kind.W: 0.0475},
)

PRESETS: dict[str, GPUPreset] = {
    "a100": _A100,
    # The board the Perseus A100 data was measured on (docs/hardware.md#sim-defaults).
    "a100-500w": replace(
        _A100,
        key="a100-500w",
        name="NVIDIA A100-SXM4-80GB (500 W)",
        power_cap_w=480.0,
        activity=1.0,
    ),
    "a40": GPUPreset(
        key="a40",
        name="NVIDIA A40",
        clocks_mhz=_clocks(210, 1740),
        power=_power(93.0, 202.0, 1120.0, 0.92, 1740.0, 30.0, _A40_BLOCKING.power_w),
        time=TimeModel(ref_mhz=1740.0, form="linear", alpha=0.42),
        power_cap_w=300.0,
        activity=1.0,
        op_time_s={Kind.F: 0.112, Kind.B: 0.277, Kind.W: 0.1385},
        memory=A40_MEMORY,
    ),
    "h100": GPUPreset(
        key="h100",
        name="NVIDIA H100 80GB HBM3",
        clocks_mhz=_clocks(345, 1980),
        power=_power(55.0, 700.0, 1400.0, 0.95, 1980.0, 70.0, _H100_BLOCKING.power_w),
        time=TimeModel(ref_mhz=1980.0),
        power_cap_w=700.0,
        activity=0.75,
        op_time_s={Kind.F: 0.025, Kind.B: 0.048, Kind.W: 0.024},
        idle_clock_mhz=345,
        estimated=True,
        architecture="Hopper",
    ),
}


def get_preset(key: str) -> GPUPreset:
    """The preset called ``key`` (case-insensitive).

    Raises:
        ConfigError: naming the known presets.
    """
    return _entry(PRESETS, key, "GPU preset")


def preset_for_name(name: str) -> GPUPreset | None:
    """The preset whose key or GPU name appears in ``name`` (case-insensitive, longest key
    first), or None."""
    text = name.lower()
    longest_first = sorted(PRESETS.values(), key=lambda p: len(p.key), reverse=True)
    return next((p for p in longest_first if p.key in text or p.name.lower() in text), None)


@runtime_checkable
class DeclaresBlockingPower(Protocol):
    """A device that knows its own blocking power (the simulated GPU: its model's value)."""

    @property
    def blocking_power_w(self) -> float: ...


def blocking_power_of_name(name: str) -> BlockingPower | None:
    """The :data:`BLOCKING_POWER` entry whose pattern matches the device name ``name``."""
    return next((figure for pattern, figure in BLOCKING_POWER if re.search(pattern, name)), None)


def blocking_power_for(gpu: GPU) -> float:
    """The power ``gpu`` draws while blocked on communication, in watts, for planning.

    A device that declares it (the simulated GPU) gives its own; otherwise its name is looked
    up in :data:`BLOCKING_POWER`. The source is logged (a warning for an estimate).

    Raises:
        ConfigError: the GPU is not one the table knows (measure it with ``perseus doctor``).
    """
    name = gpu.name
    if isinstance(gpu, DeclaresBlockingPower):
        power_w = float(gpu.blocking_power_w)
        _log.info("blocking power %.2f W for %s: declared by the device", power_w, name)
        return power_w
    figure = blocking_power_of_name(name)
    if figure is None:
        known = ", ".join(f.family for _, f in BLOCKING_POWER)
        raise ConfigError(
            f"no blocking power known for {name!r} (known: {known}); measure it with "
            "`perseus doctor` on that GPU and pass `blocking_power_w`"
        )
    if figure.estimated:
        _log.warning(
            "blocking power %.2f W for %s is an estimate (%s); measure it with `perseus doctor`",
            figure.power_w,
            name,
            figure.source,
        )
    else:
        _log.info("blocking power %.2f W for %s: %s", figure.power_w, name, figure.source)
    return figure.power_w


def gpu_identity(gpu: GPU) -> GpuIdentity | None:
    """Which GPU ``gpu`` is, as profiles and plans record it, or None when it does not say.

    A device with ``identity()`` (NVML) says so; a simulated GPU built from a preset is the
    preset's GPU; one replaying a profile is that profile's GPU by construction: None.
    """
    identity = getattr(gpu, "identity", None)
    if callable(identity):
        found = identity()
        if isinstance(found, GpuIdentity):
            return found
    name = gpu.name.removeprefix("Simulated ")  # SimulatedGPU.from_preset's name
    return next((preset.identity() for preset in PRESETS.values() if preset.name == name), None)
