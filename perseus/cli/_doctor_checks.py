"""The probes behind ``perseus doctor``: each returns a :class:`Check`, none ever raises.

NVML probes work on an open :class:`~perseus.device.nvml.NvmlGPU` (real ``pynvml`` or the tests'
fake). The CUDA check runs a transformer block's forward and backward through the real agent
path (:class:`~perseus.runtime.agent.rank_agent.RankAgent` on the NVML GPU), with a sampler thread
reading the SM clock and the clock event reasons from NVML while the ops run, and CUDA events
timing the ops on the device. Without a GPU, :func:`check_simulated` runs the same agent on a
simulated GPU.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import statistics
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from perseus.device.base import GPU, ObserveOnlyWarning
from perseus.device.nvml import LIMITING_REASONS, NvmlGPU, clock_event_names, probe_privilege
from perseus.errors import DeviceError
from perseus.plan import Baseline, Frontier, JobSpec, PlanPoint

__all__ = [
    "ARCHITECTURES",
    "Check",
    "check_clock_control",
    "check_clocks",
    "check_cuda",
    "check_energy_counter",
    "check_identity",
    "check_memory_clock_locking",
    "check_power",
    "check_set_latency",
    "check_simulated",
    "cuda_device_for",
    "probe",
]

ARCHITECTURES = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada",
    9: "Hopper",
    10: "Blackwell",
    13: "Rubin",
}
_RESTRICTED_API_SET_APPLICATION_CLOCKS = 0
_CLOCK_SM = 1


@dataclass
class Check:
    """One line of the doctor's report.

    Attributes:
        name: What was checked (``"clock locking"``).
        status: ``ok``, ``warn``, ``fail`` (perseus cannot run for real), ``skip`` (not run,
            by request or because an earlier check failed) or ``unavailable`` (the probe
            itself could not run; ``summary`` says why).
        summary: One line for people.
        data: Machine-readable figures (``--json``).
        fix: How to fix a ``fail``/``warn`` (empty when nothing to do).
    """

    name: str
    status: str
    summary: str
    data: dict[str, Any] = field(default_factory=dict)
    fix: str = ""

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "status": self.status, "summary": self.summary}
        if self.fix:
            out["fix"] = self.fix
        out["data"] = self.data
        return out


def probe(name: str, fn: Callable[[], Check]) -> Check:
    """Run one probe; any exception becomes an ``unavailable: why`` check, never a crash."""
    try:
        return fn()
    except Exception as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        return Check(name, "unavailable", f"unavailable: {why}", {"error": type(e).__name__})


def _mhz_range(clocks: Sequence[int]) -> str:
    steps = {a - b for a, b in itertools.pairwise(clocks)}
    step = f", step {steps.pop()} MHz" if len(steps) == 1 else ""
    return f"{len(clocks)} clocks, {clocks[-1]}-{clocks[0]} MHz{step}"


# ---------------------------------------------------------------------------------------------
# NVML probes


def check_identity(gpu: NvmlGPU) -> Check:
    arch = int(gpu.query("nvmlDeviceGetArchitecture"))
    arch_name = ARCHITECTURES.get(arch, f"unknown ({arch})")
    data: dict[str, Any] = {
        "name": gpu.name,
        "uuid": gpu.uuid,
        "architecture": arch_name,
        "persistence_mode": gpu.persistence_mode,
    }
    summary = f"{gpu.name}, {gpu.uuid}, {arch_name}"
    if arch < 5:
        return Check(
            "gpu",
            "fail",
            summary + " (older than Volta: no energy counter or locked clocks)",
            data,
            "perseus needs a Volta or newer GPU",
        )
    if gpu.persistence_mode is False:
        return Check(
            "gpu",
            "warn",
            summary + "; persistence mode off",
            data,
            "enable persistence mode (sudo nvidia-smi -pm 1) so the driver keeps clocks",
        )
    return Check("gpu", "ok", summary, data)


def check_clocks(gpu: NvmlGPU) -> Check:
    clocks = gpu.supported_clocks_mhz()
    mem = sorted({int(m) for m in gpu.query("nvmlDeviceGetSupportedMemoryClocks")}, reverse=True)
    # Whether plans may use (SM, memory) clock pairs here (GDDR boards, Ampere and newer).
    mem_lock = gpu.memory_clock_control()
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
        # Whether a lock works is shown by trying one (the memory clock locking check).
        lockable = "lock tried below" if mem_lock is None else f"not lockable: {mem_lock}"
        memory = f"memory {'/'.join(map(str, mem))} MHz, {lockable}"
    return Check(
        "supported clocks",
        "ok" if len(clocks) > 1 else "fail",
        f"{_mhz_range(clocks)} ({memory})",
        data,
        "" if len(clocks) > 1 else "the driver offers one SM clock: nothing to choose from",
    )


_HOW_TO_ALLOW = (
    "locking clocks needs root or CAP_SYS_ADMIN: run the job as root, or grant the capability "
    "(docker run --cap-add SYS_ADMIN; Kubernetes securityContext.capabilities.add: "
    "[SYS_ADMIN]), or have a privileged daemon change clocks for the job (e.g. zeusd; perseus "
    "does not talk to one yet)"
)


def check_clock_control(gpu: NvmlGPU, no_clock_changes: bool, settle_s: float = 0.1) -> Check:
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
    if no_clock_changes:
        word = "the privileges would allow a try" if allowed else "would NOT be allowed"
        return Check(
            "clock locking",
            "skip",
            f"not tried (--no-clock-changes); {word} ({why}); application clocks: {app}",
            data,
        )
    if gpu.observe_only_reason is not None and allowed:
        return Check(
            "clock locking",
            "fail",
            f"not possible: {gpu.observe_only_reason}",
            data,
            "perseus needs a Volta or newer GPU for locked clocks",
        )
    if not allowed:
        return Check(
            "clock locking",
            "fail",
            f"not allowed: {why}; application clocks: {app}",
            data,
            _HOW_TO_ALLOW + app_hint,
        )
    return _lock_and_read_back(gpu, data, settle_s, app_hint)


def _lock_and_read_back(
    gpu: NvmlGPU, data: dict[str, Any], settle_s: float, app_hint: str
) -> Check:
    clocks = gpu.supported_clocks_mhz()
    before = gpu.current_clock_mhz()
    target = next((c for c in _targets(clocks, 3)[1:] if c != before), clocks[-1])
    data.update({"clock_before_mhz": before, "tried_mhz": target})
    read: int | None = None
    try:
        snapped = gpu.set_locked_clock(target)
        deadline = time.perf_counter() + settle_s
        while True:
            read = gpu.current_clock_mhz()
            if read == snapped or time.perf_counter() >= deadline:
                break
            time.sleep(0.0005)
    except DeviceError as e:
        error = str(e).splitlines()[0]
        data["error"] = error
        return Check(
            "clock locking", "fail", f"lock refused: {error}", data, _HOW_TO_ALLOW + app_hint
        )
    finally:
        with contextlib.suppress(DeviceError):
            gpu.reset_locked_clock()
    data["read_back_mhz"] = read
    if read != snapped:
        return Check(
            "clock locking",
            "fail",
            f"locked {snapped} MHz but the clock read back {read} MHz (was {before} MHz): the "
            "lock did not take effect",
            data,
            "check that no other process or policy (DCGM, nvidia-smi -rgc) resets the clocks",
        )
    return Check(
        "clock locking",
        "ok",
        f"locked {snapped} MHz and read it back (was {before} MHz); lock reset",
        data,
    )


def check_memory_clock_locking(gpu: NvmlGPU, clock_locking_ok: bool) -> Check:
    """Lock the memory clock to its second-highest value and reset it (only when clock locking
    is allowed and the GPU lists several memory clocks): whether plans with (SM, memory)
    clock pairs can run here."""
    name = "memory clock locking"
    mem = gpu.supported_memory_clocks_mhz()
    data: dict[str, Any] = {"memory_clocks_mhz": list(mem)}
    why = gpu.memory_clock_control()
    if len(mem) < 2:
        return Check(name, "skip", f"one memory clock ({mem[0]} MHz): SM clocks only", data)
    if not clock_locking_ok or why is not None:
        reason = why or "clock locking not allowed"
        return Check(name, "skip", f"not tried ({reason})", data)
    try:
        applied = gpu.set_memory_locked_clock(mem[1])
    except DeviceError as e:
        data["error"] = type(e).__name__
        return Check(
            name,
            "warn",
            f"the driver refused a memory lock: {str(e).splitlines()[0]}",
            data,
            "plan with SM clocks only on this GPU (a profile without mem_freq_mhz)",
        )
    finally:
        with contextlib.suppress(DeviceError):
            gpu.reset_memory_locked_clock()
    data["tried_mhz"] = applied
    return Check(name, "ok", f"locked {applied} MHz and reset: clock pairs can run here", data)


def _targets(clocks: Sequence[int], count: int) -> list[int]:
    """``count`` clocks spread from the highest down to about half of it."""
    top = clocks[0]
    usable = [c for c in clocks if c >= top // 2] or list(clocks)
    if count <= 1:
        return [top]
    picks = [usable[round(i * (len(usable) - 1) / (count - 1))] for i in range(count)]
    return list(dict.fromkeys(picks))


def check_set_latency(gpu: NvmlGPU, repeats: int = 6, settle_s: float = 0.1) -> Check:
    """Time ``nvmlDeviceSetGpuLockedClocks`` and how long until NVML reads the clock back."""
    clocks = gpu.supported_clocks_mhz()
    pair = _targets(clocks, 3)[1:] or [clocks[0]]
    calls_ms: list[float] = []
    applied_ms: list[float] = []
    unseen = 0
    try:
        for i in range(repeats):
            target = pair[i % len(pair)]
            t0 = time.perf_counter()
            snapped = gpu.set_locked_clock(target)
            t1 = time.perf_counter()
            calls_ms.append((t1 - t0) * 1e3)
            while time.perf_counter() - t1 < settle_s:
                if gpu.current_clock_mhz() == snapped:
                    applied_ms.append((time.perf_counter() - t0) * 1e3)
                    break
                time.sleep(0.0005)
            else:
                unseen += 1
    finally:
        gpu.reset_locked_clock()
    data: dict[str, Any] = {
        "clocks_mhz": pair,
        "set_call_ms": {"median": statistics.median(calls_ms), "max": max(calls_ms)},
        "applied_ms": (
            {"median": statistics.median(applied_ms), "max": max(applied_ms)}
            if applied_ms
            else None
        ),
        "not_seen_within_ms": settle_s * 1e3 if unseen else None,
        "samples": len(calls_ms),
    }
    summary = (
        f"set call median {data['set_call_ms']['median']:.2f} ms (max "
        f"{data['set_call_ms']['max']:.2f}); "
    )
    if applied_ms:
        summary += (
            f"clock read back after median {data['applied_ms']['median']:.2f} ms "
            f"({len(applied_ms)}/{len(calls_ms)} seen)"
        )
    else:
        summary += f"clock never read back within {settle_s * 1e3:.0f} ms (an idle GPU may sit below the lock)"
    status = "warn" if max(calls_ms) > 50 else "ok"
    return Check("set latency", status, summary + "; lock reset", data)


def check_energy_counter(gpu: NvmlGPU, window_s: float) -> Check:
    """Poll the energy counter for ``window_s``: smallest step and interval between changes."""
    changes: list[tuple[float, int]] = []
    t_end = time.perf_counter() + window_s
    last = gpu.energy_mj()
    reads = 1
    while time.perf_counter() < t_end:
        value = gpu.energy_mj()
        reads += 1
        if value != last:
            changes.append((time.perf_counter(), value - last))
            last = value
        time.sleep(0.0002)
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
    return Check(
        "energy counter",
        "ok",
        f"updates every {data['median_interval_ms']:.1f} ms (median of {len(intervals)}), "
        f"smallest step {data['smallest_step_mj']} mJ",
        data,
    )


def check_power(gpu: NvmlGPU) -> Check:
    data: dict[str, Any] = {"power_w": round(gpu.power_w(), 1)}
    for key, function in (
        ("power_limit_w", "nvmlDeviceGetPowerManagementLimit"),
        ("default_power_limit_w", "nvmlDeviceGetPowerManagementDefaultLimit"),
        ("enforced_power_limit_w", "nvmlDeviceGetEnforcedPowerLimit"),
    ):
        with contextlib.suppress(Exception):
            data[key] = int(gpu.query(function)) / 1000.0
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


# ---------------------------------------------------------------------------------------------
# The agent path


def _plan(freq_mhz: int) -> Frontier:
    """A one-rank plan with one forward and one backward, both at ``freq_mhz``."""
    job = JobSpec(
        schedule="1f1b",
        ranks=1,
        stages=1,
        microbatches=1,
        blocking_power_w=0.0,
        profile_sha256="0" * 64,
    )
    point = PlanPoint(time_s=1.0, energy_j=1.0, freqs_mhz=((freq_mhz, freq_mhz),))
    return Frontier(
        job=job,
        stage_ops=(("F0", "B0"),),
        baseline=Baseline(time_s=1.0, energy_j=1.0),
        points=(point,),
    )


class _Sampler:
    """A thread reading the SM clock (and clock event reasons) while an op is marked running."""

    def __init__(self, read_clock: Callable[[], int], read_reasons: Callable[[], int] | None):
        self._read_clock = read_clock
        self._read_reasons = read_reasons
        self._op: str | None = None
        self.samples: dict[str, list[tuple[int, int]]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="perseus-doctor-sampler")

    def __enter__(self) -> _Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def mark(self, op: str | None) -> None:
        self._op = op

    def _run(self) -> None:
        while not self._stop.is_set():
            op = self._op
            if op is not None:
                try:
                    clock = int(self._read_clock())
                    reasons = int(self._read_reasons()) if self._read_reasons else 0
                except Exception:
                    self._read_reasons = None  # keep sampling the clock
                    continue
                if self._op == op:
                    self.samples.setdefault(op, []).append((clock, reasons))
            time.sleep(0.0005)


def _transformer(torch: Any, device: Any) -> tuple[Any, Any]:
    block = torch.nn.TransformerEncoderLayer(
        d_model=2048,
        nhead=16,
        dim_feedforward=8192,
        batch_first=True,
        device=device,
        dtype=torch.bfloat16,
    )
    return block, torch.randn(4, 1024, 2048, device=device, dtype=torch.bfloat16)


def cuda_device_for(torch: Any, gpu: NvmlGPU) -> int:
    """The CUDA index of the NVML GPU (by UUID), or 0 when the UUIDs cannot be compared."""
    want = gpu.uuid.removeprefix("GPU-").lower()
    for k in range(torch.cuda.device_count()):
        with contextlib.suppress(Exception):
            if str(torch.cuda.get_device_properties(k).uuid).lower() == want:
                return k
    return 0


def check_cuda(
    gpu: NvmlGPU, control: bool, clocks: int = 3, iterations: int = 5, lock_dir: str | None = None
) -> Check:
    """A transformer block's forward/backward through the agent at a few clocks (or, without
    control, at whatever clock the GPU runs), with the SM clock sampled during each op."""
    try:
        import torch
    except ImportError:
        return Check(
            "cuda check",
            "fail",
            "torch is not installed",
            {},
            "pip install torch (a CUDA build) to run pipelines with perseus",
        )
    if not torch.cuda.is_available():
        return Check(
            "cuda check",
            "fail",
            f"torch {torch.__version__} sees no CUDA device",
            {"torch": torch.__version__},
            "install a CUDA build of torch that matches the driver",
        )
    from perseus.runtime.agent.rank_agent import RankAgent

    index = cuda_device_for(torch, gpu)
    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    block, x = _transformer(torch, device)
    x.requires_grad_(True)

    def fwd_bwd() -> None:
        block(x).float().square().mean().backward()

    for _ in range(3):  # warm up kernels and the allocator
        fwd_bwd()
    torch.cuda.synchronize(device)
    targets: list[int | None] = (
        list(_targets(gpu.supported_clocks_mhz(), clocks)) if control else [None]
    )
    sampler = _Sampler(gpu.current_clock_mhz, gpu.clock_event_reasons)
    new_event: Callable[..., Any] = torch.cuda.Event
    rows: list[dict[str, Any]] = []
    with sampler, warnings.catch_warnings():
        warnings.simplefilter("ignore", ObserveOnlyWarning)
        for target in targets:
            plan = _plan(target if target is not None else gpu.supported_clocks_mhz()[0])
            times: dict[str, list[float]] = {"F": [], "B": []}
            with RankAgent(plan, gpu, rank=0, enabled=control) as agent:
                for it in range(iterations + 1):
                    agent.step_begin()
                    agent.wait_for_clock()
                    out = None
                    for op in ("F", "B"):
                        start = new_event(enable_timing=True)
                        end = new_event(enable_timing=True)
                        label = f"{target}:{op}" if it else None  # iteration 0 warms the clock
                        sampler.mark(label)
                        with agent.op(op, 0):
                            start.record()
                            if op == "F":
                                out = block(x).float().square().mean()
                            else:
                                assert out is not None
                                out.backward()
                            end.record()
                            end.synchronize()
                        sampler.mark(None)
                        if it:
                            times[op].append(start.elapsed_time(end))
                    agent.step_end()
            row: dict[str, Any] = {"requested_mhz": target}
            for op in ("F", "B"):
                samples = sampler.samples.get(f"{target}:{op}", [])
                read = [c for c, _ in samples]
                seen = sorted({n for _, r in samples for n in clock_event_names(r)})
                row[op] = {
                    "time_ms_median": statistics.median(times[op]),
                    "sm_clock_mhz_median": statistics.median(read) if read else None,
                    "sm_clock_mhz_min": min(read) if read else None,
                    "sm_clock_mhz_max": max(read) if read else None,
                    "samples": len(read),
                    "clock_event_reasons": seen,
                }
            rows.append(row)
    pulled, wrong = _compare_clocks(rows)
    parts = []
    for r in rows:
        want = "current clock" if r["requested_mhz"] is None else f"{r['requested_mhz']} MHz"
        f, b = r["F"], r["B"]
        parts.append(
            f"{want}: F {f['time_ms_median']:.2f} ms @ {f['sm_clock_mhz_median'] or '?'} MHz, "
            f"B {b['time_ms_median']:.2f} ms @ {b['sm_clock_mhz_median'] or '?'} MHz"
        )
    top = rows[0]
    top_reasons = {n for op in ("F", "B") for n in top[op]["clock_event_reasons"]}
    sampled = any(top[op]["samples"] for op in ("F", "B"))
    binds = ("sw_power_cap" in top_reasons) if sampled else None
    data = {
        "cuda_device": index,
        "torch": torch.__version__,
        "device_name": torch.cuda.get_device_name(index),
        "model": "TransformerEncoderLayer(d_model=2048, nhead=16, ff=8192), bf16, 4x1024 tokens",
        "iterations": iterations,
        "rows": rows,
        "power_cap_pulls_clock_down": bool(pulled),
        "power_cap_binds_at_top_clock": binds,
        "clock_not_as_asked": wrong,
    }
    summary = "; ".join(parts)
    if pulled:
        summary += " (a power or thermal limit pulled the clock below the lock)"
    at = "the top clock" if top["requested_mhz"] is not None else "the current clock"
    if binds is None:
        summary += f"; power cap at {at}: unknown (no clock read while the kernel ran)"
    else:
        summary += (
            f"; the power cap {'binds' if binds else 'does not bind'} at {at} for this kernel"
        )
    if wrong:
        return Check(
            "cuda check",
            "fail",
            "the clock read while the kernel ran is not the one asked: "
            + ", ".join(wrong)
            + " (no power or thermal reason set)",
            data,
            "the locks did not take effect: see the clock locking check",
        )
    return Check("cuda check", "ok", summary, data)


def _compare_clocks(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows a power or thermal limit held below their lock, and the ops that ran at
    another clock than asked with no such reason (``"asked 1485 MHz, F ran at 1980 MHz"``)."""
    pulled: list[dict[str, Any]] = []
    wrong: list[str] = []
    for r in rows:
        asked = r["requested_mhz"]
        if asked is None:
            continue
        held = False
        for op in ("F", "B"):
            ran = r[op]["sm_clock_mhz_median"]
            if ran is None or abs(ran - asked) <= 15:
                continue
            if ran < asked and LIMITING_REASONS.intersection(r[op]["clock_event_reasons"]):
                held = True
            else:
                wrong.append(f"asked {asked} MHz, {op} ran at {ran:g} MHz")
        if held:
            pulled.append(r)
    return pulled, wrong


