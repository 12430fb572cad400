"""The watchdog process: resets a GPU's clocks and power limit when its owner process dies.

Run as ``python -I _watchdog.py SPEC_JSON OWNER_PID POLL_S`` with the standard library only
(about 20 ms over the interpreter's own start: 34-100 ms to "ready" on a busy 2-core VM, where
``python -I -c pass`` took about 50 ms). The owner's death shows as EOF on our stdin (even
after SIGKILL) or a new parent pid; a clean owner writes ``stop`` first. The reset
(:func:`perseus.device.ownership.reset_if_orphaned`, loaded by file path) leaves a GPU that a
new live owner holds alone, and touches only the device named on our command line.
"""

from __future__ import annotations

import importlib.util
import json
import os
import select
import sys
from pathlib import Path
from types import ModuleType

__all__: list[str] = []


def _load_device_module(name: str) -> ModuleType:
    """``perseus/device/<name>.py`` loaded by path as ``_perseus_<name>`` (as the ownership
    module loads its siblings: once)."""
    if f"_perseus_{name}" in sys.modules:
        return sys.modules[f"_perseus_{name}"]
    path = Path(__file__).resolve().parents[2] / "device" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_perseus_{name}", path)
    if spec is None or spec.loader is None:  # pragma: no cover - the file ships with perseus
        raise ImportError(path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main(argv: list[str]) -> int:
    spec = json.loads(argv[1])
    owner_pid = int(argv[2])
    poll_s = float(argv[3])
    stdin_fd = sys.stdin.fileno()
    # Loaded before "ready": a watchdog that cannot reset must fail to start, not at the end.
    ownership = _load_device_module("ownership")
    retry = _load_device_module("clock").retry
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
    try:  # any error gets two more tries: it may be a transient driver error (NVML TIMEOUT)
        retry(
            lambda: ownership.reset_if_orphaned(spec, owner_pid),
            transient=lambda e: True,
            backoff_s=(0.1, 0.1),
        )
    except Exception:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
