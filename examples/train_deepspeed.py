"""Train a small model with DeepSpeed's PipelineEngine and perseus, on emulated GPUs.

DeepSpeed's ``PipelineEngine.train_batch`` runs its ``TrainSchedule`` unmodified; the adapter
:class:`perseus.runtime.engines.deepspeed.DeepSpeedEngine` reads the schedule, and the session
around it plans it and sets each forward/backward pass's clock.
On CPU (``--emulate``) DeepSpeed uses its CPU accelerator and gloo. Run::

    python examples/train_deepspeed.py --spawn 2 --emulate --microbatches 4 --iterations 4 \\
        --summary summary.json

or with ``torchrun --nproc-per-node 2 examples/train_deepspeed.py --emulate ...``. Flags and the
``--summary`` JSON are those of examples/train_pipeline.py (``--schedule`` is ``1f1b``, the
only training schedule DeepSpeed has).
"""

from __future__ import annotations

import itertools
import logging
import sys
from typing import Any

import torch
import torch.distributed as dist
from _engine_common import (
    emulated_setup,
    launch,
    make_session,
    parse_args,
    run_and_summarise,
    run_plain,
    write_math,
)
from torch import nn

from perseus.runtime.engines.deepspeed import DeepSpeedEngine, skip_cpu_shm_op


class Block(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.lin = nn.Linear(hidden, hidden)

    def forward(self, x: Any) -> Any:
        return torch.tanh(self.lin(x))


def worker(rank: int, world: int, args: Any) -> None:
    import deepspeed
    from deepspeed.pipe import LayerSpec, PipelineModule

    skip_cpu_shm_op()  # emulation only: gloo does the communication, no C++ op to build
    deepspeed.init_distributed(dist_backend="gloo")
    deepspeed.utils.logger.setLevel(logging.WARNING)
    torch.manual_seed(0)
    module = PipelineModule(
        layers=[LayerSpec(Block, args.hidden) for _ in range(world)],
        num_stages=world,
        loss_fn=nn.MSELoss(),
        partition_method="uniform",
    )
    config = {
        "train_micro_batch_size_per_gpu": args.microbatch_size,
        "gradient_accumulation_steps": args.microbatches,
        "optimizer": {"type": "SGD", "params": {"lr": 1e-3}},
        "steps_per_print": 10**9,
    }
    engine, *_ = deepspeed.initialize(
        model=module, model_parameters=list(module.parameters()), config=config
    )
    g = torch.Generator().manual_seed(0)
    data = itertools.cycle(
        [
            (
                torch.randn(args.microbatch_size, args.hidden, generator=g),
                torch.randn(args.microbatch_size, args.hidden, generator=g),
            )
            for _ in range(8)
        ]
    )

    def step() -> None:
        engine.train_batch(data)

    if args.no_perseus:
        run_plain(args, step)
    else:
        adapter = DeepSpeedEngine(engine)
        profile, gpu, power = emulated_setup(args, adapter.schedule.num_stages)
        session = make_session(args, adapter, gpu, profile, power).start()  # hooks its passes
        run_and_summarise(args, session, step, "deepspeed", adapter.schedule)
    write_math(args, list(module.parameters()))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__.split("\n")[0], ("1f1b",), argv)
    return launch(worker, args)


if __name__ == "__main__":
    sys.exit(main())
