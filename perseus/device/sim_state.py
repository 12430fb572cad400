"""Out-of-process state of simulated GPUs: one seqlocked JSON file per GPU.

Like a real driver's, a simulated GPU's clock locks, energy counter, slowdown and power limit
outlive the process that set them: they live in ``<state dir>/<uuid>.state`` (static
description in ``<uuid>.info.json``, owner in the :mod:`.ownership` lock file
``<uuid>.owner``). Energy is the exact integral of a piecewise-constant power: ``energy_j`` up
to ``t_last`` plus the planned ``segments`` (start, end, power, clock) and blocking power
between them, published every ``publish_interval_s``. Standard library only (and
:mod:`.private_dir`), so the watchdog can load it by file path.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import json
import math
import os
import re
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = [
    "INFO_SUFFIX",
    "STATE_SUFFIX",
    "SimStateFile",
    "advance",
    "default_state_dir",
    "energy_at",
    "enforced_limit_w",
    "list_states",
    "now_for",
    "publish_tick",
    "published_mj",
    "reset_file",
    "segment_at",
    "write_info",
]

STATE_SUFFIX = ".state"
INFO_SUFFIX = ".info.json"

State = dict[str, Any]


def _private() -> ModuleType:
    """:mod:`perseus.device.private_dir`, imported or loaded by path (the watchdog)."""
    if __name__ == "perseus.device.sim_state":
        return importlib.import_module("perseus.device.private_dir")
    module: ModuleType = sys.modules["_perseus_ownership"]._sibling("private_dir")
    return module


def default_state_dir() -> Path:
    """Simulated GPUs' state directory, created or verified (:func:`.private_dir.sim_dir`)."""
    path: Path = _private().sim_dir()
    return path


_UUID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")


def _file_in(state_dir: Path, uuid: str, suffix: str) -> Path:
    """``<state_dir>/<uuid><suffix>``; a UUID that is not one plain file name is refused."""
    if not _UUID.fullmatch(uuid) or ".." in uuid:
        raise ValueError(f"simulated GPU uuid {uuid!r} is not a plain name (letters, digits, -_.:)")
    return state_dir / f"{uuid}{suffix}"


#: One planned stretch of device work: ``[start_s, end_s, power_w, clock_mhz]``.
Segment = list[float]


def energy_at(state: State, t: float) -> float:
    """Exact energy (J) at time ``t`` >= ``state['t_last']``."""
    t0 = float(state["t_last"])
    span = max(0.0, t - t0)
    busy = 0.0
    energy = float(state["energy_j"])
    for seg in state.get("segments", ()):
        a, b = max(float(seg[0]), t0), min(float(seg[1]), t)
        if b > a:
            busy += b - a
            energy += float(seg[2]) * (b - a)
    return energy + float(state["idle_power_w"]) * max(0.0, span - busy)


def segment_at(state: State, t: float) -> Segment | None:
    """The planned segment covering time ``t``, or None when the device is idle then."""
    return next((list(seg) for seg in state.get("segments", ()) if seg[0] <= t < seg[1]), None)


def publish_tick(t: float, interval_s: float) -> float:
    """The last publish instant at or before ``t`` (``t`` itself when publishing exactly)."""
    return math.floor(t / interval_s) * interval_s if interval_s > 0 else t


def published_mj(state: State, t: float) -> int:
    """The counter an NVML read at time ``t`` returns (mJ, as of the last publish tick)."""
    interval = state["publish_interval_s"]
    tick = publish_tick(t, interval)
    if interval > 0 and tick <= state["pub_tick"]:
        return int(state["pub_mj"])
    # tick > pub_tick = tick(t_last) implies tick > t_last, so the integral formula holds.
    gain = float(state.get("counter_gain", 1.0))  # a sensor gain error (SimNoise)
    return math.floor(energy_at(state, tick) * 1000.0 * gain)


