"""``PerseusPipeline``: energy-aware ``torch.distributed.pipelining`` in a few lines.

::

    from perseus.runtime.pipeline import PerseusPipeline

    pp = PerseusPipeline(schedule, stages, gpu=gpu, blocking_power_w=83.64,
                         plan="plan.json").start()          # or online_profile=True
    for x, y in loader:
        with pp.iteration():
            schedule.step(x, target=y)
            optimizer.step()
    pp.close()

The torch adapter over :class:`~perseus.runtime.session.RankSession`: it reads the
schedule torch will run (:func:`perseus.runtime.engines.torch_pp.schedule_from_torch`) and wraps the
stages' compute calls (:mod:`perseus.runtime.engines.torch_hooks`) with the session's ``op``. Everything
else (plans, the agent, emulation, online profiling, measurement) is the session's.

Watchdog and signal handling are on by default: a SIGTERM from torchrun, a crash or a SIGKILL
never leaves the GPU at a low clock.

One ``schedule.step()`` per :meth:`PerseusPipeline.iteration`: gradient accumulation over
several steps in one iteration is refused with a :class:`~perseus.errors.PlanError` (raise the
microbatch count instead); ``schedule.eval()`` inside an iteration is refused too, and runs
untouched outside one.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from perseus.errors import PlanError
from perseus.plan import Frontier
from perseus.profile.model import Profile
from perseus.runtime.engines.torch_hooks import instrument_stages
from perseus.runtime.engines.torch_pp import schedule_from_torch
from perseus.runtime.planning import job_for_schedule
from perseus.runtime.session import BoundaryHook, IterationStats, RankSession
from perseus.schedule.actions import Action

__all__ = [
    "BoundaryHook",
    "IterationStats",
    "PerseusPipeline",
    "job_for_schedule",
]


class PerseusPipeline(RankSession):
    """One rank's perseus session around a torch pipeline schedule.

    Args:
        torch_schedule: The torch schedule object the training loop steps.
        stages: This rank's ``PipelineStage`` objects.
        group: The pipeline's process group (default: the stages' group).
        **kwargs: As :class:`~perseus.runtime.session.RankSession` (``gpu``,
            ``blocking_power_w``, ``plan``, ``profile``, ``online_profile``, ``emulate``,
            ``watchdog=True``, ``handle_signals=True``, ``power_schedule``, ``power_store``...).

    Raises:
        ConfigError: see :class:`RankSession`.
        PlanError: if ``plan`` was computed for another schedule.
    """

    def __init__(
        self,
        torch_schedule: Any,
        stages: Sequence[Any],
        *,
        gpu: Any,
        blocking_power_w: float,
        plan: Frontier | str | Path | None = None,
        profile: Profile | None = None,
        online_profile: bool = False,
        profile_cache: str | Path | None = None,
        point_index: int = 0,
        emulate: bool = False,
        group: Any = None,
        watchdog: bool = True,
        handle_signals: bool = True,
        patience: int = 5,
        timeline: str | Path | None = None,
        agent_options: dict[str, Any] | None = None,
        job_options: dict[str, Any] | None = None,
        profile_options: dict[str, Any] | None = None,
        power_schedule: str | Path | None = None,
        power_store: Any = None,
    ) -> None:
        self.torch_schedule = torch_schedule
        self.stages = list(stages)
        super().__init__(
            schedule_from_torch(torch_schedule, split_full_backward=True),
            int(self.stages[0].group_rank),
            gpu=gpu,
            blocking_power_w=blocking_power_w,
            plan=plan,
            profile=profile,
            online_profile=online_profile,
            profile_cache=profile_cache,
            point_index=point_index,
            emulate=emulate,
            group=group if group is not None else getattr(self.stages[0], "group", None),
            watchdog=watchdog,
            handle_signals=handle_signals,
            patience=patience,
            timeline=timeline,
            agent_options=agent_options,
            job_options=job_options,
            profile_options=profile_options,
            power_schedule=power_schedule,
            power_store=power_store,
        )
        self._restore: Any = None

    def start(self) -> PerseusPipeline:
        """Instrument the stages, then start the session (collective over the pipeline)."""
        if self._restore is None:
            self._restore = instrument_stages(
                self.stages, self._torch_op, split_full_backward=self.schedule.has_weight_actions
            )
        try:
            super().start()
        except BaseException:
            self._uninstrument()
            raise
        return self

    def close(self) -> None:
        """End the last window, restore the stages, reset the GPU (idempotent)."""
        try:
            super().close()
        finally:
            self._uninstrument()

    def __enter__(self) -> PerseusPipeline:
        return self.start()

    def _uninstrument(self) -> None:
        restore, self._restore = self._restore, None
        if restore is not None:
            restore()

    def _torch_op(self, action: Action) -> AbstractContextManager[Any]:
        if self._window is not None and not all(
            getattr(s, "has_backward", True) for s in self.stages
        ):
            raise PlanError(
                "schedule.eval() ran inside PerseusPipeline.iteration(): evaluate outside "
                "`with pp.iteration():` (its actions then run at the current clock, unmeasured)"
            )
        return self.op(action)
