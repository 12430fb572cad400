"""A real GPU through RankSession, observe-only: op times from CUDA events, energy from NVML.

Runs a transformer layer's forward/backward per microbatch (1F1B, one stage, bf16) through
``RankSession`` and the rank agent on ``NvmlGPU.for_cuda_device(0, control=False)``: no NVML set
or reset call is ever made, so it may run where a card's clocks must not change. Prints the
agent's per-op device times, the iteration's time and energy (counter read at its ends), and the training thread's
own cost per op (host time spent entering and leaving ``session.op``), median and p99.

    python benchmarks/gpu_session.py [--microbatches 8] [--iterations 10] [--d-model 4096]
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

from _gpu_common import TransformerOps, one_clock_plan

from perseus.device.base import ObserveOnlyWarning
from perseus.device.nvml import NvmlGPU
from perseus.runtime.session import RankSession, SessionOptions
from perseus.schedule import Kind, build_schedule


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--d-model", type=int, default=4096)
    p.add_argument("--tokens", type=int, default=2048)
    args = p.parse_args()

    import torch

    warnings.simplefilter("ignore", ObserveOnlyWarning)  # observe-only is the point here
    torch.cuda.set_device(0)
    gpu = NvmlGPU.for_cuda_device(0, control=False)
    d = args.d_model
    layer = TransformerOps(d, args.tokens, args.microbatches)
    schedule = build_schedule("1f1b", 1, args.microbatches)
    host_us: list[float] = []

    # The same loop without perseus, timed the same way (a device sync at each iteration end),
    # so that the session's cost shows as a difference of iteration times.
    plain_s: list[float] = []
    for it in range(args.warmup + args.iterations):
        t0 = time.perf_counter()
        for action in schedule.rank_actions[0]:
            layer.run(action.kind, action.microbatch_index)
        torch.cuda.synchronize()
        if it >= args.warmup:
            plain_s.append(time.perf_counter() - t0)

    with RankSession(
        schedule,
        0,
        gpu=gpu,
        plan=one_clock_plan(schedule, max(gpu.supported_clocks_mhz())),
        options=SessionOptions(blocking_power_w=75.0, watchdog=False, handle_signals=False),
    ) as session:
        agent = session.agent
        assert agent is not None
        for it in range(args.warmup + args.iterations):
            with session.iteration():
                for action in schedule.rank_actions[0]:
                    scope = session.op(action)
                    t0 = time.perf_counter()
                    scope.__enter__()
                    t1 = time.perf_counter()
                    layer.run(action.kind, action.microbatch_index)
                    t2 = time.perf_counter()
                    scope.__exit__(None, None, None)
                    t3 = time.perf_counter()
                    if it >= args.warmup:
                        host_us.append(((t1 - t0) + (t3 - t2)) * 1e6)
        session.flush()  # a GPU's last iteration is read one iteration late: read it now
        ops = agent.records.ops[args.warmup * len(schedule.rank_actions[0]) :]
        history = session.history[args.warmup :]
        print(
            f"GPU: {gpu.name}; observe-only: {agent.observe_only}; device-timed: {agent.device_timed}"
        )
        print(
            f"layer d_model={d}, 4x{args.tokens} tokens, bf16; 1F1B, 1 stage, "
            f"{args.microbatches} microbatches, {args.iterations} iterations after {args.warmup} warm-up"
        )
        for kind in (Kind.F, Kind.B):
            times = [o.time_s * 1e3 for o in ops if o.op.kind is kind]
            print(
                f"  {kind.name}: device time median {statistics.median(times):.3f} ms "
                f"(min {min(times):.3f}, max {max(times):.3f})"
            )
        busy = sum(o.time_s for o in ops) / args.iterations
        print(f"  ops' device time per iteration: {busy * 1e3:.1f} ms")
        it_t = [h.time_s for h in history]
        it_e = [h.energy_j for h in history]
        print(
            f"  iteration: median {statistics.median(it_t) * 1e3:.1f} ms, "
            f"{statistics.median(it_e):.1f} J, {statistics.median(it_e) / statistics.median(it_t):.0f} W"
        )
        plain = statistics.median(plain_s)
        ratio = statistics.median(it_t) / plain
        print(
            f"  same loop without perseus: median {plain * 1e3:.1f} ms per iteration ({ratio:.3f}x)"
        )
        print(
            f"  training-thread cost per op (session.op enter+exit): median "
            f"{statistics.median(host_us):.1f} us, p99 {_pct(host_us, 0.99):.1f} us"
        )
    print(f"locked clock after close: {gpu.locked_clock_mhz()} (None: never locked)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
