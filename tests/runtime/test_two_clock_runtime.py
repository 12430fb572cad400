"""Two-clock ops on the device's timeline: the second clock lands at the planned layer boundary.

On the asynchronous simulated GPU (seeded noise, lognormal set latency) the host launches a
whole iteration ahead of the device. The agent posts each two-clock op with the predicted
device time from its start to its layer boundary; the controller issues the second clock at
``device start + that time - measured set latency``. The simulator prices every op piece by
piece (``trace_ops=True``), so the time each op really spent at each clock is known: these
tests fail if the mid-op switch is never issued (the op runs wholly at its first clock) or
issued at op start (it runs wholly at its second).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from perseus.device.simulated import SimNoise, SimulatedGPU
from perseus.errors import PlanError
from perseus.io import load_profile
from perseus.plan import Baseline, Frontier, JobSpec, PlanOp, PlanPoint
from perseus.profile.model import Profile
from perseus.runtime.agent.rank_agent import RankAgent
from perseus.runtime.emulation import take_stages
from perseus.schedule import Kind, build_schedule

LAYERS = 12
#: Forwards: layers 0..3 at 1410 MHz, 4..11 at 1005 MHz; backwards: 6 at 1005, 6 at 1410.
FWD: PlanOp = (1410, 1005, 4)
BWD: PlanOp = (1005, 1410, 6)


def _plan(ops: tuple[PlanOp, ...], names: tuple[str, ...], layers: bool = True) -> Frontier:
    spec = JobSpec(
        schedule="1f1b",
        ranks=1,
        stages=1,
        microbatches=8,
        blocking_power_w=83.64,
        profile_sha256="0" * 64,
        layers_per_stage=(LAYERS,) if layers else None,
    )
    return Frontier(
        job=spec,
        stage_ops=(names,),
        baseline=Baseline(time_s=1.0, energy_j=1.0),
        points=(PlanPoint(time_s=1.0, energy_j=1.0, freqs_mhz=(ops,)),),
    )


def _op_time(profile: Profile, scale: float = 1.0):  # type: ignore[no-untyped-def]
    def op_time_s(stage: int, kind: Kind, freq_mhz: int) -> float:
        return scale * profile.op(stage, kind).at(freq_mhz).time_s

    return op_time_s


def _run(  # type: ignore[no-untyped-def]
    state_dir: Path,
    *,
    use_profile: bool,
    iterations: int = 3,
    virtual: bool = False,
    predicted_scale: float = 1.0,
):
    """``virtual``: the GPU and the agent share a virtual clock (the clock worker runs inline
    at step_end: deterministic, and no real waiting); else the real clock (smoke tests)."""
    from perseus.device.clock import REAL_CLOCK, Clock, VirtualClock

    clock: Clock = VirtualClock(1000.0) if virtual else REAL_CLOCK
    profile = take_stages(load_profile("a100"), 4)
    actions = build_schedule("1f1b", 4, 8).rank_actions[0]
    names = tuple(f"{a.kind.value}{a.microbatch_index}" for a in actions)
    ops = tuple(FWD if a.kind is Kind.F else BWD for a in actions)
    gpu = SimulatedGPU.from_profile(
        profile,
        blocking_power_w=83.64,
        state_dir=state_dir,
        set_latency_s=0.005,  # lognormal, p99 12 ms (notes §5.1)
        clock=clock,
        noise=SimNoise(seed=5),
        trace_ops=True,
    )
    agent = RankAgent(
        _plan(ops, names),
        gpu,
        0,
        watchdog=False,
        handle_signals=False,
        op_time_s=_op_time(profile, predicted_scale) if use_profile else None,
        clock=clock,
    )
    records = []
    with agent:
        agent.wait_for_clock(5.0)
        for _ in range(iterations):
            agent.step_begin()
            for a in actions:
                with agent.op(a.kind, a.microbatch_index):
                    gpu.launch(a.stage_index, a.kind)
            if virtual:
                records.append(agent.step_end())  # the inline worker runs with the device
                gpu.synchronize()
            else:
                gpu.synchronize()
                records.append(agent.step_end())
    return profile, actions, ops, gpu.op_trace, records, agent.records.ops


def _wrong_clock_share(profile, actions, ops, trace, skip_iterations: int) -> float:  # type: ignore[no-untyped-def]
    """Share of op time run at the wrong clock: time at the first clock beyond (or short of)
    the planned boundary, plus any time at a third clock, over all op time."""
    n = len(actions)
    wrong = total = 0.0
    for op in trace:
        if op.seq < skip_iterations * n:
            continue
        a = actions[op.seq % n]
        fa, fb, k = ops[op.seq % n]
        planned_a_s = k / LAYERS * profile.op(a.stage_index, a.kind).at(fa).time_s
        at_a = sum(t for c, t in op.pieces if c == fa)
        other = sum(t for c, t in op.pieces if c not in (fa, fb))
        total += op.end_s - op.start_s
        wrong += abs(at_a - planned_a_s) + other
    assert total > 0
    return wrong / total


@pytest.mark.slow
def test_second_clock_applies_at_the_planned_layer_boundary_in_real_time(tmp_path):
    """The real-time smoke test of the mechanism (generous bound: thread wake-ups on a loaded
    machine); the virtual-time test below holds it to the set latency's floor."""
    profile, actions, _ops, trace, records, _ = _run(tmp_path, use_profile=True)
    share = _wrong_clock_share(profile, actions, _ops, trace, skip_iterations=1)
    assert share < 0.15, share
    # Every planned switch is issued or counted as missed (a worker thread starved past an
    # op's end under load: one of 16 under two busy loops); the virtual-time test below
    # holds it to all 16 issued.
    last = records[-1]
    assert last.mid_op_switches + last.mid_op_switches_missed == len(actions)
    assert last.mid_op_switches >= len(actions) - 2, last


