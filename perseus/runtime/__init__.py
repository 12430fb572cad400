"""Processes and threads around training: the rank agent, the clock controller, safety hooks.

Importing this package never imports torch or pynvml; adapters that need torch live in their
own modules and import it lazily.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from perseus.runtime.agent.rank_agent import RankAgent
    from perseus.runtime.metrics import IterationMetrics, MetricsSink
    from perseus.runtime.pipeline import PerseusPipeline, perseus_pipeline
    from perseus.runtime.session import BoundaryHook, IterationStats, RankSession

# The session-level names, each imported from its module on first access so that importing
# one runtime module does not load the others. Internals (the controller, the watchdog, the
# signal guards) stay in their subpackages: perseus.runtime.agent, perseus.runtime.safety.
_LAZY: dict[str, str] = {
    "BoundaryHook": "perseus.runtime.session",
    "IterationMetrics": "perseus.runtime.metrics",
    "IterationStats": "perseus.runtime.session",
    "MetricsSink": "perseus.runtime.metrics",
    "PerseusPipeline": "perseus.runtime.pipeline",
    "RankAgent": "perseus.runtime.agent.rank_agent",
    "RankSession": "perseus.runtime.session",
    "perseus_pipeline": "perseus.runtime.pipeline",
}

__all__ = [
    "BoundaryHook",
    "IterationMetrics",
    "IterationStats",
    "MetricsSink",
    "PerseusPipeline",
    "RankAgent",
    "RankSession",
    "perseus_pipeline",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'perseus.runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
