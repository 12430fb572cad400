"""Shared pieces of the real-GPU benchmarks (``gpu_*.py``): a one-clock plan, a bf16
transformer layer run as pipeline ops, and a Zeus-style long-window reference measurement."""

from __future__ import annotations

import time
from typing import Any

from perseus.plan import Baseline, Frontier, JobSpec, PlanPoint
from perseus.schedule import Kind, Schedule


def one_clock_plan(schedule: Schedule, clock_mhz: int, blocking_power_w: float = 75.0) -> Frontier:
    """A one-point plan running every op of ``schedule`` at ``clock_mhz`` (its predicted
    figures are placeholders: these benchmarks compare measurements, not predictions)."""
    spec = JobSpec(
        schedule=schedule.name,
        ranks=schedule.num_ranks,
        stages=schedule.num_stages,
        microbatches=schedule.num_microbatches,
        blocking_power_w=blocking_power_w,
        profile_sha256="0" * 64,
    )
    freqs = tuple(tuple(clock_mhz for _ in ops) for ops in schedule.stage_ops())
    return Frontier(
        job=spec,
        stage_ops=schedule.stage_ops(),
        baseline=Baseline(time_s=1.0, energy_j=1.0),
        points=(PlanPoint(time_s=1.0, energy_j=1.0, freqs_mhz=freqs),),
    )


class TransformerOps:
    """A bf16 ``TransformerEncoderLayer`` on CUDA device 0; microbatch ``mb`` is a batch of 4
    sequences of ``tokens``. :meth:`run` is one pipeline op (F keeps its output for B)."""

    def __init__(self, d_model: int, tokens: int, microbatches: int) -> None:
        import torch

        self.block = torch.nn.TransformerEncoderLayer(
            d_model,
            d_model // 128,
            4 * d_model,
            batch_first=True,
            dtype=torch.bfloat16,
            device="cuda",
        )
        self.x = torch.randn(microbatches, 4, tokens, d_model, dtype=torch.bfloat16, device="cuda")
        self._outputs: dict[int, Any] = {}

    def run(self, kind: Kind, mb: int) -> None:
        if kind is Kind.F:
            self._outputs[mb] = self.block(self.x[mb])
        else:
            self._outputs.pop(mb).float().square().mean().backward()

    def forward_only(self) -> None:
        """A training forward (it builds the autograd graph), its output dropped."""
        self.block(self.x[0])

    def forward_backward(self) -> None:
        self.block(self.x[0]).float().square().mean().backward()


def reference_loop(gpu: Any, fn: Any, window_s: float) -> tuple[float, float]:
    """(device time per call, energy per call) of ``fn`` run back to back for ``window_s``:
    energy from the counter at the window's two ends (about one 100 ms publish step of error
    over the window), time from CUDA events."""
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
    end.synchronize()  # the device drains what the host queued; the counter is read after
    e1 = gpu.energy_mj()
    return start.elapsed_time(end) / 1000.0 / n, (e1 - e0) / 1000.0 / n
