"""Clock pairs and phased ops at run time: the agent sets memory clocks beside SM clocks, at
op starts and at planned layer boundaries inside ops, on the device's timeline.

The GPU is the simulated GDDR one (the bundled A40 profile extended to (SM, memory) pairs with
the ``a40`` preset's memory model), on a virtual clock: every timing decision is deterministic.
The GPU records every set call it receives (``record_set_calls``) with the device time its
change took effect, so the tests see where each change landed against the op trace. Each test
fails on an agent that refuses memory clocks or phase lists (the old ``op_clocks`` path), that
never issues a memory change, or that issues it at the op's start or end instead of at its
planned layer boundary.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

import pytest

from benchmarks._virtual_pipeline import run_virtual_pipeline
from perseus.device.base import ObserveOnlyWarning
from perseus.device.clock import VirtualClock
from perseus.device.power_model import with_memory_clocks
from perseus.device.presets import A40_MEMORY
from perseus.device.simulated import SimNoise, SimulatedGPU
from perseus.io import load_profile
from perseus.job import make_job
from perseus.plan import Baseline, Frontier, JobSpec, PlanOp, PlanPoint
from perseus.profile.model import Profile
from perseus.runtime.agent.rank_agent import RankAgent
from perseus.runtime.agent.rank_plan import OpPhase, RankPlan
from perseus.runtime.agent.readback import ClockHeldWarning
from perseus.runtime.emulation import take_stages
from perseus.schedule import Kind, build_schedule
from perseus.solver import trace

LAYERS = 12
POWER_W = 70.38
HI, LO = 7251, 5001  # the A40's two working memory clocks
#: Forwards: layers 0-3 at (1740, 7251), 4-7 at (1740, 5001), 8-11 at (1200, 5001).
FWD: PlanOp = ((1740, HI, 0), (1740, LO, 4), (1200, LO, 8))
#: Backwards: layers 0-5 at (1410, 5001), then the default memory clock at 1740.
BWD: PlanOp = ((1410, LO, 0), (1740, None, 6))


def _memory_sets(gpu: SimulatedGPU) -> list[tuple[float, int]]:
    """The memory-clock locks the GPU applied: (device time it took effect, clock)."""
    calls = gpu.set_calls
    return [
        (c.applied_s, c.applied) for c in calls if c.method == "set_memory_locked_clock" and c.ok
    ]


def _pairs(stages: int = 4) -> Profile:
    return with_memory_clocks(take_stages(load_profile("a40"), stages), A40_MEMORY)


def _plan(ops: tuple[PlanOp, ...], names: tuple[str, ...]) -> Frontier:
    spec = JobSpec(
        schedule="1f1b",
        ranks=1,
        stages=1,
        microbatches=8,
        blocking_power_w=POWER_W,
        profile_sha256="0" * 64,
        layers_per_stage=(LAYERS,),
    )
    return Frontier(
        job=spec,
        stage_ops=(names,),
        baseline=Baseline(time_s=1.0, energy_j=1.0),
        points=(PlanPoint(time_s=1.0, energy_j=1.0, freqs_mhz=(ops,)),),
    )


def _op_time(profile: Profile):  # type: ignore[no-untyped-def]
    def op_time_s(stage: int, kind: Kind, freq_mhz: int, mem_freq_mhz: int | None = None) -> float:
        return profile.op(stage, kind).at(freq_mhz, mem_freq_mhz).time_s

    return op_time_s


def _gpu(profile: Profile, state_dir: Path, clock: VirtualClock, **kw: Any) -> SimulatedGPU:
    return SimulatedGPU.from_profile(
        profile,
        blocking_power_w=POWER_W,
        state_dir=state_dir,
        set_latency_s=kw.pop("set_latency_s", 0.005),
        clock=clock,
        trace_ops=True,
        record_set_calls=100_000,
        **kw,
    )


def _one_rank(state_dir: Path, iterations: int = 3, **agent_kw: Any):  # type: ignore[no-untyped-def]
    clock = VirtualClock(1000.0)
    profile = _pairs()
    actions = build_schedule("1f1b", 4, 8).rank_actions[0]
    names = tuple(f"{a.kind.value}{a.microbatch_index}" for a in actions)
    ops = tuple(FWD if a.kind is Kind.F else BWD for a in actions)
    gpu = _gpu(profile, state_dir, clock, noise=SimNoise(seed=3))
    agent = RankAgent(
        _plan(ops, names),
        gpu,
        0,
        watchdog=False,
        handle_signals=False,
        op_time_s=_op_time(profile),
        clock=clock,
        **agent_kw,
    )
    records = []
    with agent:
        for _ in range(iterations):
            agent.step_begin()
            for a in actions:
                with agent.op(a.kind, a.microbatch_index):
                    gpu.launch(a.stage_index, a.kind)
            records.append(agent.step_end())
            gpu.synchronize()
        during = gpu.locked_memory_clock_mhz()
    return profile, actions, gpu, agent, records, during


def test_rank_plan_reads_phase_lists_with_memory_clocks():
    names = ("F0", "B0")
    plan = _plan((FWD, BWD), names)
    rank = RankPlan.of(plan, 0, 0)
    assert rank.phases[0] == (
        OpPhase(1740, HI, 0.0),
        OpPhase(1740, LO, pytest.approx(4 / 12)),
        OpPhase(1200, LO, pytest.approx(8 / 12)),
    )
    assert rank.phases[1] == (OpPhase(1410, LO, 0.0), OpPhase(1740, None, 0.5))
    assert rank.uses_memory_clocks
    assert [(p[0].freq_mhz, p[-1].freq_mhz) for p in rank.phases] == [(1740, 1200), (1410, 1740)]


def test_phased_pair_ops_switch_memory_clock_at_the_planned_layer_boundary(tmp_path):
    profile, actions, gpu, agent, records, during = _one_rank(tmp_path)
    n = len(actions)
    # The default memory clock of a phase without one is the GPU's highest.
    assert agent.planned_phases[n - 1][-1] == OpPhase(1740, HI, 0.5)
    assert during is not None  # a memory lock was held while running
    assert gpu.locked_memory_clock_mhz() is None  # ... and reset on close
    # Every planned switch inside an op is issued (a forward has 2, a backward 1).
    planned_mid = sum(2 if a.kind is Kind.F else 1 for a in actions)
    assert [r.mid_op_switches for r in records] == [planned_mid] * 3
    sets = _memory_sets(gpu)
    by_seq = {op.seq: op for op in gpu.op_trace}
    errors: list[float] = []
    for seq in range(n, 3 * n):
        a, op = actions[seq % n], by_seq[seq]
        if a.kind is not Kind.F:
            continue
        # The change to 5001 MHz lands at layer 4: a third of the op's time at its first pair.
        planned_s = op.start_s + 4 / 12 * profile.op(a.stage_index, a.kind).at(1740, HI).time_s
        inside = [t for t, m in sets if m == LO and op.start_s < t < op.end_s]
        assert len(inside) == 1, (seq, inside)
        errors.append(abs(inside[0] - planned_s))
        # The SM clock changes at layer 8 too: the op's tail runs at 1200 MHz.
        assert sum(t for c, t in op.pieces if c == 1200) > 0.2 * (op.end_s - op.start_s), op
    # Landing error: the set latency's lognormal spread, not a whole phase (~37 ms).
    errors.sort()
    assert errors[len(errors) // 2] < 0.003, errors
    assert errors[-1] < 0.015, errors
    # Back to 7251 MHz exactly where the plan's memory clock rises (a backward's second
    # phase, a forward after a forward), never more often.
    mems = [p.mem_freq_mhz for op in agent.planned_phases for p in op]
    rises = sum(1 for i, m in enumerate(mems) if m == HI and mems[i - 1] != HI)
    per_iteration = [
        sum(1 for t, m in sets if m == HI and lo <= t < hi) for lo, hi in _windows(gpu, n)
    ]
    assert per_iteration[1:] == [rises, rises], (per_iteration, rises)


def _windows(gpu: SimulatedGPU, n: int) -> list[tuple[float, float]]:
    trace_ = sorted(gpu.op_trace, key=lambda op: op.seq)
    return [(trace_[i * n].start_s, trace_[(i + 1) * n - 1].end_s) for i in range(len(trace_) // n)]


@pytest.mark.parametrize("how", ["disabled", "unprivileged"])
def test_observe_only_never_sets_memory_clocks(tmp_path, how):
    clock = VirtualClock(1000.0)
    profile = _pairs()
    actions = build_schedule("1f1b", 4, 8).rank_actions[0]
    names = tuple(f"{a.kind.value}{a.microbatch_index}" for a in actions)
    ops = tuple(FWD if a.kind is Kind.F else BWD for a in actions)
    gpu = _gpu(profile, tmp_path, clock, privileged=how != "unprivileged")
    agent = RankAgent(
        _plan(ops, names),
        gpu,
        0,
        enabled=how != "disabled",
        watchdog=False,
        handle_signals=False,
        clock=clock,
    )
    warns = (
        pytest.warns(ObserveOnlyWarning, match="NO_PERMISSION")
        if how == "unprivileged"
        else contextlib.nullcontext()
    )
    with warns, agent:
        for _ in range(2):
            agent.step_begin()
            for a in actions:
                with agent.op(a.kind, a.microbatch_index):
                    gpu.launch(a.stage_index, a.kind)
            agent.step_end()
    assert [c for c in gpu.set_calls if "memory" in c.method] == []  # never even asked
    assert not any(c.ok for c in gpu.set_calls)  # no clock changed ...
    assert how == "unprivileged" or gpu.set_calls == []  # ... nor, disabled, asked to
    assert gpu.locked_memory_clock_mhz() is None
    assert all(p.mem_freq_mhz is None for op in agent.planned_phases for p in op)


def test_memory_lock_is_reset_when_the_training_loop_raises(tmp_path):
    clock = VirtualClock(1000.0)
    profile = _pairs()
    gpu = _gpu(profile, tmp_path, clock, set_latency_s=0.0)
    plan = _plan((((1740, LO, 0),),), ("F0",))
    with (
        pytest.raises(RuntimeError, match="crash"),
        RankAgent(plan, gpu, 0, watchdog=False, handle_signals=False, clock=clock) as agent,
    ):
        agent.step_begin()
        with agent.op("F", 0):
            gpu.launch(0, Kind.F)
        assert agent.wait_for_clock()
        assert gpu.locked_memory_clock_mhz() == LO
        raise RuntimeError("crash")
    assert gpu.locked_memory_clock_mhz() is None
    assert gpu.locked_clock_mhz() is None


def test_memory_clock_plan_on_a_gpu_without_them_runs_sm_clocks_and_says_so(tmp_path, caplog):
    clock = VirtualClock(1000.0)
    profile = take_stages(load_profile("a100"), 4)  # HBM: one memory clock
    gpu = SimulatedGPU.from_profile(
        profile, blocking_power_w=83.64, state_dir=tmp_path, set_latency_s=0.0, clock=clock
    )
    plan = _plan((((1410, LO, 0), (1005, None, 6)),) * 2, ("F0", "B0"))
    agent = RankAgent(plan, gpu, 0, watchdog=False, handle_signals=False, clock=clock)
    with caplog.at_level(logging.WARNING, logger="perseus.runtime.agent.gpu_probe"), agent:
        agent.step_begin()
        for kind in (Kind.F, Kind.B):
            with agent.op(kind, 0):
                gpu.launch(0, kind)
        delivery = agent.step_end().clock_delivery
    assert sum("cannot lock them" in r.message for r in caplog.records) == 1
    assert agent.planned_phases[0] == (OpPhase(1410, None, 0.0), OpPhase(1005, None, 0.5))
    # No memory clock is read back (the simulated HBM board has none to read: a read would
    # have stopped the read-back), the SM clocks are.
    assert delivery is not None and delivery.ops_read == 2
    assert gpu.locked_clock_mhz() is None  # reset on close


def _four_rank_runs(tmp_path: Path, phases: int):  # type: ignore[no-untyped-def]
    profile = _pairs()
    job = make_job(profile, "1f1b", 4, 8, blocking_power_w=POWER_W, layers_per_stage=LAYERS)
    frontier = trace(job, max_clocks_per_op=phases).frontier
    point = frontier.cheapest_within(frontier.baseline.time_s)
    allmax = job.frontier([job.point(job.allmax())])

    def run(plan: Frontier, name: str):  # type: ignore[no-untyped-def]
        gpus = [
            _gpu(
                profile,
                tmp_path / name,
                VirtualClock(1000.0),
                index=r,
                noise=SimNoise(seed=11 + r),
            )
            for r in range(4)
        ]
        return gpus, run_virtual_pipeline(plan, gpus, iterations=5, op_time_s=_op_time(profile))

    _, base = run(allmax, "allmax")
    plan = frontier.with_points((point,))
    gpus, ran = run(plan, "plan")
    return allmax.points[0], plan, base, gpus, ran


@pytest.mark.parametrize("phases", [2, 3])
def test_four_rank_clock_pair_plan_realises_its_predicted_saving(tmp_path, phases):
    """The GDDR pair profile's no-slowdown plan on four emulated ranks: the saving measured
    against the all-max run is within 1 point of the predicted one, the time within 2 %, and
    every planned mid-op switch is issued in every iteration, memory clocks included."""
    base_point, plan, base, gpus, ran = _four_rank_runs(tmp_path, phases)
    point = plan.points[0]
    assert LO in point.memory_clocks_mhz  # the plan really lowers the memory clock
    assert point.num_switches > 0
    base_t, base_e = base.mean(skip=1)
    t, e = ran.mean(skip=1)
    assert abs(base_t / base_point.time_s - 1) < 0.02, (base_t, base_point.time_s)
    assert abs(t / point.time_s - 1) < 0.02, (t, point.time_s)
    predicted = 1 - point.energy_j / base_point.energy_j
    measured = 1 - e / base_e
    assert predicted > 0.05
    assert abs(measured - predicted) < 0.01, (measured, predicted)
    assert ran.mid_op_switches[1:] == (point.num_switches,) * 4, ran.mid_op_switches
    # Each rank's memory clock changes exactly where its part of the plan changes it (the
    # first iteration may add one set call: from no lock to the first op's memory clock).
    lowered = 0
    for r, g in enumerate(gpus):
        mems = [
            HI if p.mem_freq_mhz is None else p.mem_freq_mhz
            for op in RankPlan.of(plan, 0, r).phases
            for p in op
        ]
        changes = sum(1 for i, m in enumerate(mems) if m != mems[i - 1])
        sets = _memory_sets(g)
        assert 5 * changes <= len(sets) <= 5 * changes + 1, (r, changes, sets)
        lowered += LO in mems
    assert lowered > 0


@pytest.mark.parametrize("device", ["GPU-a40", "GPU-hbm"])
def test_agent_on_nvml_locks_memory_clocks_and_resets_them(tmp_path, device):
    """Through NVML (fake; no device events here, so host timing: each op's first phase):
    the A40 gets its memory lock and a reset at close; the HBM board is never asked."""
    from perseus.device.fake_nvml import FakeDevice, FakeNvml
    from perseus.device.nvml import NvmlGPU

    nvml = FakeNvml(
        devices=[
            FakeDevice("GPU-a40", name="NVIDIA A40", memory_clocks=(HI, LO, 810, 405)),
            FakeDevice("GPU-hbm"),
        ]
    )
    gpu = NvmlGPU(device, nvml_module=nvml, privileged=True, lock_dir=tmp_path)
    plan = _plan((((1410, LO, 0),), ((1410, None, 0),)), ("F0", "B0"))
    with RankAgent(plan, gpu, 0, watchdog=False, handle_signals=False, timing="host") as agent:
        for _ in range(2):
            agent.step_begin()
            for kind in ("F", "B"):
                with agent.op(kind, 0):
                    assert agent.wait_for_clock()  # the op's clocks are set while it runs
            agent.step_end()
    sets = [args[1:] for name, args in nvml.calls if name == "nvmlDeviceSetMemoryLockedClocks"]
    resets = nvml.names().count("nvmlDeviceResetMemoryLockedClocks")
    if device == "GPU-a40":
        # 5001 for the forward, back to the default (7251) for the backward, twice.
        assert sets == [(LO, LO), (HI, HI)] * 2, sets
        assert resets >= 1 and nvml.devices[0].mem_locked is None
    else:
        assert sets == [] and resets == 0


def test_a_refused_memory_lock_keeps_sm_clocks_running(tmp_path):
    """A board that lists memory clocks but whose driver refuses the lock: one warning, SM
    clocks still change (phases included), no memory lock is asked for again, and the ops
    whose memory clock is not the plan's are reported held."""
    from perseus.errors import DeviceNotSupportedError

    clock = VirtualClock(1000.0)
    profile = _pairs()
    actions = build_schedule("1f1b", 4, 8).rank_actions[0]
    names = tuple(f"{a.kind.value}{a.microbatch_index}" for a in actions)
    ops = tuple(FWD if a.kind is Kind.F else BWD for a in actions)
    gpu = _gpu(profile, tmp_path, clock)
    gpu.inject_error("set_memory_locked_clock", DeviceNotSupportedError("NOT_SUPPORTED"))
    agent = RankAgent(
        _plan(ops, names),
        gpu,
        0,
        watchdog=False,
        handle_signals=False,
        op_time_s=_op_time(profile),
        clock=clock,
    )
    with (
        pytest.warns(ObserveOnlyWarning, match="cannot lock memory clocks") as caught,
        pytest.warns(ClockHeldWarning, match=r"memory planned 5001 MHz, ran 7251 MHz"),
        agent,
    ):
        for _ in range(2):
            agent.step_begin()
            for a in actions:
                with agent.op(a.kind, a.microbatch_index):
                    gpu.launch(a.stage_index, a.kind)
            agent.step_end()
    assert len([w for w in caught if "memory" in str(w.message)]) == 1
    assert not agent.observe_only
    memory_calls = [(c.method, c.error) for c in gpu.set_calls if "memory" in c.method]
    assert memory_calls == [("set_memory_locked_clock", "NOT_SUPPORTED")]  # asked once only
    assert any(c == 1200 for op in gpu.op_trace for c, _ in op.pieces)  # SM phases still run
