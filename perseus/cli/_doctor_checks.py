"""The NVML probes behind ``perseus doctor``, on an open :class:`~perseus.device.nvml.NvmlGPU`:
each returns a :class:`Check` (:func:`probe` turns an exception into one)."""

from __future__ import annotations

import contextlib
import itertools
import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from perseus.cli._args import first_line
from perseus.device.clock import REAL_CLOCK, Clock
from perseus.device.nvml import NvmlGPU, probe_privilege
from perseus.device.nvml_calls import clock_event_names
from perseus.errors import DeviceError, DevicePermissionError
from perseus.identity import architecture_name

__all__ = [
    "Check",
    "check_clock_control",
    "check_clocks",
    "check_energy_counter",
    "check_identity",
    "check_memory_clock_locking",
    "check_power",
    "check_set_latency",
    "clock_range",
    "poll_counter",
    "probe",
    "spread_clocks_mhz",
]

_RESTRICTED_API_SET_APPLICATION_CLOCKS = 0
_SETTLE_S = 0.1


@dataclass
class Check:
    """One line of the doctor's report: ``status`` is ``ok``, ``warn``, ``fail`` (perseus cannot
    run for real), ``skip`` or ``unavailable`` (the probe could not run); ``data`` holds the
    figures ``--json`` prints, ``fix`` how to fix a fail or warn."""

    name: str
    status: str
    summary: str
    data: dict[str, Any] = field(default_factory=dict)
    fix: str = ""

    def as_dict(self) -> dict[str, Any]:
        head = {"name": self.name, "status": self.status, "summary": self.summary}
        return {**head, **({"fix": self.fix} if self.fix else {}), "data": self.data}


def probe(name: str, fn: Callable[[], Check]) -> Check:
    """Run one probe; any exception becomes an ``unavailable: why`` check, never a crash."""
    try:
        return fn()
    except Exception as e:
        return Check(
            name, "unavailable", f"unavailable: {first_line(e)}", {"error": type(e).__name__}
        )


def clock_range(clocks: Sequence[int]) -> str:
    """``"81 values, 1410-210 MHz, step 15"`` for a clock list, highest first."""
    if not clocks:
        return "none"
    steps = {a - b for a, b in itertools.pairwise(clocks)}
    step = f", step {steps.pop()}" if len(steps) == 1 else ""
    return f"{len(clocks)} values, {clocks[0]}-{clocks[-1]} MHz{step}"


def check_identity(gpu: NvmlGPU) -> Check:
    arch = int(gpu.query("nvmlDeviceGetArchitecture"))
    arch_name = architecture_name(arch)
    data: dict[str, Any] = {
        "name": gpu.name,
        "uuid": gpu.uuid,
        "architecture": arch_name,
        "persistence_mode": gpu.persistence_mode,
    }
    summary = f"{gpu.name}, {gpu.uuid}, {arch_name}"
    if arch < 5:
        why = " (older than Volta: no energy counter or locked clocks)"
        return Check("gpu", "fail", summary + why, data, "perseus needs a Volta or newer GPU")
    if gpu.persistence_mode is False:
        fix = "enable persistence mode (sudo nvidia-smi -pm 1) so the driver keeps clocks"
        return Check("gpu", "warn", summary + "; persistence mode off", data, fix)
    return Check("gpu", "ok", summary, data)


def check_clocks(gpu: NvmlGPU) -> Check:
    clocks = gpu.supported_clocks_mhz()
    mem = list(gpu.supported_memory_clocks_mhz())
    mem_lock = gpu.memory_clock_control()  # None: (SM, memory) clock pairs may run here
    data = {
        "sm_clocks_mhz": list(clocks),
        "count": len(clocks),
        "min_mhz": clocks[-1],
        "max_mhz": clocks[0],
        "memory_clock_mhz": mem[0],
        "memory_clocks_mhz": mem,
        "memory_clock_locking": "possible" if mem_lock is None else mem_lock,
    }
    memory = f"memory {data['memory_clock_mhz']} MHz"
    if len(mem) > 1:
        lockable = "lock tried below" if mem_lock is None else f"not lockable: {mem_lock}"
        memory = f"memory {'/'.join(map(str, mem))} MHz, {lockable}"
    return Check(
        "supported clocks",
        "ok" if len(clocks) > 1 else "fail",
        f"{clock_range(clocks)} ({memory})",
        data,
        "" if len(clocks) > 1 else "the driver offers one SM clock: nothing to choose from",
    )


