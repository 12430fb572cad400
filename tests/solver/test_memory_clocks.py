"""The solver over (SM, memory) clock pairs and phase switches: exact figures, the LP limit,
switches only where they pay, and no change at all on the bundled one-memory-clock profiles."""

from __future__ import annotations

import pytest

from perseus.device.power_model import with_memory_clocks
from perseus.device.presets import A40_MEMORY
from perseus.io import load_profile
from perseus.job import make_job
from perseus.plan import points_sha256
from perseus.runtime.emulation import take_stages
from perseus.solver import trace, trace_frontier
from perseus.solver.lp_bound import lp_energy_floor_j

POWER = {"a100": 83.64, "a40": 70.38}

# points_sha256 of the bundled frontiers (1F1B, 8 stages, 12 microbatches) as computed before
# clock pairs and phases existed (commit 1dabf08); pairs must not move a single figure. The
# a100 two-clock one moved when the one-clock plans began to seed every two-clock trace (so that
# no two-clock point is worse than one clock per op; tests/solver/test_phase_seeds.py).
BEFORE = {
    ("a100", None): "298724d3b7cc2788b404e1e927e95b6f19b1be97acc2fcdfaa8a52650492aaa1",
    ("a100", 12): "ce17c2abbe52ac11bb1791b30c987cbeb7dc325af6445342c243f410eb8073d7",
    ("a40", None): "2e46936fd01507b9b1acdab00e51ea70b28655b90e4c072276058fcd73400347",
    ("a40", 12): "8cdc24908201374a49f0c75601c8ba255dba9dde518b88df6300795322edf389",
}


@pytest.mark.slow
@pytest.mark.parametrize(("name", "layers"), sorted(BEFORE, key=str))
def test_bundled_frontiers_are_unchanged(name, layers):
    job = make_job(
        load_profile(name), "1f1b", 8, 12, blocking_power_w=POWER[name], layers_per_stage=layers
    )
    assert points_sha256(trace_frontier(job).points) == BEFORE[(name, layers)]


def _no_slowdown(job, clocks=2):
    frontier = trace(job, max_clocks_per_op=clocks).frontier
    base = frontier.baseline
    plan = frontier.cheapest_within(base.time_s)
    assert plan.time_s <= base.time_s * (1 + 1e-12)
    ev = job.evaluate(job.flat(plan))
    assert (ev.time_s, ev.energy_j) == (plan.time_s, plan.energy_j)  # exact figures
    return plan, 100 * (1 - plan.energy_j / base.energy_j), base


@pytest.fixture(scope="module")
def a40_pairs():
    return with_memory_clocks(load_profile("a40"), A40_MEMORY)


def test_pairs_save_more_than_sm_clocks_and_stay_near_the_lp_limit(a40_pairs):
    pairs = take_stages(a40_pairs, 4)
    sm_job = make_job(
        take_stages(load_profile("a40"), 4),
        "1f1b",
        4,
        6,
        blocking_power_w=70.38,
        layers_per_stage=6,
    )
    pair_job = make_job(pairs, "1f1b", 4, 6, blocking_power_w=70.38, layers_per_stage=6)
    _, sm_saving, base = _no_slowdown(sm_job)
    plan, pair_saving, pair_base = _no_slowdown(pair_job)
    assert (pair_base.time_s, pair_base.energy_j) == (base.time_s, base.energy_j)  # same all-max
    assert plan.memory_clocks_mhz  # it does lower the memory clock somewhere
    assert pair_saving > sm_saving + 0.1
    floor = lp_energy_floor_j(pair_job, base.time_s)
    limit = 100 * (1 - floor / base.energy_j)
    assert floor <= plan.energy_j * (1 + 1e-9)
    assert limit - pair_saving < 0.1
    # the LP over pairs is below the LP over SM clocks only
    assert floor < lp_energy_floor_j(sm_job, base.time_s)


def test_switches_are_made_only_where_they_pay():
    profile = load_profile("a100")
    free = make_job(
        profile, "1f1b", 8, 8, blocking_power_w=83.64, layers_per_stage=12, switch_latency_s=0.0
    )
    costly = make_job(
        profile,
        "1f1b",
        8,
        8,
        blocking_power_w=83.64,
        layers_per_stage=12,
        switch_latency_s=0.005,
        switch_stall_s=0.005,
    )
    free_plan, free_saving, _ = _no_slowdown(free)
    costly_plan, costly_saving, _ = _no_slowdown(costly)
    assert free_plan.num_switches > 0
    assert costly_plan.num_switches < free_plan.num_switches
    assert costly_saving <= free_saving + 1e-9
    # never worse than one clock per op: a switch is taken only where it pays
    _, one_clock, _ = _no_slowdown(costly, clocks=1)
    assert costly_saving >= one_clock - 1e-9


def test_up_to_three_phases_per_op_are_exact_and_near_the_limit(a40_pairs):
    job = make_job(
        take_stages(a40_pairs, 4), "1f1b", 4, 6, blocking_power_w=70.38, layers_per_stage=6
    )
    plan, saving, base = _no_slowdown(job, clocks=3)
    ops = [op for rank in plan.freqs_mhz for op in rank]
    assert any(not isinstance(op, int) and len(op) == 3 and isinstance(op[0], tuple) for op in ops)
    limit = 100 * (1 - lp_energy_floor_j(job, base.time_s) / base.energy_j)
    assert limit - saving < 0.1


def test_costly_switches_never_lose_to_one_clock_per_op(a40_pairs):
    # On this job rounding alone took switches that did not pay (12.67 % against 12.69 % with
    # one clock per op); the one-clock plans seed the phased trace.
    job = make_job(
        a40_pairs,
        "1f1b",
        8,
        12,
        blocking_power_w=70.38,
        layers_per_stage=12,
        switch_stall_s=0.005,
    )
    _, phased, _ = _no_slowdown(job, clocks=2)
    _, one_clock, _ = _no_slowdown(job, clocks=1)
    assert phased >= one_clock - 1e-9
