"""Arguments of subcommands that describe a job: flags, a TOML config (``--config FILE``), or
both (a flag wins). :class:`~perseus.io.config.JobConfig` validates flags and keys alike, and
an error names where the bad value came from: the flag, or the config file and key."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perseus.cli._args import add_path_arg, first_line, float_arg, int_arg
from perseus.errors import ConfigError, PlanError
from perseus.schedule.builders import SCHEDULE_NAMES
from perseus.validate import JOB_BOUNDS, JOB_DEFAULTS, check_job_size, show_value

if TYPE_CHECKING:  # the planner and the file readers load when a command runs, not for --help
    from perseus.job import PlanningJob
    from perseus.plan import Frontier
    from perseus.profile.model import Profile

__all__ = [
    "CONFIG_FIELDS",
    "add_job_arguments",
    "check_figures",
    "job_from_args",
    "job_from_frontier",
    "job_int",
]

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
    "switch_stall_s",
    "max_clocks_per_op",
)


def job_int(name: str) -> Callable[[str], int]:
    """The argparse ``type`` of integer job field ``name``, in its range (``JOB_BOUNDS``)."""
    bounds = JOB_BOUNDS[name]
    return int_arg(
        ge=None if bounds.ge is None else int(bounds.ge),
        le=None if bounds.le is None else int(bounds.le),
    )


def _layer_counts(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected layer counts like 12 or 12,12,10, got {show_value(text)}"
        ) from None


# The job's flags are parsed, not range-checked: JobConfig checks them with the config's keys.
_INT = int_arg()
_NUMBER = float_arg()
_D = JOB_DEFAULTS
#: The job's flags after --schedule: (field, parse, help).
_JOB_FLAGS: tuple[tuple[str, Callable[[str], object], str], ...] = (
    ("stages", _INT, "model stages (default: the profile's)"),
    ("microbatches", _INT, "microbatches per iteration (required without --config)"),
    ("virtual_stages", _INT, f"stages per rank (interleaved; default {_D.virtual_stages})"),
    (
        "blocking_power_w",
        _NUMBER,
        "power a GPU draws while waiting (default: the bundled profile's measured value)",
    ),
    ("p2p_latency_s", _NUMBER, f"latency of a P2P send (default {_D.p2p_latency_s:g})"),
    (
        "backward_split",
        _NUMBER,
        "share of a backward given to B when zero-bubble splits it into B and W (default "
        f"{_D.backward_split}; zb only)",
    ),
    (
        "layers_per_stage",
        _layer_counts,
        "layers each stage holds (one number, or one per stage: 12,12,...); lets plans switch "
        "clock once inside an op at a layer boundary (two-clock ops)",
    ),
    (
        "switch_latency_s",
        _NUMBER,
        f"time the old clock keeps running after a mid-op switch (default {_D.switch_latency_s})",
    ),
    (
        "switch_energy_j",
        _NUMBER,
        f"extra energy per mid-op clock switch (default {_D.switch_energy_j})",
    ),
    (
        "switch_stall_s",
        _NUMBER,
        "time an op stalls per mid-op switch, drawn at the new clock's power (default "
        f"{_D.switch_stall_s}; a runtime that waits for the set call: the set latency)",
    ),
)


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """Add PROFILE, --config, --schedule and the job's flags (``_JOB_FLAGS``)."""
    add_path_arg(
        parser,
        "profile",
        "PROFILE",
        "profile CSV/JSON, or a bundled name (a100, a40); optional with --config",
        nargs="?",
    )
    add_path_arg(
        parser,
        "--config",
        "FILE",
        "TOML job config (see configs/); flags given here override its values",
    )
    parser.add_argument(
        "--schedule",
        choices=SCHEDULE_NAMES,
        help=f"pipeline schedule (default {JOB_DEFAULTS.schedule})",
    )
    for name, parse, text in _JOB_FLAGS:
        parser.add_argument("--" + name.replace("_", "-"), type=parse, help=text)


