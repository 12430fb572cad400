"""The trace reader, the JIT profiler against the traces, and the replay's invariants."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from perseus.cli.main import main
from perseus.device.clock import VirtualClock
from perseus.errors import ConfigError
from perseus.recurring.policy import BatchSizeOptimizer, Decision, Observation
from perseus.recurring.profiler import PowerLimitProfiler, candidate_power_limits_w
from perseus.recurring.replay import (
    default_recurrences,
    jit_power_limit_w,
    replay_fixed,
    replay_optimizer,
    replay_workload,
)
from perseus.recurring.trace import load_workloads
from perseus.recurring.workload import Workload

TRACE = Path(__file__).resolve().parents[2] / "perseus" / "data" / "traces" / "zeus-nsdi23"
GPUS = ("a40", "v100")


@pytest.fixture(scope="module")
def workloads() -> dict[str, list[Workload]]:
    return {g: load_workloads(TRACE, g) for g in GPUS}


def test_six_workloads_per_gpu_with_zeus_defaults(workloads: dict[str, list[Workload]]) -> None:
    for gpu in GPUS:
        ws = {w.key: w for w in workloads[gpu]}
        assert len(ws) == 6
        assert ws["librispeech/deepspeech2"].default_batch_size == 192  # capped at the trace
        assert ws["cifar100/shufflenetv2"].default_batch_size == 1024
        assert not ws["cifar100/shufflenetv2"].converges(2048)
    assert workloads["a40"][0].max_power_w == 300.0
    assert workloads["v100"][0].max_power_w == 250.0
    a40 = {w.key: w for w in workloads["a40"]}
    assert default_recurrences(a40["cifar100/shufflenetv2"]) == 2 * 10 * 9


class _TraceGPU:
    """A GPU whose iteration time and power at each limit are the trace's epoch figures."""

    name = "trace-gpu"
    uuid = "GPU-trace"

    def __init__(self, workload: Workload, batch_size: int, iterations_per_epoch: int = 50):
        self.w, self.bs, self.n = workload, batch_size, iterations_per_epoch
        limits = workload.power_limits_w[batch_size]
        self.range = (float(min(limits)), float(max(limits)))
        self.limit = self.range[1]
        self.clock = VirtualClock()
        self.energy_j = 0.0
        self.sets: list[float] = []

    def iterate(self) -> None:
        epoch = self.w.epochs[(self.bs, round(self.limit))]
        dt = epoch.time_s / self.n
        self.clock.advance(dt)
        self.energy_j += epoch.avg_power_w * dt

    def power_limit_range_w(self) -> tuple[float, float]:
        return self.range

    def power_limit_w(self) -> float:
        return self.limit

    def set_power_limit_w(self, w: float) -> float:
        self.sets.append(w)
        self.limit = w
        return w

    def reset_power_limit(self) -> None:
        self.limit = self.range[1]

    def energy_mj(self) -> int:
        return int(self.energy_j * 1000)


def test_jit_profiler_picks_the_trace_optimum_for_every_batch_size(
    workloads: dict[str, list[Workload]],
) -> None:
    checked = 0
    for gpu in GPUS:
        for w in workloads[gpu]:
            for bs in w.batch_sizes:
                fake = _TraceGPU(w, bs)
                limits = [float(x) for x in reversed(w.power_limits_w[bs])]
                profiler = PowerLimitProfiler(
                    fake,  # type: ignore[arg-type]
                    eta=0.5,
                    max_power_w=w.max_power_w,
                    power_limits_w=limits,
                    warmup_steps=3,
                    settle_steps=1,
                    window_steps=5,
                    min_window_s=0.0,
                    clock=fake.clock,
                )
                steps = 0
                while not profiler.done:
                    fake.iterate()
                    profiler.step(samples=bs)
                    steps += 1
                    assert steps < 10_000
                optimum = w.optimal_power_limit_w(bs, 0.5)
                assert profiler.chosen_w == optimum, (gpu, w.key, bs)
                assert fake.limit == optimum  # left set for the rest of the run
                assert jit_power_limit_w(w, bs, 0.5) == optimum
                checked += 1
    assert checked > 80


