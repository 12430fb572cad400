"""``perseus device reset`` while a live process holds the GPU's lock whose record was
emptied by hand: the lock itself names a live owner, so the reset is refused."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from perseus.cli.main import main
from perseus.device.simulated import SimulatedGPU

REPO = Path(__file__).resolve().parents[2]
_HOLDER = textwrap.dedent(
    """
    import sys, time
    from perseus.device.ownership import acquire_owner_lock
    from perseus.device.simulated import SimulatedGPU

    gpu = SimulatedGPU.from_preset("a100", state_dir=sys.argv[1], set_latency_s=0.0)
    lock = acquire_owner_lock(gpu.owner_lock_path())
    gpu.set_locked_clock(1095)
    print("ready", flush=True)
    time.sleep(60)
    """
)


@pytest.mark.parametrize("record", [b"", b"garbage\n", b"0\n"])
def test_reset_refuses_a_held_lock_whose_record_is_gone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], record: bytes
) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-c", _HOLDER, str(tmp_path)]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
            gpu = SimulatedGPU.from_preset("a100", state_dir=tmp_path, set_latency_s=0.0)
            gpu.owner_lock_path().write_bytes(record)
            assert main(["device", "--sim-dir", str(tmp_path), "reset", "--sim", "0"]) == 2
            err = capsys.readouterr().err
            assert "is owned by a running process" in err and err.count("\n") == 1, err
            assert gpu.locked_clock_mhz() == 1095  # left to its owner
        finally:
            proc.kill()
