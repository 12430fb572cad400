"""A recurring job on CPU with a simulated GPU: batch size and power limit across re-runs.

Trains a small MLP (torch, CPU) to a target validation accuracy, again and again. Each re-run
asks :class:`perseus.recurring.RecurringJob` for a batch size and power limit; the first run of
a batch size profiles the power limits during its first iterations (JIT profiler), later runs
reuse the cached choice. The GPU is :class:`~perseus.device.simulated.SimulatedGPU` (A40
preset) on a virtual clock: every training step is one op whose time grows with the batch size
and whose time and power follow the power limit (effective clock = largest clock whose power
fits under the cap). The history lives in SQLite, so running the script again continues it.

    python examples/recurring_train.py --runs 8 --db runs/recurring.sqlite
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path

import torch
from torch import nn

from perseus.device.clock import VirtualClock
from perseus.device.simulated import SimulatedGPU
from perseus.recurring import RecurringJob, SQLiteStore
from perseus.schedule.actions import Kind

BATCH_SIZES = [16, 32, 64, 128, 256]
DEFAULT_BATCH_SIZE = 128
TARGET_ACCURACY = 0.92
MAX_EPOCHS = 20


def make_data(seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2048, 16, generator=g)
    w = torch.randn(16, 4, generator=g)
    y = (x @ w + 0.3 * torch.randn(2048, 4, generator=g)).argmax(dim=1)
    return x[:1536], y[:1536], x[1536:], y[1536:]


def simulated_gpu(batch_size: int, clock: VirtualClock, state_dir: Path) -> SimulatedGPU:
    # One training step = one op: ~0.4 ms per sample at the top clock plus a fixed overhead,
    # so small batches use the GPU poorly (time per sample falls with the batch size) and
    # draw less power (lower activity), so their best power limit differs.
    step_s = 0.01 + 0.0004 * batch_size
    activity = min(1.0, 0.55 + batch_size / 512)
    return SimulatedGPU.from_preset(
        "a40",
        state_dir=state_dir,
        publish_interval_s=0.0,
        set_latency_s=0.0,
        activity=activity,
        op_time_s={Kind.F: step_s},
        clock=clock,
    )


def train_once(job_db: Path, state_dir: Path, clock: VirtualClock, eta: float, seed: int) -> str:
    x, y, xv, yv = make_data()
    # The GPU object is re-made per run (its op time depends on the batch size); its power
    # limit and energy counter live in the shared state directory, like a real driver's.
    probe = simulated_gpu(DEFAULT_BATCH_SIZE, clock, state_dir)
    job = RecurringJob(
        "mlp-example",
        batch_sizes=BATCH_SIZES,
        default_batch_size=DEFAULT_BATCH_SIZE,
        store=SQLiteStore(job_db),
        gpu=probe,
        eta=eta,
        max_epochs=MAX_EPOCHS,
        seed=seed,
        profiler_kwargs={
            "warmup_steps": 3,
            "settle_steps": 1,
            "window_steps": 3,
            "min_window_s": 0.0,
        },
        clock=clock,
    )
    with job.run() as run:
        gpu = simulated_gpu(run.batch_size, clock, state_dir)
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.05 * (run.batch_size / 32) ** 0.5)
        accuracy = 0.0
        for _epoch in range(MAX_EPOCHS):
            perm = torch.randperm(len(x))
            for i in range(0, len(x), run.batch_size):
                idx = perm[i : i + run.batch_size]
                loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
                gpu.launch(0, Kind.F)  # the simulated GPU runs the step on its own timeline
                clock.sleep(gpu.op_cost(0, Kind.F)[0])  # the host waits for it (virtual clock)
                run.step(len(idx))
            with torch.no_grad():
                accuracy = float((model(xv).argmax(dim=1) == yv).float().mean())
            if run.end_epoch(reached=accuracy >= TARGET_ACCURACY):
                break
        obs = run.observation()
    status = "reached" if run.reached else ("stopped early" if run.stopped_early else "failed")
    limit = "-" if run.power_limit_w is None else f"{run.power_limit_w:.0f} W"
    return (
        f"batch {run.batch_size:4d} ({run.decision.phase:8s}) limit {limit:>6s}  "
        f"epochs {run.epochs:2d}  acc {accuracy:.3f}  energy {obs.energy_j:8.1f} J  "
        f"time {obs.time_s:6.2f} s  cost {obs.cost:8.1f}  {status}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8, help="re-runs of the job (default 8)")
    parser.add_argument("--db", type=Path, help="SQLite file (default: a fresh temp file)")
    parser.add_argument("--eta", type=float, default=0.5, help="energy-time weight")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    torch.set_num_threads(1)  # a tiny model: threads only contend
    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or Path(tmp) / "recurring.sqlite"
        clock = VirtualClock()
        for k in range(args.runs):
            print(f"run {k + 1}: {train_once(db, Path(tmp) / 'sim', clock, args.eta, seed=k)}")


if __name__ == "__main__":
    main()
