"""Trace replay of a recurring job: the optimizer against the default and the oracle (pure).

A recurrence is one submission, over when a run reaches the target (Zeus's
``simulate_one_job``); a run samples one recorded training path of its batch size and pays
``epochs × epoch cost`` at the limit the JIT profiler picks, the first run of a size paying
``profile_share`` of its first epoch spread over every limit. Policies: ``optimizer``,
``default`` (``b0`` at the maximum limit) and ``oracle`` (:meth:`Workload.oracle`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from perseus.errors import ConfigError, InfeasibleError
from perseus.recurring.cost import PowerLimitMeasurement, best_power_limit_w, zeus_cost
from perseus.recurring.policy import UNSTOPPED_AFTER, BatchSizeOptimizer, Decision, Observation
from perseus.recurring.workload import Workload

__all__ = [
    "POLICIES",
    "BatchSizePolicy",
    "PolicyRun",
    "RunRecord",
    "WorkloadSummary",
    "default_recurrences",
    "jit_power_limit_w",
    "replay_fixed",
    "replay_optimizer",
    "replay_workload",
    "summary_json",
    "workload_json",
]

POLICIES = ("optimizer", "default", "oracle")
_MAX_TRIES = 50  # runs in one recurrence before giving up (Zeus: 20, then raises)


class BatchSizePolicy(Protocol):
    """Anything that picks the next run's batch size from the finished runs."""

    def decide(self, history: Sequence[Observation], rng: np.random.Generator) -> Decision: ...


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One replayed run."""

    recurrence: int
    batch_size: int
    power_limit_w: int
    energy_j: float
    time_s: float
    cost: float
    reached: bool
    phase: str


@dataclass(frozen=True)
class PolicyRun:
    """Every run of one policy over N recurrences, with cumulative totals per recurrence."""

    runs: tuple[RunRecord, ...]
    cum_energy_j: np.ndarray
    cum_time_s: np.ndarray
    cum_cost: np.ndarray


def default_recurrences(workload: Workload) -> int:
    """Zeus's N: 2 × number of batch sizes × number of power limits."""
    limits = {pl for pls in workload.power_limits_w.values() for pl in pls}
    return 2 * len(workload.batch_sizes) * len(limits)


def jit_power_limit_w(workload: Workload, batch_size: int, eta: float) -> int:
    """The limit the JIT profiler picks at ``batch_size`` from the trace (throughput
    ``1 / time_per_epoch``: samples per epoch cancel)."""
    epochs = {pl: workload.epochs[(batch_size, pl)] for pl in workload.power_limits_w[batch_size]}
    measured = {
        float(pl): PowerLimitMeasurement(pl, 1.0 / e.time_s, e.avg_power_w)
        for pl, e in epochs.items()
    }
    return int(best_power_limit_w(measured, eta, workload.max_power_w))


