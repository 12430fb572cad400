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
import cProfile
import pstats
import statistics
import threading
import time
import warnings
from typing import Any

from _gpu_common import TransformerOps, one_clock_plan

from perseus.device.base import ObserveOnlyWarning
from perseus.device.nvml import NvmlGPU
from perseus.runtime.agent import controller
from perseus.runtime.session import RankSession, SessionOptions
from perseus.schedule import Kind, build_schedule


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class _TrainingThreadCalls:
    """Counts NVML reads (``nvmlDeviceGet*``) and device synchronizes made on the training
    (main) thread: wraps pynvml's read functions and torch's synchronize calls. Set and reset
    functions are left alone (the observe-only guard's)."""

    def __init__(self) -> None:
        import pynvml
        import torch

        self.counts: dict[str, int] = {}
        self._main = threading.main_thread()
        for name in dir(pynvml):
            if name.startswith("nvmlDeviceGet") and callable(getattr(pynvml, name)):
                setattr(pynvml, name, self._wrap(getattr(pynvml, name), name))
        self.device_synchronize = torch.cuda.synchronize  # the benchmark's own, uncounted
        torch.cuda.synchronize = self._wrap(torch.cuda.synchronize, "torch.cuda.synchronize")
        event = torch.cuda.Event
        event.synchronize = self._wrap(event.synchronize, "torch.cuda.Event.synchronize")  # type: ignore[method-assign]
        stream = torch.cuda.Stream
        stream.synchronize = self._wrap(stream.synchronize, "torch.cuda.Stream.synchronize")  # type: ignore[method-assign]

    def _wrap(self, fn: Any, name: str) -> Any:
        counts, main = self.counts, self._main

        def counted(*args: Any, **kwargs: Any) -> Any:
            if threading.current_thread() is main:
                counts[name] = counts.get(name, 0) + 1
            return fn(*args, **kwargs)

        return counted


def _nothing() -> None:
    pass