_GRANT = (
    "grant the capability (docker run --cap-add SYS_ADMIN; Kubernetes "
    "securityContext.capabilities.add: [SYS_ADMIN]), or have a privileged daemon change clocks "
    "for the job (e.g. zeusd; perseus does not talk to one yet)"
)
_HOW_TO_ALLOW = "locking clocks needs root or CAP_SYS_ADMIN: run the job as root, or " + _GRANT
#: The privilege probe said yes (root, or the capability seen) and the driver still refused.
_REFUSED_THOUGH_PRIVILEGED = (
    "this process looks privileged ({why}) yet the driver refused the lock: a container without "
    "CAP_SYS_ADMIN does this to root; " + _GRANT
)


def check_clock_control(gpu: NvmlGPU, no_clock_changes: bool) -> Check:
    """Whether this process can change the GPU's clocks, from evidence: a lock at another
    clock than the one read now, whose read-back shows the clock moved, then a reset. A
    refused call names the NVML error and how to allow it."""
    allowed, why = probe_privilege()
    data: dict[str, Any] = {"privileged": allowed, "privilege": why}
    app = "unknown"
    with contextlib.suppress(Exception):
        restricted = int(
            gpu.query("nvmlDeviceGetAPIRestriction", _RESTRICTED_API_SET_APPLICATION_CLOCKS)
        )
        app = "root only" if restricted else "any user"
    data["application_clocks"] = app
    if os.environ.get("ZEUSD_SOCK_PATH"):
        data["zeusd_socket"] = os.environ["ZEUSD_SOCK_PATH"]
    app_hint = ""
    if app == "root only":
        app_hint = (
            "; application clocks (nvidia-smi -ac) are root-only here: an admin can open them "
            f"with `sudo nvidia-smi -acp UNRESTRICTED -i {gpu.uuid}` (perseus's locked clocks "
            "still need root or CAP_SYS_ADMIN)"
        )
    name = "clock locking"
    if no_clock_changes:
        word = "the privileges would allow a try" if allowed else "would NOT be allowed"
        summary = f"not tried (--no-clock-changes); {word} ({why}); application clocks: {app}"
        return Check(name, "skip", summary, data)
    if gpu.observe_only_reason is not None and allowed:
        fix = "perseus needs a Volta or newer GPU for locked clocks"
        return Check(name, "fail", f"not possible: {gpu.observe_only_reason}", data, fix)
    if not allowed:
        summary = f"not allowed: {why}; application clocks: {app}"
        return Check(name, "fail", summary, data, _HOW_TO_ALLOW + app_hint)
    return _lock_and_read_back(gpu, data, app_hint)


def _lock_and_read_back(gpu: NvmlGPU, data: dict[str, Any], app_hint: str) -> Check:
    clocks = gpu.supported_clocks_mhz()
    before = gpu.current_clock_mhz()
    target = next((c for c in spread_clocks_mhz(clocks, 3)[1:] if c != before), clocks[-1])
    data.update({"clock_before_mhz": before, "tried_mhz": target})
    name = "clock locking"
    try:
        snapped, _call_s, _seen_s, read = _lock_and_watch(gpu, target)
    except DeviceError as e:
        data["error"] = first_line(e)
        fix = _HOW_TO_ALLOW
        if isinstance(e, DevicePermissionError):
            fix = _REFUSED_THOUGH_PRIVILEGED.format(why=data["privilege"])
        return Check(name, "fail", f"lock refused: {data['error']}", data, fix + app_hint)
    finally:
        with contextlib.suppress(DeviceError):
            gpu.reset_locked_clock()
    data["read_back_mhz"] = read
    if read != snapped:
        summary = (
            f"locked {snapped} MHz but the clock read back {read} MHz (was {before} MHz): the "
            "lock did not take effect"
        )
        fix = "check that no other process or policy (DCGM, nvidia-smi -rgc) resets the clocks"
        return Check(name, "fail", summary, data, fix)
    summary = f"locked {snapped} MHz and read it back (was {before} MHz); lock reset"
    return Check(name, "ok", summary, data)