def _run(
    workload: Workload,
    batch_size: int,
    power_limit_w: int,
    eta: float,
    rng: np.random.Generator,
    *,
    cost_limit: float | None,
    profile_share: float,
) -> tuple[float, float, float, bool, int]:
    """Replay one run: ``(energy_j, time_s, cost, reached, epochs)``."""
    paths = workload.paths[batch_size]
    target = paths[int(rng.integers(len(paths)))]
    epoch = workload.epochs[(batch_size, power_limit_w)]
    e_first, t_first = epoch.energy_j, epoch.time_s
    if profile_share > 0:
        limits = workload.power_limits_w[batch_size]
        e_prof = sum(workload.epochs[(batch_size, pl)].energy_j for pl in limits) / len(limits)
        t_prof = sum(workload.epochs[(batch_size, pl)].time_s for pl in limits) / len(limits)
        e_first = profile_share * e_prof + (1 - profile_share) * e_first
        t_first = profile_share * t_prof + (1 - profile_share) * t_first
    c_first = zeus_cost(e_first, t_first, eta, workload.max_power_w)
    c_epoch = workload.epoch_cost(batch_size, power_limit_w, eta)
    budget = workload.spec.max_epochs
    if cost_limit is not None:
        # Stop before the first epoch that would cross the limit; the first always runs
        # (a run cannot tell what it costs before it starts, and may reach the target in it).
        budget = min(budget, 1 + max(0, int((cost_limit - c_first) // c_epoch)))
    epochs = target if target is not None and target <= budget else budget
    energy = e_first + epoch.energy_j * (epochs - 1)
    time_s = t_first + epoch.time_s * (epochs - 1)
    cost = zeus_cost(energy, time_s, eta, workload.max_power_w)
    return energy, time_s, cost, target is not None and target <= budget, epochs


def _totals(runs: list[RunRecord], recurrences: int) -> PolicyRun:
    totals = np.zeros((3, recurrences))
    for r in runs:
        totals[:, r.recurrence] += (r.energy_j, r.time_s, r.cost)
    energy_j, time_s, cost = np.cumsum(totals, axis=1)
    return PolicyRun(tuple(runs), energy_j, time_s, cost)


def replay_optimizer(
    workload: Workload,
    recurrences: int,
    *,
    eta: float,
    beta: float,
    rng: np.random.Generator,
    profile_share: float = 1.0,
    policy: BatchSizePolicy | None = None,
) -> PolicyRun:
    """The batch-size optimizer (or another ``policy``, handed the whole history each run)
    with the JIT power-limit profiler.

    Raises:
        InfeasibleError: if a recurrence needs more than 50 runs to reach the target.
    """
    if policy is None:
        policy = BatchSizeOptimizer(workload.batch_sizes, workload.default_batch_size, beta=beta)
    history: list[Observation] = []
    decide: Callable[[], Decision] = functools.partial(policy.decide, history, rng)
    record: Callable[[Observation], None] = history.append
    # The optimizer's own decide (not a subclass's) keeps one tally of the history: each
    # run's decision re-read every run before it, O(N^2) over N recurrences.
    if isinstance(policy, BatchSizeOptimizer) and type(policy).decide is BatchSizeOptimizer.decide:
        tally = policy.tally()
        decide, record = functools.partial(policy.decide_from, tally, rng), tally.add
    profiled: dict[int, int] = {}
    runs: list[RunRecord] = []
    for rec in range(recurrences):
        for tries in range(_MAX_TRIES):
            decision = decide()
            bs = decision.batch_size
            # as the optimizer does, for any policy
            cost_limit = decision.cost_limit if tries < UNSTOPPED_AFTER else None
            first = bs not in profiled
            pl = profiled[bs] if not first else jit_power_limit_w(workload, bs, eta)
            energy, time_s, cost, reached, epochs = _run(
                workload,
                bs,
                pl,
                eta,
                rng,
                cost_limit=cost_limit,
                profile_share=profile_share if first else 0.0,
            )
            profiled[bs] = pl  # the profile survives a failed run
            record(Observation(bs, pl, energy, time_s, cost, reached, epochs))
            runs.append(RunRecord(rec, bs, pl, energy, time_s, cost, reached, decision.phase))
            if reached:
                break
        else:
            raise InfeasibleError(
                f"{workload.key} on {workload.gpu}: recurrence {rec} did not reach the target "
                f"in {_MAX_TRIES} runs"
            )
    return _totals(runs, recurrences)


def replay_fixed(
    workload: Workload,
    batch_size: int,
    power_limit_w: int,
    recurrences: int,
    *,
    eta: float,
    rng: np.random.Generator,
    phase: str,
) -> PolicyRun:
    """A fixed configuration, re-run within a recurrence until it reaches the target.

    Raises:
        InfeasibleError: if the configuration never converges.
    """
    if not any(e is not None for e in workload.paths[batch_size]):
        raise InfeasibleError(
            f"{workload.key} on {workload.gpu}: batch size {batch_size} never reaches the target"
        )
    runs: list[RunRecord] = []
    for rec in range(recurrences):
        while True:
            energy, time_s, cost, reached, _ = _run(
                workload, batch_size, power_limit_w, eta, rng, cost_limit=None, profile_share=0.0
            )
            runs.append(
                RunRecord(rec, batch_size, power_limit_w, energy, time_s, cost, reached, phase)
            )
            if reached:
                break
    return _totals(runs, recurrences)


@dataclass(frozen=True)
class WorkloadSummary:
    """Every policy over every seed for one workload: ``runs`` maps a policy to one
    :class:`PolicyRun` per seed; the configs are (batch size, power limit)."""

    workload: str
    recurrences: int
    runs: dict[str, tuple[PolicyRun, ...]]
    oracle_config: tuple[int, int]
    default_config: tuple[int, int]

    def final(self, policy: str, metric: str) -> np.ndarray:
        """Cumulative ``metric`` (``energy_j``, ``time_s``, ``cost``) after N, one per seed."""
        return np.array([getattr(r, f"cum_{metric}")[-1] for r in self.runs[policy]])

    def regret(self) -> np.ndarray:
        """Per recurrence, mean over seeds of (optimizer − oracle) / oracle cumulative cost."""
        opt = np.stack([r.cum_cost for r in self.runs["optimizer"]])
        ora = np.stack([r.cum_cost for r in self.runs["oracle"]])
        return np.asarray(((opt - ora) / ora).mean(axis=0))


def replay_workload(
    workload: Workload,
    *,
    recurrences: int | None = None,
    seeds: Sequence[int] = tuple(range(10)),
    eta: float = 0.5,
    beta: float = 2.0,
    profile_share: float = 1.0,
) -> WorkloadSummary:
    """Run the three policies for every seed (seed ``s`` feeds every policy; the default
    and the oracle sample the same training paths, so one configuration gives one figure).
    O(len(seeds) · N · (runs per recurrence) · batch sizes²).

    Raises:
        ConfigError: bad ``recurrences``/``seeds``/``profile_share``, no converging size,
            or ``b0`` never reaches the target (the default is not defined).
        InfeasibleError: a recurrence of the optimizer needs more than 50 runs
            (:func:`replay_optimizer`).
    """
    n = default_recurrences(workload) if recurrences is None else recurrences
    if n < 1 or not seeds:
        raise ConfigError(f"recurrences must be >= 1 and seeds non-empty (got {n}, {seeds})")
    if not 0.0 <= profile_share <= 1.0:
        raise ConfigError(f"profile_share must be in [0, 1], got {profile_share}")
    oracle = workload.oracle(eta)
    b0 = workload.default_batch_size
    if not any(e is not None for e in workload.paths[b0]):
        raise ConfigError(
            f"{workload.key} on {workload.gpu}: the default batch size {b0} never reaches the "
            f"target {workload.spec.target_metric:g} in the trace, so there is no default to "
            "compare with; define the job (`jobs`) with a `default_batch_size` that converges"
        )
    default = (b0, workload.max_power_limit_w(b0))
    runs: dict[str, list[PolicyRun]] = {p: [] for p in POLICIES}
    for seed in seeds:
        rng = np.random.default_rng([seed, 0])
        optimizer = replay_optimizer(
            workload, n, eta=eta, beta=beta, rng=rng, profile_share=profile_share
        )
        runs["optimizer"].append(optimizer)
        for name, (bs, pl) in (("default", default), ("oracle", oracle)):
            rng = np.random.default_rng([seed, 1])  # one draw of paths: a config, one figure
            runs[name].append(replay_fixed(workload, bs, pl, n, eta=eta, rng=rng, phase=name))
    return WorkloadSummary(workload.key, n, {p: tuple(v) for p, v in runs.items()}, oracle, default)


def workload_json(summary: WorkloadSummary) -> dict[str, Any]:
    """Per policy the mean and ``*_std`` over seeds of the cumulative totals, its config, and
    for the optimizer the mean ``regret`` after each recurrence (fractions)."""
    out: dict[str, Any] = {"recurrences": summary.recurrences, "seeds": len(summary.runs["oracle"])}
    for policy in POLICIES:
        block: dict[str, Any] = {}
        for m in ("energy_j", "time_s", "cost"):
            values = summary.final(policy, m)
            block[m] = float(values.mean())
            block[f"{m}_std"] = float(values.std())
        out[policy] = block
    out["default"]["config"] = list(summary.default_config)
    out["oracle"]["config"] = list(summary.oracle_config)
    out["optimizer"]["regret"] = [round(float(r), 6) for r in summary.regret()]
    return out


def summary_json(gpu: str, summaries: Sequence[WorkloadSummary]) -> dict[str, Any]:
    """The CLI's ``--json`` document."""
    return {"gpu": gpu, "workloads": {s.workload: workload_json(s) for s in summaries}}
