from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perseus.dag import build_dag, evaluate_durations
from perseus.errors import ScheduleError
from perseus.schedule import (
    SCHEDULE_NAMES,
    Action,
    Kind,
    action_dependencies,
    build_schedule,
    builders,
    gpipe,
    interleaved_1f1b,
    one_f_one_b,
    zero_bubble_h1,
)


def _durations(graph, f_s, b_s, w_s=1.0):
    return np.select([graph.kind == 0, graph.kind == 1], [f_s, b_s], w_s).astype(float)


@settings(max_examples=40, deadline=None)
@given(
    stages=st.integers(1, 8),
    microbatches=st.integers(1, 16),
    t_f=st.floats(0.01, 2.0),
    t_b=st.floats(0.01, 4.0),
)
def test_1f1b_uniform_makespan_closed_form(stages, microbatches, t_f, t_b):
    graph = build_dag(one_f_one_b(stages, microbatches))
    t = _durations(graph, t_f, t_b)
    ev = evaluate_durations(graph, t, t, blocking_power_w=0.0)
    assert ev.time_s == pytest.approx((microbatches + stages - 1) * (t_f + t_b), rel=1e-12)


def test_gpipe_makespan_hand_computed_with_imbalanced_stages():
    # Stage 0: F=1, B=2; stage 1: F=2, B=3; three microbatches (worked out by hand: 18).
    graph = build_dag(gpipe(2, 3))
    t = np.where(
        graph.stage == 0, np.where(graph.kind == 0, 1.0, 2.0), np.where(graph.kind == 0, 2.0, 3.0)
    )
    assert evaluate_durations(graph, t, t, blocking_power_w=0.0).time_s == pytest.approx(18.0)


def test_interleaved_makespan_hand_computed():
    # 2 ranks x 2 virtual stages, 2 microbatches, unit ops: finishes at step 10 (by hand).
    graph = build_dag(interleaved_1f1b(4, 2, 2))
    ones = np.ones(graph.num_nodes)
    assert evaluate_durations(graph, ones, ones, blocking_power_w=0.0).time_s == pytest.approx(10.0)
    assert graph.schedule.stage_to_rank == (0, 1, 0, 1)


def test_interleaved_beats_1f1b_bubble():
    # Same 4 stages of unit work on 2 ranks: interleaving shortens the bubble vs 2 fat stages.
    inter = build_dag(interleaved_1f1b(4, 8, 2))
    plain = build_dag(one_f_one_b(2, 8))
    t_inter = evaluate_durations(
        inter, np.ones(inter.num_nodes), np.ones(inter.num_nodes), blocking_power_w=0
    ).time_s
    t_plain = evaluate_durations(
        plain, 2 * np.ones(plain.num_nodes), np.ones(plain.num_nodes), blocking_power_w=0
    ).time_s
    assert t_inter < t_plain


def test_zero_bubble_fills_bubbles_and_has_weight_ops():
    sched = zero_bubble_h1(4, 8)
    assert sched.has_weight_actions
    graph = build_dag(sched)
    ones = np.ones(graph.num_nodes)
    zb = evaluate_durations(graph, ones, ones, blocking_power_w=0.0).time_s
    # 1F1B with the unsplit backward (B = 2 units) takes (M + S - 1) * 3 = 33 units.
    assert zb < 33
    # In-flight activations never exceed 1F1B's S - r on rank r.
    for r, acts in enumerate(sched.rank_actions):
        inflight = peak = 0
        for a in acts:
            inflight += {Kind.F: 1, Kind.B: 0, Kind.W: -1}[a.kind]
            peak = max(peak, inflight)
        assert peak <= 4 - r


def _zero_bubble_reference(S, M):
    """ZB-H1's greedy as documented, every rank asked at every step (O(A·R))."""
    end, free = {}, [0.0] * S
    started = {kind: [0] * S for kind in Kind}
    acts = [[] for _ in range(S)]

    def choose(r):
        nf, nb, nw = (started[kind][r] for kind in (Kind.F, Kind.B, Kind.W))
        best = None
        for kind, m, allowed in (
            (Kind.B, nb, nb < nf),
            (Kind.F, nf, nf < M and nf - nw < S - r),
            (Kind.W, nw, nw < nb),
        ):
            deps = action_dependencies(Action(r, kind, m), S)
            if allowed and all(d in end for d in deps):
                start = max([free[r], *(end[d] for d in deps)])
                if best is None or start < best[0]:
                    best = (start, Action(r, kind, m))
        return best

    for _ in range(3 * S * M):
        start, r, action = min(
            ((c[0], r, c[1]) for r in range(S) if (c := choose(r)) is not None),
            key=lambda o: (o[0], o[1]),
        )
        acts[r].append(action)
        end[action] = free[r] = start + 1.0
        started[action.kind][r] += 1
    return tuple(tuple(ra) for ra in acts)


@pytest.mark.parametrize(
    ("stages", "microbatches"), [(1, 1), (1, 5), (2, 1), (3, 7), (5, 2), (8, 8), (13, 30), (33, 4)]
)
def test_zero_bubble_matches_the_greedy_asking_every_rank(stages, microbatches):
    got = zero_bubble_h1(stages, microbatches).rank_actions
    assert got == _zero_bubble_reference(stages, microbatches)


def test_zero_bubble_asks_only_the_ranks_next_to_the_one_that_ran(monkeypatch):
    # Asking every rank at every step made ZB-H1 O(A·R): 88 s at 1024 stages x 4 microbatches,
    # hours at the 4096-stage limit. Now each step asks 3 ranks, <= 3 candidates each.
    calls = 0

    def counted(action, num_stages):
        nonlocal calls
        calls += 1
        return action_dependencies(action, num_stages)

    monkeypatch.setattr(builders, "action_dependencies", counted)
    S, M = 64, 2
    zero_bubble_h1(S, M)
    assert calls <= 3 * S + 9 * (3 * S * M)


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_every_builder_covers_every_action_once(name):
    v = 2 if name == "interleaved" else 1
    sched = build_schedule(name, 4, 8, virtual_stages=v)
    acts = [a for ra in sched.rank_actions for a in ra]
    kinds = 3 if name == "zb" else 2
    assert len(acts) == len(set(acts)) == 4 * 8 * kinds


def test_1f1b_warmup_counts():
    sched = one_f_one_b(4, 8)
    for r, acts in enumerate(sched.rank_actions):
        first_b = next(i for i, a in enumerate(acts) if a.kind is Kind.B)
        assert first_b == 4 - r  # S - r - 1 warm-up forwards, then one more F before the first B


def test_stage_ops_names():
    assert one_f_one_b(2, 2).stage_ops()[0] == ("F0", "F1", "B0", "B1")
    assert interleaved_1f1b(4, 2, 2).stage_ops()[0][:3] == ("F0@0", "F1@0", "F0@2")


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("nope", 4, 8, 1), "unknown schedule"),
        (("1f1b", 0, 8, 1), "stages"),
        (("1f1b", 4, 0, 1), "microbatches"),
        (("1f1b", 4, 8, 2), "only applies"),
        (("interleaved", 5, 8, 2), "multiple of `virtual_stages`"),
        (("interleaved", 4, 5, 2), "rounds"),
    ],
)
def test_bad_sizes(args, match):
    with pytest.raises(ScheduleError, match=match):
        name, stages, microbatches, virtual_stages = args
        build_schedule(name, stages, microbatches, virtual_stages=virtual_stages)
