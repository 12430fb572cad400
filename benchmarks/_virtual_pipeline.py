"""Run every rank of a pipeline plan in one thread, on virtual time: the whole agent path
(rank agent, device timing, controller with its clock pairs and mid-op switches) on
simulated GPUs, deterministic and without waiting.

Each rank has its own simulated GPU and its own :class:`~perseus.device.clock.VirtualClock`
(all starting at the same time), so that a rank's controller, which runs inline and sleeps on
its rank's clock, never moves another rank's time. Ops run in an order that respects the
pipeline's data dependencies: a rank runs its next op once the op that produces its input
(the previous stage's forward, the next stage's backward) has run, and its stream waits for
that op's end event (a receive). After each op the rank's controller does its work for the op
(:meth:`~perseus.runtime.agent.controller.FrequencyController.flush`): by then that op's end,
and so every later rank's input time, is final. Iterations end at a barrier (the optimizer
step): each rank's next iteration starts when the slowest rank ended, and the idle time before
it is inside the rank's iteration window, as in the planner's model.

This is a harness, not part of the package: ``benchmarks/memory_clocks.py`` and the four-rank
clock-pair tests run it; real-time, multi-process emulation is :mod:`perseus.runtime.emulation`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from perseus.device.base import DeviceEvent
from perseus.device.simulated import SimulatedGPU
from perseus.errors import PlanError
from perseus.plan import Frontier
from perseus.runtime.agent.rank_agent import RankAgent
from perseus.runtime.agent.records import AgentRecords
from perseus.schedule.actions import Action
from perseus.schedule.dependencies import action_dependencies

__all__ = ["VirtualPipelineRun", "run_virtual_pipeline"]


@dataclass(frozen=True, slots=True)
class VirtualPipelineRun:
    """What a virtual-time pipeline run measured.

    Attributes:
        time_s: Per iteration: from the previous barrier (the common start) to the last
            rank's end.
        energy_j: Per iteration: the sum over ranks of the energy in the rank's iteration
            window (its windows tile its timeline, idle time included).
        mid_op_switches: Per iteration: mid-op changes issued, all ranks together.
        records: Per rank: the agent's records.
    """

    time_s: tuple[float, ...]
    energy_j: tuple[float, ...]
    mid_op_switches: tuple[int, ...]
    records: tuple[AgentRecords, ...]

    def mean(self, skip: int = 1) -> tuple[float, float]:
        """Mean ``(time_s, energy_j)`` per iteration after the first ``skip``."""
        times, energies = self.time_s[skip:], self.energy_j[skip:]
        if not times:
            raise ValueError(f"no iterations after skipping {skip} of {len(self.time_s)}")
        return sum(times) / len(times), sum(energies) / len(energies)


def run_virtual_pipeline(
    plan: Frontier,
    gpus: Sequence[SimulatedGPU],
    *,
    iterations: int,
    point_index: int = 0,
    **agent_kwargs: Any,
) -> VirtualPipelineRun:
    """Run ``iterations`` of ``plan``'s point ``point_index`` with one agent per rank.

    Args:
        plan: A plan or frontier with ``len(gpus)`` ranks.
        gpus: One simulated GPU per rank, each on its own
            :class:`~perseus.device.clock.VirtualClock` (``clock=``), all at the same time.
        iterations: Iterations to run.
        point_index: Which point of ``plan`` to run.
        agent_kwargs: Passed to every :class:`RankAgent` (e.g. ``op_time_s``); ``clock`` is
            each GPU's own, and watchdog and signal handlers are off.

    Raises:
        PlanError: if the plan's ranks and the GPUs differ in number, or its ops deadlock.
    """
    ranks = len(plan.stage_ops)
    if len(gpus) != ranks:
        raise PlanError(f"the plan has {ranks} ranks but {len(gpus)} GPUs were given")
    agents = [
        # the GPU's own VirtualClock; no watchdog or signal handlers in one thread
        RankAgent(
            plan,
            gpu,
            r,
            point_index=point_index,
            watchdog=False,
            handle_signals=False,
            clock=gpu.clock,
            **agent_kwargs,
        )
        for r, gpu in enumerate(gpus)
    ]
    expected = [list(plan.rank_actions[r]) for r in range(ranks)]
    for agent in agents:
        agent.start()
    try:
        barrier_s = max(g.timeline_now_s() for g in gpus)
        steps: list[tuple[float, float, int]] = []
        for _ in range(iterations):
            last_s, energy_j, switches = _run_iteration(agents, gpus, expected, barrier_s)
            steps.append((last_s - barrier_s, energy_j, switches))
            barrier_s = last_s
    finally:
        for agent in agents:
            agent.close()
    return VirtualPipelineRun(
        time_s=tuple(t for t, _, _ in steps),
        energy_j=tuple(e for _, e, _ in steps),
        mid_op_switches=tuple(n for _, _, n in steps),
        records=tuple(agent.records for agent in agents),
    )


def _run_iteration(
    agents: Sequence[RankAgent],
    gpus: Sequence[SimulatedGPU],
    expected: list[list[Action]],
    barrier_s: float,
) -> tuple[float, float, int]:
    """One iteration from the barrier at ``barrier_s``: its end, energy and mid-op switches."""
    for agent, gpu in zip(agents, gpus, strict=True):
        agent.step_begin()
        gpu.wait_until(barrier_s)
    _run_ops(agents, gpus, expected)
    records = [agent.step_end() for agent in agents]
    energy_j = sum(rec.energy_j for rec in records)
    return max(map(_agent_end, agents)), energy_j, sum(rec.mid_op_switches for rec in records)


def _receives(expected: list[list[Action]]) -> dict[Action, list[Action]]:
    """Per op, the ops of other ranks whose output it receives (the one dependency rule)."""
    num_stages = 1 + max(a.stage_index for ops in expected for a in ops)
    owner = {a: r for r, ops in enumerate(expected) for a in ops}
    return {
        op: [a for a in action_dependencies(op, num_stages) if owner[a] != owner[op]]
        for op in owner
    }


def _run_ops(
    agents: Sequence[RankAgent], gpus: Sequence[SimulatedGPU], expected: list[list[Action]]
) -> None:
    """Each rank's ops in order, a rank running on until it waits for another rank's output."""
    receives = _receives(expected)
    ends: dict[Action, DeviceEvent] = {}
    todo = [list(ops) for ops in expected]
    while any(todo):
        ran = 0
        for r, (agent, gpu) in enumerate(zip(agents, gpus, strict=True)):
            while todo[r] and all(a in ends for a in receives[todo[r][0]]):
                action = todo[r].pop(0)
                for a in receives[action]:
                    gpu.wait_event(ends[a])  # the receive of its input
                ends[action] = _run_op(agent, gpu, action)
                ran += 1
        if not ran:
            stuck = [str(ops[0]) for ops in todo if ops]
            raise PlanError(f"the plan's ops deadlock across ranks at {stuck}")


def _run_op(agent: RankAgent, gpu: SimulatedGPU, action: Action) -> DeviceEvent:
    """Run one op on its rank and the controller's work for it; the op's end event."""
    with agent.op(action.kind.value, action.microbatch_index, action.stage_index):
        gpu.launch(action.stage_index, action.kind)
    end = agent.last_op_end_event
    if end is None:
        raise PlanError(f"rank {agent.rank}: op {action} recorded no end event")
    if agent.controller is not None:
        agent.controller.flush()  # this op's clock work, on this rank's clock
    return end


def _agent_end(agent: RankAgent) -> float:
    """The device time at which ``agent``'s last op ended."""
    ops = agent.records.ops
    end = ops[-1].end_s if ops else None
    if end is None:
        raise PlanError(f"rank {agent.rank}: no op end recorded")
    return end
