"""Processes and threads around training: one session per pipeline rank
(:class:`~perseus.runtime.session.RankSession`; design: ``docs/training.md``). Importing this
package never imports torch or pynvml.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from perseus import _lazy_names

if TYPE_CHECKING:
    from perseus.runtime.agent.rank_agent import RankAgent
    from perseus.runtime.metrics import IterationMetrics, MetricsSink
    from perseus.runtime.pipeline import PerseusPipeline, perseus_pipeline
    from perseus.runtime.planning import OfflineProfile, OnlineProfile, PlanFile
    from perseus.runtime.session import (
        BoundaryHook,
        IterationStats,
        RankSession,
        SessionOptions,
        SessionState,
    )
    from perseus.runtime.summary import RunSummary

_LAZY: dict[str, str] = {
    "BoundaryHook": "perseus.runtime.session",
    "IterationMetrics": "perseus.runtime.metrics",
    "IterationStats": "perseus.runtime.session",
    "MetricsSink": "perseus.runtime.metrics",
    "OfflineProfile": "perseus.runtime.planning",
    "OnlineProfile": "perseus.runtime.planning",
    "PerseusPipeline": "perseus.runtime.pipeline",
    "PlanFile": "perseus.runtime.planning",
    "RankAgent": "perseus.runtime.agent.rank_agent",
    "RankSession": "perseus.runtime.session",
    "RunSummary": "perseus.runtime.summary",
    "SessionOptions": "perseus.runtime.session",
    "SessionState": "perseus.runtime.session",
    "perseus_pipeline": "perseus.runtime.pipeline",
}

__all__ = [
    "BoundaryHook",
    "IterationMetrics",
    "IterationStats",
    "MetricsSink",
    "OfflineProfile",
    "OnlineProfile",
    "PerseusPipeline",
    "PlanFile",
    "RankAgent",
    "RankSession",
    "RunSummary",
    "SessionOptions",
    "SessionState",
    "perseus_pipeline",
]


__getattr__, __dir__ = _lazy_names(__name__, _LAZY)