def test_a_workload_groups_its_epoch_costs_in_one_pass() -> None:
    """The batch sizes and limits of a workload (and of a trace's job) come from one pass over
    its (batch size, limit) costs: a pass per batch size was O(B x E), 17 s for an 11 MB power
    trace of 450 sizes x 450 limits."""
    from collections.abc import Iterator, Mapping

    from perseus.recurring.trace import _workload
    from perseus.recurring.workload import EpochCost, JobSpec

    class Counted(Mapping[tuple[int, int], EpochCost]):
        def __init__(self, data: dict[tuple[int, int], EpochCost]) -> None:
            self.data, self.read = data, 0

        def __getitem__(self, key: tuple[int, int]) -> EpochCost:
            return self.data[key]

        def __len__(self) -> int:
            return len(self.data)

        def __iter__(self) -> Iterator[tuple[int, int]]:
            for key in self.data:
                self.read += 1
                yield key

    sizes, limits = [8 * (i + 1) for i in range(40)], list(range(100, 140))
    epochs = Counted({(b, pl): EpochCost(1.0 + b / 1e3, pl * 0.9) for b in sizes for pl in limits})
    spec = JobSpec("d", "n", "o", 0.5, 10, 64)
    w = Workload(spec, "g", 140.0, {b: (3, 4) for b in [*sizes, 1000]}, epochs, 64)
    assert w.batch_sizes == tuple(sizes) and w.power_limits_w[8] == tuple(limits)
    assert epochs.read <= len(epochs)  # was 96,840: scans per batch size
    epochs.read = 0
    seeds: dict[tuple[str, str], int | None] = {("0.1", "0"): 3}
    paths = {spec.key: {b: seeds for b in [*sizes, 1000]}}
    made = _workload(spec, "g", paths, {spec.key: epochs}, 140.0)  # type: ignore[dict-item]
    assert made is not None and made.batch_sizes == w.batch_sizes
    assert epochs.read <= 2 * len(epochs)  # its own pass, then the workload's


def test_candidate_limits_are_descending_and_include_both_ends() -> None:
    assert candidate_power_limits_w(100.0, 300.0) == tuple(range(300, 99, -25))
    assert candidate_power_limits_w(90.0, 140.0) == (140.0, 115.0, 90.0)


def test_every_recurrence_ends_with_a_converged_run_and_stops_respect_the_limit(
    workloads: dict[str, list[Workload]],
) -> None:
    for w in workloads["v100"]:
        run = replay_optimizer(w, 30, eta=0.5, beta=2.0, rng=np.random.default_rng(3))
        by_rec: dict[int, list[bool]] = {}
        best = float("inf")
        for r in run.runs:
            by_rec.setdefault(r.recurrence, []).append(r.reached)
            if not r.reached and np.isfinite(best):
                assert r.cost <= 2.0 * best * (1 + 1e-9)  # stopped before crossing β x best
            if r.reached:
                best = min(best, r.cost)
        assert sorted(by_rec) == list(range(30))
        assert all(flags[-1] and not any(flags[:-1]) for flags in by_rec.values())
        assert np.all(np.diff(run.cum_cost) > 0)


