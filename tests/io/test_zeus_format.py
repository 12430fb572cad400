"""The Zeus PFO export against Zeus's documented format.

Zeus (``zeus.optimizer.pipeline_frequency``) is not a dependency; when it is importable the
real ``PointSolution`` scheduler loads the export, otherwise a copy of what it does (read the
``.py`` file, evaluate it, check one list per rank, build ``FrequencySchedule(rank,
frequencies: list[tuple[str, int]])``) and of the ``FrequencySchedule`` model checks it.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

from perseus.cli.main import main
from perseus.io import read_frontier

from ..corpus.conftest import small_frontier


class FrequencySchedule(BaseModel):
    """Copy of Zeus's model (``zeus/optimizer/pipeline_frequency/common.py``)."""

    rank: int = Field(ge=0)
    frequencies: list[tuple[str, int]]


def _point_solution_like(path: Path, world_size: int) -> list[FrequencySchedule]:
    """What Zeus's ``PointSolution.__init__`` does with ``solution_path`` (literals only)."""
    if not path.is_file():
        raise RuntimeError(f"Solution file not found: {path}")
    if path.suffix != ".py":
        raise RuntimeError(f"Solution file is not a Python file: {path}")
    schedule = ast.literal_eval(path.read_text(encoding="utf-8"))
    if len(schedule) != world_size:
        raise RuntimeError(f"Solution file assumes {len(schedule)} ranks, job has {world_size}")
    return [FrequencySchedule(rank=r, frequencies=f) for r, f in enumerate(schedule)]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    d = tmp_path_factory.mktemp("zeus")
    _job, frontier = small_frontier()
    from perseus.io import write_frontier

    write_frontier(frontier, d / "frontier.json")
    assert (
        main(["export", str(d / "frontier.json"), "--format", "zeus-pfo", "-o", str(d / "out")])
        == 0
    )
    return d / "out", frontier


def test_point_solution_py_loads_as_zeus_does(exported: tuple[Path, object]) -> None:
    out, frontier = exported
    path = out / "point_solution.py"
    scheds = _point_solution_like(path, world_size=8)
    point = frontier.points[0]  # type: ignore[attr-defined]
    for rank, s in enumerate(scheds):
        assert s.rank == rank
        assert [f for _, f in s.frequencies] == list(point.freqs_mhz[rank])
        assert {name for name, _ in s.frequencies} <= {"forward", "backward"}
        ops = frontier.stage_ops[rank]  # type: ignore[attr-defined]
        assert [n for n, _ in s.frequencies] == [
            "forward" if op.startswith("F") else "backward" for op in ops
        ]
    # the comment header carries the plan's figures; the file evaluates to literals only
    text = path.read_text()
    assert text.startswith("# ") and f"{point.time_s:.6f} s" in text
    tree = ast.parse(text, mode="eval")
    assert all(
        isinstance(n, (ast.Expression, ast.List, ast.Tuple, ast.Constant, ast.Load))
        for n in ast.walk(tree)
    )


def test_sched_json_matches_frequency_schedule_list(exported: tuple[Path, object]) -> None:
    out, _ = exported
    doc = json.loads((out / "0.sched.json").read_text())
    scheds = [FrequencySchedule.model_validate(s) for s in doc]
    assert scheds == _point_solution_like(out / "point_solution.py", world_size=len(doc))
    assert read_frontier(out / "perseus_plan.json").points


def test_real_zeus_point_solution_if_installed(exported: tuple[Path, object]) -> None:
    scheduler = pytest.importorskip("zeus.optimizer.pipeline_frequency.server.scheduler")
    common = pytest.importorskip("zeus.optimizer.pipeline_frequency.common")
    out, _ = exported
    job = common.JobInfo(
        job_id="perseus", pp_degree=8, dp_degree=1, tp_degree=1, world_size=8, job_metadata=None
    )
    ranks = [
        common.RankInfo(rank=r, dp_rank=0, pp_rank=r, tp_rank=0, available_frequencies=[1410])
        for r in range(8)
    ]
    settings = common.PFOServerSettings(
        scheduler="PointSolution", scheduler_args={"solution_path": str(out / "point_solution.py")}
    )
    sched = scheduler.PointSolution(job, ranks, settings, str(out / "point_solution.py"))
    assert len(sched.schedule) == 8
