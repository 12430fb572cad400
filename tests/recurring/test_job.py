"""The training-loop API on a simulated GPU: JIT profiling, caching, early stopping."""

from __future__ import annotations

from pathlib import Path

import pytest

from perseus.device.clock import VirtualClock
from perseus.device.simulated import SimulatedGPU
from perseus.errors import ConfigError
from perseus.recurring.cost import zeus_cost
from perseus.recurring.job import RecurringJob, RecurringRun
from perseus.recurring.policy import Observation
from perseus.recurring.profiler import candidate_power_limits_w
from perseus.recurring.store import SQLiteStore
from perseus.schedule.actions import Kind


@pytest.fixture
def setup(tmp_path: Path) -> tuple[SimulatedGPU, VirtualClock, RecurringJob]:
    clock = VirtualClock()
    gpu = SimulatedGPU.from_preset(
        "a40",
        state_dir=tmp_path / "sim",
        publish_interval_s=0.0,
        set_latency_s=0.0,
        activity=1.0,
        clock=clock,
    )
    job = RecurringJob(
        "job",
        batch_sizes=[32, 64, 128],
        default_batch_size=64,
        store=SQLiteStore(tmp_path / "db"),
        gpu=gpu,
        eta=0.5,
        own_gpu=False,
        profiler_kwargs={"warmup_steps": 2, "settle_steps": 1, "window_steps": 3},
        clock=clock,
    )
    return gpu, clock, job


def _steps(run: RecurringRun, gpu: SimulatedGPU, clock: VirtualClock, n: int) -> None:
    for _ in range(n):
        gpu.launch(0, Kind.F)  # the simulated GPU runs the step on its own timeline
        clock.sleep(gpu.op_cost(0, Kind.F)[0])  # the host waits for it (virtual clock)
        run.step(run.batch_size)


def test_first_run_profiles_and_picks_the_cheapest_limit_then_reruns_use_the_cache(
    setup: tuple[SimulatedGPU, VirtualClock, RecurringJob],
) -> None:
    gpu, clock, job = setup
    low, high = gpu.power_limit_range_w()
    expected = {}
    for w in candidate_power_limits_w(low, high):
        gpu.set_power_limit_w(w)
        t, e = gpu.op_cost(0, Kind.F)
        expected[w] = zeus_cost(e, t, 0.5, high)
    gpu.reset_power_limit()
    best = min(expected, key=lambda w: (expected[w], -w))
    assert best < high  # the cap matters on this model, so the test can fail
    with job.run() as run:
        assert run.profiling and run.batch_size == 64
        _steps(run, gpu, clock, 200)
        assert not run.profiling
        assert run.power_limit_w == best == gpu.power_limit_w()
        run.end_epoch(reached=True)
    assert gpu.power_limit_w() == high  # reset after the run
    assert job.store.cached_power_limit_w("job", gpu.name, 64) == best
    history = job.store.history("job")
    assert len(history) == 1 and history[0].reached and history[0].epochs == 1
    assert history[0].energy_j > 0 and history[0].cost > 0
    # A re-run at the same batch size sets the cached limit at once (no profiling).
    job.store.finish_run(  # make 64 the only sensible choice: neighbours already failed
        job.store.begin_run("job", lambda h, p: job.policy.decide(h, job._rng)).run_id,
        Observation(32, best, 1e9, 1e9, 1e9, False, 1),
    )
    job.store.finish_run(
        job.store.begin_run("job", lambda h, p: job.policy.decide(h, job._rng)).run_id,
        Observation(128, best, 1e9, 1e9, 1e9, False, 1),
    )
    with job.run() as run:
        assert run.batch_size == 64 and not run.profiling
        assert gpu.power_limit_w() == best
        run.end_epoch(reached=True)


def test_a_run_past_beta_times_the_best_cost_stops_early_and_counts_as_failed(
    setup: tuple[SimulatedGPU, VirtualClock, RecurringJob],
) -> None:
    gpu, clock, job = setup
    job.store.register_job("job", job._config())
    for bs in (32, 64, 128):
        job.store.save_power_limit_w("job", gpu.name, bs, 300.0, {})
    with job.run() as run:  # the default converges after one epoch: the best so far
        _steps(run, gpu, clock, 20)
        assert run.end_epoch(reached=True)
    best = job.store.history("job")[0].cost
    with job.run() as run:
        assert run.decision.cost_limit == pytest.approx(2.0 * best)
        stops = []
        for _ in range(10):
            _steps(run, gpu, clock, 20)
            stops.append(run.end_epoch(reached=False))
            if stops[-1]:
                break
        assert run.stopped_early and not run.reached
        assert run.cost() <= 2.0 * best * 1.05
    last = job.store.history("job")[-1]
    assert not last.reached and last.epochs == len(stops)


def test_a_cached_limit_outside_the_gpus_range_is_named_and_not_a_failure(
    setup: tuple[SimulatedGPU, VirtualClock, RecurringJob],
) -> None:
    gpu, _clock, job = setup
    job.store.register_job("job", job._config())
    low, _high = gpu.power_limit_range_w()
    job.store.save_power_limit_w("job", gpu.name, 64, low / 2, {})
    with (
        pytest.raises(ConfigError, match=r"power_limits row .* outside this GPU's range"),
        job.run(),
    ):
        pytest.fail("the run must not start")
    assert gpu.power_limit_w() == gpu.power_limit_range_w()[1]  # nothing was set
    (row,) = job.store.runs("job")
    assert (row["status"], row["end_reason"]) == ("abandoned", "not started")
    assert job.store.history("job") == []  # not a failed run of 64: the store was at fault


def test_the_lease_is_renewed_with_the_cost_so_far(
    setup: tuple[SimulatedGPU, VirtualClock, RecurringJob],
) -> None:
    gpu, clock, job = setup
    job.heartbeat_interval_s = 0.5
    with job.run() as run:
        _steps(run, gpu, clock, 30)
        (row,) = job.store.runs("job")
        assert row["status"] == "running" and row["cost"] > 0
        assert row["cost"] == pytest.approx(run.cost(), rel=0.5)
        run.end_epoch(reached=True)
    (row,) = job.store.runs("job")
    assert row["status"] == "done"


def test_a_profile_the_busy_store_cannot_cache_does_not_stop_the_training(
    setup: tuple[SimulatedGPU, VirtualClock, RecurringJob], caplog: pytest.LogCaptureFixture
) -> None:
    """The lease's renewals survive a busy store (PerseusError); caching the profile at the
    step that ended it raised out of run.step() and ended the training. The run keeps the
    limit it chose, and the next run of that size profiles again."""
    import contextlib
    import sqlite3

    gpu, clock, job = setup
    job.store.busy_timeout_s = 0.1
    with job.run() as run:
        assert run.profiling
        path = job.store.path  # type: ignore[attr-defined]
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")  # another writer holds the lock meanwhile
            _steps(run, gpu, clock, 200)
            other.execute("ROLLBACK")
        high = gpu.power_limit_range_w()[1]
        assert not run.profiling and run.power_limit_w == gpu.power_limit_w() < high
        run.end_epoch(reached=True)
    assert job.store.cached_power_limit_w("job", gpu.name, 64) is None
    assert [o.reached for o in job.store.history("job")] == [True]
    assert "is not cached" in caplog.text
