"""Re-cut a profile to another number of pipeline stages, for planning before you have
measured your own model (the result is an estimate).

A new stage runs a contiguous block of the old stages' layers at one clock: merging ``k`` old
stages adds their times and energies at each clock all of them measured; splitting (a multiple
of the old count) gives each new stage an equal ``1/k`` share. New stage ``i`` of ``N`` covers
old stages ``floor(i*S/N)`` to ``floor((i+1)*S/N) - 1``.
"""

from __future__ import annotations

from perseus.errors import ConfigError
from perseus.io.profile_files import MAX_ENERGY_J, MAX_TIME_S, MIN_VALUE
from perseus.profile.model import Profile, ProfileRow, build_profile, clock_label

__all__ = ["slice_profile"]


def slice_profile(profile: Profile, stages: int) -> Profile:
    """``profile`` re-cut to ``stages`` stages.

    Raises:
        ConfigError: ``stages`` < 1, or more stages than the profile and not a multiple of its
            count, or merged stages without a clock in common.
    """
    old = profile.num_stages
    if stages < 1:
        raise ConfigError(f"`stages`: must be >= 1, got {stages}")
    if stages >= old and stages % old:
        raise ConfigError(
            f"`stages`: {stages} stages is more than the profile's {old} and not a multiple of "
            f"it; pass a multiple of {old} (each stage split evenly) or at most {old}"
        )
    if stages >= old:
        rows, how = _split(profile, stages), "split"
    else:
        rows, how = _merge(profile, stages), "merged"
    _check_figures(rows, stages, how)
    sliced = build_profile(rows, source=f"{profile.source} ({how} to {stages} stages)")
    return sliced.with_gpu(profile.gpu)  # still that GPU's measurements


def _check_figures(rows: list[ProfileRow], stages: int, how: str) -> None:
    """Refuse a time or energy that a profile file cannot hold (it would not read back)."""
    for stage, kind, freq, time_s, energy_j, *mem in rows:
        for name, value, top, unit in (
            ("time", time_s, MAX_TIME_S, "s"),
            ("energy", energy_j, MAX_ENERGY_J, "J"),
        ):
            if not MIN_VALUE <= value <= top:
                raise ConfigError(
                    f"`stages` {stages}: {how} stage {stage} {kind.profile_name} at "
                    f"{clock_label(freq, mem[0] if mem else None)} has {name} {value:g} {unit}, outside the "
                    f"[{MIN_VALUE:g}, {top:g}] {unit} a profile holds; slice to "
                    f"{'more' if value > top else 'fewer'} stages"
                )


def _split(profile: Profile, stages: int) -> list[ProfileRow]:
    k = stages // profile.num_stages
    return [
        (new, kind, o.freq_mhz, o.time_s / k, o.energy_j / k, o.mem_freq_mhz)
        for new in range(stages)
        for kind in profile.kinds
        for o in profile.op(new // k, kind).options
    ]


def _merge(profile: Profile, stages: int) -> list[ProfileRow]:
    old = profile.num_stages
    rows: list[ProfileRow] = []
    for new in range(stages):
        block = range(new * old // stages, (new + 1) * old // stages)
        for kind in profile.kinds:
            # Each op's options by clock pair (an op names a memory clock on all rows or none),
            # looked up once per clock: OpProfile.at scans the options, O(clocks^2) per op.
            by_clock = [{o.clocks: o for o in profile.op(s, kind).options} for s in block]
            common = set.intersection(*(set(options) for options in by_clock))
            if not common:
                raise ConfigError(
                    f"`stages` {stages}: stages {block.start}..{block.stop - 1} of "
                    f"{profile.source} share no {kind.profile_name} clock; cannot merge them"
                )
            for freq, mem in sorted(common, key=lambda c: (-c[0], -(c[1] or 0))):
                options = [op_options[(freq, mem)] for op_options in by_clock]
                time_s = sum(o.time_s for o in options)
                rows.append((new, kind, freq, time_s, sum(o.energy_j for o in options), mem))
    return rows