def _merge(args: argparse.Namespace) -> dict[str, str]:
    """Validate the job's flags and its config's keys as one :class:`JobConfig` (a flag wins
    over its key) and write it back to ``args``; returns where each field's value came from
    (the flag, or ``"<config>: key <name>"``)."""
    from pydantic import ValidationError

    from perseus.io.config import (
        JobConfig,
        describe_job_error,
        read_job_config,
        resolve_config_profile,
    )

    sources = {name: "--" + name.replace("_", "-") for name in CONFIG_FIELDS}
    sources["profile"] = "PROFILE"
    values: dict[str, object] = {}
    args.profile_source = None
    if getattr(args, "config", None) is not None:
        config, path = read_job_config(args.config)
        if args.profile is None:
            args.profile = resolve_config_profile(config, path)
            args.profile_source = f"{path}: key profile"
        for name in config.model_fields_set.intersection(CONFIG_FIELDS):
            values[name] = getattr(config, name)
            sources[name] = f"{path}: key {name}"
    for name in CONFIG_FIELDS:
        if getattr(args, name, None) is not None:
            values[name] = getattr(args, name)
            sources[name] = "--" + name.replace("_", "-")
    if args.profile is None:
        raise ConfigError("PROFILE: no profile given; pass PROFILE (e.g. a100) or --config FILE")
    if "microbatches" not in values:
        raise ConfigError("--microbatches: required (or give --config FILE with microbatches = N)")
    try:
        job = JobConfig.model_validate({"profile": args.profile, **values})
    except ValidationError as e:
        raise ConfigError(describe_job_error(e, sources)) from None
    where = sources["max_clocks_per_op"]  # the flag's error is the cost model's, in its words
    if (job.max_clocks_per_op or 1) > 1 and job.layers_per_stage is None and where[0] != "-":
        raise ConfigError(
            f"{where}: {job.max_clocks_per_op} clocks per op need the job's layers_per_stage; "
            "add layers_per_stage = N (or --layers-per-stage N), or set max_clocks_per_op = 1"
        )
    for name in CONFIG_FIELDS:
        setattr(args, name, getattr(job, name))
    return sources


def job_from_args(args: argparse.Namespace) -> PlanningJob:
    """Load the profile and build the job (the blocking power defaults to the bundled value);
    resolved values are written back to ``args``. A ConfigError names the flag or config key
    at fault."""
    from perseus.io.bundled import default_blocking_power_w, load_profile, resolve_profile_path

    sources = _merge(args)
    try:
        path = resolve_profile_path(args.profile)
    except ConfigError as e:
        if args.profile_source is None:
            raise
        raise ConfigError(f"{args.profile_source}: {e}") from None
    profile = load_profile(path)
    power = args.blocking_power_w
    if power is None:
        power = default_blocking_power_w(profile)
        if power is None:
            raise ConfigError(
                f"--blocking-power-w: no blocking power known for profile {path}; pass "
                f"--blocking-power-w (the GPU's power while waiting on P2P, e.g. 83.64 for "
                f"A100, 70.38 for A40)"
            )
        args.blocking_power_w = power
    stages = args.stages if args.stages is not None else profile.num_stages
    if args.stages is not None and profile.num_stages != stages:
        raise ConfigError(
            f"{sources['stages']}: {stages} stages, but profile {path} has {profile.num_stages}; "
            f"use {profile.num_stages}, or make a {stages}-stage profile with "
            f"`perseus profile slice {args.profile} --stages {stages} -o p.csv`"
        )
    if args.backward_split != JOB_DEFAULTS.backward_split and args.schedule != "zb":
        raise ConfigError(
            f"{sources['backward_split']}: only the zb schedule splits backwards into B and W, "
            f"the schedule is {args.schedule}; drop it or use --schedule zb"
        )
    if args.virtual_stages != 1 and args.schedule != "interleaved":
        raise ConfigError(
            f"{sources['virtual_stages']}: {args.virtual_stages} virtual stages need the "
            f"interleaved schedule, the schedule is {args.schedule}; drop it or use "
            "--schedule interleaved"
        )
    if args.schedule == "interleaved":
        _check_interleaved(stages, args.microbatches, args.virtual_stages, sources)
    try:
        return build_checked_job(
            profile,
            args.schedule,
            stages,
            args.microbatches,
            profile_name=path.stem,
            size_source=sources["microbatches"],
            **{name: getattr(args, name) for name in _MAKE_JOB_KEYWORDS},
        )
    except ConfigError as e:
        raise ConfigError(_blamed(str(e), sources)) from None


def _blamed(message: str, sources: dict[str, str]) -> str:
    """A job error that opens with a field's name (``layers_per_stage has 2 entries ...``), that
    name replaced by where its value came from (``sources``)."""
    name = message.partition(" ")[0].partition("[")[0]
    if name not in CONFIG_FIELDS:
        return message
    return sources[name] + message[len(name) :]


