"""Limits and defaults of a planning job, and the helpers that show a bad value in one line.

Pure (no files, no env) and free of pydantic, so that ``--help`` can show the defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

from perseus.errors import ConfigError

__all__ = [
    "JOB_BOUNDS",
    "JOB_DEFAULTS",
    "MAX_JOB_CELLS",
    "MAX_JOB_OPS",
    "MAX_LAYERS_PER_STAGE",
    "MAX_LAYER_WEIGHT",
    "MESSAGE_LIMIT",
    "Bounds",
    "JobDefaults",
    "check_job_size",
    "clip_message",
    "show_value",
    "whole_number",
]

#: Longest message an error carries (a value is shown cut, never a 7.9 MB line).
MESSAGE_LIMIT = 600
#: Largest job the planner accepts: ops in one iteration's DAG, and ops x clocks.
MAX_JOB_OPS = 1_000_000
MAX_JOB_CELLS = 20_000_000
#: Most layers one stage may hold for two-clock ops (GPT-3 175B has 96 in all).
MAX_LAYERS_PER_STAGE = 1024
#: Largest relative weight of one layer (``layer_time_fractions``): a stage's sum stays finite.
MAX_LAYER_WEIGHT = 1e6
#: Bytes the planner holds per (op, clock) cell: the 32x512 job (1.25 M cells) peaks at ~0.9 GB.
_BYTES_PER_CELL = 700


class Bounds(NamedTuple):
    """A number's accepted range; ``None`` leaves that side open."""

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None


#: The ranges of a planning job's numbers, the one table the job models derive from.
JOB_BOUNDS: dict[str, Bounds] = {
    "stages": Bounds(ge=1, le=4096),
    "microbatches": Bounds(ge=1, le=10_000_000),
    "virtual_stages": Bounds(ge=1, le=64),
    "blocking_power_w": Bounds(ge=0, le=10_000),
    "p2p_latency_s": Bounds(ge=0, le=60),
    "backward_split": Bounds(gt=0, lt=1),
    "pipelines": Bounds(ge=2, le=1_000_000),
    "layers_per_stage": Bounds(ge=1, le=MAX_LAYERS_PER_STAGE),
    "layer_time_fractions": Bounds(gt=0, le=MAX_LAYER_WEIGHT),
    "switch_latency_s": Bounds(ge=0, le=60),
    "switch_energy_j": Bounds(ge=0, le=1e6),
    "switch_stall_s": Bounds(ge=0, le=60),
}


@dataclass(frozen=True)
class JobDefaults:
    """The values a job takes for what its flags and config leave out."""

    schedule: Literal["gpipe", "1f1b", "interleaved", "zb"] = "1f1b"
    virtual_stages: int = 1
    p2p_latency_s: float = 0.0
    #: Share of a backward given to ``B`` when a zero-bubble schedule needs ``B``/``W`` and the
    #: profile has no ``weight`` rows (the ZB paper's T_B ~ T_W).
    backward_split: float = 0.5
    #: Median latency of a locked-clock set call (docs/hardware.md#sim-defaults).
    switch_latency_s: float = 0.005
    switch_energy_j: float = 0.0
    switch_stall_s: float = 0.0


JOB_DEFAULTS = JobDefaults()


def whole_number(value: object) -> object:
    """A pydantic ``BeforeValidator`` of an integer field (a schema version): ``1``, not
    ``true`` or ``1.0``, which pydantic's ``Literal[1]`` takes for 1."""
    if type(value) is not int:
        raise ValueError("must be an integer")  # the message adds ", got <value>"
    return value


def show_value(value: object, limit: int = 40) -> str:
    """``repr(value)``, cut to ``limit`` characters with a note of the full length (an int
    past Python's 4,300-digit limit of ``repr`` by its size)."""
    if isinstance(value, int) and value.bit_length() > 1000:
        return f"an integer of {value.bit_length():,} bits"
    try:
        text = repr(value)
    except ValueError:  # it holds such an int
        return f"a {type(value).__name__} too long to show"
    if len(text) <= limit:
        return text
    return f"{text[: limit - 3]}... ({len(text)} characters)"


def clip_message(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """``text`` cut to ``limit`` characters in the middle (the error handler's last guard):
    its start names the source, its end the reason and the fix."""
    if len(text) <= limit:
        return text
    note = f" ...[message cut, {len(text)} characters]... "
    keep = max(0, limit - len(note))
    return text[: keep - keep // 3] + note + text[len(text) - keep // 3 :]


def check_job_size(
    what: str,
    schedule: str,
    stages: int,
    microbatches: int,
    virtual_stages: int = 1,
    clocks: int = 1,
) -> None:
    """Refuse a job too large to plan before anything is built.

    Args:
        what: Where the sizes came from (``"--microbatches"``, a config file, a plan file).
        clocks: Clocks per op in the profile (the solver's tables are ops x clocks).

    Raises:
        ConfigError: naming the ops, clocks, estimated memory and the limits.
    """
    # F and B (and W for zero-bubble) per microbatch and model stage
    ops = (3 if schedule == "zb" else 2) * stages * microbatches
    cells = ops * max(clocks, 1)
    if ops <= MAX_JOB_OPS and cells <= MAX_JOB_CELLS:
        return
    est_gb = cells * _BYTES_PER_CELL / 1e9
    raise ConfigError(
        f"{what}: job too large to plan: {stages} stages x {microbatches} microbatches"
        f"{f' x {virtual_stages} virtual stages' if virtual_stages > 1 else ''} = {ops:,} ops"
        f" x {clocks} clocks (~{est_gb:,.1f} GB estimated); the limits are {MAX_JOB_OPS:,} ops and "
        f"{MAX_JOB_CELLS:,} op-clocks; plan fewer microbatches (the frontier per microbatch "
        "changes little past ~100)"
    )
