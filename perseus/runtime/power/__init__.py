"""Plans under power budgets at run time: follow a plan schedule, obey a power cap, re-plan."""

from perseus.runtime.power.cap import clear_cap, read_cap, read_cap_ack, set_cap
from perseus.runtime.power.replan import ReplanCost, Replanner
from perseus.runtime.power.runtime import PowerDecision, PowerRuntime, attach_power

__all__ = [
    "PowerDecision",
    "PowerRuntime",
    "ReplanCost",
    "Replanner",
    "attach_power",
    "clear_cap",
    "read_cap",
    "read_cap_ack",
    "set_cap",
]
