"""Clocks on the device's timeline: the test that fails on the host-timed design.

On the asynchronous simulated GPU the host launches a whole iteration in a few milliseconds
and the device runs it over a second. Host-timed control (the design before issue 14: post an
op's clock when the host enters it) then sets most clocks long before their op runs, so a
large share of op time runs at another op's clock. Device-timed control (events on the
stream; the controller applies the next clock as the op ends on the device) keeps the share
near the floor set by the set call's random latency (lognormal, median 5 ms, p99 12 ms: its
mean absolute deviation, ~1.5 ms per clock change, against 55-110 ms ops).

``benchmarks/clock_timing.py`` prints both for whole pipelines (README table).
"""

from __future__ import annotations

import time
from pathlib import Path

from perseus.device.simulated import SimNoise, SimulatedGPU
from perseus.io import load_profile
from perseus.plan import Baseline, Frontier, JobSpec, PlanPoint
from perseus.runtime.agent import RankAgent
from perseus.runtime.emulation import take_stages
from perseus.schedule import Kind, build_schedule


def _wrong_clock_share(timing: str, state_dir: Path, iterations: int = 3) -> float:
    profile = take_stages(load_profile("a100"), 4)
    actions = build_schedule("1f1b", 4, 8).rank_actions[0]
    names = tuple(f"{a.kind.value}{a.microbatch_index}" for a in actions)
    # Forward and backward at different clocks: nearly every boundary changes the clock.
    freqs = tuple(1200 if a.kind is Kind.F else 1005 for a in actions)
    spec = JobSpec(
        schedule="1f1b",
        ranks=1,
        stages=1,
        microbatches=8,
        blocking_power_w=83.64,
        profile_sha256="0" * 64,
    )
    plan = Frontier(
        job=spec,
        stage_ops=(names,),
        baseline=Baseline(time_s=1.0, energy_j=1.0),
        points=(PlanPoint(time_s=1.0, energy_j=1.0, freqs_mhz=(freqs,)),),
    )
    gpu = SimulatedGPU.from_profile(
        profile,
        blocking_power_w=83.64,
        state_dir=state_dir,
        set_latency_s=0.005,  # lognormal, p99 12 ms (notes §5.1)
        clock=time.perf_counter,
        noise=SimNoise(seed=3),
        trace_ops=True,
    )
    agent = RankAgent(plan, gpu, 0, watchdog=False, handle_signals=False, timing=timing)
    with agent:
        agent.wait_for_clock(5.0)
        for _ in range(iterations):
            agent.step_begin()
            t0 = time.perf_counter()
            for a in actions:
                with agent.op(a.kind, a.microbatch_index):
                    gpu.launch(a.stage_index, a.kind)
            launched_s = time.perf_counter() - t0
            gpu.synchronize()  # once per iteration, like loss.item()
            agent.step_end()
            assert launched_s < 0.2  # the host really ran ahead of the device (~1.3 s of ops)
    wrong = total = 0.0
    n = len(freqs)
    for op in gpu.op_trace:
        if op.seq < n:
            continue  # the first iteration teaches the agent each op's device time
        for clock, time_s in op.pieces:
            total += time_s
            wrong += time_s if clock != freqs[op.seq % n] else 0.0
    assert total > 0
    return wrong / total


def test_host_timed_clocks_run_ops_at_the_wrong_clock_device_timed_do_not(tmp_path):
    host = _wrong_clock_share("host", tmp_path / "host")
    device = _wrong_clock_share("device", tmp_path / "device")
    assert host > 0.2, host  # today's design: a measurable share at the wrong clock
    assert device < 0.05, device  # ~2 % measured: the set latency's spread, not the host
    assert device < host / 5, (host, device)
