"""Per-iteration metrics from an emulated run, read back by the real libraries."""

from __future__ import annotations

import csv
import json
import logging
import os
import socket
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from perseus import IterationMetrics, MetricsSink, RankSession, SimulatedGPU, make_job
from perseus.errors import ConfigError
from perseus.io import load_profile
from perseus.runtime import metrics as metrics_module
from perseus.runtime.agent.readback import HeldOp
from perseus.runtime.emulation import scale_profile, take_stages
from perseus.runtime.metrics import CSV_FIELDS, iteration_metrics
from perseus.runtime.session import IterationStats, SessionOptions
from perseus.schedule import build_schedule

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

BLOCKING_W = 83.64
ITERATIONS = 4

# A host stalled on a loaded machine only delays the host; the device timeline is exact.
pytestmark = pytest.mark.filterwarnings("ignore::perseus.runtime.emulation.EmulationOverrunWarning")


def _emulated_session(tmp_path: Path) -> RankSession:
    """One rank (a one-stage pipeline), emulated on a simulated GPU, running a plan whose
    fastest point is all-max and whose second point runs every op at 1095 MHz."""
    profile = scale_profile(take_stages(load_profile("a100"), 1), 0.1)
    gpu = SimulatedGPU.from_profile(
        profile, blocking_power_w=BLOCKING_W, state_dir=tmp_path / "sim", set_latency_s=0.0
    )
    job = make_job(profile, "1f1b", 1, 4, blocking_power_w=BLOCKING_W)
    plan = job.frontier([job.point(job.allmax()), job.point([1095] * job.graph.num_nodes)])
    return RankSession(
        build_schedule("1f1b", 1, 4),
        0,
        gpu=gpu,
        plan=plan,
        options=SessionOptions(
            blocking_power_w=BLOCKING_W,
            point_index=1,
            watchdog=False,
            handle_signals=False,
        ),
    )


def _run(session: RankSession, iterations: int) -> None:
    for _ in range(iterations):
        with session.iteration():
            for action in session.schedule.rank_actions[session.rank]:
                with session.op(action):
                    pass


