"""Data dependencies between the actions of one training iteration.

These are the edges a pipeline imposes regardless of how ranks order their work:

* ``F(s, m)`` needs ``F(s-1, m)`` (activations flow forward);
* ``B(s, m)`` needs ``B(s+1, m)`` (gradients flow backward), and the last stage's
  ``B(S-1, m)`` needs ``F(S-1, m)`` (the loss);
* ``W(s, m)`` needs ``B(s, m)`` (weight gradients use the input gradients' saved state).

Both the schedule validator and the DAG builder use this one definition.
"""

from __future__ import annotations

from perseus.schedule.actions import Action, Kind

__all__ = ["action_dependencies"]


def action_dependencies(action: Action, num_stages: int) -> tuple[Action, ...]:
    """The actions that must finish before ``action`` may start (data edges only)."""
    s, m = action.stage_index, action.microbatch_index
    if action.kind is Kind.F:
        return (Action(s - 1, Kind.F, m),) if s > 0 else ()
    if action.kind is Kind.B:
        if s == num_stages - 1:
            return (Action(s, Kind.F, m),)
        return (Action(s + 1, Kind.B, m),)
    return (Action(s, Kind.B, m),)
