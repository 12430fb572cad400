"""The README's emulated training loop on simulated GPUs whose power cap holds the plan's clocks
down: the runtime reads back what ran, warns within the first iterations naming the cap,
records the held ops, and every rank's summary says (alike) that its figures do not measure the
plan; each iteration's time is the pipeline's, equal on every rank."""

from __future__ import annotations

from typing import Any

import pytest

from perseus.io import load_profile
from perseus.job import make_job
from perseus.runtime.emulation import scale_profile, take_stages
from tests.runtime._engines import run_ranks

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.pipelining")

BLOCKING_W = 83.64
SCALE = 0.25  # ops of 5-20 ms: long enough to read back on a loaded machine


def _profile():  # type: ignore[no-untyped-def]
    return scale_profile(take_stages(load_profile("a100"), 2), SCALE)


def _readme_rank(rank: int, world: int, plan: Any, cap_w: float | None) -> dict[str, Any]:
    """README "Wrap your training loop", with the simulated GPU's power cap."""
    import warnings

    import torch.distributed as dist
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from perseus import PerseusPipeline, SimulatedGPU
    from perseus.runtime.agent.readback import ClockHeldWarning

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    stage = PipelineStage(nn.Linear(64, 64), rank, world, torch.device("cpu"))
    schedule = Schedule1F1B(stage, n_microbatches=4, loss_fn=nn.functional.mse_loss)
    optimizer = torch.optim.SGD(stage.submod.parameters(), lr=1e-3)

    gpu = SimulatedGPU.from_profile(
        _profile(),
        blocking_power_w=BLOCKING_W,
        set_latency_s=0.005 * SCALE,
        publish_interval_s=0.1 * SCALE,
        power_cap_w=cap_w,
    )
    warned_at: list[int] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pp = PerseusPipeline(schedule, [stage], gpu=gpu, plan=plan).start()
        x, y = torch.randn(16, 64), torch.randn(16, 64)
        for i in range(5):
            with pp.iteration():
                schedule.step(x) if rank == 0 else schedule.step(target=y)
                optimizer.step()
            schedule.eval(x) if rank == 0 else schedule.eval(target=y)
            held = [w for w in caught if issubclass(w.category, ClockHeldWarning)]
            if held and not warned_at:
                warned_at.append(i)
        pp.close()
    held_warnings = [str(w.message) for w in caught if issubclass(w.category, ClockHeldWarning)]
    return {
        "times": [s.time_s for s in pp.history],
        "held": [s.held_ops for s in pp.history],
        "pipeline_held": [s.pipeline_held_ops for s in pp.history],
        "reasons": [s.held_reasons for s in pp.history],
        "share": [s.clock_share_at_plan for s in pp.history],
        "warnings": held_warnings,
        "warned_at": warned_at,
        "summary": str(pp.summary),
        "caveat": pp.summary.caveat if pp.summary is not None else "no summary",
    }


def _allmax_plan():  # type: ignore[no-untyped-def]
    """The fastest plan of a 1F1B job at a locked top clock: every op at 1410 MHz."""
    job = make_job(_profile(), "1f1b", 2, 4, blocking_power_w=BLOCKING_W)
    return job.frontier([job.point(job.allmax())])


@pytest.mark.slow
def test_a_power_cap_that_holds_the_plans_clocks_is_flagged_and_the_summary_says_so():
    results = run_ranks(2, _readme_rank, _allmax_plan(), 250.0)
    for r in results:
        # One warning, naming the power cap, within the first two iterations.
        assert len(r["warnings"]) == 1, r["warnings"]
        assert "power cap" in r["warnings"][0] and "1410 MHz" in r["warnings"][0]
        assert r["warned_at"] and r["warned_at"][0] <= 1
        # IterationStats record the held ops, this rank's and the pipeline's (one reading per
        # op, by a thread of the emulating process: on a loaded machine a few go unread).
        held = [h for it in r["held"] for h in it]
        assert sum(1 for it in r["held"] if it) >= 3 and held
        assert all(
            h.reasons == ("sw_power_cap",) and h.applied_mhz < h.planned_mhz == 1410 for h in held
        )
        assert all(share in (None, 0.0) for share in r["share"])
        for i, pipeline_held in enumerate(r["pipeline_held"]):
            assert pipeline_held == sum(len(x["held"][i]) for x in results)
            assert r["reasons"][i] == (("sw_power_cap",) if pipeline_held else ())
        assert "do not measure the plan" in r["caveat"] and "power cap" in r["caveat"]
    # The pipeline's time, equal on every rank; the same summary everywhere.
    assert results[0]["times"] == results[1]["times"]
    assert results[0]["summary"] == results[1]["summary"]


@pytest.mark.slow
def test_without_a_cap_the_plans_clocks_are_delivered_and_ranks_agree():
    results = run_ranks(2, _readme_rank, _allmax_plan(), None)
    for r in results:
        assert r["warnings"] == [] and not any(r["held"])
        assert all(share in (None, 1.0) for share in r["share"]) and 1.0 in r["share"]
    assert results[0]["times"] == results[1]["times"]
    assert results[0]["summary"] == results[1]["summary"]


def _gpu_rank(rank: int, world: int, plan: Any) -> list[float]:
    """Two ranks on NVML-like GPUs with CUDA-like events (device clocks of different hosts are
    not comparable): each iteration's time is still the pipeline's, the same on both."""
    import os
    import tempfile
    import time

    import torch.distributed as dist

    from perseus.runtime.session import RankSession, SessionOptions
    from perseus.schedule import build_schedule
    from tests.runtime.test_agent import _cuda_like_events, counting_gpu

    dist.init_process_group("gloo")
    os.environ["PERSEUS_LOCK_DIR"] = tempfile.mkdtemp()
    schedule = build_schedule("1f1b", 2, 4)
    session = RankSession(
        schedule,
        rank,
        gpu=counting_gpu()[0],
        plan=plan,
        options=SessionOptions(
            blocking_power_w=BLOCKING_W,
            events=_cuda_like_events(),
            watchdog=False,
            handle_signals=False,
        ),
    )
    with session:
        for _ in range(3):
            with session.iteration():
                for action in schedule.rank_actions[rank]:
                    with session.op(action):
                        time.sleep(0.002 * (rank + 1))  # the ranks' spans differ
    return [s.time_s for s in session.history]


def test_on_gpus_each_iterations_time_is_the_same_on_every_rank():
    times = run_ranks(2, _gpu_rank, _allmax_plan())
    assert times[0] == times[1] and all(t > 0.0 for t in times[0])
