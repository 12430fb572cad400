"""Arguments shared by subcommands that describe a job (profile, schedule, sizes, power).

A job comes from flags, from a TOML config (``--config FILE``, see :mod:`perseus.io.config`),
or both: config values fill in what the flags leave out, and a flag given on the command line
always wins. The PROFILE positional is optional when ``--config`` names one.
"""

from __future__ import annotations

import argparse

from perseus.errors import ConfigError
from perseus.io.bundled import default_blocking_power_w, load_profile, resolve_profile_path
from perseus.io.config import JobConfig, read_job_config, resolve_config_profile
from perseus.job import DEFAULT_BACKWARD_SPLIT, PlanningJob, make_job
from perseus.profile.two_clock import DEFAULT_SWITCH_ENERGY_J, DEFAULT_SWITCH_LATENCY_S
from perseus.schedule.builders import SCHEDULE_NAMES

__all__ = ["CONFIG_FIELDS", "add_job_arguments", "job_from_args"]

# Flag defaults, applied after the config (argparse defaults are None so that a flag left out
# can be told apart from a flag given with the default value).
_DEFAULTS: dict[str, object] = {
    "schedule": "1f1b",
    "virtual_stages": 1,
    "p2p_latency_s": 0.0,
    "backward_split": DEFAULT_BACKWARD_SPLIT,
    "switch_latency_s": DEFAULT_SWITCH_LATENCY_S,
    "switch_energy_j": DEFAULT_SWITCH_ENERGY_J,
}
#: Job fields a TOML config can set (flags given on the command line override them).
CONFIG_FIELDS = (
    "schedule",
    "stages",
    "microbatches",
    "virtual_stages",
    "blocking_power_w",
    "p2p_latency_s",
    "backward_split",
    "layers_per_stage",
    "layer_time_fractions",
    "switch_latency_s",
    "switch_energy_j",
    "max_clocks_per_op",
)


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """Add PROFILE, --config, --schedule, --stages, --microbatches, --virtual-stages, power, latency."""
    parser.add_argument(
        "profile",
        metavar="PROFILE",
        nargs="?",
        help="profile CSV/JSON, or a bundled name (a100, a40); optional with --config",
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="TOML job config (see configs/); flags given here override its values",
    )
    parser.add_argument(
        "--schedule", choices=SCHEDULE_NAMES, help="pipeline schedule (default 1f1b)"
    )
    parser.add_argument("--stages", type=int, help="model stages (default: the profile's)")
    parser.add_argument(
        "--microbatches", type=int, help="microbatches per iteration (required without --config)"
    )
    parser.add_argument(
        "--virtual-stages", type=int, help="stages per rank (interleaved; default 1)"
    )
    parser.add_argument(
        "--blocking-power-w",
        type=float,
        help="power a GPU draws while waiting (default: the bundled profile's measured value)",
    )
    parser.add_argument("--p2p-latency-s", type=float, help="latency of a P2P send (default 0)")
    parser.add_argument(
        "--backward-split",
        type=float,
        help=f"share of a backward given to B when zero-bubble splits it into B and W (default {DEFAULT_BACKWARD_SPLIT})",
    )
    parser.add_argument(
        "--layers-per-stage",
        type=_layer_counts,
        help="layers each stage holds (one number, or one per stage: 12,12,...); lets plans "
        "switch clock once inside an op at a layer boundary (two-clock ops)",
    )
    parser.add_argument(
        "--switch-latency-s",
        type=float,
        help=f"time the old clock keeps running after a mid-op switch (default {DEFAULT_SWITCH_LATENCY_S})",
    )
    parser.add_argument(
        "--switch-energy-j",
        type=float,
        help=f"extra energy per mid-op clock switch (default {DEFAULT_SWITCH_ENERGY_J})",
    )


def _layer_counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected layer counts like 12 or 12,12,10, got {text!r}"
        ) from None
    return counts


def _merge(args: argparse.Namespace) -> tuple[str, JobConfig | None]:
    """Fill unset flags from the config, then from the defaults; write them back to ``args``."""
    config: JobConfig | None = None
    profile = args.profile
    if getattr(args, "config", None) is not None:
        config, path = read_job_config(args.config)
        if profile is None:
            profile = resolve_config_profile(config, path)
        for name in CONFIG_FIELDS:
            if getattr(args, name, None) is None:
                setattr(args, name, getattr(config, name))
    for name, value in _DEFAULTS.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    if profile is None:
        raise ConfigError("no profile given; pass PROFILE (e.g. a100) or --config FILE")
    if args.microbatches is None:
        raise ConfigError("--microbatches is required (or give --config FILE with microbatches)")
    args.profile = profile
    return profile, config


def job_from_args(args: argparse.Namespace) -> PlanningJob:
    """Load the profile and build the job; the blocking power defaults to the bundled value.

    Resolved values (config, then defaults) are written back to ``args`` so that later code
    reads the same job the planner used.

    Raises:
        ConfigError: no profile, no microbatch count, a bad config, or no known blocking power.
    """
    profile_arg, _ = _merge(args)
    path = resolve_profile_path(profile_arg)
    profile = load_profile(path)
    power = args.blocking_power_w
    if power is None:
        power = default_blocking_power_w(profile)
        if power is None:
            raise ConfigError(
                f"{path}: no blocking power known for this profile; pass --blocking-power-w "
                f"(the GPU's power while waiting on P2P, e.g. 83.64 for A100, 70.38 for A40)"
            )
        args.blocking_power_w = power
    stages = args.stages if args.stages is not None else profile.num_stages
    return make_job(
        profile,
        args.schedule,
        stages,
        args.microbatches,
        power,
        virtual_stages=args.virtual_stages,
        p2p_latency_s=args.p2p_latency_s,
        backward_split=args.backward_split,
        profile_name=path.stem,
        layers_per_stage=getattr(args, "layers_per_stage", None),
        layer_time_fractions=getattr(args, "layer_time_fractions", None),
        switch_latency_s=args.switch_latency_s,
        switch_energy_j=args.switch_energy_j,
    )
