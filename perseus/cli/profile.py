"""``perseus profile``: look at a profile, or re-cut one to your model's stage count
(:mod:`perseus.io.profile_slice`)."""

from __future__ import annotations

import argparse
from typing import Any

from perseus.cli._args import (
    add_command,
    add_output_arg,
    add_path_arg,
    check_output_file,
    message_stream,
)
from perseus.cli._job_args import job_int
from perseus.errors import ConfigError, ProfileError
from perseus.log import get_logger

__all__ = ["register", "run"]

logger = get_logger(__name__)


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("profile", help="show a profile, or re-cut it to another stage count")
    actions = p.add_subparsers(dest="profile_action", metavar="ACTION", required=True)
    show = add_command(actions, "show", run, "stages, instructions and clocks of a profile")
    cut = add_command(
        actions,
        "slice",
        run,
        "merge (or evenly split) stages: a profile for a model with another stage count",
        "Write PROFILE re-cut to --stages stages: contiguous stages are merged (times and "
        "energies added at each common clock), or each stage split evenly when --stages is "
        "a multiple of the profile's count. An estimate to plan with until you measure.",
    )
    for action in (show, cut):
        add_path_arg(action, "profile", "PROFILE", "CSV/JSON or a100/a40")
    cut.add_argument("--stages", type=job_int("stages"), required=True, help="stages of the result")
    add_output_arg(cut, "FILE", "profile to write (.json: perseus's JSON, else CSV)")


def run(args: argparse.Namespace) -> int:
    from perseus.io.bundled import default_blocking_power_w, load_profile, resolve_profile_path
    from perseus.io.profile_files import MAX_FILE_BYTES, write_profile_csv, write_profile_json
    from perseus.io.profile_slice import slice_profile

    if args.profile_action == "slice":
        out = check_output_file(args.out, inputs={"PROFILE": args.profile})
    path = resolve_profile_path(args.profile)
    profile = load_profile(path)
    power = default_blocking_power_w(profile)
    if args.profile_action == "show":
        print(f"{path}: {profile.num_stages} stages, sha256 {profile.sha256[:16]}...")
        for (stage, kind), op in profile.ops.items():
            clocks = [o.freq_mhz for o in op.options]
            print(
                f"  stage {stage} {kind.profile_name:<8} {len(clocks)} clocks "
                f"{min(clocks)}..{max(clocks)} MHz, {op.max_freq.time_s * 1e3:.2f} ms at max"
            )
        if power is not None:
            print(f"blocking power (measured): {power:g} W")
        return 0
    logger.info("slicing %s (%d stages) to %d stages", path, profile.num_stages, args.stages)
    sliced = slice_profile(profile, args.stages)
    write = write_profile_json if out.suffix.lower() == ".json" else write_profile_csv
    try:  # a profile perseus would refuse to read is not written
        write(sliced, out, max_bytes=MAX_FILE_BYTES)
    except ProfileError as e:
        raise ConfigError(f"--stages {args.stages}: {e}; slice to fewer stages") from None
    hint = f" --blocking-power-w {power:g}" if power is not None else " --blocking-power-w W"
    print(
        f"wrote {out}: {profile.num_stages} -> {sliced.num_stages} stages\n"
        f"next: perseus frontier {out} --microbatches N{hint} -o frontier.json",
        file=message_stream(out),
    )
    return 0
