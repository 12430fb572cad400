"""A preempted run (SIGTERM, SIGKILL, a hung process) is no evidence about its batch size: the
size is retried (three preemptions in a row count as one failed run), and the next decisions
never wait for it. Each test runs on both engines: a SQLite file and a real PostgreSQL database."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from perseus.device.clock import VirtualClock
from perseus.errors import PerseusError
from perseus.recurring.database import open_store
from perseus.recurring.policy import BatchSizeOptimizer, Decision, Observation
from perseus.recurring.store import SQLStore, StartedRun

REPO = Path(__file__).resolve().parents[2]
SIZES = [32, 64, 128]

_CHILD = textwrap.dedent(
    """
    import signal, sys, time
    from perseus.recurring.job import RecurringJob
    from perseus.recurring.database import open_store

    class EnergyCounter:  # a GPU without power control: energy grows with time
        name = "counter"
        def energy_mj(self):
            return int(time.monotonic() * 200_000)  # 200 W

    db, mode = sys.argv[1], sys.argv[2]
    stop = []
    if mode == "handler":  # the program's own graceful-stop handler
        signal.signal(signal.SIGTERM, lambda s, f: stop.append(s))
    job = RecurringJob("j", batch_sizes=[32, 64, 128], default_batch_size=64,
                       store=open_store(db), gpu=EnergyCounter(), max_power_w=300.0,
                       own_gpu=False, heartbeat_interval_s=0.0, seed=0)
    with job.run() as run:
        print(run.batch_size, run.run_id, flush=True)
        while not stop:
            run.step(1)
            time.sleep(0.02)
        run.end_epoch(reached=True)
    print("finished", flush=True)
    """
)


def _start(db: str, mode: str = "plain") -> tuple[subprocess.Popen[str], int, str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, db, mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, proc.communicate(timeout=30)[1]
    size, run_id = line.split()
    time.sleep(0.3)  # a few steps: heartbeats with the cost so far
    return proc, int(size), run_id


def _decide(store: SQLStore) -> tuple[int, str]:
    policy = BatchSizeOptimizer(SIZES, 64)
    rng = np.random.default_rng(0)
    started = store.begin_run("j", lambda h, p: policy.decide(h, rng, pending=p))
    store.abandon_run(started.run_id)  # only the decision matters here
    return started.decision.batch_size, started.decision.phase


@pytest.fixture
def opened(request: pytest.FixtureRequest) -> Callable[..., SQLStore]:
    """``open_store``, closed when the test ends (a PostgreSQL connection is not left open)."""

    def open_(url: str, **options: Any) -> SQLStore:
        store = open_store(url, **options)
        request.addfinalizer(store.close)
        return store

    return open_


def _update(store: SQLStore, sql: str, run_id: str) -> None:
    """Change one run's row behind the store's back (what another host or process did)."""
    with store._write() as con:
        store._x(con, sql, (run_id,))


def _row(store: SQLStore, run_id: str) -> dict[str, object]:
    return next(r for r in store.runs("j") if r["run_id"] == run_id)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_killed_run_is_retried_and_never_waited_for(
    store_url: str, opened: Callable[..., SQLStore], sig: int
) -> None:
    proc, size, run_id = _start(store_url)
    assert size == 64  # the default runs first
    proc.send_signal(sig)
    proc.communicate(timeout=30)
    assert proc.returncode == -sig  # SIGTERM was not swallowed: the process ended by it
    store = opened(store_url)
    row = _row(store, run_id)
    if sig == signal.SIGTERM:  # marked before the process ended
        assert (row["status"], row["end_reason"]) == ("abandoned", "signal")
    else:  # nothing could run: still "running" until the next decision looks
        assert row["status"] == "running"
    assert row["pid"] == proc.pid and row["cost"] is not None and row["cost"] > 0
    # The next decision: a preemption says nothing about 64, so 64 runs again.
    assert _decide(store) == (64, "default")
    row = _row(store, run_id)
    assert row["status"] == "abandoned"
    assert row["end_reason"] == ("signal" if sig == signal.SIGTERM else "process gone")
    history = store.history("j")
    assert len(history) == 1
    preempted = history[0]
    assert (preempted.batch_size, preempted.reached, preempted.preempted) == (64, False, True)
    # Not pending, not blocked: later decisions never wait for it and never count it twice.
    assert _decide(store) == (64, "default")
    assert len(store.history("j")) == 1


def test_a_signal_inside_the_processs_own_transaction_still_marks_the_run(
    store_url: str, opened: Callable[..., SQLStore]
) -> None:
    """The signal lands while this process's heartbeat holds the run's row in an open
    transaction (what a SIGTERM under load often interrupts): the handler still marks the run
    abandoned, without waiting for a lock its own process holds."""
    store = opened(store_url)
    store.register_job("j", {"batch_sizes": SIZES})
    started = store.begin_run("j", lambda h, p: Decision(64, "default", None))
    # PostgreSQL: the interrupted transaction is gone (its commit fails), SQLite: committed
    with contextlib.suppress(PerseusError), store._write() as con:
        store._x(
            con, "UPDATE runs SET heartbeat_s = ? WHERE run_id = ?", (time.time(), started.run_id)
        )
        store.abandon_run(started.run_id, "signal", urgent=True)
    row = _row(opened(store_url), started.run_id)
    assert (row["status"], row["end_reason"]) == ("abandoned", "signal")
    assert _decide(opened(store_url)) == (64, "default")  # retried: a preemption


def test_a_preempted_run_of_the_best_arm_costs_it_nothing(
    store_url: str, opened: Callable[..., SQLStore]
) -> None:
    """Once sizes converged, a preempted run of the best size is no failure: that arm keeps
    its cost and stays in the walk (Thompson sampling), not penalised, pruned or blocked."""
    store = opened(store_url)
    store.register_job("j", {"batch_sizes": SIZES})
    for b, cost in ((64, 100.0), (32, 150.0), (128, 140.0)):
        started = store.begin_run("j", lambda h, p, b=b: Decision(b, "explore", None))
        store.finish_run(started.run_id, Observation(b, 200.0, cost, 1.0, cost, True, 5))
    started = store.begin_run("j", lambda h, p: Decision(64, "thompson", 200.0))
    store.heartbeat(started.run_id, Observation(64, 200.0, 30.0, 0.3, 30.0, False, 1))
    # The run's process dies (another host's lease here: it expires).
    _update(store, "UPDATE runs SET host = 'elsewhere' WHERE run_id = ?", started.run_id)
    later = opened(store_url, lease_s=60.0, clock=VirtualClock(time.time() + 61.0))
    policy = BatchSizeOptimizer(SIZES, 64)
    history = later.history("j")
    assert len(history) == 3  # pending, not yet counted: its lease is still valid for `store`
    sizes = []
    for seed in range(20):
        rng = np.random.default_rng(seed)
        s = later.begin_run("j", lambda h, p, rng=rng: policy.decide(h, rng, pending=p))
        sizes.append(s.decision.batch_size)
        later.abandon_run(s.run_id)
    history = later.history("j")
    assert len(history) == 4 and history[-1].preempted and history[-1].batch_size == 64
    assert policy.arm_costs(history)[64] == [100.0]  # no penalty: still the best arm
    assert 64 in sizes and set(sizes) <= set(SIZES)


def test_a_programs_own_sigterm_handler_still_runs_and_its_result_counts(
    store_url: str, opened: Callable[..., SQLStore]
) -> None:
    proc, _size, run_id = _start(store_url, "handler")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert out.strip().endswith("finished")  # the handler ran: the loop stopped on its flag
    row = _row(opened(store_url), run_id)
    assert (row["status"], row["end_reason"], row["reached"]) == ("done", None, 1)


def test_a_lease_expires_and_a_reused_pid_is_not_the_holder(
    store_url: str, opened: Callable[..., SQLStore]
) -> None:
    clock = VirtualClock(1000.0)
    store = opened(store_url, lease_s=300.0, clock=clock)
    store.register_job("j", {"batch_sizes": SIZES})
    policy = BatchSizeOptimizer(SIZES, 64)

    def begin() -> StartedRun:
        return store.begin_run(
            "j", lambda h, p: policy.decide(h, np.random.default_rng(0), pending=p)
        )

    hung = begin()  # this process: alive, so only its lease can end it
    reused = begin()
    _update(  # same pid, another start time: the pid was reused by another process
        store, "UPDATE runs SET process_start = 'other-boot:1' WHERE run_id = ?", reused.run_id
    )
    clock.advance(299.0)
    store.heartbeat(hung.run_id, Observation(64, 200.0, 5.0, 1.0, 5.0, False))
    begin()
    rows = {r["run_id"]: r for r in store.runs("j")}
    assert rows[reused.run_id]["end_reason"] == "process gone"
    assert rows[hung.run_id]["status"] == "running"  # renewed 0 s ago
    clock.advance(301.0)
    begin()
    rows = {r["run_id"]: r for r in store.runs("j")}
    assert rows[hung.run_id]["end_reason"] == "lease expired"
    # A slow (not dead) run that renews too late still finishes: its figures are the truth.
    assert store.finish_run(hung.run_id, Observation(64, 200.0, 9.0, 2.0, 9.0, True, 3))
    assert _row(store, hung.run_id)["status"] == "done"


#: Cost per run of each batch size (the job's truth): 64 is the best, b0 = 128 costs 2.5x.
_TRUE_COST = {32: 60.0, 64: 40.0, 128: 100.0, 256: 130.0}


def _replay(store: SQLStore, runs: int, preempt: set[tuple[int, int]]) -> list[int]:
    """``runs`` recurrences of the job through the store; the ``(run index, batch size)``
    pairs in ``preempt`` are preempted (SIGTERM) after a heartbeat instead of finishing."""
    sizes = sorted(_TRUE_COST)
    policy = BatchSizeOptimizer(sizes, 128)
    rng = np.random.default_rng(0)
    store.register_job("j", {"batch_sizes": sizes})
    chosen = []
    for i in range(runs):
        started = store.begin_run("j", lambda h, p: policy.decide(h, rng, pending=p))
        b = started.decision.batch_size
        chosen.append(b)
        cost = _TRUE_COST[b] * (1.0 + 0.02 * rng.standard_normal())
        if (i, b) in preempt:
            store.heartbeat(started.run_id, Observation(b, 200.0, cost / 4, 0.1, cost / 4, False))
            store.abandon_run(started.run_id, "signal")
            continue
        store.finish_run(started.run_id, Observation(b, 200.0, cost, 1.0, cost, True, 3))
    return chosen


def test_one_preemption_while_exploring_does_not_prune_the_best_size(
    store_url: str, tmp_path: Path, opened: Callable[..., SQLStore]
) -> None:
    """The replay that found it: b0 = 128 converges, the walk explores 64 and that run is
    preempted. Counted as a failure, 64 (and 32 behind it) was pruned and the job stayed at
    128, 2.5x the best cost, for good. A preemption is no evidence: 64 is retried and wins."""
    quiet = _replay(opened(f"sqlite:///{tmp_path / 'quiet.db'}"), 30, set())
    assert quiet[:2] == [128, 64]  # the walk explores 64 second
    chosen = _replay(opened(store_url), 30, {(1, 64)})
    assert chosen[:3] == [128, 64, 64]  # retried at once
    assert chosen[-10:].count(64) >= 8  # and the job settles on the best size


def test_three_preemptions_in_a_row_count_as_one_failed_run(
    store_url: str, opened: Callable[..., SQLStore]
) -> None:
    """A size that is always killed (the out-of-memory killer) is not retried for ever: the
    third preemption in a row counts as one failed run, and the walk moves past it."""
    store = opened(store_url)
    chosen = _replay(store, 8, {(1, 64), (2, 64), (3, 64)})
    assert chosen[:4] == [128, 64, 64, 64]
    assert 64 not in chosen[4:6]  # failed once, not converged: pruned by the policy's rule
    history = store.history("j")
    assert [o.preempted for o in history[1:4]] == [True, True, True]
    policy = BatchSizeOptimizer(sorted(_TRUE_COST), 128)
    assert len(policy.arm_costs(history)[64]) == 1  # three preemptions, one failure
