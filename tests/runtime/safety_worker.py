"""A training worker for the safety matrix: a tiny MLP pipeline under ``PerseusPipeline``.

Run as ``python -m tests.runtime.safety_worker MODE`` (one process, world size 1) or under
torchrun (one process per pipeline rank). Each rank drives its own simulated GPU (index = rank)
in ``$PERSEUS_SIM_DIR`` through the real agent path, with a plan that locks
every op at 1095 MHz. It prints ``running`` once the first iteration has ended, then:

* ``normal``: two more iterations, ``close()``, exit 0;
* ``no-close``: two more iterations and exit without ``close()`` (atexit resets);
* ``exception``: an exception escapes an iteration and the script (exit 1);
* ``failed-iteration``: an exception inside one iteration is caught, training goes on for two
  more iterations, ``close()``, exit 0 (prints ``recovered``);
* ``loop``: iterates until killed;
* ``lock-held``: holds the clock worker's device lock on the main thread until killed;
* ``rank1-fails``: all ranks loop; once ``$SAFETY_GO_FILE`` exists rank 1 raises and the
  others block in C (as in an NCCL collective whose peer died), where torchrun SIGTERMs them.

The first four modes wait for a line on stdin after ``running``, so the test can see the lock.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from perseus.device.simulated import SimulatedGPU
from perseus.plan import Baseline, Frontier, JobSpec, PlanPoint
from perseus.runtime.engines.torch_pp import build_torch_schedule
from perseus.runtime.pipeline import PerseusPipeline, SessionOptions
from perseus.schedule import build_schedule

__all__ = ["main"]

FREQ_MHZ = 1095


def _plan(stage_ops: tuple[tuple[str, ...], ...], microbatches: int) -> Frontier:
    ranks = len(stage_ops)
    job = JobSpec(
        schedule="1f1b",
        ranks=ranks,
        stages=ranks,
        microbatches=microbatches,
        blocking_power_w=83.64,
        profile_sha256="0" * 64,
    )
    point = PlanPoint(
        time_s=1.0,
        energy_j=100.0,
        freqs_mhz=tuple(tuple(FREQ_MHZ for _ in ops) for ops in stage_ops),
    )
    return Frontier(
        job=job, stage_ops=stage_ops, baseline=Baseline(time_s=1.0, energy_j=100.0), points=(point,)
    )


def main(mode: str) -> int:
    torch.set_num_threads(1)
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    else:
        init = f"file://{tempfile.mkdtemp(prefix='perseus-pg-')}/store"
        dist.init_process_group("gloo", init_method=init, rank=0, world_size=1)
    rank, world = dist.get_rank(), dist.get_world_size()
    microbatches = 2 * world
    schedule = build_schedule("1f1b", world, microbatches)
    torch.manual_seed(rank)
    from torch.distributed.pipelining import PipelineStage

    stage = PipelineStage(
        nn.Sequential(nn.Linear(8, 8), nn.Tanh()), rank, world, torch.device("cpu")
    )
    torch_schedule = build_torch_schedule(schedule, [stage], loss_fn=nn.functional.mse_loss)
    gpu = SimulatedGPU.from_preset("a100", index=rank)
    pp = PerseusPipeline(
        torch_schedule,
        [stage],
        gpu=gpu,
        plan=_plan(schedule.stage_ops(), microbatches),
        options=SessionOptions(blocking_power_w=83.64),
    ).start()
    x = torch.randn(2 * microbatches, 8)

    def step(fail: bool = False) -> None:
        with pp.iteration():
            torch_schedule.step(
                *((x,) if rank == 0 else ()), target=x if rank == world - 1 else None
            )
            if fail:
                raise RuntimeError("training step failed")

    step()
    step()  # the first iteration's window ends here
    print("running", flush=True)
    if mode in ("normal", "no-close", "exception", "failed-iteration"):
        sys.stdin.readline()  # the test checks the lock, then lets us go on
    if mode in ("normal", "no-close"):
        step()
        step()
        if mode == "normal":
            pp.close()
        return 0
    if mode == "exception":
        step(fail=True)
    if mode == "failed-iteration":
        with contextlib.suppress(RuntimeError):
            step(fail=True)
        step()
        step()
        print("recovered", flush=True)
        pp.close()
        return 0
    if mode == "lock-held":
        # Signalled while the main thread holds the device lock, as in an emulated op's
        # launch or a power pause: the reset must not wait for the thread it interrupted.
        assert pp.agent is not None and pp.agent.controller is not None
        with pp.agent.controller.device_lock:
            while True:
                time.sleep(0.05)
    go_file = os.environ.get("SAFETY_GO_FILE", "")
    while True:  # loop / rank1-fails on the other ranks: until killed
        step()
        if mode == "rank1-fails" and os.path.exists(go_file):
            if rank == 1:
                raise RuntimeError("rank 1 failed")
            # Hang in C like an NCCL collective whose peer died (gloo would fail fast): a
            # store wait on a key nobody sets; Python cannot run signal handlers meanwhile.
            store = dist.distributed_c10d._get_default_store()
            store.wait(["perseus-test-never-set"], timedelta(seconds=120))
        time.sleep(0.05)


if __name__ == "__main__":
    # Ctrl-C as at a terminal, also when the suite runs in the background (cmd &), where
    # SIGINT reaches this process ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main(sys.argv[1]))
