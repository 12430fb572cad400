"""Emulation leaves nothing behind, however its workers were started (fork, spawn, a plain
process as torchrun starts them) and however they end (exit, exception, SIGINT): no
``perseus-job-*`` directory in ``$TMPDIR``, and no simulated GPU left orphaned (an owner that
died without resetting it) in a shared ``PERSEUS_SIM_DIR``."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from perseus.device.discovery import simulated_devices
from tests.conftest import REPO

ITERATIONS = 3
#: How a worker ends: it closes its session and returns, raises or is signalled at its second
#: iteration, or returns without closing its session (the process's exit resets the GPU).
ENDINGS = ("exit", "exception", "sigint", "unclosed")


def run_worker(tmp: str, sim_dir: str, ending: str) -> None:
    """One emulated rank (a one-stage pipeline) that ends as ``ending`` says."""
    import warnings

    from perseus import RankSession, SimulatedGPU, make_job
    from perseus.io import load_profile
    from perseus.runtime.emulation import EmulationOverrunWarning, scale_profile, take_stages
    from perseus.runtime.session import SessionOptions
    from perseus.schedule import build_schedule

    warnings.simplefilter("ignore", EmulationOverrunWarning)
    tempfile.tempdir = tmp  # $TMPDIR as the job sees it (the parent's value is cached)
    if sim_dir:
        os.environ["PERSEUS_SIM_DIR"] = sim_dir
    else:
        os.environ.pop("PERSEUS_SIM_DIR", None)
    profile = scale_profile(take_stages(load_profile("a100"), 1), 0.1)
    gpu = SimulatedGPU.from_profile(profile, blocking_power_w=83.64, set_latency_s=0.0)
    job = make_job(profile, "1f1b", 1, 4, blocking_power_w=83.64)
    plan = job.frontier([job.point(job.allmax()), job.point([1095] * job.graph.num_nodes)])
    session = RankSession(
        build_schedule("1f1b", 1, 4),
        0,
        gpu=gpu,
        plan=plan,
        options=SessionOptions(blocking_power_w=83.64, point_index=1, watchdog=False),
    )
    if ending == "unclosed":
        session.start()
        for _ in range(ITERATIONS):
            with session.iteration():
                for action in session.schedule.rank_actions[0]:
                    with session.op(action):
                        pass
        return
    try:
        with session:
            for i in range(ITERATIONS):
                with session.iteration():
                    for action in session.schedule.rank_actions[0]:
                        with session.op(action):
                            if i == 1 and ending == "exception":
                                raise RuntimeError("the training loop failed")
                            if i == 1 and ending == "sigint":
                                os.kill(os.getpid(), signal.SIGINT)
    except (RuntimeError, KeyboardInterrupt):
        if ending == "exit":
            raise


def _main() -> None:  # a worker started as torchrun starts one: a plain process
    run_worker(*sys.argv[1:4])


def _start(how: str, tmp: Path, sim_dir: str, ending: str) -> int:
    if how == "torchrun":
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                "from tests.integration.test_emulation_cleanup import _main; _main()",
                str(tmp),
                sim_dir,
                ending,
            ],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            timeout=300,
            capture_output=True,
            text=True,
        )
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc.returncode
    ctx = multiprocessing.get_context(how)
    worker = ctx.Process(target=run_worker, args=(str(tmp), sim_dir, ending))
    worker.start()
    worker.join(300)
    return int(worker.exitcode or 0)


@pytest.mark.slow  # a process per case
@pytest.mark.parametrize("ending", ENDINGS)
@pytest.mark.parametrize("how", ["fork", "spawn", "torchrun"])
@pytest.mark.parametrize("shared", [False, True], ids=["job-dir", "PERSEUS_SIM_DIR"])
def test_nothing_is_left_behind(tmp_path: Path, how: str, ending: str, shared: bool) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    sim = tmp_path / "sim"
    sim.mkdir(mode=0o700)
    rc = _start(how, tmp, str(sim) if shared else "", ending)
    assert rc == 0
    assert sorted(p.name for p in tmp.iterdir()) == []
    for info in simulated_devices(sim):
        assert info.dead_owner_pid is None, f"{info.uuid} orphaned by pid {info.dead_owner_pid}"
        assert info.owner_pid is None and info.locked_mhz is None, info