def enforced_limit_w(state: State, board_cap_w: float | None) -> float | None:
    """The limit set in ``state`` (never above the board's cap), else the board's cap."""
    limit = state.get("power_limit_w")
    if limit is None:
        return board_cap_w
    return float(limit) if board_cap_w is None else min(float(limit), board_cap_w)


def now_for(state: State) -> float:
    """Now on the clock the state's device runs on, from any process (virtual: its last time)."""
    kind = state.get("clock", "wall")
    if kind == "wall":
        return time.time()
    if kind == "monotonic":
        return time.perf_counter()
    return float(state["t_last"])


def advance(state: State, now: float) -> float:
    """Move the integral to ``now`` (never backwards); returns the time used."""
    now = max(now, state["t_last"])
    interval = state["publish_interval_s"]
    tick = publish_tick(now, interval)
    if interval > 0 and tick > state["pub_tick"]:
        state["pub_mj"] = published_mj(state, now)
        state["pub_tick"] = tick
    state["energy_j"] = energy_at(state, now)
    state["t_last"] = now
    segments = state.get("segments")
    if segments:
        state["segments"] = [seg for seg in segments if seg[1] > now]
    return now


_HEADER_BYTES = 32  # b"<seq:020d> <length:010d>\n"


def _header(seq: int, length: int) -> bytes:
    return f"{seq:020d} {length:010d}\n".encode("ascii")


def _close_fd(fd: int, pid: int) -> None:
    """Close ``fd`` if this is the process that opened it (a forked child reopens its own)."""
    if os.getpid() == pid:
        with contextlib.suppress(OSError):
            os.close(fd)


