"""Safety: a GPU locked by a process is reset when that process ends, however it ends.

Each case runs the agent in a child process on a simulated GPU whose state lives in
``tmp_path``, waits until the child has locked the clock, ends the child in one way, and
polls the shared state for up to 1 s until the lock is gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from perseus.device.simulated import SimulatedGPU
from perseus.errors import DeviceBusyError
from perseus.runtime.agent.rank_agent import RankAgent
from tests.runtime.plans import tiny_plan

CHILD = textwrap.dedent(
    """
    import os, sys, time
    from perseus.device.simulated import SimulatedGPU
    from perseus.runtime.agent.rank_agent import RankAgent
    from tests.runtime.plans import tiny_plan

    mode = sys.argv[1]
    gpu = SimulatedGPU.from_preset("a100", set_latency_s=0.0)
    plan = tiny_plan(freq_mhz=1095)

    def lock_and_report(agent):
        agent.step_begin()
        with agent.op("F", 0):
            pass
        agent.wait_for_clock()
        print("locked", gpu.locked_clock_mhz(), flush=True)

    if mode == "exit":
        with RankAgent(plan, gpu, rank=0) as agent:
            lock_and_report(agent)
    elif mode == "atexit":
        agent = RankAgent(plan, gpu, rank=0).start()
        lock_and_report(agent)
    elif mode == "exception":
        with RankAgent(plan, gpu, rank=0) as agent:
            lock_and_report(agent)
            raise RuntimeError("training crashed")
    elif mode == "uncaught":
        agent = RankAgent(plan, gpu, rank=0).start()
        lock_and_report(agent)
        raise RuntimeError("training crashed outside the with block")
    else:  # wait to be signalled
        agent = RankAgent(plan, gpu, rank=0).start()
        lock_and_report(agent)
        time.sleep(30)
    """
)


REPO = Path(__file__).resolve().parents[2]


def _as_in_a_terminal() -> None:
    """The child's SIGINT as Ctrl-C finds it in a terminal: a suite started in the background
    of a script (``cmd &``) passes SIGINT on ignored (POSIX), and an ignored SIGINT rightly
    leaves the child running."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _spawn(mode: str, state_dir: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PERSEUS_SIM_DIR": str(state_dir), "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
        preexec_fn=_as_in_a_terminal,
    )


def _wait_locked(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "locked 1095":
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"child did not lock the clock: {line!r}\n{err}")


def _lock_after(gpu: SimulatedGPU, within_s: float = 1.0) -> int | None:
    deadline = time.monotonic() + within_s
    locked = gpu.locked_clock_mhz()
    while locked is not None and time.monotonic() < deadline:
        time.sleep(0.01)
        locked = gpu.locked_clock_mhz()
    return locked


@pytest.mark.parametrize("mode", ["exit", "atexit", "exception", "uncaught"])
def test_lock_reset_when_child_ends(tmp_path: Path, mode: str) -> None:
    gpu = SimulatedGPU.from_preset("a100", state_dir=tmp_path)
    proc = _spawn(mode, tmp_path)
    _wait_locked(proc)
    _, err = proc.communicate(timeout=20)
    assert _lock_after(gpu) is None, err
    assert (proc.returncode == 0) == (mode in ("exit", "atexit")), err


@pytest.mark.parametrize(
    ("sig", "expected_rc"),
    [
        (signal.SIGTERM, -signal.SIGTERM),
        # The chained default handler raises KeyboardInterrupt; uncaught, Python then exits
        # by SIGINT so that the parent sees it.
        (signal.SIGINT, -signal.SIGINT),
        (signal.SIGKILL, -signal.SIGKILL),
    ],
)
def test_lock_reset_when_child_is_signalled(tmp_path: Path, sig: int, expected_rc: int) -> None:
    gpu = SimulatedGPU.from_preset("a100", state_dir=tmp_path)
    proc = _spawn("wait", tmp_path)
    _wait_locked(proc)
    assert gpu.locked_clock_mhz() == 1095
    proc.send_signal(sig)
    locked = _lock_after(gpu)
    _, err = proc.communicate(timeout=20)
    assert locked is None, err
    assert proc.returncode == expected_rc, err


def test_second_owner_is_refused_and_named(tmp_path: Path) -> None:
    gpu = SimulatedGPU.from_preset("a100", state_dir=tmp_path)
    proc = _spawn("wait", tmp_path)
    try:
        _wait_locked(proc)
        with pytest.raises(DeviceBusyError, match=f"process {proc.pid}"):
            RankAgent(tiny_plan(), gpu, rank=0, watchdog=False, handle_signals=False).start()
        proc.kill()
        proc.communicate(timeout=20)
        assert _lock_after(gpu) is None
        # The dead owner's lock went with it: a new agent may take the GPU.
        with RankAgent(tiny_plan(), gpu, rank=0, watchdog=False, handle_signals=False):
            pass
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_second_agent_in_same_process_is_refused(tmp_path: Path) -> None:
    gpu = SimulatedGPU.from_preset("a100", state_dir=tmp_path, set_latency_s=0.0)
    with RankAgent(tiny_plan(), gpu, rank=0, watchdog=False, handle_signals=False):
        other = SimulatedGPU.from_preset("a100", state_dir=tmp_path)
        with pytest.raises(DeviceBusyError, match="another agent in this process"):
            RankAgent(tiny_plan(), other, rank=0, watchdog=False, handle_signals=False).start()


def test_signal_handlers_are_restored_after_close(tmp_path: Path) -> None:
    gpu = SimulatedGPU.from_preset("a100", state_dir=tmp_path, set_latency_s=0.0)
    before = signal.getsignal(signal.SIGTERM)
    with RankAgent(tiny_plan(), gpu, rank=0, watchdog=False):
        assert signal.getsignal(signal.SIGTERM) != before
    assert signal.getsignal(signal.SIGTERM) == before


def test_clean_close_stops_the_watchdog_without_reset(tmp_path: Path) -> None:
    gpu = SimulatedGPU.from_preset("a100", state_dir=tmp_path, set_latency_s=0.0)
    agent = RankAgent(tiny_plan(), gpu, rank=0, handle_signals=False).start()
    assert agent._claim is not None
    watchdog = agent._claim.watchdog
    assert watchdog is not None and watchdog.pid is not None
    proc = watchdog._proc
    agent.close()
    assert proc is not None and proc.returncode == 0
    # A lock set by someone else after our clean exit is not the watchdog's business.
    gpu.set_locked_clock(1200)
    time.sleep(0.2)
    assert gpu.locked_clock_mhz() == 1200
