"""Adapter between ``torch.distributed.pipelining`` schedules and perseus's schedule IR.

The only module that touches torch's private pipelining names, checked once by
:func:`check_torch_version`. Multi-stage schedules are read from ``pipeline_order_with_comms``;
single-stage ones (``GPipe``, ``1F1B``), whose ``pipeline_order`` is only a visualisation aid,
are traced on recording stand-in stages. torch's ``I`` maps to ``B``.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Sequence
from typing import Any

from perseus.errors import ConfigError, ProfileError, ScheduleError
from perseus.profile.model import Profile
from perseus.runtime.collectives import is_distributed
from perseus.runtime.engines.base import OpContextFactory, check_engine_version, refuse_eval
from perseus.runtime.engines.torch_hooks import STAGE_COMPUTE_METHODS, instrument_stages
from perseus.schedule.actions import Action, Kind, Schedule
from perseus.schedule.builders import schedule_from_actions

__all__ = [
    "MIN_TORCH_VERSION",
    "STAGE_COMPUTE_METHODS",
    "TORCH_SCHEDULE_CLASSES",
    "TorchPipelining",
    "build_torch_schedule",
    "check_profile_fits",
    "check_torch_version",
    "job_store",
    "schedule_from_torch",
    "schedule_from_torch_class",
    "stages_of",
    "torch_class_for",
]

#: Oldest torch whose pipelining internals this adapter was written against.
MIN_TORCH_VERSION = (2, 5)

#: perseus schedule name -> torch class whose executed order equals perseus's builder (``zb``
#: has none: it runs through torch's schedule-IR runtime).
TORCH_SCHEDULE_CLASSES: dict[str, str] = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved": "ScheduleInterleaved1F1B",
}

#: Every name of ``torch.distributed.pipelining.schedules`` this module touches.
_REQUIRED_SCHEDULE_NAMES = (
    "_Action",
    "_ComputationType.FORWARD",
    "_ComputationType.FULL_BACKWARD",
    "_ComputationType.BACKWARD_INPUT",
    "_ComputationType.BACKWARD_WEIGHT",
    "_ComputationType.OVERLAP_F_B",
    "_PipelineScheduleRuntime._prepare_schedule_with_comms",
    "_PipelineScheduleRuntime._step_microbatches",
    "PipelineScheduleSingle._step_microbatches",
    "PipelineScheduleMulti",
    "ScheduleGPipe",
    "Schedule1F1B",
    "ScheduleInterleaved1F1B",
    "get_schedule_class",
)


def check_torch_version() -> types.ModuleType:
    """Import ``torch.distributed.pipelining.schedules``, checking every internal used here.

    Raises:
        ConfigError: torch is missing, older than :data:`MIN_TORCH_VERSION`, or lacks a name.
    """
    (schedules,) = check_engine_version(
        "torch",
        MIN_TORCH_VERSION,
        "pip install 'perseus-energy[torch]'",
        ("torch.distributed.pipelining.schedules",),
        [(0, name) for name in _REQUIRED_SCHEDULE_NAMES],
        f">={MIN_TORCH_VERSION[0]}.{MIN_TORCH_VERSION[1]},<=2.13",
    )
    return schedules


def _convert(torch_action: Any, sched_mod: types.ModuleType) -> list[tuple[Action, bool]]:
    """Compute actions of one torch ``_Action``: ``(action, is_split_backward)`` pairs."""
    ct = sched_mod._ComputationType
    kind_of = {
        ct.FORWARD: (Kind.F, False),
        ct.FULL_BACKWARD: (Kind.B, False),
        ct.BACKWARD_INPUT: (Kind.B, True),
        ct.BACKWARD_WEIGHT: (Kind.W, True),
    }
    if torch_action is None:
        return []
    if torch_action.computation_type == ct.OVERLAP_F_B:
        return [pair for sub in torch_action.sub_actions or () for pair in _convert(sub, sched_mod)]
    if torch_action.computation_type not in kind_of:  # communication, (un)shard, reduce-grad
        return []
    kind, split = kind_of[torch_action.computation_type]
    return [(Action(torch_action.stage_index, kind, torch_action.microbatch_index), split)]


class _RecordingStage:
    """Stand-in for a ``_PipelineStageBase``: no process group, empty P2P, records compute."""

    def __init__(self, stage_index: int, num_stages: int, group_size: int, group_rank: int):
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.group_size = group_size
        self.group_rank = group_rank
        self.submod = None  # not an nn.Module: torch's torch.compile check skips it
        self.device = "cpu"
        self.is_first = stage_index == 0
        self.is_last = stage_index == num_stages - 1
        self.has_backward = False
        self.output_chunks: list[Any] = []
        self.stage_index_to_group_rank: dict[int, int] = {}
        self.recorded: list[Action] = []

    def get_fwd_recv_ops(self, *_: Any) -> list[Any]:
        return []

    get_fwd_send_ops = get_bwd_recv_ops = get_bwd_send_ops = get_fwd_recv_ops
    _get_init_p2p_neighbors_ops = get_fwd_recv_ops

    def forward_one_chunk(self, fwd_chunk_id: int, *_: Any, **__: Any) -> None:
        self.recorded.append(Action(self.stage_index, Kind.F, fwd_chunk_id))

    def backward_one_chunk(self, bwd_chunk_id: int, *_: Any, **__: Any) -> None:
        self.recorded.append(Action(self.stage_index, Kind.B, bwd_chunk_id))

    def backward_weight_one_chunk(self, bwd_chunk_id: int, **_: Any) -> None:
        self.recorded.append(Action(self.stage_index, Kind.W, bwd_chunk_id))

    def _prepare_forward_infra(self, *_: Any, **__: Any) -> None:
        return None

    clear_runtime_states = perform_reduce_grad = _prepare_forward_infra


def schedule_from_torch(
    torch_schedule: Any, name: str | None = None, *, split_full_backward: bool = False
) -> Schedule:
    """The perseus schedule that a constructed torch schedule object (any rank's) executes.

    Args:
        name: Label for the result (default: the torch class name).
        split_full_backward: Plan the full backwards of a schedule that also splits some
            (DualPipeV) as ``B`` then ``W``.

    Raises:
        ConfigError: for an unsupported torch.
        ScheduleError: if the schedule does not fit perseus's IR.
    """
    sched_mod = check_torch_version()
    cls = type(torch_schedule)
    label = name or cls.__name__
    n_mb = int(torch_schedule._n_microbatches)
    num_stages = int(torch_schedule._num_stages)
    if issubclass(cls, sched_mod.PipelineScheduleSingle):
        orders = []
        for rank in range(num_stages):  # run its hand-written loop on a stand-in stage
            stage = _RecordingStage(rank, num_stages, num_stages, rank)
            cls(stage, n_mb)._step_microbatches(None, None, None, None, return_outputs=False)
            orders.append(stage.recorded)
        return schedule_from_actions(label, orders, num_stages, n_mb)
    if not isinstance(torch_schedule, sched_mod._PipelineScheduleRuntime):
        raise ScheduleError(
            f"{cls.__name__} is neither a single-stage schedule nor a schedule-IR runtime; "
            "perseus cannot read its action order"
        )
    with_comms = torch_schedule.pipeline_order_with_comms
    converted = [
        [pair for ta in with_comms[r] for pair in _convert(ta, sched_mod)]
        for r in sorted(with_comms)
    ]
    split_kinds = {split for order in converted for a, split in order if a.kind is not Kind.F}
    mixed = len(split_kinds) > 1
    if mixed and not split_full_backward:
        raise ScheduleError(
            f"torch schedule {label} mixes full backwards (B) with split ones (I/W); perseus "
            "plans schedules whose backwards are all full or all split: pass "
            "split_full_backward=True to plan each full backward as B then W"
        )
    rank_actions: list[list[Action]] = []
    for order in converted:
        acts: list[Action] = []
        for action, split in order:
            acts.append(action)
            if mixed and action.kind is Kind.B and not split:
                acts.append(Action(action.stage_index, Kind.W, action.microbatch_index))
        rank_actions.append(acts)
    mapping = torch_schedule.stage_index_to_group_rank
    stage_to_rank = tuple(int(mapping[s]) for s in range(num_stages))
    return schedule_from_actions(label, rank_actions, num_stages, n_mb, stage_to_rank)


def torch_class_for(name_or_class: str | type) -> type:
    """A torch schedule class from a class, a torch name (``"Interleaved1F1B"``,
    ``"ScheduleZBVZeroBubble"``) or a perseus name with a torch twin (``"1f1b"``).

    Raises:
        ConfigError: for an unknown name.
    """
    sched_mod = check_torch_version()
    if isinstance(name_or_class, type):
        return name_or_class
    name = TORCH_SCHEDULE_CLASSES.get(name_or_class, name_or_class)
    try:
        cls: type = sched_mod.get_schedule_class(name.removeprefix("Schedule"))
    except ValueError:
        raise ConfigError(
            f"unknown torch pipeline schedule {name_or_class!r}; use a torch class name "
            f"(e.g. Interleaved1F1B, ZBVZeroBubble) or one of {', '.join(TORCH_SCHEDULE_CLASSES)}"
        ) from None
    return cls


def schedule_from_torch_class(
    name_or_class: str | type,
    num_ranks: int,
    num_microbatches: int,
    stages_per_rank: int = 1,
    *,
    split_full_backward: bool = False,
) -> Schedule:
    """Build a torch schedule on stand-in stages (no process group) and convert it.

    Args:
        name_or_class: See :func:`torch_class_for`.
        stages_per_rank: Local stages per rank (1 for GPipe/1F1B, 2 for ZBV/DualPipeV).
        split_full_backward: See :func:`schedule_from_torch`.

    Raises:
        ConfigError: unknown class or unsupported torch.
        ScheduleError: torch refuses the sizes (its message), or the order does not fit
            perseus's IR.
    """
    sched_mod = check_torch_version()
    cls = torch_class_for(name_or_class)
    if num_ranks < 1 or num_microbatches < 1 or stages_per_rank < 1:
        raise ScheduleError(
            f"ranks, microbatches and stages per rank must be >= 1, got {num_ranks}, "
            f"{num_microbatches}, {stages_per_rank}"
        )
    num_stages = num_ranks * stages_per_rank
    try:
        if issubclass(cls, sched_mod.PipelineScheduleSingle):
            if stages_per_rank != 1:
                raise ScheduleError(
                    f"{cls.__name__} runs one stage per rank, not {stages_per_rank}"
                )
            # Constructing validates torch's own size rules (e.g. 1F1B needs M >= S).
            sched = cls(_RecordingStage(0, num_stages, num_ranks, 0), num_microbatches)
        else:
            # Rank 0's stages: V-shaped (0, 2R-1) or looped (0, R, 2R...).
            if cls.__name__ in ("ScheduleZBVZeroBubble", "ScheduleDualPipeV"):
                local = [0, 2 * num_ranks - 1][:stages_per_rank]
            else:
                local = [k * num_ranks for k in range(stages_per_rank)]
            stages = [_RecordingStage(s, num_stages, num_ranks, 0) for s in local]
            sched = cls(stages, num_microbatches)
    except (ValueError, RuntimeError) as e:
        raise ScheduleError(
            f"torch {cls.__name__} rejects {num_ranks} ranks x {num_microbatches} microbatches "
            f"x {stages_per_rank} stages per rank: {e}"
        ) from e
    return schedule_from_torch(sched, name=cls.__name__, split_full_backward=split_full_backward)


def build_torch_schedule(
    schedule: Schedule,
    stages: Sequence[Any],
    loss_fn: Callable[..., Any] | None = None,
    *,
    prefer_torch_class: bool = True,
    **kwargs: Any,
) -> Any:
    """A torch schedule object that executes ``schedule`` on this rank's ``stages``.

    torch's own class when ``prefer_torch_class`` and one of :data:`TORCH_SCHEDULE_CLASSES`
    matches (its executed order checked against ``schedule``); otherwise torch's schedule-IR
    runtime loaded with ``schedule``'s per-rank actions, as torch runs custom schedules.

    Args:
        stages: This rank's ``PipelineStage`` objects, in stage order.
        **kwargs: Passed to the torch schedule constructor (e.g. ``scale_grads``).

    Raises:
        ScheduleError: if torch's class would run a different order than ``schedule``.
    """
    sched_mod = check_torch_version()
    stages = list(stages)
    cls_name = TORCH_SCHEDULE_CLASSES.get(schedule.name)
    if prefer_torch_class and cls_name is not None:
        cls = getattr(sched_mod, cls_name)
        theirs = schedule_from_torch_class(
            cls, schedule.num_ranks, schedule.num_microbatches, schedule.virtual_stages
        )
        if theirs.rank_actions != schedule.rank_actions:
            raise ScheduleError(
                f"torch {cls_name} would run a different order than perseus's {schedule.name!r} "
                f"schedule; pass prefer_torch_class=False to run perseus's order"
            )
        single = len(stages) == 1 and schedule.virtual_stages == 1
        return cls(stages[0] if single else stages, schedule.num_microbatches, loss_fn, **kwargs)
    ct = sched_mod._ComputationType
    split = schedule.has_weight_actions
    code = {
        Kind.F: ct.FORWARD,
        Kind.B: ct.BACKWARD_INPUT if split else ct.FULL_BACKWARD,
        Kind.W: ct.BACKWARD_WEIGHT,
    }
    runtime = sched_mod._PipelineScheduleRuntime(
        stages, schedule.num_microbatches, loss_fn, **kwargs
    )
    order = {
        rank: [sched_mod._Action(a.stage_index, code[a.kind], a.microbatch_index) for a in acts]
        for rank, acts in enumerate(schedule.rank_actions)
    }
    runtime.pipeline_order = order
    runtime._prepare_schedule_with_comms(order)
    return runtime


def job_store() -> Any:
    """The default process group's store (torchrun's TCP store), through which
    ``perseus straggler set`` reaches a running job.

    Raises:
        ConfigError: if torch.distributed is not initialised.
    """
    if not is_distributed():
        raise ConfigError("job_store() needs torch.distributed to be initialised first")
    import torch.distributed as dist

    return dist.distributed_c10d._get_default_store()


def stages_of(torch_schedule: Any, model_parts: Sequence[Any] | None = None) -> list[Any]:
    """This rank's ``PipelineStage`` objects of a torch schedule, in stage order.

    Args:
        model_parts: The modules the trainer keeps (torchtitan's ``model_parts``): checked to
            be the stages' submodules, in order.

    Raises:
        ConfigError: if the schedule holds no stages or they do not match ``model_parts``.
    """
    check_torch_version()
    if hasattr(torch_schedule, "_stages"):
        stages = list(torch_schedule._stages)
    elif hasattr(torch_schedule, "_stage"):
        stages = [torch_schedule._stage]
    else:
        raise ConfigError(
            f"{type(torch_schedule).__name__} holds no pipeline stages; pass a torch "
            "pipelining schedule built on PipelineStage objects"
        )
    stages.sort(key=lambda st: int(st.stage_index))
    if model_parts is not None:
        parts = list(model_parts)
        submods = [getattr(st, "submod", None) for st in stages]
        if list(map(id, parts)) != list(map(id, submods)):  # the very same modules
            raise ConfigError(
                f"model_parts ({len(parts)} modules) are not the schedule's stage modules "
                f"(stages {[int(st.stage_index) for st in stages]}); pass the model parts the "
                "schedule was built from, in stage order"
            )
    return stages


class TorchPipelining:
    """The engine adapter for ``torch.distributed.pipelining`` (see :mod:`.base`).

    The schedule is the order torch really runs (:func:`schedule_from_torch`, full backwards
    split when mixed); the stages' compute methods run inside the session's ``op``.

    Args:
        torch_schedule: The torch schedule object the training loop steps.
        stages: This rank's ``PipelineStage`` objects (default: :func:`stages_of` the schedule
            and ``model_parts``).
        group: The pipeline's process group (default: the stages' group).

    Raises:
        ConfigError: see :func:`stages_of`; ScheduleError: see :func:`schedule_from_torch`.
    """

    step_call = "schedule.step()"
    schedule: Schedule
    group: Any

    def __init__(
        self,
        torch_schedule: Any,
        stages: Sequence[Any] | None = None,
        *,
        model_parts: Sequence[Any] | None = None,
        group: Any = None,
    ) -> None:
        self.torch_schedule = torch_schedule
        self.stages = stages_of(torch_schedule, model_parts) if stages is None else list(stages)
        if not self.stages:
            raise ConfigError("TorchPipelining needs this rank's PipelineStage objects")
        self.schedule = schedule_from_torch(torch_schedule, split_full_backward=True)
        self.group = group if group is not None else getattr(self.stages[0], "group", None)

    @property
    def rank(self) -> int:
        """This process's pipeline rank (the stages' ``group_rank``)."""
        return int(self.stages[0].group_rank)

    def attach(self, op: OpContextFactory, in_iteration: Callable[[], bool]) -> Callable[[], None]:
        """Wrap the stages' compute methods; ``schedule.eval()`` passes skip ``op``, and are
        refused inside an iteration when called (before they communicate, so every rank
        refuses alike), else at their first forward."""
        sched = self.torch_schedule
        original_eval = sched.eval  # every torch schedule has one (_PipelineSchedule.eval)

        def guarded(action: Action) -> Any:
            # schedule.eval() clears the stages' has_backward: its forwards run untimed.
            if not all(getattr(s, "has_backward", True) for s in self.stages):
                refuse_eval(in_iteration, "schedule.eval()")
                return contextlib.nullcontext()
            return op(action)

        undo = instrument_stages(
            self.stages, guarded, split_full_backward=self.schedule.has_weight_actions
        )

        def eval_outside_iterations(*args: Any, **kwargs: Any) -> Any:
            refuse_eval(in_iteration, "schedule.eval()")
            return original_eval(*args, **kwargs)

        sched.eval = eval_outside_iterations  # an instance attribute: the class is untouched

        def detach() -> None:
            undo()
            if vars(sched).get("eval") is eval_outside_iterations:
                del sched.eval

        return detach


def check_profile_fits(profile: Profile, schedule: Schedule) -> None:
    """Check that ``profile`` has the stages ``schedule`` runs (a profile without ``weight``
    rows fits a split schedule: :meth:`~perseus.profile.model.Profile.split_backward`).

    Raises:
        ProfileError: if the stage counts differ.
    """
    if profile.num_stages != schedule.num_stages:
        raise ProfileError(
            f"{profile.source}: profile has {profile.num_stages} stages but the model is split "
            f"into {schedule.num_stages} pipeline stages ({schedule.num_ranks} ranks x "
            f"{schedule.virtual_stages} per rank); profile the model as it is split, or for "
            f"emulation cut a deeper profile with perseus.runtime.emulation.take_stages"
        )
