from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perseus.dag import build_dag, evaluate_durations, evaluate_freqs, evaluate_many
from perseus.dag.evaluate import evaluations
from perseus.errors import PlanError, ScheduleError
from perseus.io import load_profile
from perseus.job import make_job
from perseus.schedule import SCHEDULE_NAMES, Kind, build_schedule

schedules = st.sampled_from(SCHEDULE_NAMES)


def _random_case(name: str, seed: int, p2p: float):
    v = 2 if name == "interleaved" else 1
    graph = build_dag(build_schedule(name, 4, 4, virtual_stages=v), p2p_latency_s=p2p)
    rng = np.random.default_rng(seed)
    return graph, rng.uniform(0.1, 2.0, graph.num_nodes), rng.uniform(5, 50, graph.num_nodes)


def _networkx_makespan(graph, time_s) -> float:
    g = nx.DiGraph()
    for e in range(len(graph.edge_src)):
        u, v = int(graph.edge_src[e]), int(graph.edge_dst[e])
        g.add_edge(("end", u), ("start", v), weight=float(graph.edge_latency_s[e]))
    for i in range(graph.num_nodes):
        g.add_edge(("start", i), ("end", i), weight=float(time_s[i]))
    return float(nx.dag_longest_path_length(g, weight="weight"))


@settings(max_examples=30, deadline=None)
@given(name=schedules, seed=st.integers(0, 10_000), p2p=st.sampled_from([0.0, 0.05]))
def test_time_equals_networkx_longest_path(name, seed, p2p):
    graph, t, e = _random_case(name, seed, p2p)
    ev = evaluate_durations(graph, t, e, blocking_power_w=80.0)
    assert ev.time_s == pytest.approx(_networkx_makespan(graph, t), rel=1e-12)


@settings(max_examples=30, deadline=None)
@given(name=schedules, seed=st.integers(0, 10_000), power=st.floats(0, 200))
def test_energy_identity_from_per_rank_idle_time(name, seed, power):
    graph, t, e = _random_case(name, seed, 0.0)
    ev = evaluate_durations(graph, t, e, blocking_power_w=power)
    idle = 0.0
    for r in range(graph.num_ranks):
        lo, hi = graph.rank_start[r], graph.rank_start[r + 1]
        starts, ends = ev.start_s[lo:hi], ev.end_s[lo:hi]
        # Ops on a rank run one at a time, in schedule order.
        assert np.all(starts[1:] >= ends[:-1] - 1e-12)
        gaps = starts[0] + np.sum(starts[1:] - ends[:-1]) + (ev.time_s - ends[-1])
        idle += gaps
    assert ev.energy_j == pytest.approx(e.sum() + power * idle, rel=1e-10)
    assert ev.blocking_energy_j == pytest.approx(power * idle, rel=1e-9, abs=1e-9)
    np.testing.assert_allclose(ev.end_s - ev.start_s, t)


def test_every_op_starts_when_its_last_predecessor_ends():
    graph, t, e = _random_case("1f1b", 7, 0.01)
    ev = evaluate_durations(graph, t, e, blocking_power_w=0.0)
    ready = np.zeros(graph.num_nodes)
    np.maximum.at(ready, graph.edge_dst, ev.end_s[graph.edge_src] + graph.edge_latency_s)
    np.testing.assert_allclose(ev.start_s, ready)


def test_evaluate_many_matches_single():
    graph, _t, _e = _random_case("zb", 3, 0.0)
    rng = np.random.default_rng(1)
    T = rng.uniform(0.1, 2.0, (5, graph.num_nodes))
    E = rng.uniform(1, 9, (5, graph.num_nodes))
    times, energies = evaluate_many(graph, T, E, 60.0)
    for k in range(5):
        ev = evaluate_durations(graph, T[k], E[k], blocking_power_w=60.0)
        assert times[k] == pytest.approx(ev.time_s)
        assert energies[k] == pytest.approx(ev.energy_j)


def test_p2p_latency_adds_per_hop():
    graph = build_dag(build_schedule("1f1b", 3, 1), p2p_latency_s=0.5)
    ones = np.ones(graph.num_nodes)
    # F0 F1 F2 B2 B1 B0 in a chain with 4 rank crossings.
    assert evaluate_durations(graph, ones, ones, blocking_power_w=0).time_s == pytest.approx(
        6 + 4 * 0.5
    )
    with pytest.raises(ScheduleError, match="latency"):
        build_dag(build_schedule("1f1b", 3, 1), p2p_latency_s=-1)


