"""Plans under power budgets at run time: follow a plan schedule, obey a power cap.

:class:`~perseus.runtime.power.runtime.PowerRuntime` is a boundary hook of
:class:`~perseus.runtime.session.RankSession`; :mod:`perseus.runtime.power.cap` holds the
store keys through which ``perseus power set`` reaches a running job.
"""

from perseus.runtime.power.cap import clear_cap, read_cap, read_cap_ack, set_cap
from perseus.runtime.power.runtime import PowerDecision, PowerRuntime, attach_power

__all__ = [
    "PowerDecision",
    "PowerRuntime",
    "attach_power",
    "clear_cap",
    "read_cap",
    "read_cap_ack",
    "set_cap",
]
