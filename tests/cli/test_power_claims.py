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


def test_power_set_below_every_plan_says_the_cap_does_not_hold(
    frontier_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A cap below the job's lowest-power plan is acknowledged, but the job runs that plan
    above it: ``power set`` says so and exits 1 rather than reporting the cap as in force."""
    import threading
    import time
    from datetime import timedelta

    dist = pytest.importorskip("torch.distributed")
    from perseus.runtime.power import PowerRuntime

    frontier = read_frontier(frontier_path)
    lowest = min(p.avg_power_w for p in frontier.points)
    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False
    )
    runtime = PowerRuntime(frontier, store=store)
    stop = threading.Event()

    def job() -> None:  # global rank 0 at its iteration boundaries, every 20 ms
        i = 0
        while not stop.is_set():
            runtime.read_cap_w(i)
            i += 1
            time.sleep(0.02)

    thread = threading.Thread(target=job, daemon=True)
    thread.start()
    address = f"127.0.0.1:{store.port}"
    try:
        assert main(["power", "set", "--store", address, "--cap-w", repr(0.5 * lowest)]) == 1
        err = capsys.readouterr().err
        assert f"{math.ceil(lowest * 100) / 100:.2f} W" in err and len(err.splitlines()) == 1
        per_gpu = 0.5 * lowest / frontier.job.ranks
        argv = ["power", "set", "--store", address, "--cap-w", repr(per_gpu), "--per-gpu"]
        assert main(argv) == 1
        least = math.ceil(lowest / frontier.job.ranks * 100) / 100
        assert f"at least {least:.2f} W per GPU" in capsys.readouterr().err
        # A cap the job can hold is acknowledged as before.
        assert main(["power", "set", "--store", address, "--cap-w", repr(2 * lowest)]) == 0
        assert "acknowledged by the job at iteration" in capsys.readouterr().out
    finally:
        stop.set()
        thread.join(5)


def test_schedule_never_suggests_a_deadline_it_refuses(
    tmp_path: Path, frontier_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    signal = tmp_path / "s.csv"
    signal.write_text("0,0.1\n")
    out = tmp_path / "s.json"
    for n, deadline in ((10**12, "1e10"), (4 * 10**9, "1e10")):
        argv = ["plan", "schedule", str(frontier_path), "--signal", str(signal)]
        argv += ["--iterations", str(n), "--deadline-s", deadline, "-o", str(out)]
        assert main(argv) == 1
        err = capsys.readouterr().err
        suggested = re.search(r"raise --deadline-s to at least (\S+)$", err.strip())
        if suggested is None:
            assert "lower --iterations" in err
            continue
        argv[-3] = suggested.group(1)
        assert main(argv) == 0, capsys.readouterr().err
        assert out.exists()
