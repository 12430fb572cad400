"""A signal that does not end the process leaves the run and its GPU alone; no run that measured
nothing is ever stored, and no power profile of zeros is ever used.

The runs go in child processes on a simulated A40 driven by a virtual clock, so a run that is
signalled can be compared figure for figure with one that is not: a reset of the power limit
in the middle of a profiling window shows up as a different profile and a different run.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from perseus.device.clock import VirtualClock
from perseus.errors import ConfigError
from perseus.recurring.job import RecurringJob
from perseus.recurring.policy import Decision, Observation
from perseus.recurring.store import SQLiteStore

REPO = Path(__file__).resolve().parents[2]

_RUN = textwrap.dedent(
    """
    import json, os, signal, sqlite3, sys
    from pathlib import Path
    from perseus.device.clock import VirtualClock
    from perseus.device.simulated import SimulatedGPU
    from perseus.recurring.job import RecurringJob
    from perseus.recurring.store import SQLiteStore
    from perseus.schedule.actions import Kind

    tmp, mode, own = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "own"

    clock = VirtualClock()
    gpu = SimulatedGPU.from_preset("a40", state_dir=tmp / "sim", publish_interval_s=0.0,
                                   set_latency_s=0.0, activity=1.0, clock=clock)
    seen = []
    if mode == "handler":  # the application's own "stop after this epoch" handler
        signal.signal(signal.SIGINT, lambda s, f: seen.append(s))
    elif mode == "ignored":  # SIGINT in a background job of a script (cmd &)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    elif mode == "caught":  # Ctrl-C's KeyboardInterrupt, caught by the loop, which goes on
        signal.signal(signal.SIGINT, signal.default_int_handler)  # even under cmd &
    job = RecurringJob("j", batch_sizes=[64], default_batch_size=64,
                       store=SQLiteStore(tmp / "db"), gpu=gpu, own_gpu=own, clock=clock,
                       heartbeat_interval_s=1e9,
                       profiler_kwargs={"warmup_steps": 2, "settle_steps": 1, "window_steps": 3})
    limits = []
    with job.run() as run:
        for step in range(300):
            gpu.launch(0, Kind.F)
            clock.sleep(gpu.op_cost(0, Kind.F)[0])
            if step == 40:  # mid-profiling, under a lowered limit
                try:
                    if mode != "none":
                        os.kill(os.getpid(), signal.SIGINT)
                except KeyboardInterrupt:
                    seen.append("caught")
                limits.append(gpu.power_limit_w())
            run.step(64)
        run.end_epoch(reached=True)
    store = SQLiteStore(tmp / "db")
    row = store.runs("j")[0]
    con = sqlite3.connect(tmp / "db")
    profile = con.execute("SELECT power_limit_w, profile FROM power_limits").fetchone()
    profile = profile or (None, "{}")
    print(json.dumps({"row": {k: row[k] for k in ("status", "energy_j", "time_s", "cost",
                                                  "power_limit_w", "end_reason")},
                      "cached": profile[0], "profile": json.loads(profile[1]),
                      "seen": len(seen), "limits": limits}))
    """
)


def _run(tmp_path: Path, mode: str, own: str) -> dict[str, Any]:
    work = tmp_path / f"{mode}-{own}"
    work.mkdir(mode=0o700)
    proc = subprocess.run(
        [sys.executable, "-c", _RUN, str(work), mode, own],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("own", ["own", "shared"])
@pytest.mark.parametrize("mode", ["handler", "ignored"])
def test_a_sigint_the_run_survives_leaves_its_row_and_profile_as_without_it(
    tmp_path: Path, mode: str, own: str
) -> None:
    """The application handles (or ignores) SIGINT and trains on: the GPU keeps the limit the
    profiler set, so the run's row and its power profile are what an unsignalled run gives."""
    quiet = _run(tmp_path, "none", own)
    signalled = _run(tmp_path, mode, own)
    assert signalled["seen"] == (1 if mode == "handler" else 0)
    assert signalled["row"]["status"] == "done"
    assert signalled["row"]["energy_j"] > 0 and signalled["row"]["time_s"] > 0
    # The profiler's lowered limit stays in force after the signal.
    assert signalled["limits"] == quiet["limits"] and quiet["limits"][0] < 300.0
    profile = signalled["profile"]
    assert len(profile) >= 5
    assert all(m["avg_power_w"] > 0 and m["samples_per_s"] > 0 for m in profile.values())
    assert _flat(signalled["profile"]) == pytest.approx(_flat(quiet["profile"]))
    assert signalled["cached"] == quiet["cached"]
    assert _flat({"row": signalled["row"]}) == pytest.approx(_flat({"row": quiet["row"]}))


@pytest.mark.parametrize("own", ["own", "shared"])
def test_a_run_whose_gpu_was_reset_under_it_is_abandoned_not_recorded(
    tmp_path: Path, own: str
) -> None:
    """Ctrl-C raised KeyboardInterrupt, so the GPU was reset (the process looked like it was
    ending), but the program caught it and trained on: what the run measures from then on is
    not its batch size's, so neither the run nor its profile is recorded."""
    caught = _run(tmp_path, "caught", own)
    assert caught["seen"] == 1 and caught["limits"] == [300.0]  # reset to the default
    assert (caught["row"]["status"], caught["row"]["end_reason"]) == ("abandoned", "signal")
    assert caught["cached"] is None and caught["profile"] == {}


