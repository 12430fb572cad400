"""One owner per physical GPU: ownership lock files keyed by UUID, and resetting a dead owner's lock.

A clock lock (and a power limit) is global to the device and outlives the process that set it
(notes §4.4). perseus makes one process the *owner* of each GPU it changes: the owner holds an
exclusive ``flock`` on ``<lock_dir>/<uuid>.owner`` and writes its pid into the file. The kernel
drops the ``flock`` when the owner dies, even by SIGKILL, but the pid stays in the file: a clean
release truncates it. So whoever next takes the lock and finds a pid in the file knows that the
previous owner died without resetting the GPU, and resets it first (:class:`GpuOwnership`). The
watchdog process (:mod:`perseus.runtime.safety._watchdog`) does the same the moment its owner dies; the
check here covers the case where the watchdog was killed too.

Used by every backend: simulated GPUs keep their lock files in their state directory, real GPUs
in ``$PERSEUS_LOCK_DIR`` (default ``<tmp>/perseus-locks``, shared by all users).

This module uses the standard library only and imports perseus lazily (only to raise
:class:`~perseus.errors.DeviceBusyError`), so the watchdog can load it by file path without
paying for ``import perseus``. The simulated reset loads :mod:`perseus.device.sim_state` the same
way.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import importlib.util
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

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
    "pid_alive",
    "read_owner_pid",
    "record_reset_spec",
    "release_owner_lock",
    "reset_from_spec",
    "reset_if_orphaned",
]

logger = logging.getLogger(__name__)

OWNER_LOCK_SUFFIX = ".owner"
_STATE_SUFFIX = ".state"  # sim_state.STATE_SUFFIX; repeated so this module loads alone


def default_lock_dir() -> Path:
    """Where real GPUs' ownership locks live: ``$PERSEUS_LOCK_DIR`` or ``<tmp>/perseus-locks``."""
    env = os.environ.get("PERSEUS_LOCK_DIR")
    if env:
        return Path(env)
    return Path(tempfile.gettempdir()) / "perseus-locks"


def owner_lock_path(lock_dir: Path, uuid: str) -> Path:
    """The lock file that makes a process the owner of GPU ``uuid``."""
    return lock_dir / f"{uuid}{OWNER_LOCK_SUFFIX}"


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a process of another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---------------------------------------------------------------------------------------------
# Lock files


class OwnerLock(NamedTuple):
    """The outcome of :func:`acquire_owner_lock`.

    Attributes:
        fd: The locked file descriptor (None when another process holds the lock).
        owner_pid: The holder's recorded pid when the lock is taken by someone else.
        stale_pid: When ``fd`` is ours: the pid a previous owner left in the file, i.e. an
            owner that died without a clean release (its GPU may still be locked).
        stale_spec: That owner's reset spec, if it recorded one (:func:`record_reset_spec`).
    """

    fd: int | None
    owner_pid: int | None
    stale_pid: int | None
    stale_spec: dict[str, Any] | None = None


def _parse_pid(text: str) -> int | None:
    first = text.strip().split("\n", 1)[0].strip()
    return int(first) if first.isdigit() else None


def _parse_spec(text: str) -> dict[str, Any] | None:
    lines = text.split("\n", 2)
    if len(lines) < 2 or not lines[1].strip():
        return None
    try:
        spec = json.loads(lines[1])
    except ValueError:
        return None
    return spec if isinstance(spec, dict) and "backend" in spec else None


def record_reset_spec(path: Path, spec: dict[str, Any]) -> None:
    """Add the owner's reset spec to its lock file (second line, after the pid), so that the
    next owner can reset the GPU fully if this one dies without a watchdog to do it: e.g. the
    power limit found at start, which the next owner cannot know."""
    line = json.dumps(spec, separators=(",", ":"), sort_keys=True).encode() + b"\n"
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        head = os.pread(fd, 64, 0)
        end = head.find(b"\n")
        if end < 0:
            return  # no pid line: not owned
        # The pid line stays in place, so readers never see the file without an owner.
        os.pwrite(fd, line, end + 1)
        os.ftruncate(fd, end + 1 + len(line))
    finally:
        os.close(fd)


