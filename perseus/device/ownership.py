"""One owner per physical GPU: ownership lock files keyed by UUID, and resetting a dead owner's GPU.

A clock lock or power limit outlives the process that set it (docs/hardware.md#sharing). The
owner holds an exclusive ``flock`` on ``<lock_dir>/<uuid>.owner`` and writes its process record
into it; the kernel drops the ``flock`` when the owner dies, the record stays, and a clean
release truncates it. Whoever next takes the lock and finds a record resets the GPU it opened
itself (never what another process's file says). Standard library only, like the modules it
loads beside it, so the watchdog can load it by file path without ``import perseus``.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import importlib.util
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from perseus.device.clock import Clock
    from perseus.io.process_identity import ProcessRecord

__all__ = [
    "OWNER_LOCK_SUFFIX",
    "GpuOwnership",
    "OwnerLock",
    "acquire_owner_lock",
    "close_on_fork",
    "default_lock_dir",
    "forget_on_fork",
    "infer_reset_spec",
    "owner_lock_path",
    "read_owner_pid",
    "recorded_owner",
    "release_owner_lock",
    "reset_from_spec",
    "reset_if_orphaned",
]

logger = logging.getLogger(__name__)

OWNER_LOCK_SUFFIX = ".owner"


def default_lock_dir() -> Path:
    """Real GPUs' lock directory, created or verified (:func:`.private_dir.lock_dir`)."""
    path: Path = _sibling("private_dir").lock_dir()
    return path


def owner_lock_path(lock_dir: Path, uuid: str) -> Path:
    """The lock file that makes a process the owner of GPU ``uuid``."""
    return lock_dir / f"{uuid}{OWNER_LOCK_SUFFIX}"


class OwnerLock(NamedTuple):
    """The outcome of :func:`acquire_owner_lock`.

    Attributes:
        fd: The locked file descriptor (None when another process owns the GPU).
        owner_pid: When ``fd`` is None: the owner's recorded pid (None when unrecorded).
        stale_pid: When ``fd`` is ours: the pid of a previous owner that died without a
            clean release.
    """

    fd: int | None
    owner_pid: int | None
    stale_pid: int | None


#: Lock files this process's recurring jobs (``own_gpu=False``) still owe a reset, with how
#: many: an agent of this process releasing such a lock keeps our record in it.
_DUE: dict[str, int] = {}


def _identity() -> ModuleType:
    return _sibling("process_identity", package="io")


def _read_record(fd: int) -> ProcessRecord | None:
    record: ProcessRecord | None = _identity().parse_record(
        os.pread(fd, _identity().RECORD_MAX_BYTES, 0)
    )
    return record


def _is_me(record: ProcessRecord) -> bool:
    me = _identity().this_process()
    return bool(
        record.pid == me.pid
        and record.namespace in (None, me.namespace)
        and record.start in (None, me.start)
    )


def _write_record(fd: int) -> None:
    # Overwrite, then truncate: a signal in between cannot erase the record that a reset is due.
    data: bytes = _identity().format_record(_identity().this_process())
    os.pwrite(fd, data, 0)
    os.ftruncate(fd, len(data))


