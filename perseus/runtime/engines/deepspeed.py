"""Adapter for DeepSpeed's ``PipelineEngine`` (no fork, no edit of DeepSpeed's files).

The only module that touches DeepSpeed names that are not documented API, checked once by
:func:`check_deepspeed_version`. Each stage runs its forwards and its backwards in microbatch
order, so its ``k``-th ``ForwardPass`` is microbatch ``k``; stage ``s`` is rank ``s``. The
hooks live on the engine *instance*, never its class.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from perseus.errors import ConfigError, ScheduleError
from perseus.runtime.engines.base import (
    OpContextFactory,
    attach_hooks,
    check_engine_version,
    refuse_eval,
)
from perseus.schedule.actions import Action, Kind, Schedule
from perseus.schedule.builders import schedule_from_actions

__all__ = [
    "MIN_DEEPSPEED_VERSION",
    "TESTED_VERSIONS",
    "DeepSpeedEngine",
    "check_deepspeed_version",
    "deepspeed_schedule",
    "instrument_deepspeed",
    "skip_cpu_shm_op",
]

#: Oldest deepspeed whose pipeline engine internals this adapter was written against.
MIN_DEEPSPEED_VERSION = (0, 19)
#: The versions the ``deepspeed`` extra allows (tested: 0.19.8).
TESTED_VERSIONS = ">=0.19,<0.20"

_SCHEDULE_NAMES = ("TrainSchedule.steps", "InferenceSchedule", "ForwardPass", "BackwardPass")
_ENGINE_NAMES = (
    "_INSTRUCTION_MAP",
    "_exec_forward_pass",
    "_exec_backward_pass",
    "_exec_schedule",
    "train_batch",
    "gradient_accumulation_steps",
)


def check_deepspeed_version() -> types.SimpleNamespace:
    """Import DeepSpeed's pipeline modules (``version``, ``schedule`` and ``engine_class`` of
    the result), checking every name this adapter uses.

    Raises:
        ConfigError: deepspeed is missing, older than :data:`MIN_DEEPSPEED_VERSION`, or lacks
            a name.
    """
    schedule, engine_mod = check_engine_version(
        "deepspeed",
        MIN_DEEPSPEED_VERSION,
        f"DS_BUILD_OPS=0 pip install 'perseus-energy[deepspeed]'  # deepspeed{TESTED_VERSIONS}",
        ("deepspeed.runtime.pipe.schedule", "deepspeed.runtime.pipe.engine"),
        [(0, n) for n in _SCHEDULE_NAMES] + [(1, f"PipelineEngine.{n}") for n in _ENGINE_NAMES],
        TESTED_VERSIONS,
    )
    import deepspeed

    version = str(getattr(deepspeed, "__version__", "0.0"))
    engine_class = engine_mod.PipelineEngine
    imap = engine_class._INSTRUCTION_MAP
    handlers = {
        schedule.ForwardPass: engine_class._exec_forward_pass,
        schedule.BackwardPass: engine_class._exec_backward_pass,
    }
    missing = [
        f"PipelineEngine._INSTRUCTION_MAP[{cls.__name__}] -> {fn.__name__}"
        for cls, fn in handlers.items()
        if imap.get(cls) is not fn
    ]
    if missing:
        raise ConfigError(
            f"deepspeed {version} lacks {', '.join(missing)}, which perseus's adapter needs; "
            f"use deepspeed{TESTED_VERSIONS} or report the new version"
        )
    return types.SimpleNamespace(version=version, schedule=schedule, engine_class=engine_class)


def deepspeed_schedule(num_stages: int, num_microbatches: int) -> Schedule:
    """The compute actions of DeepSpeed's ``TrainSchedule``: ``deepspeed-1f1b``.

    Args:
        num_stages: Pipeline stages (= ranks).
        num_microbatches: Microbatches per batch (DeepSpeed's gradient accumulation steps).

    Raises:
        ScheduleError: for non-positive sizes.

    Complexity: O(S · (M + S)).
    """
    ds = check_deepspeed_version()
    if num_stages < 1 or num_microbatches < 1:
        raise ScheduleError(
            f"stages and microbatches must be >= 1, got {num_stages} and {num_microbatches}"
        )
    fwd_cls, bwd_cls = ds.schedule.ForwardPass, ds.schedule.BackwardPass
    rank_actions = []
    for s in range(num_stages):
        sched = ds.schedule.TrainSchedule(
            micro_batches=num_microbatches, stages=num_stages, stage_id=s
        )
        counts = {Kind.F: 0, Kind.B: 0}
        acts = []
        for step in sched.steps():
            for cmd in step:
                kind = Kind.F if type(cmd) is fwd_cls else Kind.B if type(cmd) is bwd_cls else None
                if kind is not None:
                    acts.append(Action(s, kind, counts[kind]))
                    counts[kind] += 1
        rank_actions.append(acts)
    stage_to_rank = tuple(range(num_stages))
    return schedule_from_actions(
        "deepspeed-1f1b", rank_actions, num_stages, num_microbatches, stage_to_rank
    )


def _checked(engine: Any, who: str) -> types.SimpleNamespace:
    ds = check_deepspeed_version()
    if not isinstance(engine, ds.engine_class):
        raise ConfigError(f"{who} needs a deepspeed PipelineEngine, got {type(engine).__name__}")
    return ds


@contextmanager
def instrument_deepspeed(
    engine: Any,
    factory: OpContextFactory,
    in_iteration: Callable[[], bool] = lambda: False,
    *,
    record: bool = True,
) -> Iterator[list[Action]]:
    """Run every forward/backward pass of a ``PipelineEngine``'s training batches in ``factory``.

    ``engine`` is the ``PipelineEngine`` returned by ``deepspeed.initialize``; an evaluation
    batch while ``in_iteration()`` is refused before it communicates.

    Yields:
        The actions run so far, appended as they run (none kept when not ``record``).

    Raises:
        ConfigError: if ``engine`` is not a ``PipelineEngine`` or is already instrumented; from
            ``engine.eval_batch()`` inside a training iteration.
    """
    ds = _checked(engine, "instrument_deepspeed")
    if "_INSTRUCTION_MAP" in vars(engine):
        raise ConfigError("this PipelineEngine is already instrumented")
    cls_map = type(engine)._INSTRUCTION_MAP
    sched_mod = ds.schedule
    stage = int(engine.stage_id)
    state = {"training": False, Kind.F: 0, Kind.B: 0}
    seen: list[Action] = []

    def wrap(handler: Any, kind: Kind) -> Any:
        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not state["training"]:
                return handler(self, *args, **kwargs)
            action = Action(stage, kind, state[kind])
            state[kind] += 1
            if record:
                seen.append(action)
            with factory(action):
                return handler(self, *args, **kwargs)

        return run

    original_exec = engine._exec_schedule

    def exec_schedule(pipe_schedule: Any) -> Any:
        training = isinstance(pipe_schedule, sched_mod.TrainSchedule)
        if not training:
            refuse_eval(in_iteration, "engine.eval_batch()")
        state.update({"training": training, Kind.F: 0, Kind.B: 0})
        try:
            return original_exec(pipe_schedule)
        finally:
            state["training"] = False

    instance_map = dict(cls_map)
    instance_map[sched_mod.ForwardPass] = wrap(cls_map[sched_mod.ForwardPass], Kind.F)
    instance_map[sched_mod.BackwardPass] = wrap(cls_map[sched_mod.BackwardPass], Kind.B)
    engine._INSTRUCTION_MAP = instance_map
    engine._exec_schedule = exec_schedule  # an instance attribute: called unbound
    try:
        yield seen
    finally:
        for name in ("_INSTRUCTION_MAP", "_exec_schedule"):
            if name in vars(engine):
                delattr(engine, name)


class DeepSpeedEngine:
    """The engine adapter for DeepSpeed's ``PipelineEngine`` (see :mod:`.base`).

    ``group``: the pipeline's process group (default: the default group).

    Raises:
        ConfigError: if ``engine`` is not a ``PipelineEngine``.
    """

    step_call = "engine.train_batch()"
    schedule: Schedule
    group: Any

    def __init__(self, engine: Any, group: Any = None) -> None:
        _checked(engine, "DeepSpeedEngine")
        self.engine = engine
        self.schedule = deepspeed_schedule(
            int(engine.num_stages), int(engine.gradient_accumulation_steps())
        )
        self.group = group

    @property
    def rank(self) -> int:
        """The engine's ``stage_id``."""
        return int(self.engine.stage_id)

    def attach(self, op: OpContextFactory, in_iteration: Callable[[], bool]) -> Callable[[], None]:
        """Install :func:`instrument_deepspeed` until the returned undo is called."""
        # Nothing kept per op: the session keeps its own (bounded) records.
        return attach_hooks(instrument_deepspeed(self.engine, op, in_iteration, record=False))


def skip_cpu_shm_op() -> None:
    """Emulation on CPU only: keep ``deepspeed.init_distributed`` (call this before it) from
    building its shared-memory allreduce op, which gloo does not need, by marking it
    incompatible in ``deepspeed.ops.__compatible_ops__``."""
    check_deepspeed_version()
    import deepspeed.ops

    vars(deepspeed.ops).setdefault("__compatible_ops__", {})["deepspeed_shm_comm"] = False
