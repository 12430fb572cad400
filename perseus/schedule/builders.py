"""Builders for the common pipeline schedules, returning validated :class:`Schedule` values.

Sizes follow torch: ``stages`` counts model stages, ``virtual_stages`` is stages per rank (1
except for interleaved), and stage ``s`` runs on rank ``s % ranks`` (torch's looped placement).
``gpipe`` runs all forwards, then all backwards; ``1f1b`` is PipeDream-flush; ``interleaved``
equals torch's ``ScheduleInterleaved1F1B``; ``zb`` is ZB-H1 (Qi et al., "Zero Bubble Pipeline
Parallelism"), whose split backward's ``W`` fills the bubbles 1F1B leaves.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable

from perseus.errors import ScheduleError
from perseus.schedule.actions import Action, Kind, Schedule
from perseus.schedule.dependencies import action_dependencies
from perseus.schedule.validate import validate_schedule

__all__ = [
    "SCHEDULE_NAMES",
    "build_schedule",
    "gpipe",
    "interleaved_1f1b",
    "one_f_one_b",
    "schedule_from_actions",
    "zero_bubble_h1",
]


def _check_sizes(stages: int, microbatches: int) -> None:
    if stages < 1:
        raise ScheduleError(f"`stages` must be >= 1, got {stages}")
    if microbatches < 1:
        raise ScheduleError(f"`microbatches` must be >= 1, got {microbatches}")


def _looped(stages: int, ranks: int) -> tuple[int, ...]:
    return tuple(s % ranks for s in range(stages))


def schedule_from_actions(
    name: str,
    rank_actions: list[list[Action]] | tuple[tuple[Action, ...], ...],
    num_stages: int,
    num_microbatches: int,
    stage_to_rank: tuple[int, ...] | None = None,
) -> Schedule:
    """Wrap explicit per-rank action lists (e.g. from another engine) and validate them;
    ``stage_to_rank`` defaults to the rank on which each stage's actions appear.

    Raises:
        ScheduleError: if the actions are incomplete, misplaced or deadlock.
    """
    acts = tuple(tuple(ra) for ra in rank_actions)
    if stage_to_rank is None:
        placement: dict[int, int] = {}
        for rank, ra in enumerate(acts):
            for a in ra:
                placement.setdefault(a.stage_index, rank)
        missing = [s for s in range(num_stages) if s not in placement]
        if missing:
            raise ScheduleError(f"no rank runs stage(s) {missing}")
        stage_to_rank = tuple(placement[s] for s in range(num_stages))
    schedule = Schedule(name, num_stages, num_microbatches, stage_to_rank, acts)
    validate_schedule(schedule)
    return schedule


def gpipe(stages: int, microbatches: int) -> Schedule:
    """GPipe: every rank runs all forwards, then all backwards, in microbatch order."""
    _check_sizes(stages, microbatches)
    acts = [
        [Action(r, Kind.F, m) for m in range(microbatches)]
        + [Action(r, Kind.B, m) for m in range(microbatches)]
        for r in range(stages)
    ]
    return schedule_from_actions("gpipe", acts, stages, microbatches, _looped(stages, stages))


def one_f_one_b(stages: int, microbatches: int) -> Schedule:
    """1F1B (PipeDream-flush): warm-up forwards, steady one-forward-one-backward, cool-down."""
    _check_sizes(stages, microbatches)
    acts = []
    for r in range(stages):
        warmup = min(stages - r - 1, microbatches)
        ra = [Action(r, Kind.F, m) for m in range(warmup)]
        for i in range(microbatches - warmup):
            ra += [Action(r, Kind.F, warmup + i), Action(r, Kind.B, i)]
        ra += [Action(r, Kind.B, m) for m in range(microbatches - warmup, microbatches)]
        acts.append(ra)
    return schedule_from_actions("1f1b", acts, stages, microbatches, _looped(stages, stages))


def interleaved_1f1b(stages: int, microbatches: int, virtual_stages: int) -> Schedule:
    """Interleaved 1F1B with ``virtual_stages`` stages per rank, in torch's order: rounds of
    ``per_round`` microbatches, ``(V-1)·per_round + 2·(R-1-r)`` warm-up forwards on rank ``r``.

    Raises:
        ScheduleError: if ``stages`` is not a multiple of ``virtual_stages`` or the microbatches
            do not split into whole rounds (torch's rule: ``M % max(1, M // ranks) == 0``).
    """
    _check_sizes(stages, microbatches)
    if virtual_stages < 1 or stages % virtual_stages:
        raise ScheduleError(
            f"`stages` ({stages}) must be a multiple of `virtual_stages` ({virtual_stages})"
        )
    ranks, v = stages // virtual_stages, virtual_stages
    rounds = max(1, microbatches // ranks)
    if microbatches % rounds:
        raise ScheduleError(
            f"interleaved 1F1B needs `microbatches` ({microbatches}) to be a multiple of the "
            f"number of rounds ({rounds} = microbatches // ranks); try a multiple of {ranks}"
        )
    per_round = microbatches // rounds
    total = v * microbatches
    acts = []
    for r in range(ranks):
        warmup = min((v - 1) * per_round + 2 * (ranks - 1 - r), total)
        # (step, kind): warm-up forwards, then a forward and a backward per step, cool-down
        steps = [(t, Kind.F) for t in range(warmup)]
        for t in range(warmup, total):
            steps += [(t, Kind.F), (t, Kind.B)]
        steps += [(t, Kind.B) for t in range(total, total + warmup)]
        taken: Counter[tuple[int, Kind]] = Counter()
        ra = []
        for t, kind in steps:
            chunk = (t // per_round) % v
            if kind is Kind.B:
                chunk = v - 1 - ((t - warmup) // per_round) % v
            stage = chunk * ranks + r
            ra.append(Action(stage, kind, taken[stage, kind]))
            taken[stage, kind] += 1
        acts.append(ra)
    return schedule_from_actions("interleaved", acts, stages, microbatches, _looped(stages, ranks))


def zero_bubble_h1(stages: int, microbatches: int) -> Schedule:
    """ZB-H1: 1F1B memory, backward split into ``B`` and ``W``, ``W`` filling bubbles.

    A deterministic greedy list scheduler with unit durations (the ZB paper's T_F = T_B = T_W)
    runs, whenever a rank is free, a ready ``B`` first, then an ``F`` if fewer than ``S - r``
    microbatches are in flight, then a pending ``W``.

    Complexity: O(A log A) for A actions (a heap of the ranks' choices; see ``choice``).
    """
    _check_sizes(stages, microbatches)
    S, M = stages, microbatches
    started = {kind: [0] * S for kind in Kind}  # per kind, actions each rank has started
    # per kind and rank, the end times of its actions by microbatch (a rank starts each kind's
    # microbatches in order, so ``ends[kind][r][m]`` exists once that action has run)
    ends: dict[Kind, list[list[float]]] = {kind: [[] for _ in range(S)] for kind in Kind}
    free = [0.0] * S
    acts: list[list[Action]] = [[] for _ in range(S)]

    def dep_end(action: Action) -> float | None:
        """When the action ``action`` waits for ended; ``None`` while one has not run (the one
        rule, :func:`action_dependencies`)."""
        start = free[action.stage_index]
        for d in action_dependencies(action, S):
            done = ends[d.kind][d.stage_index]
            if d.microbatch_index >= len(done):
                return None
            start = max(start, done[d.microbatch_index])
        return start

    def choose(r: int) -> tuple[float, Action] | None:
        """The earliest ready action of rank ``r`` (ties: B, then F, then W)."""
        nf, nb, nw = (started[kind][r] for kind in (Kind.F, Kind.B, Kind.W))
        wanted = (
            (Kind.B, nb, nb < nf),
            (Kind.F, nf, nf < M and nf - nw < S - r),
            (Kind.W, nw, nw < nb),
        )
        best: tuple[float, Action] | None = None
        for kind, m, allowed in wanted:
            if allowed:
                action = Action(r, kind, m)
                start = dep_end(action)
                if start is not None and (best is None or start < best[0]):
                    best = (start, action)
        return best

    # choice[r]: rank r's current choice; the heap holds it, and stale entries, by (start, r).
    # choose(r) reads rank r's counts and clock and the finished actions of ranks r-1, r and r+1
    # (F waits on the previous stage, B on the next, W and the last stage's B on their own), so
    # running an action of rank r changes only those three choices.
    choice: list[tuple[float, Action] | None] = [choose(r) for r in range(S)]
    heap = [(c[0], r) for r, c in enumerate(choice) if c is not None]
    heapq.heapify(heap)
    for _ in range(3 * S * M):
        while heap and ((c := choice[heap[0][1]]) is None or c[0] != heap[0][0]):
            heapq.heappop(heap)  # stale: that rank has chosen again since
        if not heap:  # cannot happen for S - r >= 1; kept as a clear error, not a hang
            raise ScheduleError(f"zero-bubble construction stalled at S={S}, M={M}")
        start, r = heapq.heappop(heap)
        chosen = choice[r]
        assert chosen is not None  # the loop above dropped entries of ranks without a choice
        action = chosen[1]
        acts[r].append(action)
        free[r] = start + 1.0
        ends[action.kind][r].append(free[r])
        started[action.kind][r] += 1
        for q in range(max(0, r - 1), min(S, r + 2)):
            c = choice[q] = choose(q)
            if c is not None:
                heapq.heappush(heap, (c[0], q))
    return schedule_from_actions("zb", acts, S, M, _looped(S, S))


SCHEDULE_NAMES = ("gpipe", "1f1b", "interleaved", "zb")

_BUILDERS: dict[str, Callable[[int, int, int], Schedule]] = {
    "gpipe": lambda s, m, v: gpipe(s, m),
    "1f1b": lambda s, m, v: one_f_one_b(s, m),
    "interleaved": interleaved_1f1b,
    "zb": lambda s, m, v: zero_bubble_h1(s, m),
}


def build_schedule(
    name: str, stages: int, microbatches: int, *, virtual_stages: int = 1
) -> Schedule:
    """Build the named schedule (one of :data:`SCHEDULE_NAMES`).

    Raises:
        ScheduleError: for an unknown name, bad sizes, or ``virtual_stages`` on another one.
    """
    if not isinstance(name, str):
        raise ScheduleError(f"`schedule` must be a name (a string), got type {type(name).__name__}")
    if name not in _BUILDERS:
        raise ScheduleError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULE_NAMES)}")
    if name != "interleaved" and virtual_stages != 1:
        raise ScheduleError(
            f"`virtual_stages`={virtual_stages} only applies to the interleaved schedule"
        )
    return _BUILDERS[name](stages, microbatches, virtual_stages)
