"""Plans under power budgets at run time: follow a plan schedule, obey a power cap.

:class:`~perseus.runtime.power.runtime.PowerRuntime` is a boundary hook of
:class:`~perseus.runtime.session.RankSession`; :mod:`perseus.runtime.power.cap` holds the
store keys through which ``perseus power set`` reaches a running job;
:mod:`perseus.runtime.power.replan` re-plans the rest of a schedule when the realised signal
differs from its forecast.
"""

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
