"""Read and write plan/frontier JSON files (validated with pydantic, never executed)."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import ValidationError

from perseus.errors import PlanError
from perseus.io._errors import describe_validation_error
from perseus.io.atomic import atomic_write_text
from perseus.plan import Frontier

__all__ = ["read_frontier", "write_frontier"]


def read_frontier(path: str | os.PathLike[str]) -> Frontier:
    """Load and validate a frontier or plan file.

    Raises:
        PlanError: naming the file and the first bad field.
    """
    p = Path(path)
    try:
        text = p.read_bytes()
    except FileNotFoundError:
        raise PlanError(
            f"{p}: file not found; pass a plan/frontier JSON written by perseus"
        ) from None
    except OSError as e:
        raise PlanError(f"{p}: cannot read file ({e.strerror})") from None
    if not text.strip():
        raise PlanError(f"{p}: file is empty; pass a plan/frontier JSON written by perseus")
    try:
        return Frontier.model_validate_json(text)
    except ValidationError as e:
        raise PlanError(describe_validation_error(str(p), e)) from None


def write_frontier(frontier: Frontier, path: str | os.PathLike[str]) -> None:
    """Write ``frontier`` as compact JSON (one point per line), atomically."""
    head = frontier.model_dump_json(exclude={"points"})
    points = ",\n".join(p.model_dump_json() for p in frontier.points)
    atomic_write_text(path, head[:-1] + ',\n"points":[\n' + points + "\n]}\n")
