"""Export a plan for Zeus's pipeline frequency optimizer (PFO) server (docs/formats.md).

Zeus hands each rank a ``FrequencySchedule``, ``{"rank": r, "frequencies": [["forward",
1410], ...]}``: the rank's instructions in execution order with the SM clock to lock. Zeus sets
SM clocks only: an op that also sets a memory clock is exported with its SM clock and a
warning (the plan's figures will not hold); an op that switches SM clock mid-op cannot be
exported.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from perseus.errors import PlanError
from perseus.io.atomic import atomic_write_text, open_output_dir
from perseus.io.frontier_files import write_frontier
from perseus.log import get_logger
from perseus.plan import Frontier, PlanPoint

logger = get_logger(__name__)

__all__ = ["ZEUS_PFO_FILES", "format_point_solution", "write_zeus_pfo", "zeus_frequency_schedules"]

ZEUS_PFO_FILES = ("0.sched.json", "point_solution.py", "perseus_plan.json")


def zeus_frequency_schedules(frontier: Frontier, point: PlanPoint) -> list[dict[str, Any]]:
    """Zeus ``FrequencySchedule`` dicts (one per rank, rank order) for ``point``.

    Raises:
        PlanError: if ``point`` does not fit the frontier's ``stage_ops``.
    """
    if [len(f) for f in point.freqs_mhz] != [len(ops) for ops in frontier.stage_ops]:
        raise PlanError(
            "plan shape differs from the frontier's stage_ops; export a point of this frontier"
        )
    schedules = []
    for rank, freqs in enumerate(point.freqs_mhz):
        pairs = zip(frontier.rank_actions[rank], freqs, strict=True)
        frequencies = [
            [a.kind.profile_name, _one_clock(f"rank {rank} op {j} ({frontier.op_name(a)})", f)]
            for j, (a, f) in enumerate(pairs)
        ]
        schedules.append({"rank": rank, "frequencies": frequencies})
    if point.memory_clocks_mhz:
        logger.warning(
            "the plan sets memory clocks %s MHz; Zeus sets SM clocks only, so the export keeps "
            "each op's SM clock and Zeus will run at the default memory clock (the plan's "
            "figures will not hold); run it with perseus's agent to set both",
            sorted(point.memory_clocks_mhz),
        )
    return schedules


def _one_clock(op: str, freq: object) -> int:
    if isinstance(freq, tuple) and freq and isinstance(freq[0], tuple):
        sm_clocks = {phase[0] for phase in freq}
        if len(sm_clocks) == 1:
            return int(next(iter(sm_clocks)))  # its memory clock is dropped (the caller warns)
    if isinstance(freq, bool) or not isinstance(freq, int):
        raise PlanError(
            f"{op} has a two-clock setting {json.dumps(freq)}; Zeus's schedules hold one "
            "clock per instruction, so export a plan computed without two-clock ops"
        )
    return freq


def format_point_solution(schedules: list[dict[str, Any]], header: list[str]) -> str:
    """The ``point_solution.py`` text: comment lines, then the per-rank list literal."""
    lines = [f"# {h}" for h in header]
    lines.append("[")
    for s in schedules:
        pairs = ", ".join(f"({name!r}, {freq:d})" for name, freq in s["frequencies"])
        lines.append(f"    [{pairs}],")
    lines.append("]")
    return "\n".join(lines) + "\n"


def write_zeus_pfo(
    frontier: Frontier, point: PlanPoint, directory: str | os.PathLike[str]
) -> list[Path]:
    """Write :data:`ZEUS_PFO_FILES` for ``point`` into ``directory`` (created if missing);
    returns the paths written."""
    out = Path(directory)
    os.close(open_output_dir(out))  # created without following another user's link
    schedules = zeus_frequency_schedules(frontier, point)
    atomic_write_text(out / "0.sched.json", json.dumps(schedules) + "\n")
    j = frontier.job
    header = [
        "Zeus PointSolution frequency schedule, written by `perseus export --format zeus-pfo`.",
        f"job: {j.schedule}, {j.stages} stages x {j.microbatches} microbatches, {j.ranks} ranks",
        f"expected iteration time {point.time_s:.6f} s, energy {point.energy_j:.3f} J "
        f"(all-max {frontier.baseline.time_s:.6f} s, {frontier.baseline.energy_j:.3f} J)",
        "one list per pipeline rank: (instruction, SM clock in MHz) in execution order",
    ]
    if point.memory_clocks_mhz:
        header.append(
            f"the plan also sets memory clocks {sorted(point.memory_clocks_mhz)} MHz, which Zeus "
            "does not: ops run at the default memory clock and the figures above will not hold"
        )
    atomic_write_text(out / "point_solution.py", format_point_solution(schedules, header))
    write_frontier(frontier.with_points([point]), out / "perseus_plan.json")
    return [out / name for name in ZEUS_PFO_FILES]
