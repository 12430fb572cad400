"""The watchdog process: resets a GPU's clock lock when the process that set it dies.

Run as a script (``python -I _watchdog.py SPEC_JSON OWNER_PID POLL_S``), never imported by
perseus, and using the standard library only, so it starts in ~30 ms instead of paying for
``import perseus``. The owner keeps the write end of our stdin; we learn of its death when
that pipe reaches EOF (the kernel closes it even after SIGKILL) or when our parent pid
changes. A clean owner writes ``stop`` first, and we exit without touching the GPU.

Before resetting, we take the GPU's ownership lock ourselves: if a new live owner holds it,
the lock is theirs and we leave the GPU alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import select
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

__all__: list[str] = []


def _load_sim_state() -> ModuleType:
    path = Path(__file__).resolve().parent.parent / "device" / "sim_state.py"
    spec = importlib.util.spec_from_file_location("_perseus_sim_state", path)
    if spec is None or spec.loader is None:  # pragma: no cover - the file ships with perseus
        raise ImportError(path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _reset(spec: dict[str, Any]) -> None:
    if spec["backend"] == "sim":
        sim_state = _load_sim_state()
        store = sim_state.SimStateFile(Path(spec["state_dir"]), spec["uuid"])

        def change(state: dict[str, Any] | None) -> dict[str, Any] | None:
            if state is None:
                return None
            sim_state.advance(state, time.time())
            state["locked_mhz"] = None
            state["power_limit_w"] = None  # a recurring job's power limit (perseus.recurring)
            return state

        store.update(change)
    elif spec["backend"] == "nvml":
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByUUID(spec["uuid"])
            pynvml.nvmlDeviceResetGpuLockedClocks(handle)
            if spec.get("power_limit") == "reset":  # set by perseus.recurring's guard
                default_mw = pynvml.nvmlDeviceGetPowerManagementDefaultLimit(handle)
                pynvml.nvmlDeviceSetPowerManagementLimit(handle, default_mw)
        finally:
            pynvml.nvmlShutdown()


def _reset_if_orphaned(spec: dict[str, Any], owner_pid: int) -> None:
    lock_path = Path(spec["lock_path"])
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held = True
        except BlockingIOError:
            held = False
            text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            if text != str(owner_pid):
                return  # a new, live owner: its lock, not ours to reset
        _reset(spec)
        if held:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)


def main(argv: list[str]) -> int:
    spec = json.loads(argv[1])
    owner_pid = int(argv[2])
    poll_s = float(argv[3])
    stdin_fd = sys.stdin.fileno()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    sys.stdout.close()
    buffer = b""
    while True:
        readable, _, _ = select.select([stdin_fd], [], [], poll_s)
        if readable:
            chunk = os.read(stdin_fd, 64)
            if not chunk:
                break  # EOF: the owner is gone
            buffer += chunk
            if b"stop" in buffer:
                return 0
        elif os.getppid() != owner_pid:
            break
    with contextlib.suppress(Exception):
        _reset_if_orphaned(spec, owner_pid)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
