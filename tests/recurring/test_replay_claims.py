"""The trace replay's figures against the library and an independent recomputation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from perseus.cli.main import main
from perseus.recurring.policy import UNSTOPPED_AFTER, BatchSizeOptimizer, Observation
from perseus.recurring.replay import replay_workload
from perseus.recurring.workload import EpochCost, JobSpec, Workload


def _obs(bs: int, cost: float, reached: bool) -> Observation:
    return Observation(bs, 100.0, cost, 1.0, cost, reached, 3)


def test_the_library_stops_early_no_more_than_the_replay_does() -> None:
    # The replay turns early stopping off after UNSTOPPED_AFTER failed runs in a row (a lucky
    # cheap run can set beta x best below what every size needs); the optimizer the library
    # runs did not, so with beta near 1 its runs kept stopping (13 in a row on cifar100).
    policy = BatchSizeOptimizer((16, 32, 64), 32, beta=1.01)
    rng = np.random.default_rng(0)
    history = [_obs(32, 100.0, True)] + [_obs(32, 101.5, False)] * (UNSTOPPED_AFTER - 1)
    assert policy.decide(history, rng).cost_limit == 101.0
    assert policy.cost_limit(history) == 101.0
    history.append(_obs(16, 101.5, False))
    assert policy.decide(history, rng).cost_limit is None
    assert policy.cost_limit(history) is None
    history.append(_obs(32, 100.5, True))  # a converged run turns it back on
    assert policy.decide(history, rng).cost_limit == 101.0


def _one_size_workload() -> Workload:
    spec = JobSpec("ds", "net", "sgd", 0.5, 10, 64)
    epochs = {(64, pl): EpochCost(100.0 * (300 / pl) ** 0.5, 0.9 * pl) for pl in (100, 200, 300)}
    return Workload(spec, "g", 300.0, {64: (3, 4, 5)}, epochs, 64)


def test_the_default_and_the_oracle_sample_the_same_paths() -> None:
    # One batch size, the oracle's limit the highest: the default is the oracle, yet it
    # printed '+6.5 % vs oracle' (each drew its own training paths).
    w = _one_size_workload()
    summary = replay_workload(w, recurrences=6, seeds=range(2))
    assert summary.default_config == summary.oracle_config == (64, 300)
    for metric in ("energy_j", "time_s", "cost"):
        assert list(summary.final("default", metric)) == list(summary.final("oracle", metric))
    # Same size, another limit: the figures differ by the epoch costs' ratio exactly.
    mixed = replay_workload(w, recurrences=6, seeds=range(2), eta=1.0)
    assert mixed.oracle_config == (64, 100)
    ratio = w.epoch_cost(64, 100, 1.0) / w.epoch_cost(64, 300, 1.0)
    np.testing.assert_allclose(
        mixed.final("oracle", "cost"), ratio * mixed.final("default", "cost")
    )


def test_a_run_stopped_early_pays_its_first_epoch() -> None:
    # Batch size 8's first epoch costs more than beta x the best run at 16: the replay charged
    # its run 0 J in 0 s and pruned the size for free, where the library runs that epoch (and
    # here reaches the target in it).
    spec = JobSpec("ds", "net", "sgd", 0.5, 10, 16)
    epochs = {
        (b, pl): EpochCost(t, 0.9 * pl) for b, t in ((8, 100.0), (16, 10.0)) for pl in (100, 300)
    }
    w = Workload(spec, "g", 300.0, {8: (1, 1), 16: (1, 1)}, epochs, 16)
    runs = replay_workload(w, recurrences=3, seeds=[0]).runs["optimizer"][0].runs
    eight = [r for r in runs if r.batch_size == 8]
    assert eight and all(r.energy_j > 0 and r.time_s > 0 for r in eight)
    assert eight[0].reached  # its one-epoch path reaches the target, as in the library
    assert eight[0].cost == pytest.approx(0.5 * 100.0 * (0.9 * 200) + 0.5 * 300.0 * 100.0)


def test_a_default_that_never_converges_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # With --workload it was an InfeasibleError: exit 1 and no fix; without, exit 2.
    train = ["dataset,network,batch_size,optimizer,learning_rate,run,target_metric,target_epoch"]
    power = ["dataset,network,batch_size,optimizer,power_limit,time_per_epoch,average_power"]
    for b, path in ((16, "2"), (32, "nan")):
        train += [f"ds,net,{b},sgd,0.1,{run},0.5,{path}" for run in (0, 1)]
        power += [f"ds,net,{b},sgd,{pl},{100 / b},{0.9 * pl}" for pl in (100, 300)]
    (tmp_path / "summary_train.csv").write_text("\n".join(train) + "\n")
    (tmp_path / "summary_power_g.csv").write_text("\n".join(power) + "\n")
    jobs = tmp_path / "jobs.csv"
    jobs.write_text(
        "dataset,network,optimizer,target_metric,max_epochs,default_batch_size\n"
        "ds,net,sgd,0.5,10,32\n"
    )
    args = ["recurring", "simulate", "--trace", str(tmp_path), "--gpu", "g", "--jobs", str(jobs)]
    for extra in ([], ["--workload", "ds/net"]):
        assert main([*args, *extra, "--seeds", "1"]) == 2
        err = capsys.readouterr().err
        assert "default batch size 32 never reaches the target 0.5" in err
        assert "default_batch_size" in err.splitlines()[-1] or "see the warnings" in err