def test_jsonl_csv_and_a_prometheus_scrape_of_an_emulated_run(tmp_path: Path) -> None:
    registry = prometheus_client.CollectorRegistry()
    session = _emulated_session(tmp_path)
    sink = MetricsSink(
        session,
        jsonl=tmp_path / "metrics-{rank}.jsonl",
        csv=tmp_path / "metrics.csv",
        prometheus_registry=registry,
        labels={"job": "gpt3"},
    )
    with session, sink:
        _run(session, ITERATIONS)
    # Every iteration's end reaches the hook (the last one included).
    seen = ITERATIONS
    lines = (tmp_path / "metrics-0.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["iteration"] for r in records] == list(range(seen))
    point = session.frontier.points[1]
    for r, stats in zip(records, session.history, strict=False):
        assert r["phase"] == "run" and r["rank"] == 0 and r["point_index"] == 1
        assert r["time_s"] == stats.time_s and r["energy_j"] == stats.energy_j
        # One rank is the whole pipeline here.
        assert r["pipeline_energy_j"] == stats.energy_j
        assert r["predicted_time_s"] == point.time_s
        assert r["predicted_energy_j"] == point.energy_j
        assert r["time_error"] == pytest.approx(stats.time_s / point.time_s - 1)
        assert r["energy_error"] == pytest.approx(stats.energy_j / point.energy_j - 1)
        assert r["clocks_mhz"] == [1095] * 8
        assert r["min_clock_mhz"] == r["max_clock_mhz"] == 1095
        assert r["gpu"] == session.gpu.name
    assert sink.latest is not None and sink.latest.iteration == seen - 1

    with (tmp_path / "metrics.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == CSV_FIELDS and len(rows) == seen
    assert float(rows[-1]["energy_j"]) == records[-1]["energy_j"]
    assert rows[-1]["clocks_mhz"] == " ".join(["1095"] * 8)

    scrape = prometheus_client.generate_latest(registry).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(scrape)
        for s in family.samples
    }
    base = (("job", "gpt3"), ("rank", "0"))
    last = records[-1]
    assert samples[("perseus_iteration", base)] == last["iteration"]
    assert samples[("perseus_iteration_time_seconds", base)] == pytest.approx(last["time_s"])
    energy = "perseus_iteration_energy_joules"
    assert samples[(energy, (*base, ("scope", "gpu")))] == pytest.approx(last["energy_j"])
    assert samples[(energy, (*base, ("scope", "pipeline")))] == pytest.approx(last["energy_j"])
    assert samples[("perseus_predicted_iteration_time_seconds", base)] == point.time_s
    assert samples[("perseus_plan_point_index", base)] == 1
    assert samples[("perseus_deployed_clock_mhz", (("bound", "max"), *base))] == 1095
    assert samples[("perseus_iterations_total", base)] == seen
    total = sum(r["energy_j"] for r in records)
    assert samples[("perseus_energy_joules_total", base)] == pytest.approx(total)


def test_an_http_scrape_on_a_port_of_its_own(tmp_path: Path) -> None:
    session = _emulated_session(tmp_path)
    with session, MetricsSink(session, prometheus_port=0) as sink:
        _run(session, 2)
        port = sink.prometheus_port
        assert port is not None
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            text = reply.read().decode()
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {"perseus_iteration_time_seconds", "perseus_iteration_energy_joules"} <= names
    assert sink.prometheus_port is None  # the server stopped with the sink


def test_profiling_iterations_have_no_plan_figures() -> None:
    stats = IterationStats(
        iteration=0,
        phase="profile",
        point_index=None,
        time_s=1.0,
        energy_j=50.0,
        compute_time_s=0.9,
    )
    record = iteration_metrics(stats, rank=1, gpu="g", frontier=None, pipeline_energy_j=None)
    assert isinstance(record, IterationMetrics)
    assert record.clocks_mhz is None and record.time_error is None
    assert record.energy_error is None and record.min_clock_mhz is None


def test_a_held_memory_clock_is_written_in_the_csv(tmp_path: Path) -> None:
    """An SM hold reads ``name:planned>ran:why``; a memory hold adds its memory clocks."""
    sink = MetricsSink(_emulated_session(tmp_path), csv=tmp_path / "m.csv", pipeline=False)
    held = (
        HeldOp("0F0", 1740, 1410, ("sw_power_cap",)),
        HeldOp("0F1", 1740, 1740, ("memory_not_locked",), 5001, 7251),
    )
    stats = IterationStats(0, "run", 0, 1.0, 50.0, 0.9, held_ops=held, pipeline_held_ops=2)
    with sink:
        sink(stats)
    with (tmp_path / "m.csv").open(newline="") as f:
        (row,) = csv.DictReader(f)
    assert (
        row["held_ops"] == "0F0:1740>1410:sw_power_cap 0F1:1740>1740,mem5001>7251:memory_not_locked"
    )
    assert row["pipeline_held_ops"] == "2"


def test_outputs_are_checked_and_files_never_followed(tmp_path: Path) -> None:
    session = _emulated_session(tmp_path)
    with pytest.raises(ConfigError, match="needs an output"):
        MetricsSink(session)
    with pytest.raises(ConfigError, match="prometheus_port"):
        MetricsSink(session, prometheus_port=70000)
    with pytest.raises(ConfigError, match="label"):
        MetricsSink(session, jsonl=tmp_path / "m.jsonl", labels={"rank": "x"})
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    with pytest.raises(ConfigError, match="cannot open the metrics file"):
        MetricsSink(session, jsonl=link).attach()
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match=r"metrics file|regular file"):
        MetricsSink(session, jsonl=fifo).attach()
    hard = tmp_path / "hard.jsonl"
    os.link(target, hard)
    with pytest.raises(ConfigError, match="one link"):
        MetricsSink(session, jsonl=hard).attach()
    assert target.read_text() == "keep me"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"prometheus_port": "9100"}, r"`prometheus_port` must be an integer in \[0, 65535\]"),
        ({"prometheus_port": 9100.5}, "`prometheus_port` must be an integer"),
        ({"prometheus_port": True}, "`prometheus_port` must be an integer"),
        ({"prometheus_port": -1}, "`prometheus_port` must be an integer"),
        ({"prometheus_port": 0, "prometheus_addr": 5}, "`prometheus_addr` must be an address"),
        ({"prometheus_port": 0, "prometheus_addr": ""}, "`prometheus_addr` must be an address"),
        ({"jsonl": "m.jsonl", "labels": ["job"]}, "`labels` must be a dict"),
        ({"jsonl": "m.jsonl", "labels": {1: "a"}}, "not a Prometheus label name"),
        ({"jsonl": "m.jsonl", "labels": {"__x": "a"}}, "not a Prometheus label name"),
        ({"jsonl": "m.jsonl", "labels": {"jöb": "a"}}, "not a Prometheus label name"),
        ({"jsonl": "m.jsonl", "labels": {"job": 5}}, r"`labels\['job'\]` must be a string"),
        ({"jsonl": "m.jsonl", "labels": {"scope": "a"}}, "one perseus sets itself"),
        ({"jsonl": 5}, "`jsonl` must be a file path"),
        ({"jsonl": "m.jsonl", "pipeline": "yes"}, "`pipeline` must be True or False"),
        ({"prometheus_registry": 5}, "must be a prometheus_client.CollectorRegistry"),
    ],
)
def test_bad_arguments_are_one_line_config_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, object], match: str
) -> None:
    monkeypatch.chdir(tmp_path)  # relative paths land here if accepted
    session = _emulated_session(tmp_path)
    with pytest.raises(ConfigError, match=match) as caught:
        MetricsSink(session, **kwargs).attach()  # type: ignore[arg-type]
    assert "\n" not in str(caught.value) and str(caught.value).startswith("MetricsSink")


