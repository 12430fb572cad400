"""torchtitan-style use of torch pipelining: a session from ``(pp_schedule, model_parts)`` with
no private attribute in user code, DualPipeV planned with split full backwards, and a profile
that must fit the model."""

from __future__ import annotations

from typing import Any

import pytest

from perseus.dag import build_dag
from perseus.errors import ConfigError, ProfileError, ScheduleError
from perseus.io import load_profile
from perseus.runtime.emulation import take_stages
from perseus.runtime.engines import torch_pp
from perseus.schedule import Kind
from tests.runtime._engines import run_ranks

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.pipelining")


@pytest.mark.parametrize(("ranks", "microbatches"), [(2, 4), (2, 6), (3, 6), (4, 8)])
def test_dualpipev_plans_full_backwards_as_b_then_w(ranks, microbatches):
    with pytest.raises(ScheduleError, match="split_full_backward=True"):
        torch_pp.schedule_from_torch_class("DualPipeV", ranks, microbatches, 2)
    s = torch_pp.schedule_from_torch_class(
        "DualPipeV", ranks, microbatches, 2, split_full_backward=True
    )
    assert s.has_weight_actions
    for acts in s.rank_actions:
        for i, a in enumerate(acts):
            if a.kind is Kind.B:
                # Every backward has its W on the same rank, after it.
                assert any(
                    b.kind is Kind.W
                    and (b.stage_index, b.microbatch_index) == (a.stage_index, a.microbatch_index)
                    for b in acts[i + 1 :]
                )
    graph = build_dag(s)
    assert graph.num_nodes == 3 * s.num_stages * microbatches
    # V placement: rank 0 holds the first and the last stage.
    assert s.stage_to_rank[0] == s.stage_to_rank[-1] == 0


def test_profile_must_fit_the_model():
    s = torch_pp.schedule_from_torch_class("1f1b", 4, 8)
    torch_pp.check_profile_fits(take_stages(load_profile("a100"), 4), s)
    with pytest.raises(ProfileError, match="8 stages but the model is split into 4"):
        torch_pp.check_profile_fits(load_profile("a100"), s)


def test_stages_of_reads_the_schedule_and_checks_model_parts():
    parts = [torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)]
    stages = [torch_pp._RecordingStage(s, 4, 2, 0) for s in (2, 0)]
    for st, part in zip(stages, reversed(parts), strict=True):
        st.submod = part
    cls = torch_pp.torch_class_for("Interleaved1F1B")
    sched = cls(stages, 4)
    got = torch_pp.stages_of(sched, parts)
    assert [int(st.stage_index) for st in got] == [0, 2]
    with pytest.raises(ConfigError, match="not the schedule's stage modules"):
        torch_pp.stages_of(sched, list(reversed(parts)))
    with pytest.raises(ConfigError, match="holds no pipeline stages"):
        torch_pp.stages_of(object())


def _titan_rank(rank: int, world: int, microbatches: int, torch_class: str) -> dict[str, Any]:
    """A torchtitan-like trainer, wrapped as the README shows: it keeps (pp_schedule,
    model_parts) and nothing else, and its simulated GPU is SimulatedGPU.from_profile(profile,
    blocking_power_w=...) with no index, state directory, clock, timeline or emulate flag."""
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage

    from perseus.device.simulated import SimulatedGPU
    from perseus.io import default_blocking_power_w
    from perseus.runtime.pipeline import SessionOptions, perseus_pipeline

    dist.init_process_group("gloo", rank=rank, world_size=world)
    cls = torch_pp.torch_class_for(torch_class)
    v_shape = torch_class in ("DualPipeV", "ZBVZeroBubble")
    num_stages = 2 * world if v_shape else world
    indices = (rank, num_stages - 1 - rank) if v_shape else (rank,)
    model_parts, stages = [], []
    for index in indices:
        torch.manual_seed(index)
        part = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
        model_parts.append(part)
        stages.append(PipelineStage(part, index, num_stages, torch.device("cpu")))
    loss = torch.nn.functional.mse_loss
    pp_schedule = cls(stages if v_shape else stages[0], microbatches, loss_fn=loss)
    del stages  # from here on, only what torchtitan's trainer keeps

    bundled = load_profile("a100")
    power = default_blocking_power_w(bundled)
    assert power is not None
    profile = take_stages(bundled, num_stages)
    gpu = SimulatedGPU.from_profile(profile, blocking_power_w=power)
    pp = perseus_pipeline(
        pp_schedule,
        model_parts,
        gpu=gpu,
        plan=profile,
        options=SessionOptions(blocking_power_w=power),
    ).start()
    x, y = torch.randn(2 * microbatches, 8), torch.randn(2 * microbatches, 8)
    last = num_stages - 1
    holds_last = pp.schedule.stage_to_rank[last] == rank
    for i in range(4):
        with pp.iteration():
            pp_schedule.step(*((x,) if rank == 0 else ()), target=y if holds_last else None)
        if i == 1 and not v_shape:  # evaluation between iterations: runs untouched
            pp_schedule.eval(*((x,) if rank == 0 else ()), target=y if holds_last else None)
    pp.close()
    return {
        "times": [s.time_s for s in pp.history],
        "predicted": pp.history[-1].predicted_time_s,
        "schedule": pp.schedule.name,
        "gpu_index": pp.gpu.index,
    }


@pytest.mark.slow
@pytest.mark.parametrize("torch_class", ["1F1B", "DualPipeV"])
def test_torchtitan_style_session_as_the_readme_shows_it(torch_class):
    """No argument the README does not show: each rank gets its own simulated GPU, the
    cross-rank timeline is on, DualPipeV goes through perseus_pipeline, schedule.eval()
    between iterations runs untouched, and the iterations take the predicted time (within
    2 %, after the first)."""
    results = run_ranks(2, _titan_rank, 4, torch_class)
    assert [r["gpu_index"] for r in results] == [0, 1]
    for r in results:
        assert len(r["times"]) == 4
        mean_s = sum(r["times"][1:]) / 3
        assert abs(mean_s / r["predicted"] - 1) <= 0.02, r


def _two_steps_rank(rank: int, world: int) -> dict[str, Any]:
    """Gradient accumulation by two schedule.step() calls in one iteration, one rank."""
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from perseus.device.simulated import SimulatedGPU
    from perseus.errors import PlanError
    from perseus.runtime.emulation import scale_profile
    from perseus.runtime.pipeline import PerseusPipeline, SessionOptions

    dist.init_process_group("gloo", rank=rank, world_size=world)
    part = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
    stage = PipelineStage(part, 0, 1, torch.device("cpu"))
    schedule = Schedule1F1B(stage, 2, loss_fn=torch.nn.functional.mse_loss)
    profile = scale_profile(take_stages(load_profile("a100"), 1), 0.02)
    gpu = SimulatedGPU.from_profile(profile, blocking_power_w=83.64)
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    message = ""
    with PerseusPipeline(
        schedule, [stage], gpu=gpu, plan=profile, options=SessionOptions(blocking_power_w=83.64)
    ) as pp:
        try:
            with pp.iteration():
                schedule.step(x, target=y)
                schedule.step(x, target=y)
        except PlanError as e:
            message = str(e)
        with pp.iteration():  # usable afterwards
            schedule.step(x, target=y)
    return {"message": message, "iterations": len(pp.history)}


def test_two_schedule_steps_in_one_iteration_are_refused_naming_schedule_step():
    (result,) = run_ranks(1, _two_steps_rank)
    assert "one engine step (schedule.step())" in result["message"]
    assert "raise the microbatch count" in result["message"]
    assert result["iterations"] == 1
