"""A session's boundary hooks (:data:`~perseus.runtime.session_types.BoundaryHook`); the rules
they follow: :meth:`~perseus.runtime.session.RankSession.add_boundary_hook`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from perseus.plan import Frontier
from perseus.runtime.planning import check_frontier
from perseus.runtime.session_types import BoundaryHook
from perseus.runtime.summary import IterationStats
from perseus.schedule.actions import Schedule

__all__ = ["BoundaryHooks"]

_log = logging.getLogger("perseus.runtime.session")


class _SessionCounter:
    """A session's ``next_iteration`` as handed to a hook (replaced when it joins another)."""

    __slots__ = ("read",)

    def __init__(self, read: Callable[[], int]) -> None:
        self.read = read

    def __call__(self) -> int:
        return self.read()


class BoundaryHooks:
    """The hooks in the order attached (a hook may add or remove one as it runs).
    ``next_iteration``: the session's next iteration to start, handed to each hook added with
    a ``next_iteration`` of None or another session's (a straggler or power runtime acknowledges
    at the iteration before it: on a real GPU the stats are one iteration older than the
    boundary)."""

    def __init__(
        self, schedule: Schedule, rank: int, next_iteration: Callable[[], int] | None = None
    ) -> None:
        self.hooks: list[BoundaryHook] = []
        self._schedule, self._rank = schedule, rank
        self._next_iteration = next_iteration
        self._ops_checked: Frontier | None = None  # the last frontier whose stage ops matched

    def add(self, hook: BoundaryHook) -> None:
        # None, or another session's (a hook kept across a restart): this session's from now on
        current = getattr(hook, "next_iteration", 0)
        if self._next_iteration is not None and (
            current is None or isinstance(current, _SessionCounter)
        ):
            hook.next_iteration = _SessionCounter(self._next_iteration)  # type: ignore[attr-defined]
        self.hooks.append(hook)

    def remove(self, hook: BoundaryHook) -> None:
        if hook in self.hooks:
            self.hooks.remove(hook)

    def check(self, frontier: Frontier, point_index: int) -> None:
        """:func:`check_frontier`, the stage ops compared once per frontier: a hook may return
        its frontier every iteration (1F1B 64 x 1024: 131,072 actions, 19 ms each time)."""
        ops_checked = frontier is self._ops_checked
        check_frontier(self._schedule, frontier, point_index, ops_checked=ops_checked)
        self._ops_checked = frontier

    def decide(
        self, stats: IterationStats, power: Any, profiling: bool
    ) -> tuple[Frontier, int] | None:
        """Ask every hook, ``power`` first: the last plan returned, checked (None: none, and
        none is taken while ``profiling``: the sweep sets the clocks it measures)."""
        hooks = tuple(self.hooks)
        if power in hooks:  # the others' plans go on it
            hooks = (power, *(hook for hook in hooks if hook is not power))
        chosen = None
        for hook in hooks:
            decision = hook(stats)
            if decision is None:
                continue
            if profiling:
                _log.debug(
                    "rank %d: a boundary hook's plan is not deployed while profiling", self._rank
                )
                continue
            self.check(*decision)
            chosen = decision
        return chosen

    def within_cap(self, plan: tuple[Frontier, int], power: Any) -> tuple[Frontier, int]:
        """``plan`` within the power hook's cap while that hook is attached."""
        return power.within_cap(*plan) if power in self.hooks else plan

    def follow(self, frontier: Frontier) -> None:
        """Hand a plan the session made from its own (re-)profile to each hook with a
        ``follow_frontier`` method."""
        for hook in tuple(self.hooks):
            follow = getattr(hook, "follow_frontier", None)
            if follow is not None:
                follow(frontier)
