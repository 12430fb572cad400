"""Schedule validation; errors print the rank × step grid with the bad cells marked (as
torch's ``_format_pipeline_order`` does)."""

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
    """Check that every stage runs ``F`` and ``B`` (and ``W`` if any rank does) once per
    microbatch, on the rank holding the stage, and that running each rank's list in order,
    respecting :func:`perseus.schedule.action_dependencies`, cannot deadlock.

    Raises:
        ScheduleError: naming the problem, with the rank × step grid and the bad cells marked.

    Complexity: O(A) for A actions: the deadlock check runs each rank until it waits, and
    wakes it when the action it waits for runs.
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
        return ScheduleError(message, format_grid(acts, marked, window=_WINDOW_STEPS))

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
    acts, num_stages = schedule.rank_actions, schedule.num_stages
    done: set[Action] = set()
    pos = [0] * len(acts)
    waiting: dict[Action, list[int]] = {}  # an action not yet run: the ranks it blocks
    ready = list(range(len(acts)))
    while ready:  # run a rank as far as it can; the action it waits for wakes it again
        rank = ready.pop()
        rank_acts = acts[rank]
        while pos[rank] < len(rank_acts):
            a = rank_acts[pos[rank]]
            deps = action_dependencies(a, num_stages)
            missing = next((d for d in deps if d not in done), None)
            if missing is not None:
                waiting.setdefault(missing, []).append(rank)
                break
            done.add(a)
            pos[rank] += 1
            ready.extend(waiting.pop(a, ()))
    stuck = [(r, pos[r]) for r in range(len(acts)) if pos[r] < len(acts[r])]
    if stuck:
        waits = ", ".join(
            f"rank {r} waits at {acts[r][i]} for "
            + "/".join(str(d) for d in action_dependencies(acts[r][i], num_stages) if d not in done)
            for r, i in stuck
        )
        raise fail(f"schedule deadlocks: {waits}", stuck)
