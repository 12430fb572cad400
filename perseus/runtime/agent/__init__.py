"""The rank agent and what it drives: clocks on the device's timeline, op timing, records."""

from perseus.runtime.agent.boundary import Boundary
from perseus.runtime.agent.clock_setter import ApplyStats
from perseus.runtime.agent.controller import FrequencyController
from perseus.runtime.agent.rank_agent import RankAgent, make_agent
from perseus.runtime.agent.rank_plan import OpOrderError
from perseus.runtime.agent.records import AgentRecords, IterationRecord, NullAgent, OpRecord

__all__ = [
    "AgentRecords",
    "ApplyStats",
    "Boundary",
    "FrequencyController",
    "IterationRecord",
    "NullAgent",
    "OpOrderError",
    "OpRecord",
    "RankAgent",
    "make_agent",
]
