"""Who holds a recurring run: the process identity a run's lease records, and whether that
process is gone.

A lease names a process by ``(pid, host, start)``: ``host`` is the machine *and* its pid
namespace (two containers with the same hostname number their processes independently, so a
pid from one means nothing in the other), and ``start`` is the boot and the kernel's start
time of the process (``/proc/<pid>/stat`` field 22), because pids are reused: a live process
with the lease's pid but another start time is somebody else, and the lease's holder is gone.
Where ``/proc`` is missing, ``start`` is None and only the pid's liveness is checked.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ProcessIdentity", "process_gone", "process_start", "this_process"]


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
def _boot_id() -> str:
    with contextlib.suppress(OSError):
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    return ""


@functools.cache
def _host() -> str:
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = ""
    return f"{socket.gethostname()} {namespace}".strip()


def process_start(pid: int) -> str | None:
    """``"<boot id>:<start ticks>"`` of process ``pid``, or None (no such process, no /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ")".
    fields = stat[stat.rfind(b")") + 2 :].split()
    if len(fields) < 20:
        return None
    return f"{_boot_id()}:{fields[19].decode('ascii', 'replace')}"


def this_process() -> ProcessIdentity:
    """This process's identity (computed per call: a forked child is another process)."""
    pid = os.getpid()
    return ProcessIdentity(pid, _host(), process_start(pid))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def process_gone(holder: ProcessIdentity) -> bool:
    """Whether the process ``holder`` names is certainly gone.

    Only a process of this host (and pid namespace) can be checked; any other is never "gone"
    here (its lease expires instead).
    """
    if holder.host != _host() or holder.pid <= 0:
        return False
    if not _pid_alive(holder.pid):
        return True
    if holder.start is None:
        return False
    now = process_start(holder.pid)
    return now is not None and now != holder.start
