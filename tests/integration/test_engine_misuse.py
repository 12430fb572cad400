"""An evaluation pass inside a training iteration is refused on every engine, in the words of
the engine's own API and before it communicates (every rank refuses alike, none waits), and the
session goes on: the next iteration runs and is measured.

Its device time would otherwise count as the iteration's (DeepSpeed's ``eval_batch()`` was
counted silently) or its forwards would break the plan's order (Megatron's
``forward_only=True`` got a PlanError that blamed the plan)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.runtime._engines import Recorder, run_ranks

torch = pytest.importorskip("torch")

MICROBATCHES = 4
#: The message every engine gives, after the engine's own call.
MISUSE = "ran inside `with session.iteration():`: an evaluation (forward-only) pass"


def _session(engine: Any, stages: int) -> Any:
    from perseus.device.simulated import SimulatedGPU
    from perseus.io import default_blocking_power_w, load_profile
    from perseus.runtime.emulation import scale_profile, take_stages
    from perseus.runtime.session import RankSession, SessionOptions

    bundled = load_profile("a100")
    power = default_blocking_power_w(bundled)
    profile = scale_profile(take_stages(bundled, stages), 0.25)
    gpu = SimulatedGPU.from_profile(profile, blocking_power_w=power)
    return RankSession(
        engine, gpu=gpu, plan=profile, options=SessionOptions(blocking_power_w=power)
    )


def _misuse_between(session: Any, train: Any, evaluate: Any) -> dict[str, Any]:
    """Train, evaluate inside an iteration (refused), train again; what each rank saw."""
    from perseus.errors import ConfigError

    errors = []
    with session:
        with session.iteration():
            train()
        try:
            with session.iteration():
                evaluate()
        except ConfigError as e:
            errors.append(str(e))
        with session.iteration():
            train()
    return {"errors": errors, "iterations": len(session.history)}


def _check(results: list[dict[str, Any]], call: str) -> None:
    for r in results:
        assert r["errors"] == [
            f"{call} {MISUSE} inside a training iteration; evaluate between iterations, where "
            "it runs untouched at the current clock"
        ]
        assert r["iterations"] == 2  # the refused iteration is discarded, the next one counts


# --------------------------------------------------------------------------- Megatron-Core


def _megatron_rank(rank: int, world: int) -> dict[str, Any]:
    from perseus.runtime.engines import megatron
    from tests.runtime.test_megatron import megatron_1f1b

    run = megatron_1f1b(rank, world, MICROBATCHES)
    session = _session(megatron.MegatronEngine(world, rank, MICROBATCHES), world)
    with megatron.cuda_to_cpu():
        return _misuse_between(session, lambda: run(False), lambda: run(True))


@pytest.mark.slow
def test_megatron_forward_only_inside_an_iteration_is_named():
    pytest.importorskip("megatron.core")
    _check(run_ranks(2, _megatron_rank), "forward_backward_func(..., forward_only=True)")


def _megatron_held_function_rank(rank: int, world: int) -> dict[str, Any]:
    """A schedule function fetched before the hooks went in (``get_forward_backward_func()``
    at start-up): the forward step finds ``forward_only`` on the stack."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import schedules
    from megatron.core.transformer import TransformerConfig

    from perseus.errors import ConfigError
    from perseus.runtime.engines import megatron
    from tests.runtime.test_megatron import _Chunk

    dist.init_process_group("gloo", rank=rank, world_size=world)
    parallel_state.initialize_model_parallel(pipeline_model_parallel_size=1)
    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1)
    model = _Chunk(0, 8, config, Recorder())
    held = schedules.forward_backward_no_pipelining
    errors = []
    with megatron.instrument_megatron(1, 0, Recorder(), lambda: True), megatron.cuda_to_cpu():
        try:
            held(
                forward_step_func=lambda it, chunk: (chunk(next(it)), lambda o: (o.mean(), {})),
                data_iterator=iter([torch.randn(4, 2, 8)]),
                model=model,
                num_microbatches=1,
                seq_length=4,
                micro_batch_size=2,
                forward_only=True,
            )
        except ConfigError as e:
            errors.append(str(e))
    return {"errors": errors, "iterations": 2}


@pytest.mark.slow
def test_megatron_forward_only_through_a_held_schedule_function_is_named():
    pytest.importorskip("megatron.core")
    _check(
        run_ranks(1, _megatron_held_function_rank), "forward_backward_func(..., forward_only=True)"
    )


# --------------------------------------------------------------------------- DeepSpeed


def _deepspeed_rank(rank: int, world: int) -> dict[str, Any]:
    import logging

    import deepspeed
    from deepspeed.pipe import LayerSpec, PipelineModule
    from torch import nn

    from perseus.runtime.engines import deepspeed as ds

    ds.skip_cpu_shm_op()
    deepspeed.init_distributed(dist_backend="gloo")
    deepspeed.utils.logger.setLevel(logging.ERROR)
    torch.manual_seed(0)
    module = PipelineModule(
        layers=[LayerSpec(nn.Linear, 8, 8) for _ in range(world)],
        num_stages=world,
        loss_fn=nn.MSELoss(),
        partition_method="uniform",
    )
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": MICROBATCHES,
        "optimizer": {"type": "SGD", "params": {"lr": 1e-2}},
        "steps_per_print": 10**9,
    }
    engine, *_ = deepspeed.initialize(
        model=module, model_parameters=list(module.parameters()), config=config
    )
    data = iter([(torch.randn(2, 8), torch.randn(2, 8)) for _ in range(8 * MICROBATCHES)])
    session = _session(ds.DeepSpeedEngine(engine), world)
    return _misuse_between(
        session, lambda: engine.train_batch(data), lambda: engine.eval_batch(data)
    )


@pytest.mark.slow
def test_deepspeed_eval_batch_inside_an_iteration_is_refused():
    pytest.importorskip("deepspeed")
    _check(run_ranks(2, _deepspeed_rank), "engine.eval_batch()")


# --------------------------------------------------------------------------- torch pipelining


def _torch_rank(rank: int, world: int) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from perseus.runtime.engines.torch_pp import TorchPipelining

    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(rank)
    part = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
    stage = PipelineStage(part, rank, world, torch.device("cpu"))
    schedule = Schedule1F1B(stage, MICROBATCHES, loss_fn=torch.nn.functional.mse_loss)
    x, y = torch.randn(2 * MICROBATCHES, 8), torch.randn(2 * MICROBATCHES, 8)
    args = (x,) if rank == 0 else ()
    target = y if rank == world - 1 else None
    session = _session(TorchPipelining(schedule), world)
    return _misuse_between(
        session,
        lambda: schedule.step(*args, target=target),
        lambda: schedule.eval(*args, target=target),
    )


@pytest.mark.slow
def test_torch_schedule_eval_inside_an_iteration_is_refused_on_every_rank():
    pytest.importorskip("torch.distributed.pipelining")
    _check(run_ranks(2, _torch_rank), "schedule.eval()")
