"""``PerseusPipeline``: a :class:`~perseus.runtime.session.RankSession` around
``torch.distributed.pipelining`` (usage, torchtitan's too: ``docs/training.md``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from perseus.device.base import GPU
from perseus.runtime.engines.torch_pp import TorchPipelining, check_profile_fits
from perseus.runtime.planning import (
    OfflineProfile,
    PlanFile,
    PlanLike,
    job_for_schedule,
    plan_source,
)
from perseus.runtime.session import BoundaryHook, IterationStats, RankSession, SessionOptions

__all__ = [
    "BoundaryHook",
    "IterationStats",
    "PerseusPipeline",
    "SessionOptions",
    "job_for_schedule",
    "perseus_pipeline",
]


class PerseusPipeline(RankSession):
    """One rank's perseus session around a torch pipeline schedule.

    Args:
        torch_schedule, stages, model_parts: as
            :class:`~perseus.runtime.engines.torch_pp.TorchPipelining`.
        gpu, plan, options: as :class:`~perseus.runtime.session.RankSession`.

    Raises:
        ConfigError: see :class:`RankSession` and ``TorchPipelining``; ScheduleError: a torch
            schedule perseus cannot read (``TorchPipelining``); ProfileError: a profile for
            another model.
        PlanError: if ``plan`` was computed for another schedule.
    """

    def __init__(
        self,
        torch_schedule: Any,
        stages: Sequence[Any] | None = None,
        *,
        model_parts: Sequence[Any] | None = None,
        gpu: GPU,
        plan: PlanLike,
        options: SessionOptions | None = None,
    ) -> None:
        group = options.group if options is not None else None
        engine = TorchPipelining(torch_schedule, stages, model_parts=model_parts, group=group)
        source = plan_source(plan)
        if isinstance(source, (PlanFile, OfflineProfile)) and source.profile is not None:
            check_profile_fits(source.profile, engine.schedule)
        self.torch_schedule = torch_schedule
        self.stages = engine.stages
        super().__init__(engine, gpu=gpu, plan=source, options=options)


def perseus_pipeline(
    torch_schedule: Any, model_parts: Sequence[Any] | None = None, **session: Any
) -> PerseusPipeline:
    """A :class:`PerseusPipeline` from what a torchtitan trainer keeps.

    Args:
        torch_schedule: The trainer's ``pp_schedule`` (any torch schedule, DualPipeV too).
        model_parts: Its ``model_parts`` (checked against the schedule's stages).
        **session: :class:`PerseusPipeline`'s keywords (``gpu``, ``plan``, ``options``).
    """
    return PerseusPipeline(torch_schedule, model_parts=model_parts, **session)
