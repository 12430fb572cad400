"""Online profiling on a real GPU vs long-window reference measurements (needs clock locking).

A bf16 transformer layer's forward/backward per microbatch (1F1B, one stage) runs through
``RankSession(plan=OnlineProfile())`` on ``NvmlGPU.for_cuda_device(0)``: clocks set by the agent on
the device's timeline, op times from CUDA events, op energy fitted to the NVML counter's 100 ms
publish windows (the same path the emulated runs take). The sweep is cut to ``--clocks`` (the
GPU's nearest supported ones) so the run stays short. Then, at each of those clocks, a
Zeus-style reference: the forward alone and forward+backward in a loop for ``--window-s``
seconds with the clock locked, energy from the counter at the two ends (error about one
100 ms publish step over the window: ~2 % at 5 s), time from CUDA events. Prints both per
row and their relative differences. Resets the clock at the end.

    python benchmarks/gpu_online_profile.py [--clocks 1980,1755,1530,1305] [--window-s 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from _gpu_common import TransformerOps, reference_loop

from perseus.device.nvml import NvmlGPU
from perseus.runtime.agent.events import CudaEventSource
from perseus.runtime.planning import OnlineProfile
from perseus.runtime.session import RankSession, SessionOptions
from perseus.schedule import Kind, build_schedule


class _FewClocks:
    """The GPU with its clock list cut to a few (the sweep visits every supported clock)."""

    def __init__(self, gpu: NvmlGPU, clocks_mhz: list[int]) -> None:
        self._gpu = gpu
        supported = gpu.supported_clocks_mhz()
        snapped = {min(supported, key=lambda c: abs(c - f)) for f in clocks_mhz}
        self._clocks = tuple(sorted(snapped, reverse=True))

    def supported_clocks_mhz(self) -> tuple[int, ...]:
        return self._clocks

    def __getattr__(self, name: str) -> Any:
        return getattr(self._gpu, name)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clocks", default="1980,1755,1530,1305")
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--d-model", type=int, default=4096)
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--window-s", type=float, default=5.0)
    p.add_argument("--blocking-power-w", type=float, default=120.0)
    args = p.parse_args()

    import torch

    torch.cuda.set_device(0)
    nvml = NvmlGPU.for_cuda_device(0)
    gpu = _FewClocks(nvml, [int(c) for c in args.clocks.split(",")])
    layer = TransformerOps(args.d_model, args.tokens, args.microbatches)
    schedule = build_schedule("1f1b", 1, args.microbatches)
    run = layer.run

    session = RankSession(
        schedule,
        0,
        gpu=gpu,
        plan=OnlineProfile(),
        options=SessionOptions(blocking_power_w=args.blocking_power_w, events=CudaEventSource()),
    )
    t0 = time.perf_counter()
    with session:
        while session.profiling:
            with session.iteration():
                for action in schedule.rank_actions[0]:
                    with session.op(action):
                        run(action.kind, action.microbatch_index)
    sweep_s = time.perf_counter() - t0
    profiled = session.profiled
    assert profiled is not None
    print(
        f"{torch.cuda.get_device_name(0)}: online sweep {sweep_s:.1f} s, "
        f"{sum(1 for h in session.history if h.phase == 'profile')} iterations"
    )

    print("kind  MHz   online t/E           reference t/E        dt      dE")
    errors: list[float] = []
    try:
        for freq in gpu.supported_clocks_mhz():
            nvml.set_locked_clock(freq)
            tf, ef = reference_loop(nvml, layer.forward_only, args.window_s)
            tfb, efb = reference_loop(nvml, layer.forward_backward, args.window_s)
            ref = {Kind.F: (tf, ef), Kind.B: (tfb - tf, efb - ef)}
            for kind in (Kind.F, Kind.B):
                if (0, kind) not in profiled.ops:
                    continue
                rows = {o.freq_mhz: o for o in profiled.ops[(0, kind)].options}
                o = rows.get(freq)
                if o is None:
                    continue  # stopped early before this clock
                rt, re_ = ref[kind]
                errors.append(abs(o.energy_j / re_ - 1))
                print(
                    f"{kind.value:4s} {freq:5d} {o.time_s * 1e3:7.2f} ms {o.energy_j:7.3f} J  "
                    f"{rt * 1e3:7.2f} ms {re_:7.3f} J  {o.time_s / rt - 1:+6.1%} "
                    f"{o.energy_j / re_ - 1:+6.1%}"
                )
    finally:
        nvml.reset_locked_clock()
    if errors:
        print(f"energy vs reference: median {statistics.median(errors):.1%}, max {max(errors):.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
