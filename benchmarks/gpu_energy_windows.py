"""Op energy from NVML counter windows on a real GPU, observe-only, against long-window loops.

What online profiling does at each clock, run at the clock the GPU picks itself (no NVML set
or reset call: ``NvmlGPU(control=False)``, for machines whose clocks must not change): a bf16
transformer layer's forward/backward per microbatch (GPipe order, so that counter windows see
varying shares of forward and backward) through the rank agent with CUDA events, the energy
counter read by :class:`~perseus.runtime.profiling.energy_windows.CounterSampler` on a background thread,
and per-kind power fitted to the publish windows by
:func:`~perseus.runtime.profiling.energy_attribution.fit_group_power`. Then a Zeus-style reference: the
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

from _gpu_common import TransformerOps, one_clock_plan, reference_loop

from perseus.device.base import ObserveOnlyWarning
from perseus.device.nvml import NvmlGPU
from perseus.runtime.agent.rank_agent import RankAgent
from perseus.runtime.profiling.energy_attribution import OpSpan, fit_group_power
from perseus.runtime.profiling.energy_windows import CounterSampler, sample_period_for
from perseus.schedule import build_schedule


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
    layer = TransformerOps(d, args.tokens, args.microbatches)
    schedule = build_schedule("gpipe", 1, args.microbatches)
    actions = schedule.rank_actions[0]
    run = layer.run

    plan = one_clock_plan(schedule, max(gpu.supported_clocks_mhz()))
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
                    spans.append(OpSpan(op.op.kind.value, op.start_s, op.end_s, op.iteration))
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

    t_f, e_f = reference_loop(gpu, layer.forward_only, args.window_s)
    t_fb, e_fb = reference_loop(gpu, layer.forward_backward, args.window_s)
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
