"""What ``plan pick --peak-power-w`` and ``plan schedule`` claim holds when checked
independently (from the written plan's points and the signal)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from perseus.cli.main import main
from perseus.io.frontier_files import read_frontier


@pytest.fixture(scope="module")
def frontier_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("claims") / "f.json"
    assert main(["frontier", "a40", "--microbatches", "4", "--no-progress", "-o", str(path)]) == 0
    return path


def test_fallback_power_limit_command_holds_the_budget(
    tmp_path: Path, frontier_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    frontier = read_frontier(frontier_path)
    ranks = frontier.job.ranks
    lowest = min(p.power.peak_power_w for p in frontier.points if p.power is not None)
    # A per-GPU limit of k + 0.6 W: rounding it to the nearest watt would exceed the budget.
    budget = ranks * (math.floor(0.9 * lowest / ranks) + 0.6)
    out = tmp_path / "p.json"
    argv = ["plan", "pick", str(frontier_path), "--peak-power-w", repr(budget), "-o", str(out)]
    assert main(argv) == 0
    said = capsys.readouterr().out
    limit = re.search(r"nvidia-smi -pl (\d+)", said)
    assert limit is not None, said
    assert int(limit.group(1)) * ranks <= budget
    # Just above the blocking power, the whole-watt limit falls below it: refused, and the
    # budget it suggests is itself accepted.
    floor_w = frontier.job.blocking_power_w
    argv[4] = repr(ranks * (math.floor(floor_w) + 0.99))
    assert main(argv) == 1
    err = capsys.readouterr().err
    least = re.search(r"pass --peak-power-w of at least ([0-9.]+) W", err)
    assert least is not None, err
    argv[4] = least.group(1)
    assert main(argv) == 0
    said = capsys.readouterr().out
    limit = re.search(r"nvidia-smi -pl (\d+)", said)
    assert limit is not None and int(limit.group(1)) >= floor_w
