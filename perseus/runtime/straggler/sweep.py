"""What-if at scale: job-level energy saving when one of N pipelines straggles (no processes).

For ``N`` pipelines of ``R`` ranks planned with one frontier (blocking power ``P_b``), one
slowed by ``s``: the straggler runs its fastest plan (Perseus) or all-max (baseline) ``s``
times longer at unchanged power, so ``T′ = s·T_min``; the job's time is
``T_job = max(T′, slowest other plan)`` (all-max everywhere: ``s·T_allmax``), and each of the
``N − 1`` others uses its plan's energy plus ``R·P_b·(T_job − t_plan)`` waiting. Perseus runs
the cheapest plan within T′ capped at T* (:meth:`~perseus.plan.Frontier.cheapest_within`).
"vs all-max" compares with all-max everywhere (the Perseus paper's Table 4 quantity), "vs
fastest" with the fastest frontier plan everywhere (the straggler adaptation alone).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from perseus.errors import ConfigError
from perseus.plan import Frontier
from perseus.runtime.straggler.policy import _Table
from perseus.validate import show_value

__all__ = ["MAX_FACTOR", "StragglerCase", "parse_factors", "straggler_sweep"]


@dataclass(frozen=True, slots=True)
class StragglerCase:
    """The job-level figures for one slowdown factor.

    Attributes:
        factor: Straggler slowdown ``s`` (1.0 = no straggler).
        straggler_time_s: ``T′ = s·T_min``.
        job_time_s: The job's iteration time.
        plan_index: The plan the non-stragglers run (into ``frontier.points``), with its
            ``plan_time_s`` and ``plan_energy_j`` (per pipeline, before waiting).
        allmax_energy_j: Job energy per iteration, every pipeline at all-max.
        fastest_energy_j: Job energy per iteration, every pipeline at the fastest plan.
        perseus_energy_j: Job energy per iteration with Perseus's straggler policy.
        saving_vs_allmax: ``1 − perseus / allmax``.
        saving_vs_fastest: ``1 − perseus / fastest``.
    """

    factor: float
    straggler_time_s: float
    job_time_s: float
    plan_index: int
    plan_time_s: float
    plan_energy_j: float
    allmax_energy_j: float
    fastest_energy_j: float
    perseus_energy_j: float
    saving_vs_allmax: float
    saving_vs_fastest: float

    def cells(self) -> tuple[str, ...]:
        """Slowdown, T′, the others' plan time, and both savings: one table row's text."""
        return (
            f"{self.factor:.2f}",
            f"{self.straggler_time_s:.3f}",
            f"{self.plan_time_s:.3f}",
            f"{100 * self.saving_vs_allmax:.1f} %",
            f"{100 * self.saving_vs_fastest:.1f} %",
        )


def _check(pipelines: int, factors: list[float]) -> None:
    if pipelines < 2:
        raise ConfigError(
            f"`pipelines` must be at least 2 (one straggler and others), got {pipelines}"
        )
    if not factors:
        raise ConfigError(
            "no slowdown factors given; pass at least one in `factors` (e.g. 1.05 to 1.5)"
        )
    for f in factors:
        if not (math.isfinite(f) and 1.0 <= f <= MAX_FACTOR):
            raise ConfigError(f"slowdown factor must be a number in [1, {MAX_FACTOR:g}], got {f}")


def straggler_sweep(
    frontier: Frontier, *, pipelines: int, factors: Iterable[float]
) -> tuple[StragglerCase, ...]:
    """Job-level energy with and without Perseus for each slowdown factor ``s`` of the one
    straggler among ``pipelines`` (``N``), one case per factor in the given order;
    ``frontier``'s job gives ``R`` and ``P_b``. O(K + F·log K) for F factors and K points.

    Raises:
        ConfigError: if ``pipelines < 2``, no factor is given or one is outside
            [1, MAX_FACTOR].
    """
    factor_list = [float(f) for f in factors]
    _check(pipelines, factor_list)
    ranks = frontier.job.ranks
    power_w = frontier.job.blocking_power_w
    fastest = frontier.fastest
    allmax = frontier.baseline
    others = pipelines - 1
    table = _Table(frontier)
    cases = []
    for s in factor_list:
        t_prime = s * fastest.time_s
        index = table.choose(t_prime)  # Frontier.cheapest_within's point (s >= 1: feasible)
        plan = frontier.points[index]
        job_time = max(t_prime, plan.time_s)

        def job(energy_j: float, time_s: float, straggler_j: float, end_s: float) -> float:
            # each job waits for its own straggler: all-max's ends at s·T_allmax, not T′
            return others * (energy_j + ranks * power_w * (end_s - time_s)) + straggler_j

        allmax_total = job(allmax.energy_j, allmax.time_s, s * allmax.energy_j, s * allmax.time_s)
        fastest_total = job(fastest.energy_j, fastest.time_s, s * fastest.energy_j, t_prime)
        perseus_total = job(plan.energy_j, plan.time_s, s * fastest.energy_j, job_time)
        case = StragglerCase(
            factor=s,
            straggler_time_s=t_prime,
            job_time_s=job_time,
            plan_index=index,
            plan_time_s=plan.time_s,
            plan_energy_j=plan.energy_j,
            allmax_energy_j=allmax_total,
            fastest_energy_j=fastest_total,
            perseus_energy_j=perseus_total,
            saving_vs_allmax=1 - perseus_total / allmax_total,
            saving_vs_fastest=1 - perseus_total / fastest_total,
        )
        cases.append(case)
    return tuple(cases)


#: Largest slowdown factor accepted (a pipeline 1000x slower is a hang, not a straggler).
MAX_FACTOR = 1000.0
_MAX_FACTORS = 10_000


def parse_factors(text: str, name: str = "factors") -> tuple[float, ...]:
    """``"1.05:1.5:0.05"`` (start:stop:step, stop included) or ``"1.1,1.2,1.5"`` -> factors,
    each in [1, 1000], at most 10,000.

    Raises:
        ConfigError: naming the parameter ``name``, the bad part and the accepted forms.
    """
    hint = "use start:stop:step (e.g. 1.05:1.5:0.05) or a comma list (e.g. 1.1,1.2)"

    def bad(why: str, fix: str = f"; {hint}") -> ConfigError:
        return ConfigError(f"`{name}` {show_value(text)}: {why}{fix}")

    if len(text) > 100_000:
        raise bad("too long")
    pieces = text.split(":") if ":" in text else [p for p in text.split(",") if p.strip()]
    if not pieces:
        raise bad("no factors")
    try:
        numbers = [float(p) for p in pieces]
    except ValueError:
        raise bad("not numbers") from None
    if not all(math.isfinite(n) for n in numbers):
        raise bad("factors must be finite numbers")
    factors = _stepped(numbers, bad) if ":" in text else tuple(numbers)
    if len(factors) > _MAX_FACTORS:
        raise bad(f"{len(factors)} factors is too many (at most {_MAX_FACTORS:,})", "")
    for f in factors:
        if not 1.0 <= f <= MAX_FACTOR:
            raise bad(f"factor {f!r} is outside [1, {MAX_FACTOR:g}] (1 = no straggler)", "")
    return factors


def _stepped(numbers: list[float], bad: Callable[[str], ConfigError]) -> tuple[float, ...]:
    """``start, stop, step`` -> the factors from start to stop included."""
    if len(numbers) != 3:
        raise bad("need exactly three parts")
    start, stop, step = numbers
    if not (step > 0 and stop >= start):
        raise bad("need step > 0 and stop >= start")
    count = math.floor((stop - start) / step + 1e-9) + 1
    if count > _MAX_FACTORS:
        raise bad(f"{count:.3g} factors is too many (at most {_MAX_FACTORS:,})")
    return tuple(round(start + i * step, 10) for i in range(count))
