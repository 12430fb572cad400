"""Who holds a recurring run: a process as ``(pid, host, start)``, and whether it is gone.

``host`` is the machine and its pid namespace, ``start`` the boot and the process's start
time (pids are reused), as :mod:`perseus.device.process_identity` reads them.
"""

from __future__ import annotations

import functools
import socket
from dataclasses import dataclass

from perseus.device.process_identity import ProcessRecord, liveness, pid_namespace
from perseus.device.process_identity import this_process as current_process

__all__ = ["ProcessIdentity", "process_gone", "this_process"]


@dataclass(frozen=True, slots=True)
class ProcessIdentity:
    """A process as a lease records it: ``host`` is ``"node7 pid:[4026531836]"``, ``start``
    ``"<boot id>:<ticks>"`` or None where unknown."""

    pid: int
    host: str
    start: str | None


@functools.cache
def _host() -> str:
    return f"{socket.gethostname()} {pid_namespace() or ''}".strip()


def this_process() -> ProcessIdentity:
    """This process's identity (computed per call: a forked child is another process)."""
    me = current_process()
    return ProcessIdentity(me.pid, _host(), me.start)


def process_gone(holder: ProcessIdentity) -> bool:
    """Whether the process ``holder`` names is certainly gone (one of another host or pid
    namespace never is: its lease expires instead)."""
    if holder.host != _host() or holder.pid <= 0:
        return False
    return liveness(ProcessRecord(holder.pid, holder.start)) == "gone"
