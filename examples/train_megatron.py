"""Train a small model with Megatron-Core's own pipeline schedules and perseus, on emulated GPUs.

Megatron-Core's ``forward_backward_pipelining_without_interleaving`` (``--schedule 1f1b``) or
``..._with_interleaving`` (``--schedule interleaved``, ``--virtual-stages`` chunks per rank)
runs unmodified; the adapter :class:`perseus.runtime.engines.megatron.MegatronEngine` reads its
order, and the session around it plans it and sets each forward/backward step's clock. On CPU (``--emulate``) the schedule gets
a CPU ``p2p_communicator`` and runs under a ``device="cuda"`` -> CPU mapping. Run::

    python examples/train_megatron.py --spawn 2 --emulate --schedule interleaved \\
        --microbatches 4 --iterations 4 --summary summary.json

or with ``torchrun --nproc-per-node 2 examples/train_megatron.py --emulate ...``. Flags and the
``--summary`` JSON are those of examples/train_pipeline.py.
"""

from __future__ import annotations

import itertools
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

from perseus.runtime.engines.megatron import MegatronEngine, cpu_communication, cuda_to_cpu


class Chunk(nn.Module):
    """One model chunk as Megatron's schedules want it: ``config``, ``model_type``,
    ``set_input_tensor`` (the received activation on every stage but the first)."""

    def __init__(self, stage: int, hidden: int, config: Any) -> None:
        from megatron.core.enums import ModelType

        super().__init__()
        torch.manual_seed(stage)
        self.lin = nn.Linear(hidden, hidden)
        self.config, self.model_type, self.stage = config, ModelType.encoder_or_decoder, stage
        self.input: Any = None

    def set_input_tensor(self, tensors: list[Any]) -> None:
        self.input = tensors[0]

    def forward(self, x: Any) -> Any:
        return torch.tanh(self.lin(x if self.stage == 0 else self.input))


def worker(rank: int, world: int, args: Any) -> None:
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.transformer import TransformerConfig

    dist.init_process_group("gloo", rank=rank, world_size=world)
    parallel_state.initialize_model_parallel(pipeline_model_parallel_size=world)
    v = args.virtual_stages if args.schedule == "interleaved" else 1
    seq = 4
    config = TransformerConfig(
        num_layers=world * v,
        hidden_size=args.hidden,
        num_attention_heads=1,
        pipeline_dtype=torch.float32,
        pipeline_model_parallel_size=world,
        virtual_pipeline_model_parallel_size=v if v > 1 else None,
    )
    model = [Chunk(c * world + rank, args.hidden, config) for c in range(v)]
    optimizer = torch.optim.SGD([p for c in model for p in c.parameters()], lr=1e-3)
    g = torch.Generator().manual_seed(0)
    data = [torch.randn(seq, args.microbatch_size, args.hidden, generator=g) for _ in range(8)]

    def forward_step(it: Any, chunk: Any) -> Any:
        y = chunk(next(it))
        return y, lambda out: ((out**2).mean(), {"loss": (out**2).mean().detach()})

    func = get_forward_backward_func(pp_size=world, vp_size=v if v > 1 else None)
    comm = cpu_communication(config)  # emulation only: CPU p2p buffers over gloo

    def step() -> None:
        iters = [itertools.cycle(data) for _ in model]
        func(
            forward_step_func=forward_step,
            data_iterator=iters if v > 1 else iters[0],
            model=model if v > 1 else model[0],
            num_microbatches=args.microbatches,
            seq_length=seq,
            micro_batch_size=args.microbatch_size,
            **comm,
        )
        optimizer.step()
        optimizer.zero_grad()

    with cuda_to_cpu():
        if args.no_perseus:
            run_plain(args, step)
        else:
            engine = MegatronEngine(world, rank, args.microbatches, v)
            profile, gpu, power = emulated_setup(args, engine.schedule.num_stages)
            session = make_session(args, engine, gpu, profile, power).start()  # hooks its steps
            run_and_summarise(args, session, step, "megatron-core", engine.schedule)
    write_math(args, [p for c in model for p in c.parameters()])
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__.split("\n")[0], ("1f1b", "interleaved"), argv)
    return launch(worker, args)


if __name__ == "__main__":
    sys.exit(main())
