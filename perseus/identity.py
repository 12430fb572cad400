"""The GPU a profile, frontier or plan describes: one record, :class:`GpuIdentity`.

Figures measured on one GPU do not hold on another, so profiles and plans carry the GPU they
were measured on and a session compares it with its own
(:func:`perseus.runtime.planning.check_gpu`); files without the record are unchecked.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from perseus.validate import whole_number

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

# What does not change a GPU's profile: vendor, memory size and kind, separators.
_NOISE = re.compile(r"nvidia|\b\d+\s*gb\b|\bhbm\d*e?\b|\(.*?\)|[\s_-]+", re.IGNORECASE)
_Clock = Annotated[int, Field(ge=1, le=100_000)]


def architecture_name(code: int) -> str:
    """The name of NVML architecture ``code`` (``"unknown (n)"`` for a code not listed)."""
    return ARCHITECTURES.get(code, f"unknown ({code})")


class GpuIdentity(BaseModel):
    """Which GPU a profile, frontier or plan describes (None or empty: not known).

    Attributes:
        name: The name NVML reports (``NVIDIA A100-SXM4-80GB``).
        architecture: ``Ampere``, ``Hopper``...
        clocks_mhz: The GPU's supported SM clocks, highest first.
        default_power_limit_w: The board's default power limit.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Annotated[Literal[1], BeforeValidator(whole_number)] = 1
    name: Annotated[str, Field(min_length=1, max_length=200)]
    architecture: Annotated[str, Field(max_length=100)] | None = None
    clocks_mhz: tuple[_Clock, ...] = Field(default=(), max_length=1000)
    default_power_limit_w: Annotated[float, Field(gt=0, le=10_000, allow_inf_nan=False)] | None = (
        None
    )

    @property
    def model(self) -> str:
        """The name without vendor, memory size and kind, lower case."""
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
        parts = [self.architecture] if self.architecture else []
        if self.clocks_mhz:
            parts.append(f"{self.clocks_mhz[0]} MHz max")
        if self.default_power_limit_w:
            parts.append(f"{self.default_power_limit_w:g} W")
        return self.name + (f" ({', '.join(parts)})" if parts else "")