class SimStateFile:
    """One simulated GPU's state file: a seqlock-protected JSON document, updated in place.

    A 32-byte header ``"<seq> <length>\n"``, then JSON. A writer (holding a re-entrant
    ``flock``) makes ``seq`` odd, writes, makes it even; a reader seeing the same even ``seq``
    before and after has a consistent copy, and a cached ``seq`` costs one 32-byte ``pread``
    (a rename per write would cost ~0.4 ms). Descriptors are reopened after ``fork``, and
    closed by :meth:`close` or when the object is garbage-collected. A signal handler that
    reads or updates the state while its thread is mid-write (an exit guard's reset) gets
    the state being written, not the torn file.
    """

    def __init__(self, state_dir: Path, uuid: str) -> None:
        self.path = _file_in(state_dir, uuid, STATE_SUFFIX)
        self._fd: int | None = None
        self._pid = 0
        # (seq, state) in one attribute: a thread reading it never sees one without the other.
        self._cached: tuple[int, State | None] = (-1, None)
        self._rlock = threading.RLock()
        self._depth = 0
        # (thread, state) while that thread writes the state: its own file is torn meanwhile.
        self._writing: tuple[int, State] | None = None
        # Closes the descriptor when this object is collected without close() (a simulated
        # GPU has no close): else every GPU object dropped kept one open for good.
        self._closer: weakref.finalize[Any, Any] | None = None

    def _file(self) -> int:
        if self._fd is None or self._pid != os.getpid():
            private = _private()
            private.verify_private_dir(self.path.parent, what="simulated GPU directory")
            self._fd = private.open_private(self.path, os.O_RDWR, mode=0o644)
            self._pid = os.getpid()
            self._cached = (-1, None)
            self._closer = weakref.finalize(self, _close_fd, self._fd, self._pid)
            self._closer.atexit = False  # exit handlers may still reset through this object
        return self._fd

    def close(self) -> None:
        """Close the file descriptor (reopened on next use)."""
        fd, self._fd = self._fd, None
        closer, self._closer = self._closer, None
        if fd is not None and self._pid == os.getpid() and self._depth == 0:
            if closer is not None:
                closer.detach()
            os.close(fd)

    def read(self) -> State | None:
        """The current state (cached while ``seq`` is unchanged), or None if not created yet."""
        fd = self._file()
        writing = self._writing
        if writing is not None and writing[0] == threading.get_ident():
            return writing[1]  # interrupting our own write (a signal handler)
        for _ in range(50):
            head = os.pread(fd, _HEADER_BYTES, 0)
            known, state = self._known(head)
            if known:
                return state
            seq = int(head[:20])
            if seq % 2 == 0:
                payload = os.pread(fd, int(head[21:31]), _HEADER_BYTES)
                if os.pread(fd, 20, 0) == head[:20]:
                    return self._accept(seq, payload)
            time.sleep(0)
        # A writer is slow or died mid-write: read under the lock (writers are excluded).
        with self._locked():
            return self._read_locked(fd)

    def _known(self, head: bytes) -> tuple[bool, State | None]:
        """``(True, state)`` when ``head`` needs no payload read (no state, or cached)."""
        if len(head) < _HEADER_BYTES:
            return True, None
        cached_seq, cached = self._cached
        return int(head[:20]) == cached_seq, cached

    def _read_locked(self, fd: int) -> State | None:
        head = os.pread(fd, _HEADER_BYTES, 0)
        known, state = self._known(head)
        if known:
            return state
        payload = os.pread(fd, int(head[21:31]), _HEADER_BYTES)
        try:
            return self._accept(int(head[:20]), payload)
        except ValueError:
            return None  # torn by a writer that died mid-write: start afresh

    def _accept(self, seq: int, payload: bytes) -> State:
        state: State = json.loads(payload)
        self._cached = (seq, state)
        return state

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._rlock:
            fd = self._file()
            if self._depth == 0:
                fcntl.flock(fd, fcntl.LOCK_EX)
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0:
                    fcntl.flock(fd, fcntl.LOCK_UN)

    def update(self, change: Callable[[State | None], State | None]) -> State | None:
        """Apply ``change`` to a shallow copy of the state (None: none yet) under the lock
        and write what it returns (None: leave the file untouched)."""
        with self._locked():
            fd = self._file()
            # Nested in our own write (a signal handler's reset): from the state being written.
            writing = self._writing
            current = writing[1] if writing is not None else self._read_locked(fd)
            new = change(dict(current) if current is not None else None)
            if new is None:
                return current
            data = json.dumps(new, separators=(",", ":")).encode("utf-8")
            head = os.pread(fd, _HEADER_BYTES, 0)
            seq = int(head[:20]) if len(head) == _HEADER_BYTES else 0
            base = seq + (seq % 2)  # an odd seq means a writer died (or is interrupted) mid-write
            self._writing = (threading.get_ident(), new)
            try:
                os.pwrite(fd, _header(base + 1, len(data)), 0)
                # No truncation: readers take ``length`` bytes.
                os.pwrite(fd, data, _HEADER_BYTES)
                os.pwrite(fd, _header(base + 2, len(data)), 0)
            finally:
                self._writing = writing
            self._cached = (base + 2, new)
            return new


def reset_file(spec: dict[str, Any]) -> dict[str, Any]:
    """Reset simulated GPU ``spec["uuid"]`` in ``spec["state_dir"]`` to its default clocks,
    memory clock and power limit, from any process.

    Returns:
        What was restored: ``{"power_limit_w": (before, default)}`` when a limit was set.
    """
    store = SimStateFile(Path(spec["state_dir"]), spec["uuid"])
    before: State | None = None

    def to_defaults(state: State | None) -> State | None:
        nonlocal before
        if state is None:
            return None
        before = dict(state)
        advance(state, now_for(state))
        state["locked_mhz"] = None
        if "mem_locked_mhz" in state:  # a simulated GDDR board's memory lock
            state["mem_locked_mhz"] = None
        if "power_limit_w" in state:
            state["power_limit_w"] = None  # None: the GPU's default limit
        return state

    try:
        store.update(to_defaults)
    finally:
        store.close()
    restored: dict[str, Any] = {}
    if before is not None and before.get("power_limit_w") is not None:
        default = before.get("default_power_limit_w", before.get("power_cap_w"))
        restored["power_limit_w"] = (float(before["power_limit_w"]), default)
    return restored


