"""Who holds a recurring run: the process identity a run's lease records, and whether that
process is gone.

A lease names a process by ``(pid, host, start)``: ``host`` is the machine *and* its pid
namespace (two containers with the same hostname number their processes independently, so a
pid from one means nothing in the other), and ``start`` is the boot and the kernel's start
time of the process (``/proc/<pid>/stat`` field 22), because pids are reused: a live process
with the lease's pid but another start time is somebody else, and the lease's holder is gone.
Where ``/proc`` is missing, ``start`` is None and only the pid's liveness is checked. The
reading of ``/proc`` is :mod:`perseus.device.process_identity`'s (ownership locks record the
same identity).
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
    """A process as a lease records it.

    Attributes:
        pid: Its process id.
        host: Machine and pid namespace (``"node7 pid:[4026531836]"``).
        start: Boot id and start time (``"<boot id>:<ticks>"``), or None where unknown.
    """

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
    """Whether the process ``holder`` names is certainly gone.

    Only a process of this host (and pid namespace) can be checked; any other is never "gone"
    here (its lease expires instead).
    """
    if holder.host != _host() or holder.pid <= 0:
        return False
    return liveness(ProcessRecord(holder.pid, holder.start)) == "gone"
