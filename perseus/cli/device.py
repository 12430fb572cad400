"""``perseus device``: list GPUs (real or simulated) with their clocks, locks, power limits and
owners; reset a lock and power limit after a crash; slow a simulated GPU down."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perseus.cli._args import add_command, first_line, float_arg, nonempty_arg
from perseus.errors import ConfigError

if TYPE_CHECKING:  # heavy modules load when the command runs, not for --help
    from perseus.device.discovery import DeviceInfo

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("device", help="list GPUs, their clocks, locks and owners")
    p.add_argument(
        "--sim-dir",
        type=lambda text: Path(nonempty_arg(text)),
        help="simulated GPUs' state directory (default: $PERSEUS_SIM_DIR or a per-user temp dir)",
    )
    actions = p.add_subparsers(dest="device_command", metavar="ACTION", required=True)
    add_command(actions, "info", _info, "list GPUs (real and simulated)")
    reset = add_command(
        actions,
        "reset",
        _reset,
        "remove a GPU's clock lock and restore its default power limit (after a crash)",
    )
    target = reset.add_mutually_exclusive_group(required=True)
    target.add_argument("--sim", type=int, metavar="INDEX", help="a simulated GPU")
    target.add_argument(
        "--uuid", type=nonempty_arg, help="a real GPU, by UUID (needs root or CAP_SYS_ADMIN)"
    )
    reset.add_argument(
        "--force",
        action="store_true",
        help="reset although the recorded owner is in another PID namespace (a container) "
        "and cannot be checked from here; only when you know it is gone",
    )
    slow = add_command(
        actions,
        "slowdown",
        _slowdown,
        "make a simulated GPU's ops take FACTOR times longer (a straggler)",
    )
    slow.add_argument("index", type=int, help="simulated GPU index")
    slow.add_argument(
        "factor",
        type=float_arg(ge=0.001, le=1000),
        help="time multiplier, 1 = normal (0.001 to 1000)",
    )


def _slowdown(args: argparse.Namespace) -> int:
    from perseus.device.discovery import open_simulated

    open_simulated(args.index, args.sim_dir).set_slowdown(args.factor)
    print(f"simulated GPU {args.index}: slowdown {args.factor:g}")
    return 0


def _reset(args: argparse.Namespace) -> int:
    from perseus.device.discovery import hidden_owners_note, open_simulated
    from perseus.device.nvml import NvmlGPU
    from perseus.device.ownership import default_lock_dir, reset_from_spec

    if args.sim is not None:
        sim = open_simulated(args.sim, args.sim_dir)
        what, locked = f"simulated GPU {args.sim}", sim.locked_clock_mhz()
        done = _reset_owned(
            what, sim.owner_lock_path(), lambda: reset_from_spec(sim.watchdog_spec()), args.force
        )
        print(_said(what, locked, done))
        return 0
    hidden = hidden_owners_note(default_lock_dir())
    if hidden:  # root's agent may own it: resetting would pull clocks from under it
        raise ConfigError(f"GPU {args.uuid}: cannot tell whether root's agent owns it: {hidden}")
    with NvmlGPU(args.uuid) as gpu:

        def reset_nvml() -> dict[str, Any]:
            before_w = gpu.query_w("nvmlDeviceGetPowerManagementLimit")
            gpu.reset_locked_clock()
            gpu.reset_power_limit()
            after_w = gpu.query_w("nvmlDeviceGetPowerManagementLimit")
            changed = before_w is not None and before_w != after_w
            return {"power_limit_w": (before_w, after_w)} if changed else {}

        done = _reset_owned(args.uuid, gpu.owner_lock_path(), reset_nvml, args.force)
    print(_said(args.uuid, None, done))
    return 0


def _reset_owned(what: str, lock_path: Path, reset: Any, force: bool) -> dict[str, Any]:
    """Run ``reset`` unless a live process owns the GPU (holds the lock, or is recorded in the
    file); clear a dead owner's record. An owner in another PID namespace needs ``force``."""
    from perseus.device.ownership import acquire_owner_lock, recorded_owner, release_owner_lock

    fd, owner, dead = acquire_owner_lock(lock_path, record=False, take_unverifiable=force)
    if fd is None and owner != os.getpid():
        found, state = recorded_owner(lock_path)
        if state == "unknown" and found is not None:
            raise ConfigError(
                f"{what} is recorded as owned by pid {owner} of another PID namespace "
                f"({found.namespace}; a container's process) in {lock_path}: this namespace "
                "cannot tell whether it still runs; stop that job, or, if you know it is gone, "
                "run again with --force"
            )
        if state != "gone":  # no record (emptied by hand): the lock's holder still runs
            who = "a running process" if owner is None else f"the running process {owner}"
            raise ConfigError(
                f"{what} is owned by {who} (lock {lock_path}); stop it "
                "first: it resets the GPU when it exits"
            )
    try:
        done: dict[str, Any] = dict(reset())
        if dead is not None:
            done["dead_owner_pid"] = dead
    finally:
        if fd is not None:
            release_owner_lock(fd, lock_path)  # truncates: no longer orphaned
    return done


