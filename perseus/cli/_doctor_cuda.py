"""The doctor's agent-path probes: a transformer block through the real agent on the NVML GPU
(:func:`check_cuda`), or without a GPU the same agent on a simulated one (:func:`check_simulated`)."""

from __future__ import annotations

import contextlib
import statistics
import tempfile
import threading
import warnings
from collections.abc import Callable
from typing import Any

from perseus.cli._doctor_checks import Check, spread_clocks_mhz
from perseus.device.base import GPU, ObserveOnlyWarning
from perseus.device.clock import REAL_CLOCK
from perseus.device.nvml import NvmlGPU
from perseus.device.nvml_calls import LIMITING_REASONS, clock_event_names
from perseus.plan import Baseline, Frontier, JobSpec, PlanPoint

__all__ = ["check_cuda", "check_simulated", "cuda_device_for"]


def _plan(freq_mhz: int) -> Frontier:
    """A one-rank plan with one forward and one backward, both at ``freq_mhz``."""
    sizes = {"ranks": 1, "stages": 1, "microbatches": 1}
    job = JobSpec(schedule="1f1b", **sizes, blocking_power_w=0.0, profile_sha256="0" * 64)
    point = PlanPoint(time_s=1.0, energy_j=1.0, freqs_mhz=((freq_mhz, freq_mhz),))
    baseline = Baseline(time_s=1.0, energy_j=1.0)
    return Frontier(job=job, stage_ops=(("F0", "B0"),), baseline=baseline, points=(point,))


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
            REAL_CLOCK.sleep(0.0005)


def _transformer(torch: Any, device: Any) -> tuple[Any, Any]:
    on = {"device": device, "dtype": torch.bfloat16}
    block = torch.nn.TransformerEncoderLayer(2048, 16, 8192, batch_first=True, **on)
    return block, torch.randn(4, 1024, 2048, **on)


def cuda_device_for(torch: Any, gpu: NvmlGPU) -> int:
    """The CUDA index of the NVML GPU (by UUID), or 0 when the UUIDs cannot be compared."""
    want = gpu.uuid.removeprefix("GPU-").lower()
    for k in range(torch.cuda.device_count()):
        with contextlib.suppress(Exception):
            if str(torch.cuda.get_device_properties(k).uuid).lower() == want:
                return k
    return 0


def check_cuda(gpu: NvmlGPU, control: bool, clocks: int = 3, iterations: int = 5) -> Check:
    """A transformer block's forward/backward through the agent at a few clocks (or, without
    control, at whatever clock the GPU runs), with the SM clock sampled during each op."""
    torch, refusal = _cuda_torch()
    if refusal is not None:
        return refusal
    index = cuda_device_for(torch, gpu)
    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    block, x = _transformer(torch, device)
    x.requires_grad_(True)
    for _ in range(3):  # warm up kernels and the allocator
        block(x).float().square().mean().backward()
    torch.cuda.synchronize(device)
    targets: list[int | None] = (
        list(spread_clocks_mhz(gpu.supported_clocks_mhz(), clocks)) if control else [None]
    )
    rows = _measure(gpu, control, targets, iterations, (block, x), torch.cuda.Event)
    data = {
        "cuda_device": index,
        "torch": torch.__version__,
        "device_name": torch.cuda.get_device_name(index),
        "model": "TransformerEncoderLayer(d_model=2048, nhead=16, ff=8192), bf16, 4x1024 tokens",
        "iterations": iterations,
        "rows": rows,
    }
    return _verdict(rows, data)


def _cuda_torch() -> tuple[Any, Check | None]:
    """``torch`` when it sees a CUDA device, else the failed check saying why."""
    try:
        import torch
    except ImportError:
        fix = "pip install torch (a CUDA build) to run pipelines with perseus"
        return None, Check("cuda check", "fail", "torch is not installed", {}, fix)
    if not torch.cuda.is_available():
        summary = f"torch {torch.__version__} sees no CUDA device"
        fix = "install a CUDA build of torch that matches the driver"
        return torch, Check("cuda check", "fail", summary, {"torch": torch.__version__}, fix)
    return torch, None


