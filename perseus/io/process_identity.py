"""Which process a record names, and whether it is still there: pid, start time, boot, namespace.

Pids are reused and mean nothing across PID namespaces, so a lock or lease records
``<pid> <boot id>:<start ticks> pid:[<inode>]`` (one ASCII line; only its first 256 bytes are
read, anything else names no process). Another boot: gone; another namespace: unknown; no such
pid or another start time: gone; else alive. Standard library only: the watchdog loads it by
file path beside :mod:`perseus.device.ownership`, with no ``import perseus`` (the installed
package may be another version, or none).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from pathlib import Path
from typing import Literal, NamedTuple

__all__ = [
    "RECORD_MAX_BYTES",
    "Liveness",
    "ProcessRecord",
    "format_record",
    "liveness",
    "parse_record",
    "pid_alive",
    "pid_namespace",
    "process_start",
    "this_process",
]

#: How much of a lock file is read: a record is far shorter; a 1 MB file is not read whole.
RECORD_MAX_BYTES = 256
_RECORD = re.compile(
    rb"\A([0-9]{1,10})(?:[ \t]+([0-9a-f-]{1,64}:[0-9]{1,20}))?(?:[ \t]+(pid:\[[0-9]{1,20}\]))?"
    rb"[ \t]*(?:\n|\Z)"
)

Liveness = Literal["alive", "gone", "unknown"]
#: The largest pid Linux hands out (``pid_max`` at most 2**22).
_PID_MAX = 1 << 22


class ProcessRecord(NamedTuple):
    """A process as a lock file or lease names it (None: unknown).

    Attributes:
        pid: Its pid, in ``namespace``.
        start: ``"<boot id>:<start ticks>"``.
        namespace: ``"pid:[<inode>]"`` of its PID namespace.
    """

    pid: int
    start: str | None = None
    namespace: str | None = None


@functools.cache
def _boot_id() -> str:
    with contextlib.suppress(OSError):
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    return ""


def pid_namespace() -> str | None:
    """``"pid:[<inode>]"`` of this process's PID namespace."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def process_start(pid: int) -> str | None:
    """``"<boot id>:<start ticks>"`` of process ``pid``, or None (no such process, no /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ")".
    fields = stat[stat.rfind(b")") + 2 :].split()
    if len(fields) < 20 or not fields[19].isdigit():
        return None
    return f"{_boot_id()}:{fields[19].decode('ascii')}"


def this_process() -> ProcessRecord:
    """This process (computed per call: a forked child is another process)."""
    pid = os.getpid()
    return ProcessRecord(pid, process_start(pid), pid_namespace())


def format_record(record: ProcessRecord) -> bytes:
    """The one-line lock-file form of ``record``."""
    fields = [str(record.pid), record.start or "", record.namespace or ""]
    return (" ".join(f for f in fields if f) + "\n").encode("ascii")


def parse_record(data: bytes) -> ProcessRecord | None:
    """The process a lock file's first line names, or None (empty, or not a record)."""
    match = _RECORD.match(data[:RECORD_MAX_BYTES])
    if match is None:
        return None
    pid = int(match.group(1))
    if pid == 0:
        return None  # 0 would name a process group, never a process
    start, namespace = (g.decode("ascii") if g else None for g in match.group(2, 3))
    return ProcessRecord(pid, start, namespace)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists here (a process of another user counts as alive)."""
    if not 0 < pid <= _PID_MAX:
        return False  # 0 and -1 would signal a whole process group: never "a process"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def liveness(record: ProcessRecord) -> Liveness:
    """Whether the process ``record`` names is alive, gone, or cannot be told from here."""
    if record.start is not None and _boot_id():
        boot = record.start.rsplit(":", 1)[0]
        if boot and boot != _boot_id():
            return "gone"  # recorded before the last reboot
    if record.namespace is not None and record.namespace != pid_namespace():
        return "unknown"  # its pid means nothing here: a missing pid is no proof of death
    if not pid_alive(record.pid):
        return "gone"
    if record.start is None:
        return "alive"
    now = process_start(record.pid)
    return "gone" if now is not None and now != record.start else "alive"
