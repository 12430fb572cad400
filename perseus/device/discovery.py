"""What GPUs are there: real ones through NVML and simulated ones in the state directory.

Used by ``perseus device`` (info, reset, slowdown). Reading never takes an ownership lock; the
owner is the process recorded in the lock file: alive, it owns the GPU; dead, the GPU is
*orphaned* until the next owner or ``perseus device reset`` resets it.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perseus.device.nvml import list_nvml_gpus, probe_privilege
from perseus.device.ownership import default_lock_dir, owner_lock_path, recorded_owner
from perseus.device.private_dir import read_private
from perseus.device.sim_state import default_state_dir, enforced_limit_w, list_states
from perseus.device.simulated import SimulatedGPU, sim_uuid
from perseus.errors import ConfigError, DeviceError

__all__ = [
    "ROOT_LOCK_DIR",
    "DeviceInfo",
    "hidden_owners_note",
    "nvml_devices",
    "open_simulated",
    "owner_status",
    "simulated_devices",
]


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """One GPU as ``perseus device info`` shows it.

    Attributes:
        backend: ``"nvml"`` or ``"sim"``.
        clocks_mhz: Supported SM clocks, highest first.
        can_lock: Whether this process may change clocks.
        privilege: Why (``running as root``...).
        locked_mhz: The current lock (None: unlocked, or unknown to NVML).
        lock_known: False when the lock cannot be read back (NVML).
        owner_pid: The live owner's pid, or None.
        detail: Backend-specific extras (model source, slowdown, persistence mode).
        dead_owner_pid: The pid of an owner that died without resetting the GPU.
        power_limit_w: The power limit in force (None: unknown).
        default_power_limit_w: The board's default power limit (None: unknown).
        owner_unknown: Why this user cannot know the owner (empty when it can).
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
    dead_owner_pid: int | None = None
    power_limit_w: float | None = None
    default_power_limit_w: float | None = None
    lock_path: str = ""
    owner_unknown: str = ""


#: Where root's agents keep real GPUs' ownership locks (``private_dir.lock_dir()`` as root).
ROOT_LOCK_DIR = Path("/run/perseus/locks")


def hidden_owners_note(lock_dir: Path, root_lock_dir: Path | None = None) -> str:
    """Why this user may not see a real GPU's owner (root's lock directory exists but is
    unreadable), or ``""``."""
    root_lock_dir = ROOT_LOCK_DIR if root_lock_dir is None else root_lock_dir
    if os.geteuid() == 0 or os.path.abspath(lock_dir) == os.path.abspath(root_lock_dir):
        return ""
    try:
        os.listdir(root_lock_dir)
    except FileNotFoundError:
        return ""  # root has not run perseus here since boot
    except OSError:
        return (
            f"locks in {root_lock_dir} are not readable by this user: run as root "
            "(sudo perseus device info) to see root's owners"
        )
    return ""


def owner_status(lock_path: Path) -> tuple[int | None, int | None]:
    """``(live owner pid, dead owner pid)`` from the record in ``lock_path``."""
    found, state = recorded_owner(lock_path)
    if found is None:
        return None, None
    return (found.pid, None) if state != "gone" else (None, found.pid)


def _owner_fields(lock_path: Path, hidden: str = "") -> dict[str, Any]:
    """The :class:`DeviceInfo` fields about the owner recorded in ``lock_path`` (``hidden``:
    why no owner may show, when nothing else says)."""
    live, dead = owner_status(lock_path)
    unknown = (_lock_refused(lock_path) or hidden) if live is None and dead is None else ""
    return {
        "owner_pid": live,
        "dead_owner_pid": dead,
        "lock_path": str(lock_path),
        "owner_unknown": unknown,
    }


def _lock_refused(lock_path: Path) -> str:
    """Why ``perseus device reset`` would refuse ``lock_path`` (a FIFO, directory or link
    planted there, another user's file), or ``""``."""
    try:
        read_private(lock_path, 0)
    except ConfigError as e:
        return f"lock file refused: {e}"
    except OSError:
        return ""  # missing (free), or unreadable: told as no owner, as before
    return ""


def nvml_devices(
    nvml_module: Any = None, lock_dir: Path | None = None, root_lock_dir: Path | None = None
) -> list[DeviceInfo]:
    """Every NVIDIA GPU on this machine (``root_lock_dir``: see :func:`hidden_owners_note`).

    Raises:
        NvmlUnavailableError: no nvidia-ml-py, library or driver.
        DeviceError: another NVML failure.
    """
    infos = []
    can, why = probe_privilege()
    gpus = list_nvml_gpus(nvml_module)
    with contextlib.ExitStack() as closing:
        for gpu in gpus:
            closing.callback(gpu.close)
        locks = lock_dir or default_lock_dir()
        hidden = hidden_owners_note(locks, root_lock_dir)
        for i, gpu in enumerate(gpus):
            reason = gpu.observe_only_reason
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
                    current_clock_mhz=current,
                    detail=f"persistence mode {persistence[gpu.persistence_mode]}",
                    power_limit_w=gpu.query_w("nvmlDeviceGetPowerManagementLimit"),
                    default_power_limit_w=gpu.query_w("nvmlDeviceGetPowerManagementDefaultLimit"),
                    **_owner_fields(owner_lock_path(locks, gpu.uuid), hidden),
                )
            )
    return infos


def simulated_devices(state_dir: Path | None = None) -> list[DeviceInfo]:
    """Every simulated GPU that has state in ``state_dir`` (default ``$PERSEUS_SIM_DIR``)."""
    directory = state_dir or default_state_dir()
    infos = []
    for state in list_states(directory):
        locked = state.get("locked_mhz")
        uuid = str(state.get("uuid", ""))
        cap = state.get("power_cap_w")
        default = state.get("default_power_limit_w", cap)
        # No limit set: the board's default, as the simulator's reset restores.
        unset = state.get("power_limit_w") is None
        limit = default if unset else enforced_limit_w(state, None if cap is None else float(cap))
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
                current_clock_mhz=None,
                detail=f"{state.get('source', '')}; slowdown {float(state.get('slowdown', 1.0)):g}",
                power_limit_w=None if limit is None else float(limit),
                default_power_limit_w=None if default is None else float(default),
                **_owner_fields(owner_lock_path(directory, uuid)),
            )
        )
    return infos


def open_simulated(index: int, state_dir: Path | None = None) -> SimulatedGPU:
    """A handle on existing simulated GPU ``index`` (no op model), enough to read it, reset
    it or change its slowdown from another process.

    Raises:
        ConfigError: if no simulated GPU ``index`` exists in the state directory.
    """
    directory = state_dir or default_state_dir()
    state = next((s for s in list_states(directory) if s.get("uuid") == sim_uuid(index)), None)
    if state is None:
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
