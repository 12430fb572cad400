"""Per-(stage, kind) time/energy options at each clock pair, and the checks that make them usable.

A :class:`Profile` holds, for every stage and kind (``F``, ``B``, optionally ``W``), the measured
options ``(freq_mhz, time_s, energy_j)``, energy being one GPU's over one microbatch's op. Options
may carry a memory clock (all of an op's, or none); a plain SM clock ``f`` then means ``f`` at
the highest memory clock profiled with it (:meth:`OpProfile.at`), so one-clock plans and
baselines mean the same on both kinds of profile.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from perseus.errors import ProfileError
from perseus.identity import GpuIdentity
from perseus.schedule.actions import Kind

__all__ = [
    "CAP_FLAT_POWER",
    "CAP_FLAT_TIME",
    "CAP_MIN_SPAN",
    "OpOption",
    "OpProfile",
    "Profile",
    "ProfileRow",
    "build_profile",
    "cap_bound_clock_mhz",
    "clock_label",
]

#: ``(stage, kind, freq_mhz, time_s, energy_j)``, optionally followed by ``mem_freq_mhz``.
ProfileRow = tuple[int, Kind, int, float, float] | tuple[int, Kind, int, float, float, int | None]


def clock_label(freq_mhz: int, mem_freq_mhz: int | None) -> str:
    """A clock (pair) in messages: ``1410 MHz`` or ``1740/7251 MHz (SM/memory)``."""
    if mem_freq_mhz is None:
        return f"{freq_mhz} MHz"
    return f"{freq_mhz}/{mem_freq_mhz} MHz (SM/memory)"


@dataclass(frozen=True, slots=True)
class OpOption:
    """One measured operating point of an op at SM clock ``freq_mhz`` and memory clock
    ``mem_freq_mhz`` (``None``: the GPU's default one)."""

    freq_mhz: int
    time_s: float
    energy_j: float
    mem_freq_mhz: int | None = None

    @property
    def clocks(self) -> tuple[int, int | None]:
        return self.freq_mhz, self.mem_freq_mhz


@dataclass(frozen=True, slots=True)
class OpProfile:
    """All options of one (stage, kind), sorted by clock, highest first."""

    stage_index: int
    kind: Kind
    options: tuple[OpOption, ...]

    @property
    def max_freq(self) -> OpOption:
        """The option at the highest (SM, then memory) clock: the "all-max" choice."""
        return self.options[0]

    @property
    def has_memory_clocks(self) -> bool:
        return self.options[0].mem_freq_mhz is not None

    def at(self, freq_mhz: int, mem_freq_mhz: int | None = None) -> OpOption:
        """The option measured at ``freq_mhz`` and ``mem_freq_mhz`` (``None``: the highest
        memory clock profiled at ``freq_mhz``, which the sort puts first).

        Raises:
            KeyError: ``freq_mhz`` or ``(freq_mhz, mem_freq_mhz)``, if not profiled.
        """
        for option in self.options:
            if option.freq_mhz == freq_mhz and (
                mem_freq_mhz is None or option.mem_freq_mhz == mem_freq_mhz
            ):
                return option
        raise KeyError(freq_mhz if mem_freq_mhz is None else (freq_mhz, mem_freq_mhz))


@dataclass(frozen=True)
class Profile:
    """Time/energy options for every (stage, kind) of a pipeline, built by :func:`build_profile`.

    ``gpu`` is the GPU the rows were measured on (None: unchecked); it is not part of the hash.
    """

    ops: Mapping[tuple[int, Kind], OpProfile]
    num_stages: int
    source: str = "<profile>"
    _sha256: str = field(default="", compare=False, repr=False)
    gpu: GpuIdentity | None = field(default=None, compare=False)

    @property
    def kinds(self) -> tuple[Kind, ...]:
        return tuple(k for k in Kind if (0, k) in self.ops)

    @property
    def has_weight(self) -> bool:
        return Kind.W in self.kinds

    def op(self, stage_index: int, kind: Kind) -> OpProfile:
        """The options of one (stage, kind); :class:`ProfileError` if it has no rows."""
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
        """Split each ``backward`` option into ``B`` (``b_fraction`` of time and energy) and
        ``W`` (the rest) for zero-bubble schedules; unchanged if it has ``weight`` rows.

        Raises:
            ProfileError: if ``b_fraction`` is not in (0, 1).
        """
        if self.has_weight:
            return self
        if not 0.0 < b_fraction < 1.0:
            raise ProfileError(f"backward split fraction must be in (0, 1), got {b_fraction}")
        rows: list[ProfileRow] = []
        for (stage, kind), op in self.ops.items():
            # Other kinds keep their figures (times 1.0: exactly the same floats).
            parts = ((Kind.B, b_fraction), (Kind.W, 1 - b_fraction)) if kind is Kind.B else ()
            for o in op.options:
                for part, share in parts or ((kind, 1.0),):
                    t, e = o.time_s * share, o.energy_j * share
                    rows.append((stage, part, o.freq_mhz, t, e, o.mem_freq_mhz))
        split = build_profile(rows, source=f"{self.source} (backward split {b_fraction:g})")
        return split.with_gpu(self.gpu)

    def with_gpu(self, gpu: GpuIdentity | None) -> Profile:
        """The same profile (and hash), recorded as measured on ``gpu``."""
        return dataclasses.replace(self, gpu=gpu)

    def cap_bound_clocks(self) -> dict[tuple[int, Kind], int]:
        """The cap-bound clock (:func:`cap_bound_clock_mhz`) of each op that has one."""
        clocks = {key: cap_bound_clock_mhz(op.options) for key, op in self.ops.items()}
        return {key: clock for key, clock in clocks.items() if clock is not None}

    def collapse_cap_bound(self) -> Profile:
        """The profile with every option above an op's cap-bound clock dropped, so a plan asks
        for the clock the GPU runs (an A40 at 300 W ran 1500-1740 MHz alike). The hash stays the
        measured profile's. Complexity: O(options).
        """
        bound = self.cap_bound_clocks()
        if not bound:
            return self
        ops = dict(self.ops)
        for key, clock in bound.items():
            kept = tuple(o for o in ops[key].options if o.freq_mhz <= clock)
            ops[key] = dataclasses.replace(ops[key], options=kept)
        clocks = sorted(set(bound.values()))
        source = f"{self.source} (cap-bound above {'/'.join(map(str, clocks))} MHz: collapsed)"
        return dataclasses.replace(self, ops=ops, source=source)


#: A cap-bound run: options within these fractions of the top one's time and power, spanning
#: at least this share of the top clock.
CAP_FLAT_TIME = 0.025
CAP_FLAT_POWER = 0.015
CAP_MIN_SPAN = 0.10


def cap_bound_clock_mhz(options: tuple[OpOption, ...]) -> int | None:
    """The clock a power cap held an op at (options highest clock first): the lowest clock of
    the run from the top within :data:`CAP_FLAT_TIME` and :data:`CAP_FLAT_POWER` of the top
    option's time and power, if it spans :data:`CAP_MIN_SPAN` of the top clock; else None
    (also for memory clocks, where each memory clock has its own cap-bound SM clock).
    """
    if len(options) < 3 or options[0].mem_freq_mhz is not None:
        return None
    top = options[0]
    top_power_w = top.energy_j / top.time_s
    lowest = top.freq_mhz
    for o in options[1:]:
        power_w = o.energy_j / o.time_s
        if (
            abs(o.time_s / top.time_s - 1.0) > CAP_FLAT_TIME
            or abs(power_w / top_power_w - 1.0) > CAP_FLAT_POWER
        ):
            break
        lowest = o.freq_mhz
    if top.freq_mhz - lowest < CAP_MIN_SPAN * top.freq_mhz:
        return None
    return lowest


_Full = tuple[int, Kind, int, float, float, int | None]


def _hash_rows(rows: Iterable[_Full]) -> str:
    # A row without a memory clock hashes without a tail, as before memory clocks existed.
    digest = hashlib.sha256()
    for stage, kind, freq, time_s, energy_j, mem in sorted(
        rows, key=lambda r: (r[0], r[1].value, r[2], r[5] or 0)
    ):
        tail = "" if mem is None else f",{mem}"
        digest.update(f"{stage},{kind.value},{freq},{time_s!r},{energy_j!r}{tail}\n".encode())
    return digest.hexdigest()


_Grouped = dict[tuple[int, Kind], dict[tuple[int, int | None], OpOption]]


def _group(full: list[_Full], source: str) -> _Grouped:
    """The rows' options by (stage, kind), each row checked on its own and against its op's."""
    grouped: _Grouped = {}
    for stage, kind, freq, time_s, energy_j, mem in full:
        where = f"{source}: stage {stage} {kind.profile_name} at {clock_label(freq, mem)}"
        if stage < 0:
            raise ProfileError(f"{where}: stage index must be >= 0")
        if freq <= 0 or (mem is not None and mem <= 0):
            raise ProfileError(f"{where}: clocks must be positive integers in MHz")
        for name, value in (("time", time_s), ("energy", energy_j)):
            if not math.isfinite(value) or value <= 0:
                raise ProfileError(f"{where}: {name} must be a finite number > 0, got {value}")
        options = grouped.setdefault((stage, kind), {})
        if (freq, mem) in options:
            raise ProfileError(f"{where}: duplicate row; keep one measurement per clock")
        if options and (next(iter(options))[1] is None) != (mem is None):
            raise ProfileError(
                f"{where}: some rows of this op name a memory clock and some do not; give "
                "mem_freq_mhz on every row of the op or on none"
            )
        options[(freq, mem)] = OpOption(freq, time_s, energy_j, mem)
    return grouped


def _check_shape(grouped: _Grouped, source: str) -> int:
    """The number of stages, once every stage has the same kinds, ``F`` and ``B`` among them."""
    stages = {s for s, _ in grouped}
    num_stages = max(stages) + 1
    if missing := sorted(set(range(num_stages)) - stages):
        shown = missing if len(missing) <= 8 else f"{missing[:8]} and {len(missing) - 8} more"
        raise ProfileError(
            f"{source}: stage(s) {shown} have no rows (stages must be numbered "
            f"0..{num_stages - 1} without gaps)"
        )
    kinds = sorted({k for _, k in grouped}, key=lambda k: k.value)
    for required in (Kind.F, Kind.B):
        if required not in kinds:
            raise ProfileError(f"{source}: no {required.profile_name!r} rows at all")
    for stage, kind in itertools.product(range(num_stages), kinds):
        if (stage, kind) not in grouped:
            raise ProfileError(
                f"{source}: stage {stage} has no {kind.profile_name!r} rows; every stage "
                f"needs the same instructions"
            )
    return num_stages


def build_profile(
    rows: Iterable[ProfileRow], source: str = "<profile>", gpu: GpuIdentity | None = None
) -> Profile:
    """Assemble and validate a profile from :data:`ProfileRow` rows measured on ``gpu``.

    Raises:
        ProfileError: naming ``source`` and the offending stage, kind or clock, unless stages
            run 0..S-1 without gaps, each with the same kinds (``F`` and ``B`` among them),
            values are finite and positive, no (stage, kind, clock pair) repeats, and each
            (stage, kind) names a memory clock on every row or on none.
    """
    full: list[_Full] = [(*r, None) if len(r) == 5 else r for r in rows]
    if not full:
        raise ProfileError(
            f"{source}: profile has no rows; add stage,instruction,frequency,time,energy rows"
        )
    grouped = _group(full, source)
    num_stages = _check_shape(grouped, source)
    ops = {
        key: OpProfile(
            key[0],
            key[1],
            tuple(sorted(opts.values(), key=lambda o: (-o.freq_mhz, -(o.mem_freq_mhz or 0)))),
        )
        for key, opts in sorted(grouped.items(), key=lambda kv: (kv[0][0], kv[0][1].value))
    }
    return Profile(ops, num_stages, source, _hash_rows(full), gpu)