#: Fields the readers index, text ones, nullable ones: a file edited by hand may break them.
_NEEDED = {"name", "clocks_mhz", "idle_clock_mhz", "t_last", "energy_j", "idle_power_w"}
_NEEDED |= {"publish_interval_s", "pub_tick", "pub_mj", "locked_mhz"}
_TEXT = {"uuid", "clock", "name", "source"}
_NULLABLE = {"locked_mhz", "mem_locked_mhz", "power_limit_w", "power_cap_w"}
_NULLABLE |= {"default_power_limit_w"}


def _number(value: Any) -> bool:
    """A finite number of sane size (not a bool, NaN, 1e308 or a 5,000-digit integer)."""
    return type(value) in (int, float) and abs(value) < 1e18


def _fits(key: str, v: Any) -> bool:
    if key in _TEXT:
        return isinstance(v, str)
    if key == "segments":  # [start_s, end_s, power_w, clock_mhz] each
        return isinstance(v, list) and all(
            isinstance(x, list) and len(x) == 4 and all(map(_number, x)) for x in v
        )
    if key == "clocks_mhz":
        return isinstance(v, list) and all(map(_number, v))
    return _number(v) or (v is None and key in _NULLABLE)


def write_info(state_dir: Path, uuid: str, info: State) -> None:
    """Write a GPU's static description to ``<uuid>.info.json`` atomically (kept out of the
    state file so every op does not re-encode the clock list)."""
    path = _file_in(state_dir, uuid, INFO_SUFFIX)
    data = json.dumps(info, indent=1).encode("utf-8")
    private = _private()
    with contextlib.suppress(OSError, ValueError):
        if private.read_private(path, len(data) + 1) == data:
            return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # our own leftover (or a planted name): unlink never follows a link
    try:
        fd = private.open_private(tmp, os.O_WRONLY, mode=0o644)
        with open(fd, "wb") as f:
            f.write(data)
        private.replace_private(tmp, path)  # a planted link itself, never its target
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def list_states(state_dir: Path) -> list[State]:
    """Every simulated GPU's state merged with its description, ordered by index.

    Raises:
        ConfigError: ``state_dir`` is not a directory nobody else controls.
    """
    private = _private()
    try:
        private.verify_private_dir(state_dir, create=False, what="simulated GPU directory")
    except FileNotFoundError:
        return []
    if not os.access(state_dir, os.R_OK | os.X_OK):  # glob would say "none" of root's 0700
        st = os.stat(state_dir)
        raise private._error(
            f"simulated GPU directory {state_dir} is not readable by this user "
            f"({private._describe(st)}): run as its owner (sudo perseus device ...) or use a "
            f"directory of yours (`state_dir` or ${private.SIM_DIR_ENV})"
        )
    states = []
    for path in sorted(state_dir.glob(f"*{STATE_SUFFIX}")):
        uuid = path.name[: -len(STATE_SUFFIX)]
        try:
            store = SimStateFile(state_dir, uuid)
        except ValueError:
            continue  # not a name perseus writes
        try:
            state = store.read()
            info = json.loads(private.read_private(_file_in(state_dir, uuid, INFO_SUFFIX)))
            state = None if state is None else {**info, **state}
        except (OSError, ValueError, TypeError):  # missing, torn, refused, not a JSON object
            state = None
        finally:
            store.close()
        # A field missing or of the wrong type (edited by hand): taken for torn, as above.
        if (
            state is not None
            and state.keys() >= _NEEDED
            and all(_fits(*kv) for kv in state.items())
        ):
            states.append(state)
    return sorted(states, key=lambda s: (s.get("index", 0), s.get("uuid", "")))
