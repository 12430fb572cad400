"""Processes and threads around training: one session per pipeline rank.

Design note (the parts, what flows between them, where a new engine plugs in):

* **Engine adapters** (:mod:`perseus.runtime.engines`): one module per engine (torch
  pipelining, Megatron-Core, DeepSpeed) behind one protocol,
  :class:`~perseus.runtime.engines.base.EngineAdapter`: the schedule the engine really runs (a
  perseus :class:`~perseus.schedule.Schedule`), this process's rank and group, the call that
  runs one step, and ``attach(op, in_iteration)``, which makes the engine run each compute
  action inside the session's ``op(action)``. Engine-private names stay in the adapter module,
  checked once by :func:`~perseus.runtime.engines.base.check_engine_version`.
* **Plan sources** (:mod:`perseus.runtime.planning`): a plan file, an offline profile or an
  online sweep, each a small typed object that yields the frontier (collective over the
  pipeline).
* **The session** (:class:`~perseus.runtime.session.RankSession`; torch's
  :class:`~perseus.runtime.pipeline.PerseusPipeline` is a session whose engine is torch
  pipelining): an explicit lifecycle (new, idle, in iteration, closed); the collectives at
  each iteration's start and end that make the pipeline's time and energy one figure; the
  emulation set-up (a simulated GPU per rank and per job, the cross-rank timeline,
  :mod:`perseus.runtime.emulation`); the online sweep, one object
  (:class:`~perseus.runtime.session_sweep.SessionSweep` over :mod:`perseus.runtime.profiling`).
* **The rank agent** (:mod:`perseus.runtime.agent`): sets each op's clock on the device's
  timeline and measures ops; the safety net (:mod:`perseus.runtime.safety`) resets the GPU
  however the process ends; the straggler policy (:mod:`perseus.runtime.straggler`) is a
  boundary hook.

Flow: adapter -> ``session.op(action)`` -> agent (clock, device event) -> device; at each
iteration's end the session's :class:`~perseus.runtime.session.IterationStats` go to
``history`` and the boundary hooks, which may return a new plan that the agent runs from the
next iteration on; ``close()`` logs one :class:`~perseus.runtime.summary.RunSummary`.

A new engine plugs in with one module under ``perseus/runtime/engines/`` holding a class with
``schedule``, ``rank``, ``group``, ``step_call`` and ``attach``: ``RankSession(engine, gpu=...,
plan=..., options=SessionOptions(...))`` does the rest.

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
    from perseus.runtime.session import BoundaryHook, IterationStats, RankSession, SessionOptions

# The session-level names, each imported from its module on first access so that importing
# one runtime module does not load the others. Internals (the controller, the watchdog, the
# signal guards) stay in their subpackages: perseus.runtime.agent, perseus.runtime.safety.
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


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'perseus.runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