def _plain(layer: TransformerOps, schedule: Any, iterations: int, sync: Any) -> list[float]:
    """The loop without perseus: wall time per iteration, a device sync at each end."""
    out: list[float] = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        for action in schedule.rank_actions[0]:
            layer.run(action.kind, action.microbatch_index)
        sync()
        out.append(time.perf_counter() - t0)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--d-model", type=int, default=4096)
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="print the training thread's N "
        "costliest functions (cProfile, after warm-up; it slows the loop: figures are not kept)",
    )
    p.add_argument(
        "--poll-s",
        type=float,
        default=None,
        help="the controller worker's event polling period "
        "(an experiment: how much its wake-ups cost the training thread; default the library's)",
    )
    args = p.parse_args()
    if args.poll_s is not None:
        controller.POLL_S = args.poll_s

    import torch

    warnings.simplefilter("ignore", ObserveOnlyWarning)  # observe-only is the point here
    torch.cuda.set_device(0)
    gpu = NvmlGPU.for_cuda_device(0, control=False)
    top_mhz = max(gpu.supported_clocks_mhz())
    d = args.d_model
    layer = TransformerOps(d, args.tokens, args.microbatches)
    schedule = build_schedule("1f1b", 1, args.microbatches)
    calls = _TrainingThreadCalls()
    sync = calls.device_synchronize
    host_us: list[float] = []
    boundary_us: list[float] = []
    wall_s: list[float] = []
    profiler = cProfile.Profile()

    # The same loop without perseus, timed the same way (a device sync at each iteration end),
    # before and after the session's loop, so that the session's cost shows as a difference.
    _plain(layer, schedule, args.warmup, sync)
    plain_before = _plain(layer, schedule, args.iterations, sync)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.simplefilter("ignore", ObserveOnlyWarning)
        with RankSession(
            schedule,
            0,
            gpu=gpu,
            plan=one_clock_plan(schedule, top_mhz),
            options=SessionOptions(blocking_power_w=75.0, watchdog=False, handle_signals=False),
        ) as session:
            agent = session.agent
            assert agent is not None
            for it in range(args.warmup + args.iterations):
                if it == args.warmup:
                    calls.counts.clear()
                on = profiler.enable if args.profile and it >= args.warmup else _nothing
                off = profiler.disable if args.profile and it >= args.warmup else _nothing
                t0 = time.perf_counter()
                on()
                iteration = session.iteration()
                iteration.__enter__()
                off()
                t1 = time.perf_counter()
                for action in schedule.rank_actions[0]:
                    u0 = time.perf_counter()
                    on()
                    scope = session.op(action)
                    scope.__enter__()
                    off()
                    u1 = time.perf_counter()
                    layer.run(action.kind, action.microbatch_index)
                    u2 = time.perf_counter()
                    on()
                    scope.__exit__(None, None, None)
                    off()
                    u3 = time.perf_counter()
                    if it >= args.warmup:
                        host_us.append(((u1 - u0) + (u3 - u2)) * 1e6)
                t2 = time.perf_counter()
                on()
                iteration.__exit__(None, None, None)
                off()
                t3 = time.perf_counter()
                sync()  # the plain loop's sync, uncounted: iterations timed alike
                t4 = time.perf_counter()
                if it >= args.warmup:
                    boundary_us.append(((t1 - t0) + (t3 - t2)) * 1e6)
                    wall_s.append(t4 - t0)
            training_calls = dict(calls.counts)
            session.flush()  # a GPU's last iteration is read one iteration late: read it now
            ops = agent.records.ops[args.warmup * len(schedule.rank_actions[0]) :]
            history = session.history[args.warmup :]
    plain_after = _plain(layer, schedule, args.iterations, sync)

    print(
        f"GPU: {gpu.name}; observe-only: {agent.observe_only}; device-timed: {agent.device_timed}"
    )
    print(
        f"layer d_model={d}, 4x{args.tokens} tokens, bf16; 1F1B, 1 stage, "
        f"{args.microbatches} microbatches, {args.iterations} iterations after {args.warmup} "
        f"warm-up; plan: every op at {top_mhz} MHz (the top clock)"
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
        f"  iteration (device events, counter): median {statistics.median(it_t) * 1e3:.1f} ms, "
        f"{statistics.median(it_e):.1f} J, {statistics.median(it_e) / statistics.median(it_t):.0f} W"
    )
    plain = statistics.median(plain_before + plain_after)
    wall = statistics.median(wall_s)
    print(
        f"  wall time per iteration (sync at each end): with perseus median {wall * 1e3:.2f} ms; "
        f"without: {plain * 1e3:.2f} ms (before {statistics.median(plain_before) * 1e3:.2f}, "
        f"after {statistics.median(plain_after) * 1e3:.2f}); ratio {wall / plain:.3f}x"
    )
    print(
        f"  training-thread cost per op (session.op(action), its enter and exit): median "
        f"{statistics.median(host_us):.1f} us, p99 {_pct(host_us, 0.99):.1f} us"
    )
    print(
        f"  training-thread cost per iteration boundary (session.iteration enter+exit): median "
        f"{statistics.median(boundary_us):.1f} us, p99 {_pct(boundary_us, 0.99):.1f} us"
    )
    print(
        f"  on the training thread after warm-up: {training_calls or 'no NVML read, no synchronize'}"
    )
    shares = [h.clock_share_at_plan for h in history]
    read = [s for s in shares if s is not None]
    held = [len(h.held_ops) for h in history]
    reasons = sorted({r for h in history for r in h.held_reasons})
    print(
        f"  clocks read back: {len(read)}/{len(history)} iterations read; share of op time at "
        f"the planned {top_mhz} MHz median {statistics.median(read) if read else float('nan'):.2f}; "
        f"held ops per iteration median {statistics.median(held) if held else 0}; reasons {reasons}"
    )
    applied = sorted(h.applied_mhz for x in history for h in x.held_ops)
    if applied:
        print(
            f"  held ops ran {applied[0]}-{applied[-1]} MHz (median "
            f"{statistics.median(applied):.0f}) against the planned {top_mhz} MHz"
        )
    for w in caught:
        if w.category.__name__ == "ClockHeldWarning":
            print(f"  warning: {w.category.__name__}: {w.message}")
    others: dict[str, int] = {}
    for w in caught:
        if w.category.__name__ != "ClockHeldWarning":
            others[w.category.__name__] = others.get(w.category.__name__, 0) + 1
    print(f"  other warnings (the plan's predictions are placeholders): {others}")
    print(f"locked clock after close: {gpu.locked_clock_mhz()} (None: never locked)")
    if args.profile:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.profile)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