def acquire_owner_lock(path: Path, *, record: bool = True) -> OwnerLock:
    """Try to take the exclusive lock on ``path`` without blocking.

    The ``flock`` is held as long as the returned descriptor is open in some process, and the
    kernel drops it when the owner dies (even by SIGKILL). With ``record``, the previous
    content is read (``stale_pid``) and replaced by our pid, for error messages and
    ``perseus device info``.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return OwnerLock(None, read_owner_pid(path), None)
    stale: int | None = None
    spec: dict[str, Any] | None = None
    if record:
        text = os.pread(fd, 4096, 0).decode("utf-8", "replace")
        stale = _parse_pid(text)
        if stale == os.getpid():
            stale = None  # our own earlier record (re-acquired in this process)
        spec = _parse_spec(text) if stale is not None else None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return OwnerLock(fd, None, stale, spec)


def release_owner_lock(fd: int, path: Path) -> None:
    """Give up ownership cleanly: clear the recorded pid and close (unlocking) ``fd``."""
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
    with contextlib.suppress(OSError):
        os.close(fd)


def read_owner_pid(path: Path) -> int | None:
    """The pid recorded in a lock file, or None when free or unreadable.

    The pid is only meaningful while the lock is held: a clean release truncates it, and a
    killed owner's stale pid is ignored by callers that first try the lock.
    """
    try:
        text = path.read_text(encoding="ascii")
    except (OSError, ValueError):
        return None
    return _parse_pid(text)


# ---------------------------------------------------------------------------------------------
# Resetting a GPU from another process (watchdog, next owner)


def _sibling(name: str) -> ModuleType:
    """``perseus.device.<name>``: imported normally inside perseus, else loaded by path."""
    if __name__ == "perseus.device.ownership":
        return importlib.import_module(f"perseus.device.{name}")
    key = f"_perseus_{name}"
    if key in sys.modules:
        return sys.modules[key]
    path = Path(__file__).resolve().parent / f"{name}.py"
    spec = importlib.util.spec_from_file_location(key, path)
    if spec is None or spec.loader is None:  # pragma: no cover - the file ships with perseus
        raise ImportError(path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    spec.loader.exec_module(module)
    return module


def _reset_sim_state(state: dict[str, Any] | None, sim_state: ModuleType) -> dict[str, Any] | None:
    if state is None:
        return None
    now_for = getattr(sim_state, "now_for", None)
    sim_state.advance(state, now_for(state) if callable(now_for) else time.time())
    to_defaults = getattr(sim_state, "reset_to_defaults", None)
    if callable(to_defaults):
        to_defaults(state)
    state["locked_mhz"] = None
    if "mem_locked_mhz" in state:  # a simulated GDDR board's memory lock
        state["mem_locked_mhz"] = None
    if "power_limit_w" in state:
        state["power_limit_w"] = None
    return state


def reset_from_spec(spec: dict[str, Any]) -> None:
    """Reset everything perseus may change on the GPU ``spec`` names, from any process.

    ``spec`` is a GPU's ``watchdog_spec()``: ``{"backend": "sim", "state_dir", "uuid"}`` (the
    locked clock and, when present, the power limit go back to defaults in the state file) or
    ``{"backend": "nvml", "uuid"}`` (``nvmlDeviceResetGpuLockedClocks``,
    ``nvmlDeviceResetMemoryLockedClocks`` when the spec says ``memory_clocks``, and the power
    limit restored to ``power_limit_mw`` when the spec recorded one and it changed).

    Raises:
        Exception: whatever the backend raised (callers log it).
    """
    backend = spec.get("backend")
    if backend == "sim":
        sim_state = _sibling("sim_state")
        store = sim_state.SimStateFile(Path(spec["state_dir"]), spec["uuid"])
        try:
            store.update(lambda state: _reset_sim_state(state, sim_state))
        finally:
            store.close()
    elif backend == "nvml":
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByUUID(spec["uuid"])
            pynvml.nvmlDeviceResetGpuLockedClocks(handle)
            if spec.get("memory_clocks"):  # a GDDR board whose memory clock may be locked
                with contextlib.suppress(pynvml.NVMLError):
                    pynvml.nvmlDeviceResetMemoryLockedClocks(handle)
            wanted = spec.get("power_limit_mw")
            if not wanted and spec.get("power_limit") == "reset":  # perseus.recurring's guard
                with contextlib.suppress(pynvml.NVMLError):
                    wanted = pynvml.nvmlDeviceGetPowerManagementDefaultLimit(handle)
            if wanted:
                with contextlib.suppress(pynvml.NVMLError):
                    if int(pynvml.nvmlDeviceGetPowerManagementLimit(handle)) != int(wanted):
                        pynvml.nvmlDeviceSetPowerManagementLimit(handle, int(wanted))
        finally:
            pynvml.nvmlShutdown()
    else:
        raise ValueError(f"unknown GPU backend {backend!r} in reset spec {spec!r}")


def infer_reset_spec(uuid: str, lock_path: Path) -> dict[str, Any]:
    """The reset spec of GPU ``uuid`` when its owner did not give one: simulated when its state
    file sits next to the lock file (simulated GPUs keep both in the state directory), else NVML."""
    state_dir = lock_path.parent
    if (state_dir / f"{uuid}{_STATE_SUFFIX}").exists():
        return {"backend": "sim", "state_dir": str(state_dir), "uuid": uuid}
    return {"backend": "nvml", "uuid": uuid}


def reset_if_orphaned(spec: dict[str, Any], owner_pid: int) -> bool:
    """The watchdog's reset after its owner died; True when the GPU was reset.

    Takes the owner lock first: if a new live owner holds it (its pid is in the file), the GPU
    is theirs and is left alone. Otherwise resets, then clears the dead owner's pid so that the
    next owner does not reset again.
    """
    lock_path = Path(spec["lock_path"])
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held = True
        except BlockingIOError:
            held = False
            recorded = _parse_pid(os.pread(fd, 64, 0).decode("ascii", "replace"))
            if recorded != owner_pid:
                return False  # a new, live owner: its lock, not ours to reset
        reset_from_spec(spec)
        if held:
            os.ftruncate(fd, 0)
        return True
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------
# Descriptors that must not survive into a forked child (ownership locks, watchdog pipes)

_FORK_CLOSE: set[int] = set()
_fork_hook_installed = False


def _close_in_child() -> None:
    for fd in list(_FORK_CLOSE):
        with contextlib.suppress(OSError):
            os.close(fd)
    _FORK_CLOSE.clear()


def close_on_fork(fd: int) -> None:
    """Close ``fd`` in every child forked from now on (DataLoader workers must not keep a GPU's
    ownership lock or its watchdog's pipe alive after the owner died)."""
    global _fork_hook_installed
    if not _fork_hook_installed:
        os.register_at_fork(after_in_child=_close_in_child)
        _fork_hook_installed = True
    _FORK_CLOSE.add(fd)


def forget_on_fork(fd: int) -> None:
    """Undo :func:`close_on_fork` (before closing ``fd`` ourselves)."""
    _FORK_CLOSE.discard(fd)


# ---------------------------------------------------------------------------------------------
# The owner


class GpuOwnership:
    """Exclusive ownership of one GPU's clocks and power limit, by ``flock`` on ``lock_path``.

    Args:
        uuid: The GPU's UUID (for messages).
        lock_path: The lock file (per GPU UUID).
        spec: The GPU's reset spec (``watchdog_spec()``), used when a previous owner died
            without a reset; inferred from ``uuid`` and ``lock_path`` when None.
        reset: Called instead of :func:`reset_from_spec` for that reset (e.g. the GPU
            object's own ``reset_locked_clock``).
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

    def acquire(self, wait_s: float = 2.0) -> None:
        """Become the owner; reset the GPU first if the previous owner died without doing so.

        A lock held by no live process (a watchdog resetting the GPU after its owner died,
        or a dead owner's forked child exiting) is waited for, up to ``wait_s``.

        Raises:
            DeviceBusyError: if another live process (or another agent in this process) owns
                the GPU; the message names its pid and the lock file.
        """
        if self._fd is not None:
            return
        deadline = time.monotonic() + wait_s
        while True:
            fd, owner, stale, stale_spec = acquire_owner_lock(self.lock_path)
            if fd is not None:
                break
            transient = owner is None or not pid_alive(owner)
            if not transient or time.monotonic() >= deadline:
                from perseus.errors import DeviceBusyError

                who = f"process {owner}" if owner is not None else "another process"
                if owner == os.getpid():
                    who = "another agent in this process"
                raise DeviceBusyError(
                    f"GPU {self.uuid} is already owned by {who} (lock {self.lock_path}); one "
                    "agent per GPU: stop the other agent or give each rank its own GPU"
                )
            time.sleep(0.01)
        self._fd = fd
        close_on_fork(fd)
        if stale is not None:
            self._reset_stale(stale, stale_spec)
        if self._spec is not None:
            with contextlib.suppress(OSError):
                record_reset_spec(self.lock_path, self._spec)

    def _reset_stale(self, pid: int, recorded: dict[str, Any] | None) -> None:
        # We hold the lock, so no watchdog or other owner can race this reset. The dead
        # owner's recorded spec knows what it found at start (power limit); ours does not.
        try:
            if recorded is not None:
                reset_from_spec(recorded)
            elif self._reset is not None:
                self._reset()
            else:
                reset_from_spec(self._spec or infer_reset_spec(self.uuid, self.lock_path))
        except Exception as e:  # the new owner sets its own clocks anyway: warn, go on
            logger.warning(
                "GPU %s: its previous owner (pid %d) died without resetting it, and the reset "
                "failed: %s",
                self.uuid,
                pid,
                e,
            )
            return
        self.reset_stale_pid = pid
        logger.warning(
            "GPU %s: its previous owner (pid %d) died without resetting it; reset to defaults",
            self.uuid,
            pid,
        )

    def release(self) -> None:
        """Give up ownership (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            forget_on_fork(fd)
            release_owner_lock(fd, self.lock_path)

    @staticmethod
    def owner_pid(lock_path: Path) -> int | None:
        """The live owner's pid, or None when the GPU is free (never takes the lock over)."""
        fd, owner, _stale, _spec = acquire_owner_lock(lock_path, record=False)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
            return None
        return owner if owner is not None else read_owner_pid(lock_path)