def test_the_optimizer_replay_reads_each_run_once(
    workloads: dict[str, list[Workload]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each decision of the replay reads a tally, not every run before it: it re-read the
    whole history each run, O(N^2) over N recurrences (hours at the 100,000 limit)."""
    import perseus.recurring.policy as policy_module

    read: list[int] = []
    evidence = policy_module.evidence

    def counted(history: Sequence[Observation]) -> list[Observation]:
        read.append(len(history))
        return evidence(history)

    monkeypatch.setattr(policy_module, "evidence", counted)
    w = next(x for x in workloads["a40"] if x.key == "cifar100/shufflenetv2")
    run = replay_optimizer(w, 300, eta=0.5, beta=2.0, rng=np.random.default_rng(0))
    assert len(run.runs) >= 300
    assert sum(read) <= len(run.runs)  # was 91,506: the whole history, twice a run

    class Wrapped:  # another policy is handed the whole history each run, as before
        def __init__(self) -> None:
            self.policy = BatchSizeOptimizer(w.batch_sizes, w.default_batch_size)
            self.lengths: list[int] = []

        def decide(self, history: Sequence[Observation], rng: np.random.Generator) -> Decision:
            self.lengths.append(len(history))
            return self.policy.decide(history, rng)

    wrapped = Wrapped()
    again = replay_optimizer(
        w, 300, eta=0.5, beta=2.0, rng=np.random.default_rng(0), policy=wrapped
    )
    assert again.runs == run.runs  # the same runs, decided from the history
    assert wrapped.lengths == list(range(len(run.runs)))


def test_fixed_policy_pays_sampled_epochs_times_epoch_cost(
    workloads: dict[str, list[Workload]],
) -> None:
    w = next(x for x in workloads["a40"] if x.key == "squad/bert_base_uncased")
    b0 = w.default_batch_size
    pl = w.max_power_limit_w(b0)
    run = replay_fixed(w, b0, pl, 40, eta=0.5, rng=np.random.default_rng(0), phase="default")
    epoch = w.epochs[(b0, pl)]
    for r in run.runs:
        epochs = r.energy_j / epoch.energy_j
        assert epochs == pytest.approx(round(epochs))
        assert round(epochs) in {e for e in w.paths[b0] if e is not None}


def test_optimizer_beats_the_default_where_the_oracle_saves_a_lot(
    workloads: dict[str, list[Workload]],
) -> None:
    for gpu in GPUS:
        for w in workloads[gpu]:
            s = replay_workload(w, seeds=range(3))
            default, oracle = s.final("default", "cost").mean(), s.final("oracle", "cost").mean()
            opt = s.final("optimizer", "cost").mean()
            assert opt >= oracle * 0.97  # the oracle is (in expectation) unbeatable
            if oracle < 0.8 * default:
                assert opt < default, (gpu, w.key)


def test_bad_trace_rows_name_file_line_and_field(tmp_path: Path) -> None:
    (tmp_path / "summary_train.csv").write_text(
        "dataset,network,batch_size,optimizer,learning_rate,run,target_metric,target_epoch\n"
        "squad,bert_base_uncased,abc,adamw,1e-6,1,84.0,4\n"
    )
    (tmp_path / "summary_power_x.csv").write_text(
        "dataset,network,batch_size,optimizer,power_limit,time_per_epoch,average_power\n"
        "squad,bert_base_uncased,8,adamw,100,10,90\n"
    )
    with pytest.raises(ConfigError, match=r"summary_train.csv:2: field batch_size='abc'"):
        load_workloads(tmp_path, "x")
    (tmp_path / "summary_train.csv").write_text(
        "dataset,network,batch_size,optimizer,learning_rate,run,target_metric,target_epoch\n"
        "squad,bert_base_uncased,8,adamw,1e-6,1,84.0,4\n"
    )
    (tmp_path / "summary_power_y.csv").write_text("dataset,network\nsquad,bert\n")
    with pytest.raises(ConfigError, match=r"summary_power_y\.csv: missing column"):
        load_workloads(tmp_path, "y")


@pytest.mark.parametrize(
    ("cells", "field"),
    [
        ("8,adamw,100,5e-324,90", "time_per_epoch"),  # costs of inf epochs: an internal error
        ("8,adamw,100,10,0", "average_power"),  # a zero cost at eta 1: division by zero
        ("8,adamw,1e300,10,90", "power_limit"),  # an overflow in the statistics
        ("inf,adamw,100,10,90", "batch_size"),  # int(inf) overflows
    ],
)
def test_power_trace_numbers_keep_costs_finite_and_nonzero(
    tmp_path: Path, cells: str, field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "summary_train.csv").write_text(
        "dataset,network,batch_size,optimizer,learning_rate,run,target_metric,target_epoch\n"
        "squad,bert_base_uncased,8,adamw,1e-6,1,84.0,4\n"
        "squad,bert_base_uncased,8,adamw,1e-6,2,84.0,5\n"
    )
    (tmp_path / "summary_power_x.csv").write_text(
        "dataset,network,batch_size,optimizer,power_limit,time_per_epoch,average_power\n"
        f"squad,bert_base_uncased,{cells}\nsquad,bert_base_uncased,8,adamw,150,8,120\n"
    )
    args = ["recurring", "simulate", "--trace", str(tmp_path), "--gpu", "x", "--eta", "1"]
    assert main([*args, "--seeds", "2", "--recurrences", "5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path / 'summary_power_x.csv'}:2: field {field}=")
    assert err.count("\n") == 1 and "must be a" in err


def test_cli_json_shape_and_bad_input_exit_codes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "recurring",
        "simulate",
        "--trace",
        str(TRACE),
        "--gpu",
        "v100",
        "--workload",
        "squad/bert_base_uncased",
        "--recurrences",
        "5",
        "--seeds",
        "2",
    ]
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["gpu"] == "v100"
    w = doc["workloads"]["squad/bert_base_uncased"]
    assert w["recurrences"] == 5
    for policy in ("optimizer", "default", "oracle"):
        assert {"energy_j", "time_s", "cost"} <= set(w[policy])
    assert len(w["optimizer"]["regret"]) == 5
    assert main([*args, "--plot", str(tmp_path / "plots")]) == 0
    assert "regret vs oracle" in capsys.readouterr().out
    assert len(list((tmp_path / "plots").glob("*.png"))) == 2
    for bad in (["--gpu", "nope"], ["--eta", "2"], ["--beta", "0.5"], ["--workload", "a/b"]):
        assert main([*args, *bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err


def test_unsupported_workload_is_skipped_with_a_warning_and_jobs_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    head = "dataset,network,batch_size,optimizer,learning_rate,run,target_metric,target_epoch\n"
    rows = [f"aa,net,{b},sgd,0.1,{r},0.9,{e}\n" for b, e in ((8, 5), (16, 3)) for r in (1, 2)]
    rows += [f"bb,net,{b},sgd,0.1,{r},0.5,4\n" for b in (8, 16) for r in (1, 2)]  # never 0.9
    (tmp_path / "summary_train.csv").write_text(head + "".join(rows))
    power = "dataset,network,batch_size,optimizer,power_limit,time_per_epoch,average_power\n"
    power += "".join(
        f"{d},net,{b},sgd,{pl},{10.0 * b / pl},{0.8 * pl}\n"
        for d in ("aa", "bb")
        for b in (8, 16)
        for pl in (100, 150, 200)
    )
    (tmp_path / "summary_power_toy.csv").write_text(power)
    jobs = tmp_path / "jobs.csv"
    jobs.write_text(
        "dataset,network,optimizer,target_metric,max_epochs,default_batch_size\n"
        "aa,net,sgd,0.9,10,16\nbb,net,sgd,0.9,10,16\n"
    )
    args = [
        "recurring",
        "simulate",
        "--trace",
        str(tmp_path),
        "--gpu",
        "toy",
        "--jobs",
        str(jobs),
        "--seeds",
        "2",
        "--json",
    ]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert list(json.loads(captured.out)["workloads"]) == ["aa/net"]
    assert "warning: skipping bb/net" in captured.err
    assert main([*args, "--workload", "bb/net"]) == 2


def test_plots_are_written_all_or_none_on_a_full_disk(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second plot not fitting left the first written, and the error said "nothing was
    written"."""
    import errno
    import os

    real_fsync, calls = os.fsync, []

    def second_is_full(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", second_is_full)
    plots = tmp_path / "plots"
    args = ["recurring", "simulate", "--trace", str(TRACE), "--gpu", "v100"]
    args += ["--workload", "squad/bert_base_uncased", "--recurrences", "3", "--plot", str(plots)]
    assert main(args) == 2
    assert "the disk is full (ENOSPC)); nothing was written" in capsys.readouterr().err
    assert list(plots.glob("*")) == []