def _lock_and_watch(gpu: NvmlGPU, target_mhz: int) -> tuple[int, float, float | None, int]:
    """Lock ``target_mhz`` and read the clock back until it shows the lock, at most
    ``_SETTLE_S``: ``(snapped, call_s, seen_s, read)``; ``seen_s`` (from the call's start) is
    None when the lock was not seen."""
    t0 = REAL_CLOCK.now()
    snapped = gpu.set_locked_clock(target_mhz)
    t1 = REAL_CLOCK.now()
    while True:
        read = gpu.current_clock_mhz()
        now = REAL_CLOCK.now()
        if read == snapped:
            return snapped, t1 - t0, now - t0, read
        if now - t1 >= _SETTLE_S:
            return snapped, t1 - t0, None, read
        REAL_CLOCK.sleep(0.0005)


def check_memory_clock_locking(
    gpu: NvmlGPU, clock_locking_ok: bool, *, not_tried: str | None = None
) -> Check:
    """Whether (SM, memory) clock pairs can run here: lock the memory clock to its
    second-highest value and reset it. ``not_tried``: why clock locking was not tried, other
    than a refusal."""
    name = "memory clock locking"
    mem = gpu.supported_memory_clocks_mhz()
    data: dict[str, Any] = {"memory_clocks_mhz": list(mem)}
    why = gpu.memory_clock_control()
    if len(mem) < 2:
        return Check(name, "skip", f"one memory clock ({mem[0]} MHz): SM clocks only", data)
    if not clock_locking_ok or why is not None:
        return Check(
            name, "skip", f"not tried ({why or not_tried or 'clock locking not allowed'})", data
        )
    try:
        applied = gpu.set_memory_locked_clock(mem[1])
    except DeviceError as e:
        data["error"] = type(e).__name__
        fix = "plan with SM clocks only on this GPU (a profile without mem_freq_mhz)"
        return Check(name, "warn", f"the driver refused a memory lock: {first_line(e)}", data, fix)
    finally:
        with contextlib.suppress(DeviceError):
            gpu.reset_memory_locked_clock()
    data["tried_mhz"] = applied
    return Check(name, "ok", f"locked {applied} MHz and reset: clock pairs can run here", data)


