"""The fake NVML (:mod:`perseus.device.fake_nvml`) shared across processes.

The devices live in a JSON file named by ``$PERSEUS_FAKE_NVML_STATE`` (write it with
:func:`write_devices`); every ``nvml*`` call loads them under an exclusive ``flock``, runs the
fake's function and saves them, so a rank, its watchdog and the next owner all see one GPU.

Pass this *module* as ``NvmlGPU(nvml_module=...)``: the GPU's watchdog spec then names this
file, and the watchdog process (``python -I``, without ``import perseus``) loads it by path
instead of ``pynvml``. That is why this module loads the fake by path, never by package.
Its clock is the wall clock (:class:`~perseus.device.clock.WallClock`), one timeline for every
process.
"""

from __future__ import annotations

import dataclasses
import fcntl
import importlib.util
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from perseus.device.clock import WallClock

__all__ = ["STATE_ENV", "read_devices", "write_devices"]

STATE_ENV = "PERSEUS_FAKE_NVML_STATE"


def _load_fake() -> ModuleType:
    key = "_perseus_fake_nvml"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, Path(__file__).with_name("fake_nvml.py"))
        if spec is None or spec.loader is None:  # pragma: no cover - the file ships with it
            raise ImportError("fake_nvml.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


_fake = _load_fake()
_TUPLES = ("locked", "mem_locked", "memory_clocks", "graphics_clocks", "activity_cycle")


def _device(data: dict[str, Any]) -> Any:
    for key in _TUPLES:
        if data.get(key) is not None:
            data[key] = tuple(data[key])
    return _fake.FakeDevice(**data)


def _dump(devices: Sequence[Any]) -> str:
    return json.dumps([dataclasses.asdict(d) for d in devices])


def write_devices(path: Path, devices: Sequence[Any]) -> None:
    """Start the shared fake with ``devices`` (FakeDevice objects without ``energy_fn``)."""
    path.write_text(_dump(devices), encoding="utf-8")


def read_devices(path: Path) -> list[Any]:
    """The shared devices now (FakeDevice objects), read under the lock writers take."""
    with open(path, encoding="utf-8") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_SH)
        return [_device(d) for d in json.loads(f.read())]


class _SharedNvml(_fake.FakeNvml):  # type: ignore[misc,name-defined]
    def _dev(self, handle: Any) -> Any:
        # Handles outlive a reload: find the device by UUID in the devices just loaded.
        uuid = getattr(handle, "uuid", None)
        for device in self.devices:
            if device.uuid == uuid:
                return device
        raise _fake.NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)


_nvml = _SharedNvml(clock=WallClock())


def _shared(function: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        path = Path(os.environ[STATE_ENV])
        with open(path, "r+", encoding="utf-8") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            _nvml.devices = [_device(d) for d in json.loads(f.read())]
            try:
                return function(*args)
            finally:
                f.seek(0)
                f.truncate()
                f.write(_dump(_nvml.devices))

    return call


def __getattr__(name: str) -> Any:
    attr = getattr(_nvml, name)
    if name.startswith("nvml") and callable(attr):
        return _shared(attr)
    return attr
