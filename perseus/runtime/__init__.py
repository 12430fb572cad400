"""Processes and threads around training: the rank agent, the clock controller, safety hooks.

Importing this package never imports torch or pynvml; adapters that need torch live in their
own modules and import it lazily.
"""

from perseus.runtime.agent import (
    AgentRecords,
    ApplyStats,
    FrequencyController,
    IterationRecord,
    NullAgent,
    OpRecord,
    RankAgent,
    make_agent,
)
from perseus.runtime.safety import ExitGuard, GpuOwnership, Watchdog

__all__ = [
    "AgentRecords",
    "ApplyStats",
    "ExitGuard",
    "FrequencyController",
    "GpuOwnership",
    "IterationRecord",
    "NullAgent",
    "OpRecord",
    "RankAgent",
    "Watchdog",
    "make_agent",
]