def _measure(
    gpu: NvmlGPU,
    control: bool,
    targets: list[int | None],
    iterations: int,
    model: tuple[Any, Any],
    new_event: Callable[..., Any],
) -> list[dict[str, Any]]:
    """One row per target clock: ``iterations`` (after one that warms the clock) of F and B
    through the agent, each op's median CUDA-event time and the clocks read while it ran."""
    from perseus.runtime.agent.rank_agent import RankAgent
    from perseus.runtime.agent.readback import ClockHeldWarning

    block, x = model
    sampler = _Sampler(gpu.current_clock_mhz, gpu.clock_event_reasons)
    rows: list[dict[str, Any]] = []
    with sampler, warnings.catch_warnings():
        warnings.simplefilter("ignore", ObserveOnlyWarning)
        # The check reports held clocks itself (the sampler's reading and reasons).
        warnings.simplefilter("ignore", ClockHeldWarning)
        for target in targets:
            plan = _plan(target if target is not None else gpu.supported_clocks_mhz()[0])
            times: dict[str, list[float]] = {"F": [], "B": []}
            with RankAgent(plan, gpu, rank=0, enabled=control) as agent:
                for it in range(iterations + 1):
                    agent.step_begin()
                    agent.wait_for_clock()
                    out = None
                    for op in ("F", "B"):
                        start, end = new_event(enable_timing=True), new_event(enable_timing=True)
                        sampler.mark(f"{target}:{op}" if it else None)  # 0 warms the clock
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
            rows.append(_row(target, times, sampler))
    return rows


def _row(target: int | None, times: dict[str, list[float]], sampler: _Sampler) -> dict[str, Any]:
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
    return row


def _verdict(rows: list[dict[str, Any]], data: dict[str, Any]) -> Check:
    """The check from its rows: fails when an op ran at another clock than asked with no
    power or thermal reason; says whether the power cap binds at the top clock."""
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
    data.update(
        power_cap_pulls_clock_down=pulled,
        power_cap_binds_at_top_clock=binds,
        clock_not_as_asked=wrong,
    )
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
        summary = (
            f"the clock read while the kernel ran is not the one asked: {', '.join(wrong)} (no "
            "power or thermal reason set)"
        )
        fix = "the locks did not take effect: see the clock locking check"
        return Check("cuda check", "fail", summary, data, fix)
    return Check("cuda check", "ok", summary, data)


def _compare_clocks(rows: list[dict[str, Any]]) -> tuple[bool, list[str]]:
    """Whether a power or thermal limit held an op below its lock, and the ops that ran at
    another clock than asked with no such reason (``"asked 1485 MHz, F ran at 1980 MHz"``)."""
    pulled, wrong = False, []
    for r in rows:
        asked = r["requested_mhz"]
        for op in ("F", "B"):
            ran = r[op]["sm_clock_mhz_median"]
            if asked is None or ran is None or abs(ran - asked) <= 15:
                continue
            if ran < asked and LIMITING_REASONS.intersection(r[op]["clock_event_reasons"]):
                pulled = True
            else:
                wrong.append(f"asked {asked} MHz, {op} ran at {ran:g} MHz")
    return pulled, wrong


def check_simulated(iterations: int = 3) -> Check:
    """The agent on a simulated A100 (its own temporary state directory): clocks applied per
    op, and reset at close."""
    from perseus.device.simulated import SimulatedGPU
    from perseus.runtime.agent.rank_agent import RankAgent

    name = "simulated path"
    with tempfile.TemporaryDirectory(prefix="perseus-doctor-") as state_dir:
        gpu: GPU = SimulatedGPU.from_preset("a100", state_dir=state_dir, index=0)
        clocks = gpu.supported_clocks_mhz()
        seen: dict[int, list[int | None]] = {}
        for target in spread_clocks_mhz(clocks, 3):
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
                summary = f"the agent left the simulated GPU locked at {after} MHz"
                return Check(name, "fail", summary, {"locked_after_close_mhz": after})
    wrong = {t: v for t, v in seen.items() if any(c != t for c in v)}
    ran = sorted(seen, reverse=True)
    data: dict[str, Any] = {"clocks_mhz": ran, "ops_per_clock": 2 * iterations}
    if wrong:
        return Check(name, "fail", f"ops ran at other clocks than planned: {wrong}", data)
    summary = (
        f"agent on a simulated A100: {len(seen)} clocks ({', '.join(map(str, ran))} MHz) "
        "applied per op, lock reset at close"
    )
    return Check(name, "ok", summary, data)
