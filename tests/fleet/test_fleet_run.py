"""Three emulated two-rank jobs (gloo processes) in a fleet on a real PostgreSQL server.

The budget is lowered while they run: each job acknowledges the new plan at its next
iteration boundary and runs it from the iteration after (within two iterations of the change),
and each plan's measured pipeline power (the median of its iterations: the emulation runs in
real time, so a loaded host's stall moves one iteration, not the plan) is within 2 % of its
prediction.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from perseus.fleet.registry import FleetRegistry
from perseus.io import load_profile
from perseus.io.frontier_files import write_frontier
from perseus.job import make_job
from perseus.runtime.emulation import scale_profile, take_stages
from perseus.solver import trace
from perseus.solver.power import with_power

pytest.importorskip("torch.distributed.pipelining")
REPO = Path(__file__).resolve().parents[2]
SCALE = 0.25
ITERATIONS = 120


@pytest.mark.slow
def test_three_two_rank_jobs_follow_a_lowered_budget(postgres_url: str, tmp_path: Path) -> None:
    profile = scale_profile(take_stages(load_profile("a100"), 2), SCALE)
    job = make_job(profile, "1f1b", 2, 8, blocking_power_w=83.64)
    frontier = with_power(job, trace(job, min_gap_fraction=0.01).frontier)
    path = tmp_path / "frontier.json"
    write_frontier(frontier, path)
    pts = frontier.points
    fleet = FleetRegistry(postgres_url)
    fleet.set_budget(3 * pts[0].avg_power_w * 1.001)
    procs = []
    for k in range(3):
        env = {**os.environ, "PYTHONPATH": str(REPO), "PERSEUS_SIM_DIR": str(tmp_path / f"s{k}")}
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    str(REPO / "examples" / "train_pipeline.py"),
                    "--spawn",
                    "2",
                    "--emulate",
                    "--microbatches",
                    "8",
                    "--time-scale",
                    str(SCALE),
                    "--plan",
                    str(path),
                    "--fleet",
                    f"{postgres_url}:job{k}",
                    "--warmup",
                    "0",
                    "--iterations",
                    str(ITERATIONS),
                    "--summary",
                    str(tmp_path / f"job{k}.json"),
                ],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    names = [f"job{k}" for k in range(3)]
    lowered, acked = None, None
    deadline = time.monotonic() + 600
    try:
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            fleet.replan()
            _, epoch, members = fleet.status()
            state = {m.name: m for m in members}
            running = all(n in state and state[n].status == "running" for n in names)
            on_plan = running and all(
                state[n].epoch == epoch and state[n].ack_point == state[n].point
                and state[n].ack_iteration is not None for n in names
            )  # fmt: skip
            if lowered is None and on_plan and epoch >= 1:
                least_w = min(p.avg_power_w for p in pts)
                fleet.set_budget(3 * (least_w + 0.4 * (pts[0].avg_power_w - least_w)))
                lowered = fleet.replan()
            elif lowered is not None and acked is None and on_plan and epoch == lowered:
                acked = {n: (state[n].point, state[n].ack_iteration) for n in names}
            time.sleep(0.1)
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
        fleet.close()
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    assert acked is not None, "the jobs never all ran the lowered budget's plans"
    for k, name in enumerate(names):
        point, from_iteration = acked[name]
        rows = json.loads((tmp_path / f"job{k}.json").read_text())["power"]["iterations"]
        ran = [r["point"] for r in rows]
        # the plan before, then the new one from the iteration after the acknowledgement
        assert ran[from_iteration] == point and ran[from_iteration - 1] != point, (name, ran)
        mine = [r for r in rows[from_iteration:] if r["point"] == point]
        measured_w = statistics.median(r["power_w"] for r in mine)
        print(f"{name}: point {point} from iteration {from_iteration}, measured "
              f"{measured_w:.2f} W, predicted {pts[point].avg_power_w:.2f} W")  # fmt: skip
        assert abs(measured_w / pts[point].avg_power_w - 1) <= 0.02, (name, measured_w, point)
