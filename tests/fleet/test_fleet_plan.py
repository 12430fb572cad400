"""The fleet planner: one plan per job under one power budget, against an exact MILP."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import LinearConstraint, milp
from scipy.sparse import csr_array

from perseus.cli.main import main
from perseus.errors import ConfigError, InfeasibleError
from perseus.fleet.jobs import read_fleet_jobs
from perseus.plan import Frontier
from perseus.solver.fleet import FleetJob, fleet_job, plan_fleet

Frontiers = dict[str, tuple[Path, Frontier]]


def _jobs_file(frontiers: Frontiers, folder: Path, n: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    names = sorted(frontiers)
    entries = []
    for k in range(n):
        path, frontier = frontiers[names[k % len(names)]]
        entries.append(
            {
                "name": f"job{k:04d}",
                "frontier": path.name if path.parent == folder else str(path),
                "weight": rng.choice([0.5, 1.0, 2.0, 5.0]),
                "gpus": frontier.job.ranks * rng.choice([1, 2, 4]),
            }
        )
    out = folder / f"jobs{n}.json"
    out.write_text(json.dumps(entries))
    return out


def _exact(jobs: list[FleetJob], budget_w: float) -> float:
    """An exact MILP (HiGHS), independent of the planner: identical jobs are one integer
    variable per plan counting how many of them run it (the same optimum, no symmetry)."""
    kinds = Counter((j.time_s, j.average_power_w, j.weight) for j in jobs)
    cost, power, rows, cols = [], [], [], []
    for row, (times, watts, weight) in enumerate(kinds):
        for t, w in zip(times, watts, strict=True):
            rows.append(row)
            cols.append(len(cost))
            cost.append(weight * (t / min(times) - 1))
            power.append(w / budget_w)
    n = len(cost)
    res = milp(
        np.asarray(cost),
        constraints=[
            LinearConstraint(
                csr_array((np.ones(n), (rows, cols)), shape=(len(kinds), n)),
                list(kinds.values()),
                list(kinds.values()),
            ),
            LinearConstraint(np.asarray(power)[None, :], -np.inf, 1.0),
        ],
        integrality=np.ones(n),
        bounds=(0, np.inf),
        options={"mip_rel_gap": 1e-6},
    )
    assert res.status == 0, res.message
    return float(res.fun)


def test_thousand_jobs_fit_every_budget_within_a_tenth_of_a_percent_of_exact(
    fleet_frontiers: Frontiers, tmp_path: Path
) -> None:
    jobs = read_fleet_jobs(_jobs_file(fleet_frontiers, tmp_path, 1000))
    assert len(jobs) == 1000
    all_max_w = sum(j.average_power_w[0] for j in jobs)
    # every job at its minimum-energy plan
    min_energy_w = sum(
        min(zip(j.time_s, j.average_power_w, strict=True), key=lambda tp: tp[0] * tp[1])[1]
        for j in jobs
    )
    assert min_energy_w < all_max_w
    for f in (1.0, 0.999, 0.99, 0.95, 0.8, 0.5, 0.2, 0.0):
        budget_w = min_energy_w + f * (all_max_w - min_energy_w)
        plan = plan_fleet(jobs, budget_w)
        total_w = sum(a.average_power_w for a in plan.jobs)
        assert total_w <= budget_w * (1 + 1e-12)
        assert plan.total_average_power_w == pytest.approx(total_w, rel=1e-12)
        exact = _exact(jobs, budget_w)
        # HiGHS meets the budget to 1e-7 of it: its optimum may sit a hair below the bound
        assert plan.lp_bound <= exact * (1 + 1e-5) + 1e-9
        assert plan.weighted_slowdown <= exact * 1.001 + 1e-12, (f, plan, exact)
        # the greedy is a real step down the same road, never better than the answer
        greedy = plan_fleet(jobs, budget_w, method="greedy")
        assert greedy.weighted_slowdown >= plan.weighted_slowdown - 1e-12
        assert greedy.total_average_power_w <= budget_w * (1 + 1e-12)


def test_dynamic_program_beats_the_rounded_greedy() -> None:
    """Two jobs must save 10 W: the greedy takes the cheapest-per-watt segment whole (60 W
    for 6), the optimum saves exactly enough elsewhere (10 W for 2)."""
    a = FleetJob("a", 1.0, (0, 1), (1.0, 1.05), (100.0, 40.0), (100.0, 40.0))
    b = FleetJob("b", 1.0, (0, 1), (1.0, 1.02), (100.0, 90.0), (100.0, 90.0))
    plan = plan_fleet([a, b], 190.0)
    assert [x.point for x in plan.jobs] == [0, 1]
    assert plan.weighted_slowdown == pytest.approx(0.02)
    greedy = plan_fleet([a, b], 190.0, method="greedy")
    assert greedy.weighted_slowdown == pytest.approx(0.05)
    assert plan.lp_bound <= plan.weighted_slowdown


def test_dynamic_program_keeps_a_byte_per_state_per_job() -> None:
    """Many identical jobs all enter the dynamic program (their moves tie at the break
    segment's price). Its trace-back record was two int64 arrays of ``grid + 1`` states per
    job (2 GB at 15,000 jobs of the 1 MB jobs file); now one small-integer array per job."""
    import tracemalloc

    time_s = tuple(1.0 + 0.01 * i for i in range(20))
    power_w = tuple(500.0 - 9.0 * i for i in range(20))
    jobs = [
        FleetJob(f"j{k}", 1.0 + k % 3, tuple(range(20)), time_s, power_w, power_w)
        for k in range(300)
    ]
    budget_w = sum(power_w[0] for _ in jobs) - 0.37 * sum(power_w[0] - power_w[-1] for _ in jobs)
    tracemalloc.start()
    try:
        plan = plan_fleet(jobs, budget_w)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert plan.total_average_power_w <= budget_w * (1 + 1e-12)
    assert plan.weighted_slowdown < plan_fleet(jobs, budget_w, method="greedy").weighted_slowdown
    grid = 9000
    assert peak < 4 * len(jobs) * grid, peak  # 16 bytes a state a job before


def test_cli_json_and_per_gpu_cap(fleet_frontiers: Frontiers, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    jobs_path = _jobs_file(fleet_frontiers, tmp_path, 12)
    jobs = read_fleet_jobs(jobs_path)
    budget_w = 0.9 * sum(j.average_power_w[0] for j in jobs)
    assert main(["fleet", "plan", str(jobs_path), "--budget-w", str(budget_w), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"jobs", "total_average_power_w", "weighted_slowdown"}
    assert [set(j) for j in doc["jobs"]] == [
        {"name", "point", "time_s", "average_power_w", "peak_power_w"}
    ] * 12
    assert doc["total_average_power_w"] <= budget_w
    entries = json.loads(jobs_path.read_text())
    for entry, out in zip(entries, doc["jobs"], strict=True):
        _, frontier = next(
            v for v in fleet_frontiers.values() if v[0].name == Path(entry["frontier"]).name
        )
        point = frontier.points[out["point"]]
        replicas = entry["gpus"] // frontier.job.ranks
        assert out["time_s"] == point.time_s
        assert out["average_power_w"] == pytest.approx(replicas * point.avg_power_w)
        assert point.power is not None
        assert out["peak_power_w"] == pytest.approx(replicas * point.power.peak_power_w)
    # a per-GPU cap leaves out the plans above it
    cap_w = max(
        min(p.avg_power_w for p in f.points) / f.job.ranks for _, f in fleet_frontiers.values()
    )
    assert any(f.fastest.avg_power_w > cap_w * f.job.ranks for _, f in fleet_frontiers.values())
    assert main(
        ["fleet", "plan", str(jobs_path), "--budget-w", "1e9", "--per-gpu-cap-w", str(cap_w),
         "--json"]
    ) == 0  # fmt: skip
    capped = json.loads(capsys.readouterr().out)
    for entry, out in zip(entries, capped["jobs"], strict=True):
        _, frontier = next(
            v for v in fleet_frontiers.values() if v[0].name == Path(entry["frontier"]).name
        )
        assert frontier.points[out["point"]].avg_power_w <= cap_w * frontier.job.ranks + 1e-9
    assert capped["weighted_slowdown"] > 0


def test_no_assignment_fits_is_one_line_naming_the_least_power(
    fleet_frontiers: Frontiers, tmp_path: Path, capsys
) -> None:  # type: ignore[no-untyped-def]
    jobs_path = _jobs_file(fleet_frontiers, tmp_path, 5)
    least_w = sum(min(j.average_power_w) for j in read_fleet_jobs(jobs_path))
    assert main(["fleet", "plan", str(jobs_path), "--budget-w", str(least_w * 0.99)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"{least_w:.6g} W" in err
    with pytest.raises(InfeasibleError, match="least power that fits"):
        plan_fleet(read_fleet_jobs(jobs_path), least_w * 0.99)
    plan = plan_fleet(read_fleet_jobs(jobs_path), least_w)  # exactly the least: fits
    assert plan.total_average_power_w <= least_w * (1 + 1e-12)


def test_bad_jobs_files_name_the_entry(fleet_frontiers: Frontiers, tmp_path: Path) -> None:
    path, frontier = next(iter(fleet_frontiers.values()))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"name": "x", "frontier": str(path), "gpus": 3}]))
    with pytest.raises(ConfigError, match="not a positive multiple"):
        read_fleet_jobs(bad)
    bad.write_text(json.dumps([{"name": "x", "frontier": str(path), "weight": -1}]))
    with pytest.raises(ConfigError, match=r"entry 0\.weight"):
        read_fleet_jobs(bad)
    bad.write_text(json.dumps([{"name": "x", "frontier": str(path)}] * 2))
    with pytest.raises(ConfigError, match="appears twice"):
        read_fleet_jobs(bad)
    bad.write_text(json.dumps([{"name": "x", "frontier": "a\u0000.json"}]))
    with pytest.raises(ConfigError, match=r"bad.json: entry 0\.frontier: .*NUL"):
        read_fleet_jobs(bad)
    assert main(["fleet", "plan", str(bad), "--budget-w", "100"]) == 2
    with pytest.raises(ConfigError, match="budget_w"):
        plan_fleet([fleet_job("x", frontier)], float("nan"))


def test_each_frontier_is_read_once_and_kept_only_until_its_last_job(
    fleet_frontiers: Frontiers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every frontier of the jobs file stayed in memory until the last job was made, so the
    peak was their sum (a parsed frontier takes ~2.2x its file: a hundred jobs with their
    own 20 MB frontiers held ~4 GB; 20 of 0.16 MB: 10.2 MB peak, 3.3 MB now); now only
    those a later job names."""
    import gc
    import weakref

    from perseus.fleet import jobs as jobs_module

    shapes = sorted(fleet_frontiers)
    order = [0, 0, 1, 2, 1, 3]
    path = tmp_path / "jobs.json"
    entries = [
        {"name": f"j{k}", "frontier": str(fleet_frontiers[shapes[s]][0])}
        for k, s in enumerate(order)
    ]
    path.write_text(json.dumps(entries))
    read = jobs_module.read_frontier
    made: list[weakref.ref[Frontier]] = []
    alive: list[int] = []

    def counted(p: Path) -> Frontier:
        gc.collect()
        alive.append(sum(r() is not None for r in made))
        frontier = read(p)
        made.append(weakref.ref(frontier))
        return frontier

    monkeypatch.setattr(jobs_module, "read_frontier", counted)
    jobs = read_fleet_jobs(path)
    assert len(made) == 4  # each frontier once
    assert max(alive) <= 1, alive  # the one a later job names (or the last one made)
    assert jobs == [fleet_job(f"j{k}", fleet_frontiers[shapes[s]][1]) for k, s in enumerate(order)]


class _CountedTimes(tuple[float, ...]):
    """A job's times that count the passes over them."""

    passes = 0

    def __iter__(self) -> Iterator[float]:
        _CountedTimes.passes += 1
        return super().__iter__()


def test_costs_find_each_jobs_fastest_time_once() -> None:
    """Without ``fastest_time_s`` a job's slowdowns are against its fastest choice: that
    minimum was taken again for every choice (P^2 for P points: 10^10 steps for a frontier of
    100,000 points)."""
    n = 400
    time_s = _CountedTimes(1.0 + 0.001 * i for i in range(n))
    power_w = tuple(500.0 - i for i in range(n))
    jobs = [FleetJob("a", 1.0, tuple(range(n)), time_s, power_w, power_w)]
    _CountedTimes.passes = 0
    plan = plan_fleet(jobs, 300.0)
    assert plan.jobs[0].average_power_w <= 300.0
    assert plan.jobs[0].slowdown == pytest.approx(time_s[plan.jobs[0].point] / 1.0 - 1.0)
    assert _CountedTimes.passes <= 4, _CountedTimes.passes  # n + 1 before


class _CountedName(str):
    """A job name that counts its ``==`` comparisons."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        _CountedName.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_repeated_names_are_found_without_comparing_every_pair() -> None:
    """Each name was counted over the whole list (K^2 comparisons: 6.7 s at 18,000 jobs
    before the error)."""
    one = ((0,), (1.0,), (100.0,), (100.0,))
    names = [_CountedName(f"job{k}") for k in range(300)] + [_CountedName("job7")]
    jobs = [FleetJob(name, 1.0, *one) for name in names]
    _CountedName.compared = 0
    with pytest.raises(ConfigError, match=r"job names must be unique; repeated: job7$"):
        plan_fleet(jobs, 1e9)
    assert _CountedName.compared < 10 * len(names), _CountedName.compared  # 90,000 before
