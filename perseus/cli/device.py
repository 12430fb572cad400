"""``perseus device``: list GPUs (real or simulated), reset a lock, slow a simulated GPU down.

``perseus device info`` shows each GPU's clocks, whether this process may lock them, the
current lock and its owner. Without an NVIDIA driver it says so in one line and lists the
simulated GPUs in the state directory and the presets.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path
from typing import Any

from perseus.cli._args import float_arg
from perseus.device.discovery import (
    DeviceInfo,
    nvml_devices,
    open_simulated,
    simulated_devices,
)
from perseus.device.nvml import NvmlGPU, NvmlUnavailableError
from perseus.device.presets import PRESETS
from perseus.device.sim_state import default_state_dir
from perseus.errors import ConfigError

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("device", help="list GPUs, their clocks, locks and owners")
    p.add_argument(
        "--sim-dir",
        type=Path,
        default=None,
        help="simulated GPUs' state directory (default: $PERSEUS_SIM_DIR or a per-user temp dir)",
    )
    actions = p.add_subparsers(dest="device_command", metavar="ACTION")
    actions.required = True
    info = actions.add_parser("info", help="list GPUs (real and simulated)")
    info.set_defaults(handler=run)
    reset = actions.add_parser("reset", help="remove a GPU's clock lock (e.g. after a crash)")
    target = reset.add_mutually_exclusive_group(required=True)
    target.add_argument("--sim", type=int, metavar="INDEX", help="a simulated GPU")
    target.add_argument("--uuid", help="a real GPU, by UUID (needs root or CAP_SYS_ADMIN)")
    reset.set_defaults(handler=run)
    slow = actions.add_parser(
        "slowdown", help="make a simulated GPU's ops take FACTOR times longer (a straggler)"
    )
    slow.add_argument("index", type=int, help="simulated GPU index")
    slow.add_argument(
        "factor",
        type=float_arg(ge=0.001, le=1000),
        help="time multiplier, 1 = normal (0.001 to 1000)",
    )
    slow.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    command = args.device_command
    if command == "info":
        return _info(args.sim_dir)
    if command == "reset":
        if args.sim is not None:
            open_simulated(args.sim, args.sim_dir).reset_locked_clock()
            print(f"simulated GPU {args.sim}: lock removed")
        else:
            with NvmlGPU(args.uuid) as gpu:
                gpu.reset_locked_clock()
            print(f"{args.uuid}: lock removed")
        return 0
    if command == "slowdown":
        if not args.factor > 0:
            raise ConfigError(f"slowdown FACTOR must be > 0, got {args.factor}")
        open_simulated(args.index, args.sim_dir).set_slowdown(args.factor)
        print(f"simulated GPU {args.index}: slowdown {args.factor:g}")
        return 0
    raise ConfigError(f"unknown device action {command!r}")  # argparse prevents this


def _clock_range(clocks: tuple[int, ...]) -> str:
    if not clocks:
        return "none"
    steps = {a - b for a, b in itertools.pairwise(clocks)}
    step = f", step {steps.pop()}" if len(steps) == 1 else ""
    return f"{len(clocks)} values, {clocks[0]}-{clocks[-1]} MHz{step}"


def _show(info: DeviceInfo) -> None:
    lock = (
        "unknown to other processes (NVML cannot read locks back)"
        if not info.lock_known
        else ("none" if info.locked_mhz is None else f"{info.locked_mhz} MHz")
    )
    owner = "none" if info.owner_pid is None else f"pid {info.owner_pid}"
    control = "can lock clocks" if info.can_lock else "observe-only"
    print(f"  [{info.index}] {info.name}  {info.uuid}")
    print(f"      clocks: {_clock_range(info.clocks_mhz)}")
    print(f"      privilege: {control} ({info.privilege})")
    now = "" if info.current_clock_mhz is None else f"; now {info.current_clock_mhz} MHz"
    print(f"      lock: {lock}; owner: {owner}{now}")
    if info.detail:
        print(f"      {info.detail}")


def _info(sim_dir: Path | None) -> int:
    try:
        real = nvml_devices()
    except NvmlUnavailableError:
        print("no NVIDIA driver found; showing simulated GPUs")
        real = None
    except Exception as e:  # any probe failure: one line, never a traceback
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"NVML failed ({first}); showing simulated GPUs")
        real = None
    if real is not None:
        print(f"NVIDIA GPUs ({len(real)}):")
        for info in real:
            _show(info)
    directory = sim_dir or default_state_dir()
    sims = simulated_devices(directory)
    print(f"simulated GPUs in {directory} ({len(sims)}):")
    if not sims:
        print("  none yet; one appears when a process first uses SimulatedGPU(index=...)")
    for info in sims:
        _show(info)
    presets = ", ".join(
        f"{p.key} ({p.name}{', estimated' if p.estimated else ''})" for p in PRESETS.values()
    )
    print(f"simulator presets: {presets}")
    return 0
