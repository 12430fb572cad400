"""Wrap a pipeline stage's compute calls so perseus sees every action as it runs.

The wrappers are set on the stage *instances*, never on torch's classes. torch waits for a
receive before calling ``forward_one_chunk``, so the wrapped window is pure compute.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from perseus.errors import ConfigError
from perseus.runtime.engines.base import OpContextFactory
from perseus.schedule.actions import Action, Kind

__all__ = ["STAGE_COMPUTE_METHODS", "instrument_stages"]

#: Stage methods the runtime calls once per compute action, with the kind each one performs.
#: ``backward_one_chunk`` is a full backward, or the input-gradient half when called with
#: ``full_backward=False``; both are perseus's ``B``.
STAGE_COMPUTE_METHODS: dict[str, Kind] = {
    "forward_one_chunk": Kind.F,
    "backward_one_chunk": Kind.B,
    "backward_weight_one_chunk": Kind.W,
}


def _wrap(
    method: Callable[..., Any],
    stage: Any,
    kind: Kind,
    factory: OpContextFactory,
    split_full_backward: bool = False,
) -> Callable[..., Any]:
    @functools.wraps(method)
    def wrapper(chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        # A backward on a stage without backward (eval) is a no-op in torch: do not time it.
        if kind is not Kind.F and not getattr(stage, "has_backward", True):
            return method(chunk_id, *args, **kwargs)
        with factory(Action(int(stage.stage_index), kind, int(chunk_id))):
            result = method(chunk_id, *args, **kwargs)
        if split_full_backward and kind is Kind.B and kwargs.get("full_backward", True):
            # A full backward planned split (DualPipeV): its W op follows at once.
            with factory(Action(int(stage.stage_index), Kind.W, int(chunk_id))):
                pass
        return result

    wrapper.perseus_op = kind  # type: ignore[attr-defined]  # instrumented (one session a stage)
    return wrapper


def instrument_stages(
    stages: Sequence[Any], factory: OpContextFactory, *, split_full_backward: bool = False
) -> Callable[[], None]:
    """Run every compute call of this rank's ``stages`` inside ``factory(action)``; return a
    function that restores the original methods (idempotent). ``split_full_backward``: follow
    each full backward with its ``W`` action (a mixed schedule planned split).

    Raises:
        ConfigError: a stage another open session instruments."""
    for stage in stages:  # a second session's undo would drop the first's wrappers too
        if any(hasattr(vars(stage).get(name), "perseus_op") for name in STAGE_COMPUTE_METHODS):
            raise ConfigError(
                f"pipeline stage {stage.stage_index} is already instrumented by another open "
                "perseus session; close that session first (one session per pipeline)"
            )
    originals: list[tuple[Any, str]] = []
    for stage in stages:
        for name, kind in STAGE_COMPUTE_METHODS.items():
            method = getattr(stage, name)
            setattr(stage, name, _wrap(method, stage, kind, factory, split_full_backward))
            originals.append((stage, name))

    def restore() -> None:
        while originals:
            stage, name = originals.pop()
            # The wrapper is an instance attribute; deleting it re-exposes the class method.
            if name in vars(stage):
                delattr(stage, name)

    return restore