def test_a_taken_port_and_an_unknown_address_are_named(tmp_path: Path) -> None:
    session = _emulated_session(tmp_path)
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    port = squatter.getsockname()[1]
    try:
        with pytest.raises(ConfigError) as caught:
            MetricsSink(session, prometheus_port=port).attach()
        assert str(caught.value) == (
            f"MetricsSink: port {port} on 127.0.0.1 is in use by another process; pick another "
            "with prometheus_port=... (0: any free port)"
        )
    finally:
        squatter.close()
    with pytest.raises(ConfigError, match="is not an address of this host"):
        MetricsSink(session, prometheus_port=0, prometheus_addr="no-such-host.invalid").attach()


def test_one_path_for_both_files_is_refused(tmp_path: Path) -> None:
    session = _emulated_session(tmp_path)
    (tmp_path / "d").mkdir()
    for csv_path in (tmp_path / "m.log", tmp_path / "d" / ".." / "m.log"):
        sink = MetricsSink(session, jsonl=tmp_path / "m.log", csv=csv_path)
        with pytest.raises(ConfigError, match=r"MetricsSink `csv` .*the same file as"):
            sink.attach()
    assert not (tmp_path / "m.log").exists()  # refused before anything was opened


def _disk_fills_after_open(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each metrics file, once opened, writes to ``/dev/full``: every write fails with ENOSPC
    at the system call, as on a full disk."""
    real = metrics_module._open_log

    def on_full_disk(path: Path) -> Any:
        f = real(path)
        full = os.open("/dev/full", os.O_WRONLY)
        os.dup2(full, f.fileno())
        os.close(full)
        return f

    monkeypatch.setattr(metrics_module, "_open_log", on_full_disk)


def test_a_full_disk_is_named_and_never_stops_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full (Linux)")
    _disk_fills_after_open(monkeypatch)
    session = _emulated_session(tmp_path)
    # Full before the run: the CSV header cannot be written; one line says why.
    with pytest.raises(ConfigError) as caught:
        MetricsSink(session, csv=tmp_path / "m.csv").attach()
    assert str(caught.value) == (
        f"{tmp_path / 'm.csv'}: cannot write the metrics file (the disk is full (ENOSPC)); "
        "free space or choose another path"
    )
    # Full during the run: one warning naming the full disk, and the run goes on.
    sink = MetricsSink(session, jsonl=tmp_path / "m.jsonl")
    with caplog.at_level(logging.WARNING, logger="perseus.runtime.metrics"), session, sink:
        _run(session, 2)
    assert len(session.history) == 2
    warned = [r.getMessage() for r in caplog.records if "metrics files" in r.getMessage()]
    assert len(warned) == 1 and "the disk is full (ENOSPC)" in warned[0], warned


def _names(registry: Any) -> set[str]:
    return {family.name for family in registry.collect()}


def test_a_failed_attach_leaves_the_registry_as_it_was(tmp_path: Path) -> None:
    """A port in use fails attach with its message; the gauges it had registered go again, so
    a retry on another port with the same registry works (it raised DuplicateTimeseries), and
    gauges that could not all be registered leave none behind."""
    from types import SimpleNamespace

    registry = prometheus_client.CollectorRegistry()
    hooks: list[Any] = []
    session = SimpleNamespace(
        rank=0, add_boundary_hook=hooks.append, remove_boundary_hook=hooks.remove
    )
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        sink = MetricsSink(session, prometheus_registry=registry, prometheus_port=port)
        with pytest.raises(ConfigError, match="is in use by another process"):
            sink.attach()
    assert _names(registry) == set() and hooks == []
    retry = MetricsSink(session, prometheus_registry=registry, prometheus_port=0)
    with retry:
        assert retry.prometheus_port and hooks == [retry]
    assert "perseus_iteration" in _names(registry)  # kept after close: a last scrape reads it

    other = prometheus_client.CollectorRegistry()
    prometheus_client.Counter("perseus_iterations", "someone else's", registry=other)
    before = _names(other)
    with pytest.raises(ValueError, match="Duplicated"):
        MetricsSink(session, prometheus_registry=other).attach()
    assert _names(other) == before and hooks == []


def test_a_real_gpus_late_figures_are_recorded_with_the_frontier_they_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a real GPU an iteration's figures reach the sink one iteration late: after a deploy
    of another frontier (the all-max baseline, one point) the last iteration of the old
    frontier's point 1 was recorded against the new frontier: an IndexError out of the
    training loop at the iteration's end (or, the other way, the other frontier's clocks)."""
    from tests.runtime.test_agent import _cuda_like_events, counting_gpu
    from tests.runtime.test_rank_session import _session

    monkeypatch.setenv("PERSEUS_LOCK_DIR", str(tmp_path))
    profile = scale_profile(take_stages(load_profile("a100"), 2), 0.02)
    session = _session(counting_gpu()[0], profile, events=_cuda_like_events(), checked=True)
    with session, MetricsSink(session, jsonl=tmp_path / "m.jsonl", pipeline=False) as sink:
        planned = session.frontier
        assert planned is not None and len(planned.points) > 1
        session.deploy(planned, 1)
        _run(session, 2)
        baseline = session.allmax_plan()
        session.deploy(baseline)
        _run(session, 2)
        session.flush()
        assert session.stats_frontier is baseline  # outside the hooks: the deployed one
    records = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    clocks = [[c if isinstance(c, int) else tuple(c) for c in r["clocks_mhz"]] for r in records]
    assert [r["point_index"] for r in records] == [1, 1, 0, 0]
    ran = [planned.points[1]] * 2 + [baseline.points[0]] * 2
    assert clocks == [list(p.freqs_mhz[0]) for p in ran]
    assert sink.latest is not None and sink.latest.iteration == 3
