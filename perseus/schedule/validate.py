"""Schedule validation with torch-style rank × step grids in the error message.

A schedule is valid when every stage runs ``F`` and ``B`` (and, if any rank runs ``W``, also
``W``) exactly once per microbatch, on the rank that holds the stage, and the ranks' orders
cannot deadlock: executing each rank's list in order, respecting the data dependencies of
:mod:`perseus.schedule.dependencies`, finishes every action. Errors print the grid with the
offending cells marked, as torch's ``_format_pipeline_order`` does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from itertools import product

from perseus.errors import ScheduleError
from perseus.schedule.actions import Action, Kind, Schedule, format_grid
from perseus.schedule.dependencies import action_dependencies

__all__ = ["validate_schedule"]

#: Steps shown either side of the marked cells in an error's grid (long schedules).
_WINDOW_STEPS = 4


def validate_schedule(schedule: Schedule) -> None:
    """Check completeness, placement and deadlock freedom of ``schedule``.

    Raises:
        ScheduleError: naming the problem, with the rank × step grid and the bad cells marked.

    Complexity: O(A) for A actions (the deadlock check advances every rank at most A times in
    total, each step O(1) amortised).
    """
    acts = schedule.rank_actions
    S, M = schedule.num_stages, schedule.num_microbatches
    if S < 1 or M < 1:
        raise ScheduleError(f"schedule needs stages >= 1 and microbatches >= 1, got {S} and {M}")
    if len(schedule.stage_to_rank) != S:
        raise ScheduleError(
            f"stage_to_rank has {len(schedule.stage_to_rank)} entries for {S} stages"
        )

    def fail(message: str, marked: Iterable[tuple[int, int]]) -> ScheduleError:
        return ScheduleError(f"{message}\n{format_grid(acts, marked, window=_WINDOW_STEPS)}")

    counts = Counter(a for rank_acts in acts for a in rank_acts)
    for rank, rank_acts in enumerate(acts):
        for step, a in enumerate(rank_acts):
            problem = _cell_problem(schedule, counts, rank, step, a)
            if problem is not None:
                raise fail(*problem)
    kinds = [Kind.F, Kind.B] + ([Kind.W] if schedule.has_weight_actions else [])
    for s, kind, m in product(range(S), kinds, range(M)):
        if Action(s, kind, m) not in counts:
            raise fail(
                f"action {Action(s, kind, m)} (stage {s} {kind.profile_name} of "
                f"microbatch {m}) is missing from rank {schedule.stage_to_rank[s]}",
                [],
            )
    _check_deadlock(schedule, fail)


def _cell_problem(
    schedule: Schedule, counts: Counter[Action], rank: int, step: int, a: Action
) -> tuple[str, list[tuple[int, int]]] | None:
    """What is wrong with action ``a`` at ``(rank, step)`` and the cells to mark, or None."""
    S, M = schedule.num_stages, schedule.num_microbatches
    here = f"action {a} at rank {rank} step {step}"
    if not (0 <= a.stage_index < S and 0 <= a.microbatch_index < M):
        return f"{here} is out of range (stages 0..{S - 1}, microbatches 0..{M - 1})", [
            (rank, step)
        ]
    owner = schedule.stage_to_rank[a.stage_index]
    if owner != rank:
        return f"{here} belongs to rank {owner} (stage {a.stage_index})", [(rank, step)]
    if counts[a] > 1:
        acts = schedule.rank_actions
        dups = [(r, i) for r, ra in enumerate(acts) for i, b in enumerate(ra) if b == a]
        return f"action {a} appears {counts[a]} times", dups
    return None


def _check_deadlock(
    schedule: Schedule, fail: Callable[[str, Iterable[tuple[int, int]]], ScheduleError]
) -> None:
    acts = schedule.rank_actions
    done: set[Action] = set()
    pos = [0] * len(acts)
    remaining = sum(len(a) for a in acts)
    while remaining:
        progressed = False
        for rank, rank_acts in enumerate(acts):
            while pos[rank] < len(rank_acts):
                a = rank_acts[pos[rank]]
                if all(d in done for d in action_dependencies(a, schedule.num_stages)):
                    done.add(a)
                    pos[rank] += 1
                    remaining -= 1
                    progressed = True
                else:
                    break
        if not progressed:
            stuck = [(r, pos[r]) for r in range(len(acts)) if pos[r] < len(acts[r])]
            waits = ", ".join(
                f"rank {r} waits at {acts[r][i]} for "
                + "/".join(
                    str(d)
                    for d in action_dependencies(acts[r][i], schedule.num_stages)
                    if d not in done
                )
                for r, i in stuck
            )
            raise fail(f"schedule deadlocks: {waits}", stuck)