def _said(what: str, locked_mhz: int | None, done: dict[str, Any]) -> str:
    parts = ["clock lock removed" if locked_mhz is None else f"clock lock {locked_mhz} MHz removed"]
    if "power_limit_w" in done:
        before_w, after_w = done["power_limit_w"]
        default = "the default" if after_w is None else f"the default {after_w:g} W"
        parts.append(f"power limit {before_w:g} W restored to {default}")
    else:
        parts.append("power limit already at its default")
    if "dead_owner_pid" in done:
        parts.append(f"dead owner pid {done['dead_owner_pid']}'s record cleared")
    return f"{what}: " + "; ".join(parts)


def _show(info: DeviceInfo) -> None:
    from perseus.cli._doctor_checks import clock_range

    lock = (
        "unknown to other processes (NVML cannot read locks back)"
        if not info.lock_known
        else ("none" if info.locked_mhz is None else f"{info.locked_mhz} MHz")
    )
    target = f"--sim {info.index}" if info.backend == "sim" else f"--uuid {info.uuid}"
    if info.owner_pid is not None:
        owner = f"pid {info.owner_pid} (alive)"
    elif info.dead_owner_pid is not None:
        owner = f"pid {info.dead_owner_pid} (dead); orphaned: run `perseus device reset {target}`"
    elif info.owner_unknown:
        owner = f"unknown: {info.owner_unknown}"
    else:
        owner = "none"
        if _off_defaults(info):  # changed by a process that is gone (or never owned it)
            owner += f"; not at its defaults: run `perseus device reset {target}`"
    control = "can lock clocks" if info.can_lock else "observe-only"
    print(f"  [{info.index}] {info.name}  {info.uuid}")
    print(f"      clocks: {clock_range(info.clocks_mhz)}")
    print(f"      privilege: {control} ({info.privilege})")
    now = "" if info.current_clock_mhz is None else f"; now {info.current_clock_mhz} MHz"
    print(f"      lock: {lock}; owner: {owner}{now}")
    print(f"      power limit: {_power(info.power_limit_w, info.default_power_limit_w)}")
    if info.lock_path:
        print(f"      lock file: {info.lock_path}")
    if info.detail:
        print(f"      {info.detail}")


def _off_defaults(info: DeviceInfo) -> bool:
    """Whether the GPU is known to be away from its default clocks or power limit."""
    locked = info.lock_known and info.locked_mhz is not None
    limit, default = info.power_limit_w, info.default_power_limit_w
    lowered = limit is not None and default is not None and abs(limit - default) > 1e-6
    return locked or lowered


def _power(limit_w: float | None, default_w: float | None) -> str:
    if limit_w is None:
        return "unknown"
    if default_w is None:
        return f"{limit_w:g} W (default unknown)"
    if abs(limit_w - default_w) < 1e-6:
        return f"{limit_w:g} W (the default)"
    return f"{limit_w:g} W (default {default_w:g} W)"


def _info(args: argparse.Namespace) -> int:
    from perseus.device.discovery import nvml_devices, simulated_devices
    from perseus.device.nvml import NvmlUnavailableError
    from perseus.device.presets import PRESETS
    from perseus.device.sim_state import default_state_dir

    directory = args.sim_dir or default_state_dir()
    unreadable = ""
    try:
        sims = simulated_devices(directory)  # a refused directory: one line before any output
    except ConfigError as e:
        if "not readable by this user" not in str(e):
            raise
        sims, unreadable = [], str(e)
    try:
        real = nvml_devices()
    except NvmlUnavailableError:
        print("no NVIDIA driver found; showing simulated GPUs")
        real = None
    except Exception as e:  # any probe failure: one line, never a traceback
        print(f"NVML failed ({first_line(e)}); showing simulated GPUs")
        real = None
    if real is not None:
        print(f"NVIDIA GPUs ({len(real)}):")
        for info in real:
            _show(info)
    print(unreadable or f"simulated GPUs in {directory} ({len(sims)}):")
    if not sims and not unreadable:
        print("  none yet; one appears when a process first uses SimulatedGPU(index=...)")
    for info in sims:
        _show(info)
    presets = ", ".join(
        f"{p.key} ({p.name}{', estimated' if p.estimated else ''})" for p in PRESETS.values()
    )
    print(f"simulator presets: {presets}")
    return 0
