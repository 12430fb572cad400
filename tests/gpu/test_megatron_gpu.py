"""Megatron-Core's own 1F1B on real GPUs (NCCL), with perseus's hooks and no emulation means.

Needs two NVIDIA GPUs (NCCL refuses two ranks on one GPU); skipped otherwise. Checks that the
forward/backward steps Megatron runs on GPUs are the ones perseus planned, in order, and that
each hook window contains the step's CUDA work (the stream is synchronised inside the window).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import pytest

from tests.runtime._engines import run_ranks

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")


def _gpu_rank(rank: int, world: int, microbatches: int) -> dict[str, Any]:
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.enums import ModelType
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.transformer import TransformerConfig

    from perseus.runtime.engines.megatron import instrument_megatron

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    parallel_state.initialize_model_parallel(pipeline_model_parallel_size=world)
    hidden, seq, mbs = 256, 32, 4
    config = TransformerConfig(
        num_layers=world,
        hidden_size=hidden,
        num_attention_heads=1,
        pipeline_dtype=torch.float32,
        pipeline_model_parallel_size=world,
    )

    class Chunk(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(hidden, hidden)
            self.config, self.model_type = config, ModelType.encoder_or_decoder
            self.input: Any = None

        def set_input_tensor(self, tensors: list[Any]) -> None:
            self.input = tensors[0]

        def forward(self, x: Any) -> Any:
            return torch.tanh(self.lin(x if rank == 0 else self.input))

    model = Chunk().cuda()
    data = [torch.randn(seq, mbs, hidden, device="cuda") for _ in range(microbatches)]
    windows: list[tuple[str, float]] = []

    @contextmanager
    def timed(action: Any) -> Any:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        yield
        end.record()
        end.synchronize()
        windows.append((str(action), start.elapsed_time(end)))

    def forward_step(it: Any, chunk: Any) -> Any:
        y = chunk(next(it))
        return y, lambda o: ((o**2).mean(), {"loss": (o**2).mean().detach()})

    func = get_forward_backward_func()
    with instrument_megatron(world, rank, timed):
        func(
            forward_step_func=forward_step,
            data_iterator=iter(data),
            model=model,
            num_microbatches=microbatches,
            seq_length=seq,
            micro_batch_size=mbs,
        )
    return {"windows": windows}


def test_megatron_1f1b_on_gpus_runs_the_planned_steps_in_order():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs: NCCL does not run two pipeline ranks on one GPU")
    from perseus.runtime.engines.megatron import megatron_schedule

    results = run_ranks(2, _gpu_rank, 4)
    expected = megatron_schedule(2, 4)
    for rank, got in enumerate(results):
        assert [a for a, _ in got["windows"]] == [str(a) for a in expected.rank_actions[rank]]
        assert all(ms > 0 for _, ms in got["windows"])
