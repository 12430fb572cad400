"""The agent speaks actions: its order errors, op records and held-op reports carry them."""

from __future__ import annotations

from pathlib import Path

import pytest

from perseus.device.clock import VirtualClock
from perseus.device.simulated import SimulatedGPU
from perseus.errors import PlanError
from perseus.runtime.agent import OpOrderError, RankAgent
from perseus.schedule import Action, Kind, build_schedule
from tests.runtime.plans import tiny_plan


@pytest.fixture
def gpu(tmp_path: Path) -> SimulatedGPU:
    return SimulatedGPU.from_preset(
        "a100", state_dir=tmp_path, set_latency_s=0.0, publish_interval_s=0.0
    )


def _agent(plan, gpu, rank=0, **kwargs):  # type: ignore[no-untyped-def]
    return RankAgent(plan, gpu, rank, watchdog=False, handle_signals=False, **kwargs)


def test_an_order_error_carries_the_planned_and_the_run_action(gpu: SimulatedGPU) -> None:
    with _agent(tiny_plan(), gpu) as agent:
        agent.step_begin()
        with agent.op("F", 0):
            pass
        with pytest.raises(OpOrderError) as wrong, agent.op(Kind.B, 0):
            pass
        assert (wrong.value.planned, wrong.value.ran) == (
            Action(0, Kind.F, 1),
            Action(0, Kind.B, 0),
        )
        assert isinstance(wrong.value, PlanError)  # the CLI maps it as before
        agent.step_abort()
        with pytest.raises(OpOrderError) as outside, agent.op("W", 1, stage_index=1):
            pass
        assert (outside.value.planned, outside.value.ran) == (None, Action(1, Kind.W, 1))
        with pytest.raises(PlanError, match="op kind 'X' is not one of F, B, W"):
            agent.step_begin()
            with agent.op("X", 0):
                pass


def test_op_records_carry_the_action_of_a_multi_stage_rank(gpu: SimulatedGPU) -> None:
    ops = (("F0@0", "F0@2", "B0@2", "B0@0"), ("F0@1", "F0@3", "B0@3", "B0@1"))
    plan = tiny_plan(stage_ops=ops)
    with _agent(plan, gpu) as agent:
        agent.step_begin()
        for a in plan.rank_actions[0]:
            with agent.op(a):
                pass
        agent.step_end()
        agent.step_begin()
        with pytest.raises(OpOrderError) as wrong, agent.op(Action(2, Kind.F, 0)):
            pass
        assert (wrong.value.planned, wrong.value.ran) == (
            Action(0, Kind.F, 0),
            Action(2, Kind.F, 0),
        )
        with pytest.raises(TypeError, match="an Action, or a kind and a microbatch_index"):
            agent.op(Kind.F)
    ran = [o.op for o in agent.records.ops]
    assert ran == [
        Action(0, Kind.F, 0),
        Action(2, Kind.F, 0),
        Action(2, Kind.B, 0),
        Action(0, Kind.B, 0),
    ]


def test_held_ops_carry_their_action(tmp_path: Path) -> None:
    """Under a 300 W cap an H100 locked at 1980 MHz runs every op held: each report names
    the action it held."""
    clock = VirtualClock()
    gpu = SimulatedGPU.from_preset(
        "h100",
        state_dir=tmp_path,
        clock=clock,
        set_latency_s=0.0,
        publish_interval_s=0.0,
        power_cap_w=300.0,
    )
    actions = build_schedule("1f1b", 1, 4).rank_actions[0]
    plan = tiny_plan(1980, stage_ops=(tuple(a.op_name(False) for a in actions),))
    agent = _agent(plan, gpu, clock=clock).start()
    with pytest.warns(RuntimeWarning, match="0F0 planned 1980 MHz"):
        agent.step_begin()
        for a in actions:
            with agent.op(a.kind, a.microbatch_index):
                gpu.launch(a.stage_index, a.kind)
                agent.mark_op_end()
        record = agent.step_end()
    agent.close()
    assert record.clock_delivery is not None
    assert tuple(h.op for h in record.clock_delivery.held) == actions