def acquire_owner_lock(
    path: Path, *, record: bool = True, take_unverifiable: bool = False
) -> OwnerLock:
    """Try to take the exclusive lock on ``path`` without blocking.

    A record naming another live process (a recurring job that only records itself,
    :meth:`GpuOwnership.mark_due`), or one in another PID namespace unless
    ``take_unverifiable``, is an owner too. A previous owner's record is ``stale_pid``; with
    ``record`` ours replaces it.

    Raises:
        ConfigError: the lock directory or ``path`` is refused (:mod:`.private_dir`).
    """
    fd = _open_lock(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            found = _read_record(fd)
            os.close(fd)
            return OwnerLock(None, None if found is None else found.pid, None)
        found = _read_record(fd)
        if found is not None and not _is_me(found):
            state = _identity().liveness(found)
            if state == "alive" or (state == "unknown" and not take_unverifiable):
                os.close(fd)  # unlocks: a live owner that holds no flock
                return OwnerLock(None, found.pid, None)
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise
    stale = found.pid if found is not None and not _is_me(found) else None
    if record:
        try:
            _write_record(fd)
        except BaseException:
            os.close(fd)  # unlocks: a failed take leaves the lock free, not held for ever
            raise
    return OwnerLock(fd, None, stale)


def _open_lock(path: Path) -> int:
    """``path`` opened read-write in a verified directory, never through a link."""
    private = _sibling("private_dir")
    private.verify_private_dir(path.parent, what="lock directory")
    fd: int = private.open_private(path, os.O_RDWR, mode=0o644)
    return fd


def release_owner_lock(fd: int, path: Path) -> None:
    """Clear the record (unless a recurring job here still owes a reset) and close ``fd``."""
    with contextlib.suppress(OSError):
        if _DUE.get(str(path)):
            _write_record(fd)
        else:
            os.ftruncate(fd, 0)
    with contextlib.suppress(OSError):
        os.close(fd)


def recorded_owner(path: Path) -> tuple[ProcessRecord | None, str | None]:
    """The process a lock file names and its liveness; ``(None, None)`` when free or
    unreadable. Never takes the lock."""
    try:
        data = _sibling("private_dir").read_private(path, _identity().RECORD_MAX_BYTES)
    except (OSError, ValueError):  # missing, or refused (ConfigError is a ValueError)
        return None, None
    found: ProcessRecord | None = _identity().parse_record(data)
    if found is None:
        return None, None
    state: str = "alive" if _is_me(found) else _identity().liveness(found)
    return found, state


def read_owner_pid(path: Path) -> int | None:
    """The pid recorded in a lock file, or None when free or unreadable."""
    found, _state = recorded_owner(path)
    return None if found is None else found.pid


def _sibling(name: str, package: str = "device") -> ModuleType:
    """``perseus.<package>.<name>``, or loaded by path once as ``_perseus_<name>``."""
    if __name__ == "perseus.device.ownership":
        return importlib.import_module(f"perseus.{package}.{name}")
    key = f"_perseus_{name}"
    if key not in sys.modules:
        path = Path(__file__).resolve().parents[1] / package / f"{name}.py"
        spec = importlib.util.spec_from_file_location(key, path)
        if spec is None or spec.loader is None:  # pragma: no cover - the file ships with perseus
            raise ImportError(path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


def _reset_nvml(spec: dict[str, Any]) -> dict[str, Any]:
    """The NVML reset of GPU ``spec["uuid"]``: locked clocks, memory clocks when
    ``spec["memory_clocks"]``, and the power limit back to NVML's *default* limit (never the
    limit found at open)."""
    nvml = importlib.import_module("pynvml")
    restored: dict[str, Any] = {}
    nvml.nvmlInit()
    try:
        handle = nvml.nvmlDeviceGetHandleByUUID(spec["uuid"])
        try:
            nvml.nvmlDeviceResetGpuLockedClocks(handle)
        finally:  # a failed clock reset still restores the memory clock and the limit
            if spec.get("memory_clocks"):
                with contextlib.suppress(nvml.NVMLError):
                    nvml.nvmlDeviceResetMemoryLockedClocks(handle)
            default_mw = int(nvml.nvmlDeviceGetPowerManagementDefaultLimit(handle))
            current_mw = int(nvml.nvmlDeviceGetPowerManagementLimit(handle))
            if current_mw != default_mw:
                nvml.nvmlDeviceSetPowerManagementLimit(handle, default_mw)
                restored["power_limit_w"] = (current_mw / 1000.0, default_mw / 1000.0)
    finally:
        nvml.nvmlShutdown()
    return restored


def reset_from_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """Reset everything perseus may change on the GPU ``spec`` names, from any process
    (``spec``: the ``watchdog_spec()`` of a GPU this process or its owner opened).

    Returns:
        What was restored: ``{"power_limit_w": (before, after)}`` when the limit changed.

    Raises:
        ValueError: an unknown backend.
    """
    backend = spec.get("backend")
    if backend == "nvml":
        return _reset_nvml(spec)
    if backend != "sim":
        raise ValueError(f"unknown GPU backend {backend!r} in reset spec {spec!r}")
    restored: dict[str, Any] = _sibling("sim_state").reset_file(spec)
    return restored


def infer_reset_spec(uuid: str, lock_path: Path) -> dict[str, Any]:
    """The reset spec of GPU ``uuid`` when its owner gave none: simulated when its state file
    sits next to the lock file, else NVML."""
    state_dir = lock_path.parent
    if (state_dir / f"{uuid}{_sibling('sim_state').STATE_SUFFIX}").exists():
        return {"backend": "sim", "state_dir": str(state_dir), "uuid": uuid}
    return {"backend": "nvml", "uuid": uuid}


def reset_if_orphaned(spec: dict[str, Any], owner_pid: int) -> bool:
    """The watchdog's reset after its owner died; True when the GPU was reset.

    A new live owner (holding the lock, or recorded without it) keeps the GPU; otherwise it
    is reset and the dead owner's record cleared so the next owner does not reset again.
    """
    lock_path = Path(spec["lock_path"])
    fd = _open_lock(lock_path)
    try:
        found = _read_record(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held = True
        except BlockingIOError:
            held = False
            if found is None or found.pid != owner_pid:
                return False  # a new, live owner: its lock, not ours to reset
        found = _read_record(fd)
        if found is not None and found.pid != owner_pid and _identity().liveness(found) != "gone":
            return False  # recorded since our owner died, by a live process
        reset_from_spec({k: v for k, v in spec.items() if k != "lock_path"})
        if held:
            os.ftruncate(fd, 0)
        return True
    finally:
        os.close(fd)


_FORK_CLOSE: set[int] = set()
_fork_hook_installed = False


def _close_in_child() -> None:
    for fd in list(_FORK_CLOSE):
        with contextlib.suppress(OSError):
            os.close(fd)
    _FORK_CLOSE.clear()


def close_on_fork(fd: int) -> None:
    """Close ``fd`` in every child forked from now on (DataLoader workers must not keep a
    lock or a watchdog pipe alive after the owner died)."""
    global _fork_hook_installed
    if not _fork_hook_installed:
        os.register_at_fork(after_in_child=_close_in_child)
        _fork_hook_installed = True
    _FORK_CLOSE.add(fd)


def forget_on_fork(fd: int) -> None:
    """Undo :func:`close_on_fork` (before closing ``fd`` ourselves)."""
    _FORK_CLOSE.discard(fd)


class GpuOwnership:
    """Exclusive ownership of one GPU's clocks and power limit, by ``flock`` on ``lock_path``.

    Args:
        uuid: The GPU's UUID (for messages).
        spec: The ``watchdog_spec()`` of the GPU this process opened, for resetting after a
            dead previous owner (default: inferred from ``uuid`` and ``lock_path``).
        reset: Called instead of :func:`reset_from_spec` for that reset.
    """

    def __init__(
        self,
        uuid: str,
        lock_path: Path,
        *,
        spec: dict[str, Any] | None = None,
        reset: Callable[[], None] | None = None,
    ) -> None:
        self.uuid = uuid
        self.lock_path = lock_path
        self._spec = spec
        self._reset = reset
        self._fd: int | None = None
        #: The pid of a dead previous owner whose lock this owner reset on acquiring.
        self.reset_stale_pid: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, wait_s: float = 2.0, clock: Clock | None = None) -> None:
        """Become the owner; reset the GPU first if the previous owner died without doing so.

        A lock held by no live process (a watchdog resetting) is waited for up to ``wait_s``
        on ``clock`` (default real time: the holder is another process).

        Raises:
            DeviceBusyError: another live process (or agent in this process) owns the GPU.
        """
        if self._fd is not None:
            return
        clock = clock if clock is not None else _sibling("clock").REAL_CLOCK
        deadline = clock.now() + wait_s
        while True:
            fd, owner, stale = acquire_owner_lock(self.lock_path)
            if fd is not None:
                break
            found, state = recorded_owner(self.lock_path)
            transient = owner is None or state == "gone"
            if not transient or clock.now() >= deadline:
                from perseus.errors import DeviceBusyError

                who = f"process {owner}" if owner is not None else "another process"
                if state == "unknown" and found is not None:
                    who += f" of another PID namespace ({found.namespace})"
                if owner == os.getpid():
                    who = "another agent in this process"
                raise DeviceBusyError(
                    f"GPU {self.uuid} is already owned by {who} (lock {self.lock_path}); one "
                    "agent per GPU: stop the other agent or give each rank its own GPU"
                )
            clock.sleep(0.01)
        self._fd = fd
        close_on_fork(fd)
        if stale is not None:
            self._reset_stale(stale)

    def _reset_stale(self, pid: int) -> None:
        # We hold the lock: nobody races this reset of the GPU we opened.
        try:
            if self._reset is not None:
                self._reset()
            else:
                reset_from_spec(self._spec or infer_reset_spec(self.uuid, self.lock_path))
        except Exception as e:  # the new owner sets its own clocks anyway: warn, go on
            outcome = f", and the reset failed: {e}"
        else:
            self.reset_stale_pid = pid
            outcome = "; reset to defaults"
        message = "GPU %s: its previous owner (pid %d) died without resetting it%s"
        logger.warning(message, self.uuid, pid, outcome)

    def mark_due(self) -> None:
        """Record this process as owing the GPU a reset, without keeping the lock.

        For a recurring job's power limit while an agent of the same process takes the lock
        itself: our record stays, so if we are killed the next owner resets the GPU; an
        agent of this process finds its own record and resets nothing.

        Raises:
            DeviceBusyError: another live process owns the GPU.
        """
        key = str(self.lock_path)
        if self.owner_pid(self.lock_path) != os.getpid():
            self.acquire()
        # else an agent of this process holds it: when it releases, it keeps our record.
        _DUE[key] = _DUE.get(key, 0) + 1
        self.release()  # unlocks, keeping our record (a reset is due)

    def clear_due(self) -> None:
        """Remove the record :meth:`mark_due` left (only ours, only while the lock is free)."""
        key = str(self.lock_path)
        left = _DUE.pop(key, 0) - 1
        if left > 0:  # another job of this process still owes the GPU a reset
            _DUE[key] = left
            return
        fd = acquire_owner_lock(self.lock_path, record=False).fd
        if fd is None:
            return
        try:
            found = _read_record(fd)
            if found is not None and _is_me(found):
                os.ftruncate(fd, 0)
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)

    def release(self) -> None:
        """Give up ownership (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            forget_on_fork(fd)
            release_owner_lock(fd, self.lock_path)

    @staticmethod
    def owner_pid(lock_path: Path) -> int | None:
        """The live owner's pid, or None when the GPU is free."""
        fd, owner, _stale = acquire_owner_lock(lock_path, record=False)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
            return None
        return owner if owner is not None else read_owner_pid(lock_path)
