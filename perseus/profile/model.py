"""Per-(stage, kind) time/energy options at each SM clock, and the checks that make them usable.

A :class:`Profile` is what the planner knows about the hardware: for every stage and every
computation kind (``F``, ``B``, optionally ``W``) a list of measured options
``(freq_mhz, time_s, energy_j)``, where energy is one GPU's energy over one microbatch's op.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from perseus.errors import ProfileError
from perseus.schedule.actions import Kind

__all__ = ["OpOption", "OpProfile", "Profile", "build_profile"]


@dataclass(frozen=True, slots=True)
class OpOption:
    """One measured operating point of an op: time and one GPU's energy at ``freq_mhz``."""

    freq_mhz: int
    time_s: float
    energy_j: float


@dataclass(frozen=True, slots=True)
class OpProfile:
    """All options of one (stage, kind), sorted by clock, highest first."""

    stage_index: int
    kind: Kind
    options: tuple[OpOption, ...]

    @property
    def max_freq(self) -> OpOption:
        """The option at the highest profiled clock (the "all-max" choice)."""
        return self.options[0]

    def at(self, freq_mhz: int) -> OpOption:
        """The option measured at ``freq_mhz``.

        Raises:
            KeyError: if the clock was not profiled for this op.
        """
        for option in self.options:
            if option.freq_mhz == freq_mhz:
                return option
        raise KeyError(freq_mhz)


@dataclass(frozen=True)
class Profile:
    """Time/energy options for every (stage, kind) of a pipeline.

    Build with :func:`build_profile`, which validates completeness.
    """

    ops: Mapping[tuple[int, Kind], OpProfile]
    num_stages: int
    source: str = "<profile>"
    _sha256: str = field(default="", compare=False, repr=False)

    @property
    def kinds(self) -> tuple[Kind, ...]:
        return tuple(k for k in Kind if (0, k) in self.ops)

    @property
    def has_weight(self) -> bool:
        return Kind.W in self.kinds

    def op(self, stage_index: int, kind: Kind) -> OpProfile:
        """The options of one (stage, kind).

        Raises:
            ProfileError: if the profile has no rows for it.
        """
        try:
            return self.ops[(stage_index, kind)]
        except KeyError:
            raise ProfileError(
                f"{self.source}: no {kind.profile_name!r} rows for stage {stage_index} "
                f"(profile has stages 0..{self.num_stages - 1}, kinds "
                f"{', '.join(k.profile_name for k in self.kinds)})"
            ) from None

    @property
    def sha256(self) -> str:
        """A content hash of the options (independent of file format and row order)."""
        return self._sha256

    def split_backward(self, b_fraction: float) -> Profile:
        """Split each ``backward`` option into ``B`` and ``W`` for zero-bubble schedules.

        ``B`` gets ``b_fraction`` of the time and energy, ``W`` the rest. This is the fallback
        when a profile has no ``weight`` rows; the ZB paper measures T_B ≈ T_W, hence the usual
        0.5. A profile that already has ``weight`` rows is returned unchanged.

        Raises:
            ProfileError: if ``b_fraction`` is not in (0, 1).
        """
        if self.has_weight:
            return self
        if not 0.0 < b_fraction < 1.0:
            raise ProfileError(f"backward split fraction must be in (0, 1), got {b_fraction}")
        rows: list[tuple[int, Kind, int, float, float]] = []
        for (stage, kind), op in self.ops.items():
            for o in op.options:
                if kind is Kind.B:
                    rows.append(
                        (stage, Kind.B, o.freq_mhz, o.time_s * b_fraction, o.energy_j * b_fraction)
                    )
                    rows.append(
                        (
                            stage,
                            Kind.W,
                            o.freq_mhz,
                            o.time_s * (1 - b_fraction),
                            o.energy_j * (1 - b_fraction),
                        )
                    )
                else:
                    rows.append((stage, kind, o.freq_mhz, o.time_s, o.energy_j))
        return build_profile(rows, source=f"{self.source} (backward split {b_fraction:g})")


def _hash_rows(rows: Iterable[tuple[int, Kind, int, float, float]]) -> str:
    digest = hashlib.sha256()
    for stage, kind, freq, time_s, energy_j in sorted(rows, key=lambda r: (r[0], r[1].value, r[2])):
        digest.update(f"{stage},{kind.value},{freq},{time_s!r},{energy_j!r}\n".encode())
    return digest.hexdigest()


def build_profile(
    rows: Iterable[tuple[int, Kind, int, float, float]], source: str = "<profile>"
) -> Profile:
    """Assemble and validate a profile from ``(stage, kind, freq_mhz, time_s, energy_j)`` rows.

    Checks the structure only (row-level parsing errors are the readers' job): stages numbered
    0..S-1 without gaps, every stage has the same kinds, ``F`` and ``B`` present, values finite
    and positive, no duplicate (stage, kind, clock).

    Raises:
        ProfileError: naming ``source`` and the offending stage/kind/clock.
    """
    rows = list(rows)
    if not rows:
        raise ProfileError(
            f"{source}: profile has no rows; add stage,instruction,frequency,time,energy rows"
        )
    grouped: dict[tuple[int, Kind], dict[int, OpOption]] = {}
    for stage, kind, freq, time_s, energy_j in rows:
        where = f"{source}: stage {stage} {kind.profile_name} at {freq} MHz"
        if stage < 0:
            raise ProfileError(f"{where}: stage index must be >= 0")
        if freq <= 0:
            raise ProfileError(f"{where}: frequency must be a positive integer in MHz")
        for name, value in (("time", time_s), ("energy", energy_j)):
            if not math.isfinite(value) or value <= 0:
                raise ProfileError(f"{where}: {name} must be a finite number > 0, got {value}")
        options = grouped.setdefault((stage, kind), {})
        if freq in options:
            raise ProfileError(f"{where}: duplicate row; keep one measurement per clock")
        options[freq] = OpOption(freq, time_s, energy_j)
    stages = sorted({s for s, _ in grouped})
    num_stages = stages[-1] + 1
    missing_stages = sorted(set(range(num_stages)) - set(stages))
    if missing_stages:
        raise ProfileError(
            f"{source}: stage(s) {missing_stages} have no rows (stages must be numbered "
            f"0..{num_stages - 1} without gaps)"
        )
    kinds_present = {k for _, k in grouped}
    for required in (Kind.F, Kind.B):
        if required not in kinds_present:
            raise ProfileError(f"{source}: no {required.profile_name!r} rows at all")
    for stage in range(num_stages):
        for kind in sorted(kinds_present, key=lambda k: k.value):
            if (stage, kind) not in grouped:
                raise ProfileError(
                    f"{source}: stage {stage} has no {kind.profile_name!r} rows; every stage "
                    f"needs the same instructions"
                )
    ops = {
        key: OpProfile(key[0], key[1], tuple(sorted(opts.values(), key=lambda o: -o.freq_mhz)))
        for key, opts in sorted(grouped.items(), key=lambda kv: (kv[0][0], kv[0][1].value))
    }
    return Profile(ops, num_stages, source, _hash_rows(rows))
