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

This is what the four-rank clock-pair tests and ``benchmarks/memory_clocks.py`` run; real-time,
multi-process emulation is :mod:`perseus.runtime.emulation`.
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
from perseus.runtime.agent.rank_plan import RankPlan
from perseus.runtime.agent.records import AgentRecords
from perseus.schedule.actions import Kind

__all__ = ["VirtualPipelineRun", "run_virtual_pipeline"]

_OpKey = tuple[str, int, int]  # (kind, microbatch, stage)


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


def _producer(op: _OpKey, num_stages: int) -> _OpKey | None:
    """The op whose output ``op`` consumes from another stage (None: none)."""
    kind, mb, stage = op
    if kind == "F":
        return ("F", mb, stage - 1) if stage > 0 else None
    if kind == "B":
        return ("B", mb, stage + 1) if stage + 1 < num_stages else ("F", mb, stage)
    return ("B", mb, stage)  # W: its own stage's B (same rank: already in order)


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
        RankAgent(
            plan,
            gpu,
            r,
            point_index=point_index,
            watchdog=False,
            handle_signals=False,
            clock=gpu.clock,  # the GPU's own VirtualClock
            **agent_kwargs,
        )
        for r, gpu in enumerate(gpus)
    ]
    expected = [RankPlan.of(plan, point_index, r).expected for r in range(ranks)]
    num_stages = 1 + max(op[2] for ops in expected for op in ops)
    times: list[float] = []
    energies: list[float] = []
    switches: list[int] = []
    for agent in agents:
        agent.start()
    try:
        barrier_s = max(g.timeline_now_s() for g in gpus)
        for _ in range(iterations):
            for agent, gpu in zip(agents, gpus, strict=True):
                agent.step_begin()
                gpu.wait_until(barrier_s)
            ends: dict[_OpKey, DeviceEvent] = {}
            owner = {op: r for r, ops in enumerate(expected) for op in ops}
            cursors = [0] * ranks
            while any(c < len(expected[r]) for r, c in enumerate(cursors)):
                progressed = False
                for r, agent in enumerate(agents):
                    ops, gpu = expected[r], gpus[r]
                    while cursors[r] < len(ops):
                        op = ops[cursors[r]]
                        src = _producer(op, num_stages)
                        if src is not None and owner.get(src, r) != r:
                            if src not in ends:
                                break
                            gpu.wait_event(ends[src])  # the receive of its input
                        kind, mb, stage = op
                        with agent.op(kind, mb, stage):
                            gpu.launch(stage, Kind(kind))
                        end = agent.last_op_end_event
                        assert end is not None
                        ends[op] = end
                        ctl = agent.controller
                        if ctl is not None:
                            ctl.flush()  # this op's clock work, on this rank's clock
                        cursors[r] += 1
                        progressed = True
                if not progressed:
                    stuck = {
                        r: ops[cursors[r]]
                        for r, ops in enumerate(expected)
                        if cursors[r] < len(ops)
                    }
                    raise PlanError(f"the plan's ops deadlock across ranks at {stuck}")
            records = [agent.step_end() for agent in agents]
            last_s = max(_agent_end(agent) for agent in agents)
            times.append(last_s - barrier_s)
            energies.append(sum(rec.energy_j for rec in records))
            switches.append(sum(rec.mid_op_switches for rec in records))
            barrier_s = last_s
    finally:
        for agent in agents:
            agent.close()
    return VirtualPipelineRun(
        time_s=tuple(times),
        energy_j=tuple(energies),
        mid_op_switches=tuple(switches),
        records=tuple(agent.records for agent in agents),
    )


def _agent_end(agent: RankAgent) -> float:
    """The device time at which ``agent``'s last op ended."""
    ops = agent.records.ops
    end = ops[-1].end_s if ops else None
    if end is None:
        raise PlanError(f"rank {agent.rank}: no op end recorded")
    return end
