"""The GPU a profile, frontier or plan describes: one record, :class:`GpuIdentity`.

Times and energies measured on one GPU do not hold on another (an A100 profile predicted
4.62 s and 2200 J per iteration for a job an H100 ran in 0.116 s and 68 J), so profiles,
frontiers and plans carry the GPU they were measured on, and a session compares it with the GPU
it runs on (:func:`perseus.runtime.planning.check_gpu`). Files written before the record
existed still read; they are unchecked.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ARCHITECTURES", "GpuIdentity", "architecture_name"]

#: NVML's ``nvmlDeviceGetArchitecture`` values and their names.
ARCHITECTURES = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada",
    9: "Hopper",
    10: "Blackwell",
    13: "Rubin",
}

# Parts of a name that do not change what a GPU's profile measures: the vendor, the memory
# size (A100-SXM4-40GB and -80GB run the same clocks) and the memory kind, and separators.
_NOISE = re.compile(r"nvidia|\b\d+\s*gb\b|\bhbm\d*e?\b|\(.*?\)|[\s_-]+", re.IGNORECASE)
_Clock = Annotated[int, Field(ge=1, le=100_000)]


def architecture_name(code: int) -> str:
    """The name of NVML architecture ``code`` (``"unknown (n)"`` for a code not listed)."""
    return ARCHITECTURES.get(code, f"unknown ({code})")


class GpuIdentity(BaseModel):
    """Which GPU a profile, frontier or plan describes.

    Attributes:
        name: The name NVML reports (``NVIDIA A100-SXM4-80GB``).
        architecture: ``Ampere``, ``Hopper``... (None: not known).
        clocks_mhz: The GPU's supported SM clocks, highest first (empty: not known).
        default_power_limit_w: The board's default power limit (None: not known).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    name: Annotated[str, Field(min_length=1, max_length=200)]
    architecture: Annotated[str, Field(max_length=100)] | None = None
    clocks_mhz: tuple[_Clock, ...] = Field(default=(), max_length=1000)
    default_power_limit_w: Annotated[float, Field(gt=0, le=10_000, allow_inf_nan=False)] | None = (
        None
    )

    @property
    def model(self) -> str:
        """The name without vendor, memory size and memory kind, lower case: what two
        records must share to describe the same kind of GPU."""
        return _NOISE.sub("", self.name).lower()

    def same_gpu(self, other: GpuIdentity) -> bool:
        """Whether ``other`` is the same kind of GPU: the same model, and the same highest
        clock and architecture where both records know them."""
        if self.model != other.model:
            return False
        if self.clocks_mhz and other.clocks_mhz and self.clocks_mhz[0] != other.clocks_mhz[0]:
            return False
        return not (
            self.architecture and other.architecture and self.architecture != other.architecture
        )

    def describe(self) -> str:
        """One phrase: ``NVIDIA A100-SXM4-80GB (Ampere, 1410 MHz max, 400 W)``."""
        parts = [
            p
            for p in (
                self.architecture,
                f"{self.clocks_mhz[0]} MHz max" if self.clocks_mhz else None,
                f"{self.default_power_limit_w:g} W" if self.default_power_limit_w else None,
            )
            if p
        ]
        return self.name + (f" ({', '.join(parts)})" if parts else "")
