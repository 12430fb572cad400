"""The fleet's jobs file: ``[{"name", "frontier": path, "weight", "gpus"}, ...]``.

A relative ``frontier`` path is taken from the jobs file's directory; each frontier is read
once however many jobs name it, and kept only until its last job is made.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from perseus.errors import ConfigError
from perseus.io._errors import describe_validation_error
from perseus.io.frontier_files import read_frontier, read_json_document
from perseus.io.reading import INPUT_LIMITS
from perseus.plan import Frontier
from perseus.solver.fleet import FleetJob, fleet_job

__all__ = ["FleetJobEntry", "read_fleet_jobs"]


class FleetJobEntry(BaseModel):
    """One job of the fleet (``name`` unique in the file).

    Attributes:
        frontier: Its frontier JSON (``perseus frontier``).
        weight: The value of one unit of the job's progress.
        gpus: The job's GPUs, a multiple of the frontier's ranks (default: the ranks).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    name: Annotated[str, Field(min_length=1, max_length=200)]
    frontier: Annotated[str, Field(min_length=1, max_length=4096)]
    weight: Annotated[float, Field(ge=0, le=1e9, allow_inf_nan=False)] = 1.0
    gpus: Annotated[int, Field(ge=1, le=10**6)] | None = None


_ENTRIES = TypeAdapter(list[FleetJobEntry])


def read_fleet_jobs(
    path: str | os.PathLike[str], *, per_gpu_cap_w: float | None = None
) -> list[FleetJob]:
    """The jobs of ``path`` with their frontiers' choices.

    Raises:
        ConfigError: an unreadable or invalid file (naming the entry and field), a repeated
            name, a frontier that cannot be read.
        InfeasibleError: a job with no plan under ``per_gpu_cap_w``.
    """
    p = Path(path)
    doc = read_json_document(p, "a fleet jobs JSON list", ConfigError, INPUT_LIMITS["jobs"])
    try:
        entries = _ENTRIES.validate_python(doc)
    except ValidationError as e:
        raise ConfigError(
            f"{describe_validation_error(str(p), e, 'entry')}; each entry is "
            '{"name": str, "frontier": path, "weight": number >= 0, "gpus": int}'
        ) from None
    if not entries:
        raise ConfigError(f"{p}: no jobs; list at least one")
    seen: set[str] = set()
    paths = [p.parent / entry.frontier for entry in entries]  # an absolute path stays as it is
    # A frontier is kept only until its last job: together they can take gigabytes.
    last = {path: i for i, path in enumerate(paths)}
    kept: dict[Path, Frontier] = {}
    out = []
    for i, (entry, path) in enumerate(zip(entries, paths, strict=True)):
        if entry.name in seen:
            raise ConfigError(f"{p}: job name {entry.name!r} appears twice; names are unique")
        seen.add(entry.name)
        if not entry.name.isprintable():  # printed as is in the plan's table
            raise ConfigError(
                f"{p}: entry {i}.name: {entry.name!r} holds a control character; rename the job"
            )
        if "\0" in entry.frontier:
            raise ConfigError(f"{p}: entry {i}.frontier: the path holds a NUL character; fix it")
        frontier = kept.pop(path) if path in kept else read_frontier(path)
        if last[path] > i:
            kept[path] = frontier
        try:
            job = fleet_job(
                entry.name,
                frontier,
                weight=entry.weight,
                gpus=entry.gpus,
                per_gpu_cap_w=per_gpu_cap_w,
            )
        except ConfigError as e:  # gpus not a multiple of the frontier's ranks
            raise ConfigError(f"{p}: entry {i}.gpus: {e}") from None
        out.append(job)
    return out
