"""Data dependencies between the actions of one iteration: the one rule, used by the schedule
validator, the builders and the DAG, whatever order the ranks run their work in."""

from __future__ import annotations

from perseus.schedule.actions import Action, Kind

__all__ = ["action_dependencies"]


def action_dependencies(action: Action, num_stages: int) -> tuple[Action, ...]:
    """The actions that must finish before ``action`` may start: ``F(s, m)`` needs
    ``F(s-1, m)``; ``B(s, m)`` needs ``B(s+1, m)``, or ``F(s, m)`` on the last stage (the
    loss); ``W(s, m)`` needs ``B(s, m)``."""
    s, m = action.stage_index, action.microbatch_index
    if action.kind is Kind.F:
        return (Action(s - 1, Kind.F, m),) if s > 0 else ()
    if action.kind is Kind.B:
        if s == num_stages - 1:
            return (Action(s, Kind.F, m),)
        return (Action(s + 1, Kind.B, m),)
    return (Action(s, Kind.B, m),)
