"""Online profiling of clock pairs on the simulated GDDR GPU, on a virtual clock.

A :class:`PairSweep` drives the rank agent: each sweep step runs one iteration with every op
at the step's (SM, memory) pair (a one-phase plan op with a memory clock), and the ops' device
times and energies (exact on the simulator: per-op counter readings) are fed back. The sweep
must measure the pairs the simulated GPU really costs, find every vertex of each op's lower
hull over the full grid, and stay within its bound, far below the full grid.
"""

from __future__ import annotations

import pytest

from perseus.device.clock import VirtualClock
from perseus.device.power_model import with_memory_clocks
from perseus.device.presets import A40_MEMORY
from perseus.device.simulated import SimulatedGPU
from perseus.errors import ConfigError
from perseus.io import load_profile
from perseus.plan import Baseline, Frontier, JobSpec, PlanPoint
from perseus.profile.model import build_profile
from perseus.profile.pair_grid import _hull
from perseus.runtime.agent.rank_agent import RankAgent
from perseus.runtime.emulation import take_stages
from perseus.runtime.profiling.pair_sweep import PairSweep
from perseus.runtime.profiling.sweep import check_fit
from perseus.schedule import Kind, build_schedule

POWER_W = 70.38


def _plan(sweep: PairSweep, actions, names) -> Frontier:  # type: ignore[no-untyped-def]
    ops = tuple(sweep.plan_op_for(a.stage_index, a.kind) for a in actions)
    spec = JobSpec(
        schedule="1f1b",
        ranks=1,
        stages=1,
        microbatches=4,
        blocking_power_w=POWER_W,
        profile_sha256="0" * 64,
    )
    return Frontier(
        job=spec,
        stage_ops=(names,),
        baseline=Baseline(time_s=1.0, energy_j=1.0),
        points=(PlanPoint(time_s=1.0, energy_j=1.0, freqs_mhz=(ops,)),),
    )


def test_pair_sweep_finds_every_hull_pair_within_its_bound(tmp_path):
    truth = with_memory_clocks(take_stages(load_profile("a40"), 4), A40_MEMORY)
    clock = VirtualClock(1000.0)
    gpu = SimulatedGPU.from_profile(
        truth,
        blocking_power_w=POWER_W,
        state_dir=tmp_path,
        set_latency_s=0.005,
        publish_interval_s=0.0,  # exact counter: per-op energies
        clock=clock,
    )
    actions = build_schedule("1f1b", 4, 4).rank_actions[0]
    names = tuple(f"{a.kind.value}{a.microbatch_index}" for a in actions)
    ops = {(a.stage_index, a.kind) for a in actions}
    sweep = PairSweep(
        ops,
        gpu.supported_clocks_mhz(),
        gpu.supported_memory_clocks_mhz(),
        blocking_power_w=POWER_W,
    )
    agent = RankAgent(
        _plan(sweep, actions, names), gpu, 0, watchdog=False, handle_signals=False, clock=clock
    )
    steps = 0
    with agent:
        while not sweep.done:
            steps += 1
            assert steps <= sweep.max_pairs + 1
            agent.step_begin()
            for a in actions:
                with agent.op(a.kind, a.microbatch_index):
                    gpu.launch(a.stage_index, a.kind)
            agent.step_end()
            for rec in agent.records.ops[-len(actions) :]:
                a = actions[rec.index]
                sweep.record(a.stage_index, a.kind, rec.time_s, rec.energy_j)
            sweep.end_iteration()
            if not sweep.done:
                agent.swap_plan(_plan(sweep, actions, names))
    grid = len(gpu.supported_clocks_mhz()) * len(gpu.supported_memory_clocks_mhz())
    assert len(sweep.measured) <= sweep.max_pairs < grid  # bounded, well below the grid
    assert len(sweep.measured) == len(set(sweep.measured))  # no pair twice
    assert sweep.rounds >= 1  # it refined near the hull, not only the coarse grid
    measured = build_profile(sweep.rows(), source="sweep")
    for stage, kind in ops:
        got = measured.op(stage, kind)
        want = truth.op(stage, kind)
        # Each row is what the GPU costs at that pair (ops at one pair, exact counter).
        for o in got.options:
            ref = want.at(o.freq_mhz, o.mem_freq_mhz)
            assert o.time_s == pytest.approx(ref.time_s, rel=1e-3), o
            assert o.energy_j == pytest.approx(ref.energy_j, rel=1e-3), o
        # Every hull vertex of the full grid was measured, memory clocks lowered included.
        full_hull = {o.clocks for o in _hull(want.options, POWER_W)}
        got_hull = {o.clocks for o in _hull(got.options, POWER_W)}
        assert full_hull == got_hull, (stage, kind, full_hull - got_hull)
        assert any(m != A40_MEMORY.max_mhz for _, m in full_hull)
    check_fit(sweep)  # per-op energies: no fit uncertainty


def test_pair_sweep_refuses_a_gpu_with_one_memory_clock():
    with pytest.raises(ConfigError, match="at least two memory clocks"):
        PairSweep([(0, Kind.F)], [1410, 1005], [1593], blocking_power_w=80.0)
