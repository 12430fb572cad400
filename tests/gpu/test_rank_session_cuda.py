"""RankSession on a real GPU in observe-only mode: CUDA events time the ops (skipped here).

A small transformer block's forward/backward per microbatch runs through RankSession and the
rank agent on ``NvmlGPU.for_cuda_device(0, control=False)`` (never sets or resets clocks, as
on machines whose owner forbids it). Op times come from CUDA event pairs on the compute
stream, energies from the NVML counter read at those device-time boundaries.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from perseus.plan import Baseline, Frontier, JobSpec, PlanPoint
from perseus.schedule import Kind, build_schedule

pytestmark = pytest.mark.gpu


def _plan(schedule: Any, clock_mhz: int) -> Frontier:
    spec = JobSpec(
        schedule=schedule.name,
        ranks=1,
        stages=1,
        microbatches=schedule.num_microbatches,
        blocking_power_w=80.0,
        profile_sha256="0" * 64,
    )
    freqs = tuple(tuple(clock_mhz for _ in ops) for ops in schedule.stage_ops())
    return Frontier(
        job=spec,
        stage_ops=schedule.stage_ops(),
        baseline=Baseline(time_s=1.0, energy_j=1.0),
        points=(PlanPoint(time_s=1.0, energy_j=1.0, freqs_mhz=freqs),),
    )


@pytest.mark.filterwarnings("ignore::perseus.device.base.ObserveOnlyWarning")
def test_transformer_block_through_rank_session_observe_only(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA")
    from perseus.device.nvml import NvmlGPU
    from perseus.runtime.session import RankSession, SessionOptions

    torch.cuda.set_device(0)
    gpu = NvmlGPU.for_cuda_device(0, control=False)
    block = torch.nn.TransformerEncoderLayer(1024, 16, 4096, batch_first=True).cuda()
    schedule = build_schedule("1f1b", 1, 4)
    x = torch.randn(4, 8, 256, 1024, device="cuda")
    outputs: dict[int, Any] = {}
    with RankSession(
        schedule,
        0,
        gpu=gpu,
        plan=_plan(schedule, max(gpu.supported_clocks_mhz())),
        options=SessionOptions(blocking_power_w=80.0, watchdog=False, handle_signals=False),
    ) as session:
        agent = session.agent
        assert agent is not None and agent.device_timed and agent.observe_only
        for _ in range(3):
            with session.iteration():
                for action in schedule.rank_actions[0]:
                    with session.op(action):
                        mb = action.microbatch_index
                        if action.kind is Kind.F:
                            outputs[mb] = block(x[mb])
                        else:
                            outputs.pop(mb).float().square().mean().backward()
    # An iteration's record is written when the next one starts or the session closes.
    ops = agent.records.ops
    assert len(ops) == 3 * len(schedule.rank_actions[0])
    assert all(o.time_s > 0 for o in ops)  # device time from CUDA events
    assert all(o.energy_j >= 0 for o in ops)  # not read per op on NVML (100 ms counter)
    assert len(session.history) == 3
    # Energy is the 100 ms counter read at the iteration's ends: 0 for an iteration inside one period.
    assert all(s.time_s > 0 and s.energy_j >= 0 for s in session.history)
    assert gpu.locked_clock_mhz() is None  # observe-only: never locked