# ---------------------------------------------------------------------------------------------
# Without a GPU


def check_simulated(iterations: int = 3) -> Check:
    """The agent on a simulated A100 (its own temporary state directory): clocks applied per
    op, and reset at close."""
    from perseus.device.simulated import SimulatedGPU
    from perseus.runtime.agent.rank_agent import RankAgent

    with tempfile.TemporaryDirectory(prefix="perseus-doctor-") as state_dir:
        gpu: GPU = SimulatedGPU.from_preset("a100", state_dir=state_dir, index=0)
        clocks = gpu.supported_clocks_mhz()
        seen: dict[int, list[int | None]] = {}
        for target in _targets(clocks, 3):
            with RankAgent(_plan(target), gpu, rank=0) as agent:
                for _ in range(iterations):
                    agent.step_begin()
                    for op in ("F", "B"):
                        with agent.op(op, 0):
                            agent.wait_for_clock()
                            seen.setdefault(target, []).append(gpu.locked_clock_mhz())
                    agent.step_end()
            after = gpu.locked_clock_mhz()
            if after is not None:
                return Check(
                    "simulated path",
                    "fail",
                    f"the agent left the simulated GPU locked at {after} MHz",
                    {"locked_after_close_mhz": after},
                )
    wrong = {t: v for t, v in seen.items() if any(c != t for c in v)}
    ran = sorted(seen, reverse=True)
    data: dict[str, Any] = {"clocks_mhz": ran, "ops_per_clock": 2 * iterations}
    if wrong:
        return Check(
            "simulated path", "fail", f"ops ran at other clocks than planned: {wrong}", data
        )
    return Check(
        "simulated path",
        "ok",
        f"agent on a simulated A100: {len(seen)} clocks ({', '.join(map(str, ran))}"
        " MHz) applied per op, lock reset at close",
        data,
    )
