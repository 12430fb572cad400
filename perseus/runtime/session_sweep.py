"""The online sweep of a session: a one-point "plan" of the clocks to measure next, op times
from the agent's device events, op power from a fit to the energy counter's windows
(:mod:`perseus.runtime.profiling.energy_attribution`).
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

from perseus.device.base import GPU
from perseus.errors import ConfigError, ProfileError
from perseus.plan import Baseline, Frontier, PlanPoint
from perseus.profile.model import Profile
from perseus.runtime.agent.gpu_probe import lockable_memory_clocks
from perseus.runtime.agent.rank_agent import RankAgent
from perseus.runtime.collectives import all_reduce_max
from perseus.runtime.planning import OnlineProfile, job_spec
from perseus.runtime.profiling.energy_attribution import OpSpan, SweepWindow
from perseus.runtime.profiling.energy_windows import CounterSampler, sample_period_for
from perseus.runtime.profiling.pair_sweep import PairProfileRow, PairSweep
from perseus.runtime.profiling.sweep import MAX_FIT_ERROR, ClockSweep, ProfileRow, check_fit
from perseus.schedule.actions import Kind, Schedule

__all__ = ["SessionSweep", "clock_control_kept"]

_log = logging.getLogger("perseus.runtime.session")


def clock_control_kept(agent: RankAgent | None, rank: int, group: Any) -> bool:
    """Whether every rank still sets clocks (one all-reduce): a sweep to profile again needs
    to, and an observe-only run goes on as it is (said on rank 0)."""
    (lost,) = all_reduce_max([float(agent is not None and agent.observe_only)], group)
    if lost and rank == 0:
        _log.warning(
            "perseus: not profiling again: clock control was lost (observe-only) on a rank; "
            "the run goes on at the clocks its GPUs run"
        )
    return not lost


class SessionSweep:
    """One rank's online sweep inside a session.

    Args:
        blocking_power_w: GPU power while waiting (the fit's idle power).
        only: Profile again only these ops (stage, kind) (None: every op of the rank) ...
        previous: ... keeping the rank's other ops' rows of this profile.
    """

    def __init__(
        self,
        options: OnlineProfile,
        schedule: Schedule,
        rank: int,
        gpu: GPU,
        blocking_power_w: float,
        only: Collection[tuple[int, Kind]] | None = None,
        previous: Profile | None = None,
    ) -> None:
        self.options = options
        self.schedule = schedule
        self.rank = rank
        self.gpu = gpu
        self.blocking_power_w = blocking_power_w
        own = {(a.stage_index, a.kind) for a in schedule.rank_actions[rank]}
        ops = own if only is None else own & set(only)
        self.kept_rows: list[Any] = []  # the rows of the ops not swept again
        if previous is not None:
            for op in sorted(own - ops):
                for o in previous.op(*op).options:
                    self.kept_rows.append((*op, o.freq_mhz, o.time_s, o.energy_j, o.mem_freq_mhz))
        self.profiler: ClockSweep | PairSweep
        mem_clocks = lockable_memory_clocks(gpu)
        if mem_clocks:  # a lockable memory clock: sweep (SM, memory) pairs (docs/memory-clocks.md)
            self.profiler = PairSweep(
                ops, gpu.supported_clocks_mhz(), mem_clocks, blocking_power_w=blocking_power_w
            )
        else:
            self.profiler = ClockSweep(ops, gpu.supported_clocks_mhz(), patience=options.patience)
        self._sampler: CounterSampler | None = None
        self._window: SweepWindow | None = None
        self._warned_observe_only = False

    def start(self, agent: RankAgent) -> None:
        """Start reading the energy counter on the agent's device timeline.

        Raises:
            ConfigError: the agent is observe-only.
        """
        if agent.observe_only:
            raise ConfigError(
                f"online profiling needs to set clocks on {self.gpu.name}, but the agent is "
                "observe-only (no privilege, or unsupported): run `perseus doctor`, or "
                "profile where clocks can be locked and pass that profile as plan="
            )
        events, clock = agent.events, agent.clock  # reads paced on the agent's clock
        now_s = events.timeline_now_s if events is not None else clock.now
        period = self.options.sample_period_s
        sampler = CounterSampler(
            self.gpu.energy_mj,
            now_s,
            period_s=sample_period_for(self.gpu) if period is None else float(period),
            clock=clock,
        )
        self._window = SweepWindow(
            sampler,
            min_intervals=self.options.min_windows,
            max_iterations=self.options.max_step_iterations,
            idle_power_w=self.blocking_power_w,
            ridge=self.options.ridge,
        )
        self._sampler = sampler
        sampler.start()

    def close(self) -> None:
        """Stop the counter sampler (idempotent)."""
        sampler, self._sampler = self._sampler, None
        self._window = None
        if sampler is not None:
            sampler.close()

    def discard_iteration(self) -> None:
        """A failed iteration: its ops are unknown, restart the step."""
        self.profiler.discard_iteration()
        if self._window is not None:
            self._window.reset()

    def sweep_plan(self) -> Frontier:
        """A one-point "plan" running every op at the clock the sweep measures next."""
        schedule = self.schedule
        top = max(self.gpu.supported_clocks_mhz())
        freqs = tuple(
            tuple(
                self.profiler.plan_op_for(a.stage_index, a.kind) if r == self.rank else top
                for a in actions
            )
            for r, actions in enumerate(schedule.rank_actions)
        )
        return Frontier(
            job=job_spec(schedule, self.blocking_power_w, "0" * 64),
            stage_ops=schedule.stage_ops(),
            baseline=Baseline(time_s=1.0, energy_j=1.0),
            points=(PlanPoint(time_s=1.0, energy_j=1.0, freqs_mhz=freqs),),
        )

    def add_iteration(self, agent: RankAgent) -> bool:
        """Feed the sweep the agent's last iteration; once the step's ops span enough counter
        windows, fit their power and advance (then True)."""
        step = self._window
        if step is None:
            return False
        profiler = self.profiler
        if agent.observe_only and not self._warned_observe_only:
            self._warned_observe_only = True
            _log.warning(
                "rank %d: clock control was lost during online profiling; the rows measured "
                "from now on are at the GPU's own clock, not the swept one",
                self.rank,
            )
        actions = self.schedule.rank_actions[self.rank]
        last = agent.iteration - 1
        spans = []
        for op in agent.recent_ops(len(actions)):
            if op.iteration == last:
                action = actions[op.index]
                profiler.record(action.stage_index, action.kind, op.time_s)
                if op.start_s is not None and op.end_s is not None:
                    spans.append(OpSpan((action.stage_index, action.kind), op.start_s, op.end_s))
        step.add_iteration(spans)
        if not step.ready():
            return False
        fit = step.fit()
        if fit is not None:
            _log.debug(
                "rank %d: sweep step %d: %d windows over %d iterations, residual %.1f W",
                self.rank,
                profiler.iterations,
                fit.intervals,
                step.iterations,
                fit.residual_w,
            )
        profiler.end_iteration(power_w=None if fit is None else fit.power_w, fit=fit)
        step.reset()
        return True

    def finished_everywhere(self, group: Any) -> bool:
        """True when every rank's sweep is done (one all-reduce over ``group``)."""
        (busy,) = all_reduce_max([0.0 if self.profiler.done else 1.0], group)
        return busy == 0.0

    def measured_rows(self, group: Any) -> list[ProfileRow] | list[PairProfileRow]:
        """The finished sweep's rows, once every rank's energy fit passed (one all-reduce).

        Raises:
            ProfileError: on every rank together when any rank's fit is poor.
        """
        (worst,) = all_reduce_max([self.profiler.worst_fit_error()], group)
        if worst > MAX_FIT_ERROR:
            check_fit(self.profiler)  # raises here, naming this rank's worst row
            raise ProfileError(
                f"online profile refused: another rank's energy fit is worse than "
                f"{MAX_FIT_ERROR:.0%} (its error names the row)"
            )
        return [*self.profiler.rows(), *self.kept_rows]
