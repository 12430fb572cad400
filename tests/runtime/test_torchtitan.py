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


def _titan_rank(rank: int, world: int, microbatches: int) -> dict[str, Any]:
    """A torchtitan-like trainer: it keeps (pp_schedule, model_parts) and nothing else."""
    import tempfile

    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from perseus.device.simulated import SimulatedGPU
    from perseus.io import default_blocking_power_w
    from perseus.job import make_job
    from perseus.runtime.emulation import scale_profile

    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(rank)
    model_parts = [torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())]
    stage = PipelineStage(model_parts[0], rank, world, torch.device("cpu"))
    pp_schedule = Schedule1F1B(stage, microbatches, loss_fn=torch.nn.functional.mse_loss)
    del stage  # from here on, only what torchtitan's trainer keeps

    bundled = load_profile("a100")
    power = default_blocking_power_w(bundled)
    assert power is not None
    profile = scale_profile(take_stages(bundled, world), 0.02)
    gpu = SimulatedGPU.from_profile(
        profile,
        blocking_power_w=power,
        index=rank,
        state_dir=tempfile.mkdtemp(),
        set_latency_s=0.0,
    )
    # A one-point plan (all clocks at max) keeps the test about construction, not planning.
    job = make_job(profile, "1f1b", world, microbatches, blocking_power_w=power)
    plan = job.frontier([job.point(job.allmax())])
    pp = torch_pp.perseus_pipeline(
        pp_schedule,
        model_parts,
        gpu=gpu,
        blocking_power_w=power,
        plan=plan,
        profile=profile,
        emulate=True,
    ).start()
    x, y = torch.randn(2 * microbatches, 8), torch.randn(2 * microbatches, 8)
    for _ in range(3):
        with pp.iteration():
            pp_schedule.step(*((x,) if rank == 0 else ()), target=y if rank == world - 1 else None)
    pp.close()
    return {"iterations": len(pp.history), "schedule": pp.schedule.name}


def test_torchtitan_style_session_runs_without_private_attributes():
    results = run_ranks(2, _titan_rank, 4)
    assert [r["iterations"] for r in results] == [3, 3]


def _dualpipev_rank(rank: int, world: int, microbatches: int) -> dict[str, Any]:
    """DualPipeV (full and split backwards) run under PerseusPipeline on emulated GPUs."""
    import tempfile

    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage

    from perseus.device.simulated import SimulatedGPU
    from perseus.io import default_blocking_power_w
    from perseus.runtime.emulation import scale_profile
    from perseus.runtime.pipeline import PerseusPipeline
    from perseus.runtime.planning import job_for_schedule

    dist.init_process_group("gloo", rank=rank, world_size=world)
    num_stages = 2 * world
    parts, stages = [], []
    for index in (rank, num_stages - 1 - rank):  # V placement
        torch.manual_seed(index)
        part = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
        parts.append(part)
        stages.append(PipelineStage(part, index, num_stages, torch.device("cpu")))
    cls = torch_pp.torch_class_for("DualPipeV")
    pp_schedule = cls(stages, microbatches, loss_fn=torch.nn.functional.mse_loss)
    bundled = load_profile("a100")
    power = default_blocking_power_w(bundled)
    assert power is not None
    profile = scale_profile(take_stages(bundled, num_stages), 0.25).split_backward(0.5)
    gpu = SimulatedGPU.from_profile(
        profile, blocking_power_w=power, index=rank, state_dir=tempfile.mkdtemp()
    )
    schedule = torch_pp.schedule_from_torch(pp_schedule, split_full_backward=True)
    job = job_for_schedule(schedule, profile, power)
    plan = job.frontier([job.point(job.allmax())])
    pp = PerseusPipeline(
        pp_schedule,
        stages,
        gpu=gpu,
        blocking_power_w=power,
        plan=plan,
        profile=profile,
        emulate=True,
        watchdog=False,
        handle_signals=False,
    ).start()
    x, y = torch.randn(2 * microbatches, 8), torch.randn(2 * microbatches, 8)
    for _ in range(3):
        with pp.iteration():
            pp_schedule.step(x if rank == 0 else None, target=y if rank == 0 else None)
    pp.close()
    return {"times": [s.time_s for s in pp.history], "predicted": plan.points[0].time_s}


def test_dualpipev_runs_under_perseus_pipeline_with_split_full_backwards():
    results = run_ranks(2, _dualpipev_rank, 4)
    for r in results:
        assert len(r["times"]) == 3
        # The W after each full backward is an op of its own on the simulated device: the
        # iteration takes the planned time (the first one pays start-up).
        assert abs(r["times"][-1] / r["predicted"] - 1) <= 0.05, r