def _check_interleaved(
    stages: int, microbatches: int, virtual_stages: int, sources: dict[str, str]
) -> None:
    """Interleaved 1F1B's size rules, blamed on where the values came from."""
    if stages % virtual_stages:
        raise ConfigError(
            f"{sources['virtual_stages']}: {stages} stages do not split into {virtual_stages} "
            f"virtual stages per rank; use a divisor of {stages}"
        )
    ranks = stages // virtual_stages
    rounds = max(1, microbatches // ranks)
    if microbatches % rounds:
        raise ConfigError(
            f"{sources['microbatches']}: interleaved 1F1B on {ranks} ranks needs a microbatch "
            f"count that splits into whole rounds (torch's rule), got {microbatches}; try a "
            f"multiple of {ranks}"
        )


#: The job fields :func:`~perseus.job.make_job` takes as keywords.
_MAKE_JOB_KEYWORDS = tuple(
    name
    for name in CONFIG_FIELDS
    if name not in {"schedule", "stages", "microbatches", "max_clocks_per_op"}
)


def build_checked_job(
    profile: Profile,
    schedule: str,
    stages: int,
    microbatches: int,
    *,
    size_source: str = "--microbatches",
    **job: Any,
) -> PlanningJob:
    """:func:`~perseus.job.make_job` after the size bound is checked, blamed on ``size_source``."""
    from perseus.job import make_job

    clocks = max((len(op.options) for op in profile.ops.values()), default=1)
    virtual_stages = job.get("virtual_stages", JOB_DEFAULTS.virtual_stages)
    check_job_size(size_source, schedule, stages, microbatches, virtual_stages, clocks)
    return make_job(profile, schedule, stages, microbatches, **job)


def job_from_frontier(
    frontier: Frontier,
    profile_arg: str | None,
    source: str,
    flag: str = "--profile",
    verify: bool = True,
) -> PlanningJob:
    """The job a plan/frontier file records, rebuilt on ``profile_arg`` (else the profile the
    file names); it must match the file and, with ``verify``, reproduce its figures
    (ConfigError: no usable profile, or one that differs from the file's)."""
    from perseus.io.bundled import load_profile, resolve_profile_path

    j = frontier.job
    how = "give the profile as PROFILE" if flag == "PROFILE" else f"pass {flag} PROFILE"
    if profile_arg is not None:
        path = resolve_profile_path(profile_arg)
        profile = load_profile(path)
    else:
        path, profile = _plan_profile(j.profile_name, source, how)
    if profile.num_stages != j.stages:
        raise ConfigError(
            f"{flag if profile_arg else source + ': field job.profile_name'} {path}: profile has "
            f"{profile.num_stages} stages, the plan's job has {j.stages}; pass the profile the "
            "plan was computed from"
        )
    keywords = {name: getattr(j, name) for name in _MAKE_JOB_KEYWORDS}
    if j.backward_split is None:  # the job did not split backwards: any share gives it
        keywords["backward_split"] = JOB_DEFAULTS.backward_split
    if j.schedule not in SCHEDULE_NAMES:  # a torch schedule's plan, planned in the runtime
        raise ConfigError(
            f"{source}: field job.schedule: {j.schedule!r} is not one of "
            f"{', '.join(SCHEDULE_NAMES)}, the jobs this command rebuilds; pass a plan of one of those"
        )
    job = build_checked_job(
        profile,
        j.schedule,
        j.stages,
        j.microbatches,
        profile_name=j.profile_name,
        size_source=f"{source}: field job",
        **keywords,
    )
    if job.spec.profile_sha256 != j.profile_sha256:
        raise ConfigError(
            f"{source}: field job.profile_sha256: the plan was computed for another job (its "
            f"profile differs from {path}); pass the profile it was computed from ({flag})"
        )
    job.check_frontier(frontier, source)
    if verify:
        check_figures(job, frontier, source)
    return job


def _plan_profile(name: str | None, source: str, how: str) -> tuple[Path, Profile]:
    """The profile a plan file names: bundled, or a file beside the plan. Its errors do not
    quote it: a plan must not be a way to show another file's lines."""
    from perseus.io.bundled import load_profile, resolve_plan_profile

    where = f"{source}: field job.profile_name"
    if name is None:
        raise ConfigError(f"{where}: not set; {how}")
    try:
        path = resolve_plan_profile(name, source, source)
    except ConfigError as e:
        raise ConfigError(f"{first_line(e)}; {how}") from None
    try:
        return path, load_profile(path)
    except ConfigError:
        raise ConfigError(
            f"{where}: {path} is not a valid profile (`perseus profile show {path}` says why); "
            f"{how}"
        ) from None


def check_figures(job: PlanningJob, frontier: Frontier, source: str) -> None:
    """Check that the file's all-max figures and its first, cheapest and last points are what
    the exact evaluator gives on ``job`` (relative 1e-6); PlanError names the file and field."""
    from perseus.plan import same_figures

    regenerate = "the file was edited or computed differently; regenerate it (perseus frontier)"
    base = job.evaluate(job.allmax())
    b = frontier.baseline
    if not same_figures(base, b):
        raise PlanError(
            f"{source}: field baseline: {b.time_s:.6g} s, {b.energy_j:.6g} J, but all-max on the "
            f"job's profile is {base.time_s:.6g} s, {base.energy_j:.6g} J; {regenerate}"
        )
    points = frontier.points
    cheapest = min(range(len(points)), key=lambda i: points[i].energy_j)
    for i in sorted({0, cheapest, len(points) - 1}):
        p = points[i]
        try:
            ev = job.evaluate(job.flat(p))
        except PlanError as e:
            raise PlanError(f"{source}: field points.{i}.freqs_mhz: {e}") from None
        if not same_figures(ev, p):
            raise PlanError(
                f"{source}: field points.{i}: {p.time_s:.6g} s, {p.energy_j:.6g} J, but its "
                f"clocks evaluate to {ev.time_s:.6g} s, {ev.energy_j:.6g} J; {regenerate}"
            )