def _flat(nested: dict[str, Any]) -> dict[str, Any]:
    return {f"{k}/{f}": v for k, m in nested.items() for f, v in m.items()}


class _StuckCounter:
    """A GPU whose energy counter never advances (a driver that reports nothing)."""

    name = "stuck"

    def energy_mj(self) -> int:
        return 1_000_000


def test_a_run_that_measured_no_energy_is_not_recorded(tmp_path: Path) -> None:
    store, clock = SQLiteStore(tmp_path / "db"), VirtualClock()
    job = RecurringJob(
        "j",
        batch_sizes=[32, 64],
        default_batch_size=64,
        store=store,
        gpu=_StuckCounter(),
        max_power_w=300.0,
        clock=clock,
    )
    with job.run() as run:
        clock.advance(1.0)  # time passes, energy does not
        run.step(64)
        run.end_epoch(reached=True)
    (row,) = store.runs("j")
    assert (row["status"], row["end_reason"]) == ("abandoned", "unmeasured")
    assert store.history("j") == []  # no evidence: 64 is tried again


def test_the_store_refuses_a_finished_run_without_energy_or_time(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "db")
    store.register_job("j", {"batch_sizes": [64]})
    for energy_j, time_s in ((0.0, 10.0), (100.0, 0.0)):
        started = store.begin_run("j", lambda h, p: Decision(64, "default", None))
        with pytest.raises(ConfigError, match="done_measured"):
            store.finish_run(
                started.run_id, Observation(64, 250.0, energy_j, time_s, 50.0, True, 1)
            )
    con = sqlite3.connect(tmp_path / "db")
    with pytest.raises(sqlite3.IntegrityError, match="done_measured"):
        con.execute(
            "INSERT INTO runs (run_id, job, status, phase, batch_size, energy_j, time_s, cost, "
            "reached, started_s) VALUES ('x', 'j', 'done', 'default', 64, 0.0, 1.0, 1.0, 1, 1.0)"
        )
    con.close()


def test_a_power_profile_of_zeros_is_never_used(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "db")
    store.register_job("j", {"batch_sizes": [64]})
    zeros = {"300.0": {"samples_per_s": 500.0, "avg_power_w": 0.0}}
    with pytest.raises(ConfigError, match="profile measured no power"):
        store.save_power_limit_w("j", "A40", 64, 175.0, zeros)
    assert store.cached_power_limit_w("j", "A40", 64) is None
    con = sqlite3.connect(tmp_path / "db")  # a row written past the trigger (by hand)
    con.execute("DROP TRIGGER power_limits_profile_measured")
    con.execute("INSERT INTO power_limits VALUES ('j', 'A40', 64, 175.0, ?)", (json.dumps(zeros),))
    con.commit()
    con.close()
    with pytest.raises(ConfigError, match=r"profile at '300.0' W .*DELETE FROM power_limits"):
        store.cached_power_limit_w("j", "A40", 64)


_V2_ROWS = (
    "INSERT INTO jobs VALUES ('j', '{\"batch_sizes\": [64, 128]}', 1.0);"
    "INSERT INTO runs (run_id, job, status, phase, batch_size, power_limit_w, energy_j, time_s,"
    " cost, reached, epochs, started_s, finished_s, heartbeat_s) VALUES"
    " ('zero', 'j', 'done', 'default', 64, 175.0, 0.0, 9.0, 1350.0, 1, 3, 1.0, 2.0, 2.0),"
    " ('real', 'j', 'done', 'explore', 128, 250.0, 900.0, 8.0, 1650.0, 1, 3, 3.0, 4.0, 4.0);"
    "INSERT INTO power_limits VALUES ('j', 'A40', 64, 175.0,"
    ' \'{"300.0": {"avg_power_w": 0.0, "samples_per_s": 40.0}}\'),'
    " ('j', 'A40', 128, 250.0,"
    ' \'{"250.0": {"avg_power_w": 240.0, "samples_per_s": 50.0}}\');'
)


def test_a_version_2_store_drops_what_runs_that_measured_nothing_left(tmp_path: Path) -> None:
    """A store written before the check (a 0 J run recorded as done, its zero profile cached)
    is repaired in place when opened: the run is abandoned ("unmeasured", out of the history),
    the zero profile's cached limit is dropped (the next run profiles again); the rest stays."""
    from perseus.recurring import schema

    path = tmp_path / "v2.db"
    con = sqlite3.connect(path)
    con.isolation_level = None
    con.execute("BEGIN")
    for _step, sql in schema.MIGRATIONS[:2]:  # the store as version 2 left it
        for statement in schema.statements(sql):
            con.execute(statement)
    con.execute("PRAGMA user_version = 2")
    con.execute("COMMIT")
    con.executescript(_V2_ROWS)
    con.close()
    store = SQLiteStore(path)
    assert [(o.batch_size, o.energy_j) for o in store.history("j")] == [(128, 900.0)]
    rows = {r["run_id"]: r for r in store.runs("j")}
    assert (rows["zero"]["status"], rows["zero"]["end_reason"]) == ("abandoned", "unmeasured")
    assert store.cached_power_limit_w("j", "A40", 64) is None
    assert store.cached_power_limit_w("j", "A40", 128) == 250.0