def test_second_clock_applies_at_the_planned_layer_boundary(tmp_path):
    profile, actions, ops, trace, records, op_records = _run(
        tmp_path, use_profile=True, virtual=True
    )
    n = len(actions)
    share = _wrong_clock_share(profile, actions, ops, trace, skip_iterations=1)
    # Switch never issued: ~2/3 (forwards) and ~1/2 (backwards) of the time at the wrong
    # clock; issued at op start: ~1/3 and ~1/2. Issued on time: the set latency's spread.
    assert share < 0.03, share
    at_a = planned_a = 0.0
    for op in trace:
        if op.seq < n:
            continue
        fa, fb, k = ops[op.seq % n]
        a = actions[op.seq % n]
        planned_a_s = k / LAYERS * profile.op(a.stage_index, a.kind).at(fa).time_s
        planned_a += planned_a_s
        at_a += sum(t for c, t in op.pieces if c == fa)
        # Every op ran at both clocks (a clock may land a few ms off at either end: the set
        # latency's lognormal spread, p99 12 ms).
        assert sum(t for c, t in op.pieces if c == fb) > 0.25 * planned_a_s, op
    # Over all ops, the time at the first clock is the planned share's.
    assert abs(at_a - planned_a) < 0.1 * planned_a, (at_a, planned_a)
    assert [r.mid_op_switches for r in records] == [n] * len(records)
    assert all(r.mid_freq_mhz == ops[r.index][1] for r in op_records)


def test_without_a_profile_the_agent_predicts_from_last_iterations_device_time(tmp_path):
    profile, actions, ops, trace, records, _ = _run(
        tmp_path, use_profile=False, iterations=3, virtual=True
    )
    n = len(actions)
    assert records[0].mid_op_switches == 0  # nothing to predict from yet: first clock only
    assert [r.mid_op_switches for r in records[1:]] == [n, n]
    share = _wrong_clock_share(profile, actions, ops, trace, skip_iterations=2)
    assert share < 0.05, share


def test_a_switch_whose_op_ends_first_is_counted_missed_not_silent(tmp_path):
    """Predictions four times the ops' real time put every layer boundary after its op's
    end: no mid-op change is issued, and each is counted missed."""
    _profile, actions, _ops, _trace, records, _ = _run(
        tmp_path, use_profile=True, iterations=2, virtual=True, predicted_scale=4.0
    )
    n = len(actions)
    assert [(r.mid_op_switches, r.mid_op_switches_missed) for r in records] == [(0, n)] * 2
    good = _run(tmp_path / "good", use_profile=True, iterations=2, virtual=True)[4]
    assert [(r.mid_op_switches, r.mid_op_switches_missed) for r in good] == [(n, 0)] * 2


def test_two_clock_plan_without_layers_is_refused(tmp_path):
    actions = build_schedule("1f1b", 4, 8).rank_actions[0]
    names = tuple(f"{a.kind.value}{a.microbatch_index}" for a in actions)
    plan = _plan(tuple(FWD for _ in names), names, layers=False)
    with pytest.raises(PlanError, match="layers_per_stage"):
        RankAgent(plan, None, 0)


@pytest.mark.parametrize(
    "bad",
    [(1410, 1005, LAYERS), (1410, 1005, 40), ((1410, None, 0), (1005, 1593, LAYERS))],
)
def test_a_switch_at_a_layer_the_stage_lacks_is_refused_naming_rank_op_and_limit(bad):
    """A switch at or past the stage's last layer was accepted and landed at the op's end
    (its whole op at the first clock, though the plan was priced otherwise); ``perseus
    evaluate`` refused the same plan."""
    from perseus.runtime.agent.rank_plan import RankPlan

    actions = build_schedule("1f1b", 4, 8).rank_actions[0]
    names = tuple(f"{a.kind.value}{a.microbatch_index}" for a in actions)
    ops = tuple(bad if i == 3 else FWD for i in range(len(names)))
    with pytest.raises(PlanError, match=rf"plan rank 0 op 3 \({names[3]}\): .*{LAYERS} layers"):
        RankPlan.of(_plan(ops, names), 0, 0)
    RankPlan.of(_plan(tuple(FWD for _ in names), names), 0, 0)  # layers 1..11: accepted


def test_host_timing_runs_two_clock_ops_at_their_first_clock_and_says_so(tmp_path, caplog):
    profile = take_stages(load_profile("a100"), 4)
    actions = build_schedule("1f1b", 4, 8).rank_actions[0]
    names = tuple(f"{a.kind.value}{a.microbatch_index}" for a in actions)
    gpu = SimulatedGPU.from_profile(
        profile, blocking_power_w=83.64, state_dir=tmp_path, set_latency_s=0.0
    )
    agent = RankAgent(
        _plan(tuple(FWD for _ in names), names),
        gpu,
        0,
        watchdog=False,
        handle_signals=False,
        timing="host",
    )
    with caplog.at_level("WARNING", logger="perseus.runtime.agent.rank_agent"), agent:
        agent.step_begin()
        for a in actions:
            with agent.op(a.kind, a.microbatch_index):
                pass
        record = agent.step_end()
    assert record.mid_op_switches == 0
    assert agent.planned_clocks_mhz[0] == 1410 and agent.planned_phases[0][-1].freq_mhz == 1005
    assert sum("cannot switch clocks mid-op" in r.message for r in caplog.records) == 1
