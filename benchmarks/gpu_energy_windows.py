"""Op energy from NVML counter windows on a real GPU, observe-only, against long-window loops.

What online profiling does at each clock, run at the clock the GPU picks itself (no NVML set
or reset call: ``NvmlGPU(control=False)``, for machines whose clocks must not change): a bf16
transformer layer's forward/backward per microbatch (GPipe order, so that counter windows see
varying shares of forward and backward) through the rank agent with CUDA events, the energy
counter read by :class:`~perseus.runtime.energy_windows.CounterSampler` on a background thread,
and per-kind power fitted to the publish windows by
:func:`~perseus.runtime.energy_attribution.fit_group_power`. Then a Zeus-style reference: the
forward alone, and forward+backward, in a loop for ``--window-s`` seconds each, energy from
the counter at the two ends (about one 100 ms publish step of error over the window), time
from CUDA events. Also: the publish grid as the sampler saw it, and the iteration time with
and without the sampler thread (its ~3 ms reads off the training thread).

    python benchmarks/gpu_energy_windows.py [--d-model 4096] [--seconds 4] [--window-s 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from typing import Any

from perseus.device.base import ObserveOnlyWarning
from perseus.device.nvml import NvmlGPU
from perseus.plan import Baseline, Frontier, JobSpec, PlanPoint
from perseus.runtime.agent import RankAgent
from perseus.runtime.energy_attribution import OpSpan, fit_group_power
from perseus.runtime.energy_windows import CounterSampler, sample_period_for
from perseus.schedule import Kind, build_schedule


def _plan(schedule: Any, clock_mhz: int) -> Frontier:
    spec = JobSpec(
        schedule=schedule.name,
        ranks=1,
        stages=1,
        microbatches=schedule.num_microbatches,
        blocking_power_w=75.0,
        profile_sha256="0" * 64,
    )
    freqs = tuple(tuple(clock_mhz for _ in ops) for ops in schedule.stage_ops())
    return Frontier(
        job=spec,
        stage_ops=schedule.stage_ops(),
        baseline=Baseline(time_s=1.0, energy_j=1.0),
        points=(PlanPoint(time_s=1.0, energy_j=1.0, freqs_mhz=freqs),),
    )


def _loop(gpu: NvmlGPU, fn: Any, window_s: float) -> tuple[float, float]:
    """(device time per call, energy per call) of ``fn`` back to back for ``window_s``."""
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    e0 = gpu.energy_mj()
    start.record()
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < window_s:
        fn()
        n += 1
    end.record()
    end.synchronize()
    e1 = gpu.energy_mj()
    return start.elapsed_time(end) / 1000.0 / n, (e1 - e0) / 1000.0 / n


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--d-model", type=int, default=4096)
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--seconds", type=float, default=4.0, help="agent run with the sampler")
    p.add_argument("--window-s", type=float, default=5.0, help="each reference loop")
    args = p.parse_args()

    import torch

    warnings.simplefilter("ignore", ObserveOnlyWarning)
    torch.cuda.set_device(0)
    gpu = NvmlGPU.for_cuda_device(0, control=False)
    d = args.d_model
    block = torch.nn.TransformerEncoderLayer(
        d, d // 128, 4 * d, batch_first=True, dtype=torch.bfloat16, device="cuda"
    )
    schedule = build_schedule("gpipe", 1, args.microbatches)
    actions = schedule.rank_actions[0]
    x = torch.randn(args.microbatches, 4, args.tokens, d, dtype=torch.bfloat16, device="cuda")
    outputs: dict[int, Any] = {}

    def run(kind: Kind, mb: int) -> None:
        if kind is Kind.F:
            outputs[mb] = block(x[mb])
        else:
            outputs.pop(mb).float().square().mean().backward()

    plan = _plan(schedule, max(gpu.supported_clocks_mhz()))
    print(f"GPU: {gpu.name}; torch {torch.__version__}; layer d_model={d}, 4x{args.tokens} tokens")

    def agent_run(
        seconds: float, sampler: CounterSampler | None
    ) -> tuple[list[OpSpan], list[float]]:
        spans: list[OpSpan] = []
        iteration_s: list[float] = []
        with RankAgent(plan, gpu, 0, watchdog=False, handle_signals=False) as agent:
            assert agent.device_timed and agent.events is not None
            if sampler is not None:
                sampler.start()  # CUDA events' timeline is time.perf_counter
            t_end = time.perf_counter() + seconds
            it = 0
            while time.perf_counter() < t_end or it < 3:
                t0 = time.perf_counter()
                agent.step_begin()
                for a in actions:
                    with agent.op(a.kind, a.microbatch_index):
                        run(a.kind, a.microbatch_index)
                agent.step_end()
                iteration_s.append(time.perf_counter() - t0)
                it += 1
            for op in agent.records.ops:
                if op.start_s is not None and op.end_s is not None:
                    spans.append(OpSpan(op.name[0], op.start_s, op.end_s, op.iteration))
        return spans, iteration_s

    agent_run(1.0, None)  # warm-up
    _, plain_it = agent_run(args.seconds / 2, None)
    sampler = CounterSampler(gpu.energy_mj, time.perf_counter, period_s=sample_period_for(gpu))
    try:
        spans, sampled_it = agent_run(args.seconds, sampler)
    finally:
        sampler.close()
    lo, hi = min(s.start_s for s in spans), max(s.end_s for s in spans)
    windows = sampler.intervals(lo, hi)
    raw = sampler.intervals(lo, hi, grid=False)
    lengths = sorted(w.length_s * 1e3 for w in windows)
    raw_lengths = sorted(w.length_s * 1e3 for w in raw)
    print(
        f"sampler: {len(sampler.samples())} reads every {sampler.period_s * 1e3:.1f} ms, "
        f"{sampler.errors} errors; {len(windows)} publish windows in the run"
    )
    if lengths:
        q = lambda v, f: v[min(len(v) - 1, int(f * len(v)))]  # noqa: E731
        print(
            f"  publish window length (grid-fitted): median {statistics.median(lengths):.1f} ms, "
            f"p10 {q(lengths, 0.1):.1f}, p90 {q(lengths, 0.9):.1f}; from bracket middles: "
            f"median {statistics.median(raw_lengths):.1f}, p10 {q(raw_lengths, 0.1):.1f}, "
            f"p90 {q(raw_lengths, 0.9):.1f}"
        )
    print(
        f"iteration (host, {len(actions)} ops): median {statistics.median(plain_it) * 1e3:.1f} ms "
        f"without the sampler, {statistics.median(sampled_it) * 1e3:.1f} ms with it "
        f"({statistics.median(sampled_it) / statistics.median(plain_it):.3f}x)"
    )
    fit = fit_group_power(windows, spans, idle_power_w=75.0)
    times = {k: statistics.median(s.end_s - s.start_s for s in spans if s.group == k) for k in "FB"}
    print(
        f"fit over {fit.intervals} windows: residual {fit.residual_w:.1f} W; gap "
        f"{fit.gap_power_w:.0f} W, between iterations {fit.outside_power_w:.0f} W"
    )

    def f_only() -> None:
        block(x[0])

    def f_and_b() -> None:
        block(x[0]).float().square().mean().backward()

    t_f, e_f = _loop(gpu, f_only, args.window_s)
    t_fb, e_fb = _loop(gpu, f_and_b, args.window_s)
    ref = {"F": (t_f, e_f), "B": (t_fb - t_f, e_fb - e_f)}
    print("op | windows: time, power, energy | reference loop: time, power, energy | energy diff")
    for k in "FB":
        power = fit.power_w[k]
        energy = power * times[k]
        rt, re = ref[k]
        print(
            f"{k}  | {times[k] * 1e3:.2f} ms, {power:.0f} W, {energy:.3f} J | "
            f"{rt * 1e3:.2f} ms, {re / rt:.0f} W, {re:.3f} J | {(energy / re - 1) * 100:+.1f} %"
        )
    print(f"locked clock after all: {gpu.locked_clock_mhz()} (None: never locked)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
