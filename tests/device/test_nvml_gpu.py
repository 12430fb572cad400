"""The NVML backend on a real GPU (skipped without an NVIDIA driver).

Tests that lock clocks run only when ``PERSEUS_GPU_TESTS_MAY_CHANGE_CLOCKS=1``: some lent GPUs'
operators forbid clock changes, so a plain ``pytest -m gpu`` never changes one.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from perseus.device.nvml import NvmlGPU
from perseus.errors import DevicePermissionError
from perseus.runtime.agent.rank_agent import RankAgent
from tests.runtime.plans import tiny_plan

pytestmark = pytest.mark.gpu

may_change_clocks = pytest.mark.skipif(
    os.environ.get("PERSEUS_GPU_TESTS_MAY_CHANGE_CLOCKS") != "1",
    reason="changes clocks: set PERSEUS_GPU_TESTS_MAY_CHANGE_CLOCKS=1 where that is allowed",
)


def test_open_and_read_sensors() -> None:
    with NvmlGPU(index=0) as gpu:
        clocks = gpu.supported_clocks_mhz()
        assert clocks == tuple(sorted(clocks, reverse=True)) and len(clocks) > 1
        assert gpu.uuid.startswith(("GPU-", "MIG-"))
        first = gpu.energy_mj()
        time.sleep(0.3)
        assert gpu.energy_mj() >= first
        assert gpu.power_w() > 0
        assert gpu.current_clock_mhz() > 0


@may_change_clocks
def test_lock_and_reset(tmp_path: Path) -> None:
    with NvmlGPU(index=0, lock_dir=tmp_path) as gpu:
        if gpu.observe_only_reason is not None:
            pytest.skip(f"cannot lock clocks here: {gpu.observe_only_reason}")
        clocks = gpu.supported_clocks_mhz()
        target = clocks[len(clocks) // 3]
        try:
            assert gpu.set_locked_clock(target) == target
        except DevicePermissionError as e:
            pytest.skip(str(e))
        assert gpu.locked_clock_mhz() == target
        gpu.reset_locked_clock()
        assert gpu.locked_clock_mhz() is None


@may_change_clocks
def test_agent_on_real_gpu(tmp_path: Path) -> None:
    gpu = NvmlGPU(index=0, lock_dir=tmp_path)
    plan = tiny_plan(freq_mhz=1095)
    # Host timing: the ops below are host sleeps, with no GPU work for device events to time.
    with RankAgent(plan, gpu, rank=0, handle_signals=False, timing="host") as agent:
        agent.step_begin()
        for name in plan.stage_ops[0]:
            with agent.op(name[0], int(name[1:])):
                time.sleep(0.01)
        record = agent.step_end()
        assert record.time_s > 0.03
    gpu.close()
