"""Export a plan for Zeus's pipeline frequency optimizer (PFO) server.

Zeus (``zeus.optimizer.pipeline_frequency``) hands each rank a ``FrequencySchedule``: the
rank's instructions for one iteration in execution order, each with the SM clock to lock,
as ``{"rank": r, "frequencies": [["forward", 1410], ["backward", 1395], ...]}``. The client
checks every instruction name against the one the training loop announces
(``on_instruction_begin("forward")``), so the names are the profile's instruction names:
``forward``, ``backward`` (and ``weight`` for zero-bubble schedules, which Zeus's stock
integrations do not emit).

Two files carry the same schedule:

* ``0.sched.json``: the list of per-rank ``FrequencySchedule`` objects, in the layout the
  server dumps and reloads (``zeus...common.load_sched(DIR, 0)`` reads it as is).
* ``point_solution.json``: ``[[["forward", 1410], ...], ...]`` indexed by rank, the nested
  list Zeus's ``PointSolution`` scheduler loads. It is plain data: perseus never writes Python
  code as a plan format (``PointSolution`` evaluates its file; give it only data you trust).

Ranks are pipeline ranks; with data or tensor parallelism Zeus's ``PointSolution3D`` copies
each pipeline rank's schedule to every rank with that ``pp_rank``. The chosen plan is also
written as ``perseus_plan.json`` (perseus's own plan format) for provenance.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from perseus.errors import PlanError
from perseus.io.atomic import atomic_write_text
from perseus.io.frontier_files import write_frontier
from perseus.plan import Frontier, PlanPoint
from perseus.schedule.actions import Kind

__all__ = ["ZEUS_PFO_FILES", "write_zeus_pfo", "zeus_frequency_schedules"]

ZEUS_PFO_FILES = ("0.sched.json", "point_solution.json", "perseus_plan.json")


def _instruction(op_name: str) -> str:
    try:
        return Kind(op_name[:1]).profile_name
    except ValueError:
        raise PlanError(
            f"stage_ops entry {op_name!r} does not start with F, B or W; recompute the frontier"
        ) from None


def zeus_frequency_schedules(frontier: Frontier, point: PlanPoint) -> list[dict[str, Any]]:
    """Zeus ``FrequencySchedule`` dicts (one per rank, rank order) for ``point``.

    Raises:
        PlanError: if ``point`` does not fit the frontier's ``stage_ops``.
    """
    if [len(f) for f in point.freqs_mhz] != [len(ops) for ops in frontier.stage_ops]:
        raise PlanError(
            "plan shape differs from the frontier's stage_ops; export a point of this frontier"
        )
    return [
        {
            "rank": rank,
            "frequencies": [
                [_instruction(op), int(freq)] for op, freq in zip(ops, freqs, strict=True)
            ],
        }
        for rank, (ops, freqs) in enumerate(
            zip(
                frontier.stage_ops,
                (point.one_clock_mhz(r) for r in range(len(point.freqs_mhz))),
                strict=True,
            )
        )
    ]


def write_zeus_pfo(
    frontier: Frontier, point: PlanPoint, directory: str | os.PathLike[str]
) -> list[Path]:
    """Write :data:`ZEUS_PFO_FILES` for ``point`` into ``directory`` (created if missing).

    Returns:
        The paths written.
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    schedules = zeus_frequency_schedules(frontier, point)
    atomic_write_text(out / "0.sched.json", json.dumps(schedules) + "\n")
    atomic_write_text(
        out / "point_solution.json", json.dumps([s["frequencies"] for s in schedules]) + "\n"
    )
    write_frontier(frontier.with_points([point]), out / "perseus_plan.json")
    return [out / name for name in ZEUS_PFO_FILES]
