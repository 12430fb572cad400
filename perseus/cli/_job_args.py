"""Arguments shared by subcommands that describe a job (profile, schedule, sizes, power)."""

from __future__ import annotations

import argparse

from perseus.errors import ConfigError
from perseus.io.bundled import default_blocking_power_w, load_profile, resolve_profile_path
from perseus.job import DEFAULT_BACKWARD_SPLIT, PlanningJob, make_job
from perseus.schedule.builders import SCHEDULE_NAMES

__all__ = ["add_job_arguments", "job_from_args"]


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """Add PROFILE, --schedule, --stages, --microbatches, --virtual-stages, power and latency."""
    parser.add_argument("profile", metavar="PROFILE", help="profile CSV/JSON, or a bundled name (a100, a40)")
    parser.add_argument("--schedule", choices=SCHEDULE_NAMES, default="1f1b")
    parser.add_argument("--stages", type=int, help="model stages (default: the profile's)")
    parser.add_argument("--microbatches", type=int, required=True)
    parser.add_argument("--virtual-stages", type=int, default=1, help="stages per rank (interleaved)")
    parser.add_argument(
        "--blocking-power-w",
        type=float,
        help="power a GPU draws while waiting (default: the bundled profile's measured value)",
    )
    parser.add_argument("--p2p-latency-s", type=float, default=0.0)
    parser.add_argument(
        "--backward-split",
        type=float,
        default=DEFAULT_BACKWARD_SPLIT,
        help="share of a backward given to B when zero-bubble splits it into B and W",
    )


def job_from_args(args: argparse.Namespace) -> PlanningJob:
    """Load the profile and build the job; the blocking power defaults to the bundled value."""
    path = resolve_profile_path(args.profile)
    profile = load_profile(path)
    power = args.blocking_power_w
    if power is None:
        power = default_blocking_power_w(profile)
        if power is None:
            raise ConfigError(
                f"{path}: no blocking power known for this profile; pass --blocking-power-w "
                f"(the GPU's power while waiting on P2P, e.g. 83.64 for A100, 70.38 for A40)"
            )
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
    )