def spread_clocks_mhz(clocks: Sequence[int], count: int) -> list[int]:
    """``count`` clocks spread from the highest down to about half of it."""
    top = clocks[0]
    usable = [c for c in clocks if c >= top // 2] or list(clocks)
    if count <= 1:
        return [top]
    picks = [usable[round(i * (len(usable) - 1) / (count - 1))] for i in range(count)]
    return list(dict.fromkeys(picks))


def check_set_latency(gpu: NvmlGPU, repeats: int = 6) -> Check:
    """Time ``nvmlDeviceSetGpuLockedClocks`` and how long until NVML reads the clock back."""
    clocks = gpu.supported_clocks_mhz()
    pair = spread_clocks_mhz(clocks, 3)[1:] or [clocks[0]]
    calls_ms: list[float] = []
    applied_ms: list[float] = []
    try:
        for i in range(repeats):
            _snapped, call_s, seen_s, _read = _lock_and_watch(gpu, pair[i % len(pair)])
            calls_ms.append(call_s * 1e3)
            if seen_s is not None:
                applied_ms.append(seen_s * 1e3)
    finally:
        gpu.reset_locked_clock()
    call = {"median": statistics.median(calls_ms), "max": max(calls_ms)}
    applied = (
        {"median": statistics.median(applied_ms), "max": max(applied_ms)} if applied_ms else None
    )
    data: dict[str, Any] = {
        "clocks_mhz": pair,
        "set_call_ms": call,
        "applied_ms": applied,
        "not_seen_within_ms": _SETTLE_S * 1e3 if len(applied_ms) < len(calls_ms) else None,
        "samples": len(calls_ms),
    }
    summary = f"set call median {call['median']:.2f} ms (max {call['max']:.2f}); "
    if applied:
        summary += (
            f"clock read back after median {applied['median']:.2f} ms "
            f"({len(applied_ms)}/{len(calls_ms)} seen)"
        )
    else:
        summary += (
            f"clock never read back within {_SETTLE_S * 1e3:.0f} ms (an idle GPU may sit below "
            "the lock)"
        )
    status = "warn" if max(calls_ms) > 50 else "ok"
    return Check("set latency", status, summary + "; lock reset", data)


def check_energy_counter(gpu: NvmlGPU, window_s: float) -> Check:
    """Poll the energy counter for ``window_s``: smallest step and interval between changes."""
    first, publishes, reads = poll_counter(gpu.energy_mj, window_s, poll_s=0.0002)
    values = [first] + [v for _, v in publishes]
    changes = [(t, v - last) for (t, v), last in zip(publishes, values, strict=False)]
    steps = [d for _, d in changes if d > 0]
    intervals = [(b[0] - a[0]) * 1e3 for a, b in itertools.pairwise(changes)]
    data: dict[str, Any] = {
        "window_s": window_s,
        "reads": reads,
        "updates": len(changes),
        "smallest_step_mj": min(steps) if steps else None,
        "median_interval_ms": statistics.median(intervals) if intervals else None,
    }
    if len(changes) < 2:
        return Check(
            "energy counter",
            "fail" if not changes else "warn",
            f"changed {len(changes)} times in {window_s:g} s of polling ({reads} reads)",
            data,
            "perseus measures energy from this counter (Volta+); poll longer with "
            "--energy-window-s if the GPU is idle and the counter is coarse",
        )
    summary = (
        f"updates every {data['median_interval_ms']:.1f} ms (median of {len(intervals)}), "
        f"smallest step {data['smallest_step_mj']} mJ"
    )
    return Check("energy counter", "ok", summary, data)


def poll_counter(
    read_energy_mj: Callable[[], int],
    window_s: float,
    *,
    busy: Callable[[], None] | None = None,
    clock: Clock = REAL_CLOCK,
    poll_s: float = 0.002,
) -> tuple[int, list[tuple[float, int]], int]:
    """Read an energy counter every ``poll_s`` for ``window_s`` (calling ``busy`` before each
    read): the first value, each change as ``(time, new value)``, and how many reads."""
    if busy is not None:
        busy()
    first = last = read_energy_mj()
    end = clock.now() + window_s
    publishes: list[tuple[float, int]] = []
    reads = 1
    while True:
        if busy is not None:
            busy()
        value, at = read_energy_mj(), clock.now()
        reads += 1
        if value != last:
            publishes.append((at, value))
            last = value
        if at >= end:
            return first, publishes, reads
        clock.sleep(poll_s)


def check_power(gpu: NvmlGPU) -> Check:
    data: dict[str, Any] = {"power_w": round(gpu.power_w(), 1)}
    for key, function in (
        ("power_limit_w", "nvmlDeviceGetPowerManagementLimit"),
        ("default_power_limit_w", "nvmlDeviceGetPowerManagementDefaultLimit"),
        ("enforced_power_limit_w", "nvmlDeviceGetEnforcedPowerLimit"),
    ):
        figure = gpu.query_w(function)
        if figure is not None:
            data[key] = figure
    reasons: tuple[str, ...] = ()
    with contextlib.suppress(Exception):
        reasons = clock_event_names(gpu.clock_event_reasons())
    data["clock_event_reasons"] = list(reasons)
    limit = data.get("enforced_power_limit_w", data.get("power_limit_w"))
    summary = f"drawing {data['power_w']:g} W"
    if limit is not None:
        summary += f", cap {limit:g} W"
    if data.get("default_power_limit_w") not in (None, limit):
        summary += f" (default {data['default_power_limit_w']:g} W)"
    summary += f"; clock event reasons now: {', '.join(reasons) or 'none'}"
    return Check("power", "ok", summary, data)