def test_unknown_clock_in_plan_is_named():
    job = make_job(load_profile("a100"), "1f1b", 8, 4, blocking_power_w=83.64)
    freqs = job.allmax()
    freqs[9] = 1234
    with pytest.raises(PlanError, match=r"1234 MHz for rank 1 op 1 .*not profiled"):
        evaluate_freqs(job.graph, job.profile, freqs, blocking_power_w=83.64)
    with pytest.raises(PlanError, match="clocks but the schedule"):
        job.evaluate(freqs[:-1])


def test_clock_arrays_and_plan_op_lists_cost_the_same():
    from perseus.dag.evaluate import op_costs

    job = make_job(load_profile("a40"), "1f1b", 8, 6, blocking_power_w=70.38)
    rng = np.random.default_rng(3)
    kinds = list(Kind)
    ops = [
        job.profile.op(s, kinds[k])
        for s, k in zip(job.graph.stage.tolist(), job.graph.kind.tolist(), strict=True)
    ]
    clocks = [[o.freq_mhz for o in op.options] for op in ops]
    plan = np.array([rng.choice(c) for c in clocks], dtype=np.int64)
    as_array, as_list = (
        op_costs(job.graph, job.profile, plan),
        op_costs(job.graph, job.profile, plan.tolist()),
    )
    assert np.array_equal(as_array[0], as_list[0]) and np.array_equal(as_array[1], as_list[1])


def test_allmax_on_real_profile_is_plausible():
    job = make_job(load_profile("a100"), "1f1b", 8, 24, blocking_power_w=83.64)
    ev = job.evaluate(job.allmax())
    # 31 forward+backward slots of roughly 0.05 + 0.095 s.
    assert 4.0 < ev.time_s < 5.5
    assert ev.blocking_energy_j > 0
    assert ev.energy_j == pytest.approx(ev.compute_energy_j + ev.blocking_energy_j)


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_generations_equal_networkx_topological_generations(name):
    v = 2 if name == "interleaved" else 1
    graph = build_dag(build_schedule(name, 4, 6, virtual_stages=v), p2p_latency_s=0.01)
    g = nx.DiGraph()
    g.add_nodes_from(range(graph.num_nodes))
    g.add_edges_from(zip(graph.edge_src.tolist(), graph.edge_dst.tolist(), strict=True))
    expected = [sorted(gen) for gen in nx.topological_generations(g)]
    assert [gen.tolist() for gen in graph.generations] == expected


def test_a_dependency_cycle_is_a_schedule_error():
    good = build_schedule("1f1b", 2, 2)
    # Rank 0 runs its first backward before the forward it depends on: a cycle.
    rank0 = good.rank_actions[0]
    first_b = next(i for i, a in enumerate(rank0) if a.kind.value == "B")
    swapped = (rank0[first_b], *rank0[:first_b], *rank0[first_b + 1 :])
    bad = type(good)(
        name="bad",
        num_stages=good.num_stages,
        num_microbatches=good.num_microbatches,
        stage_to_rank=good.stage_to_rank,
        rank_actions=(swapped, *good.rank_actions[1:]),
    )
    with pytest.raises(ScheduleError, match="dependency cycle"):
        build_dag(bad)


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_many_plans_in_one_pass_give_each_plan_its_own_figures_exactly(name) -> None:
    graph, _, _ = _random_case(name, 0, 0.05)
    rng = np.random.default_rng(1)
    times = rng.uniform(0.1, 2.0, (5, graph.num_nodes))
    energies = rng.uniform(5, 50, (5, graph.num_nodes))
    together = evaluations(graph, times, energies, blocking_power_w=80.0)
    for t, e, ev in zip(times, energies, together, strict=True):
        alone = evaluate_durations(graph, t.copy(), e.copy(), blocking_power_w=80.0)
        assert (ev.time_s, ev.energy_j, ev.blocking_energy_j) == (
            alone.time_s,
            alone.energy_j,
            alone.blocking_energy_j,
        )
        assert np.array_equal(ev.start_s, alone.start_s)
        assert np.array_equal(ev.end_s, alone.end_s)
        assert np.array_equal(ev.busy_s, alone.busy_s)
