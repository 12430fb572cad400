"""What GPUs are there: real ones through NVML and simulated ones in the state directory.

Used by ``perseus device info``. Reading never takes an ownership lock (a probe could make a
starting agent fail with "busy"); the owner is the pid recorded in the lock file, if alive.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perseus.device.nvml import list_nvml_gpus, probe_privilege
from perseus.device.ownership import default_lock_dir, owner_lock_path, read_owner_pid
from perseus.device.sim_state import default_state_dir, list_states
from perseus.device.simulated import SimulatedGPU, sim_uuid
from perseus.errors import ConfigError, DeviceError

__all__ = [
    "DeviceInfo",
    "live_owner_pid",
    "nvml_devices",
    "open_simulated",
    "simulated_devices",
]


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """One GPU as ``perseus device info`` shows it.

    Attributes:
        backend: ``"nvml"`` or ``"sim"``.
        index: Device index.
        uuid: Device UUID.
        name: Device name.
        clocks_mhz: Supported SM clocks, highest first.
        can_lock: Whether this process may change clocks.
        privilege: Why (``running as root``, ``not root and no CAP_SYS_ADMIN``...).
        locked_mhz: The current lock, None when unlocked (NVML: only known to its setter).
        lock_known: False when the lock cannot be read back (NVML).
        owner_pid: The live owner's pid, or None.
        current_clock_mhz: The SM clock now.
        detail: Backend-specific extras (model source, slowdown, persistence mode).
    """

    backend: str
    index: int
    uuid: str
    name: str
    clocks_mhz: tuple[int, ...]
    can_lock: bool
    privilege: str
    locked_mhz: int | None
    lock_known: bool
    owner_pid: int | None
    current_clock_mhz: int | None
    detail: str = ""


def live_owner_pid(lock_path: Path) -> int | None:
    """The pid recorded as owner in ``lock_path`` if that process still exists."""
    pid = read_owner_pid(lock_path)
    if pid is None:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid  # exists, owned by another user
    return pid


def nvml_devices(nvml_module: Any = None, lock_dir: Path | None = None) -> list[DeviceInfo]:
    """Every NVIDIA GPU on this machine.

    Raises:
        NvmlUnavailableError: no nvidia-ml-py, library or driver.
        DeviceError: another NVML failure.
    """
    infos = []
    can, why = probe_privilege()
    for i, gpu in enumerate(list_nvml_gpus(nvml_module)):
        try:
            reason = gpu.observe_only_reason
            lock_path = owner_lock_path(lock_dir or default_lock_dir(), gpu.uuid)
            try:
                current: int | None = gpu.current_clock_mhz()
            except DeviceError:
                current = None
            persistence = {True: "on", False: "OFF (enable it: nvidia-smi -pm 1)", None: "n/a"}
            infos.append(
                DeviceInfo(
                    backend="nvml",
                    index=i,
                    uuid=gpu.uuid,
                    name=gpu.name,
                    clocks_mhz=gpu.supported_clocks_mhz(),
                    can_lock=can and reason is None,
                    privilege=why if reason is None else reason,
                    locked_mhz=None,
                    lock_known=False,
                    owner_pid=live_owner_pid(lock_path),
                    current_clock_mhz=current,
                    detail=f"persistence mode {persistence[gpu.persistence_mode]}",
                )
            )
        finally:
            gpu.close()
    return infos


def simulated_devices(state_dir: Path | None = None) -> list[DeviceInfo]:
    """Every simulated GPU that has state in ``state_dir`` (default ``$PERSEUS_SIM_DIR``)."""
    directory = state_dir or default_state_dir()
    infos = []
    for state in list_states(directory):
        locked = state.get("locked_mhz")
        uuid = str(state.get("uuid", ""))
        infos.append(
            DeviceInfo(
                backend="sim",
                index=int(state.get("index", 0)),
                uuid=uuid,
                name=str(state.get("name", "?")),
                clocks_mhz=tuple(int(c) for c in state.get("clocks_mhz", ())),
                can_lock=True,
                privilege="simulated",
                locked_mhz=None if locked is None else int(locked),
                lock_known=True,
                owner_pid=live_owner_pid(owner_lock_path(directory, uuid)),
                current_clock_mhz=None,
                detail=f"{state.get('source', '')}; slowdown {float(state.get('slowdown', 1.0)):g}",
            )
        )
    return infos


def open_simulated(index: int, state_dir: Path | None = None) -> SimulatedGPU:
    """A handle on existing simulated GPU ``index`` (its recorded clock list, no op model),
    enough to read it, reset its lock or change its slowdown from another process.

    Raises:
        ConfigError: if no simulated GPU ``index`` exists in the state directory.
    """
    directory = state_dir or default_state_dir()
    wanted = sim_uuid(index)
    for state in list_states(directory):
        if state.get("uuid") == wanted:
            break
    else:
        raise ConfigError(
            f"no simulated GPU {index} in {directory}; it appears once a process uses it "
            "(or point PERSEUS_SIM_DIR or `state_dir` at the right directory)"
        )

    def no_model(stage_index: int, kind: Any, freq_mhz: int) -> tuple[float, float]:
        raise DeviceError("this handle only manages the simulated GPU; it cannot run ops")

    return SimulatedGPU(
        name=str(state["name"]),
        clocks_mhz=tuple(state["clocks_mhz"]),
        op_cost_fn=no_model,
        blocking_power_w=float(state["idle_power_w"]),
        index=index,
        state_dir=directory,
        publish_interval_s=float(state["publish_interval_s"]),
        set_latency_s=0.0,
        power_cap_w=state.get("power_cap_w"),
        idle_clock_mhz=int(state["idle_clock_mhz"]),
        source=str(state.get("source", "")),
    )
