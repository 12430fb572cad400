"""Profiles with a memory-clock column, plans with phased ops, and their exports."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from perseus.device.power_model import with_memory_clocks
from perseus.device.presets import A40_MEMORY
from perseus.errors import PlanError, ProfileError
from perseus.io import (
    load_profile,
    read_frontier,
    read_profile,
    write_profile_csv,
    write_profile_json,
)
from perseus.io.frontier_files import write_frontier
from perseus.io.zeus_export import write_zeus_pfo, zeus_frequency_schedules
from perseus.job import make_job
from perseus.schedule import Kind

HEADER = "stage,instruction,frequency,time,energy,mem_freq_mhz\n"
ROWS = "".join(
    f"{s},{k},{f},{t * (1 + (m < 7000) * 0.1)},{e},{m}\n"
    for s in range(2)
    for k, t, e in (("forward", 0.1, 10.0), ("backward", 0.2, 20.0))
    for f in (1410, 1200)
    for m in (7000, 5000)
)


def test_memory_column_reads_and_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_text(HEADER + ROWS)
    profile = read_profile(path)
    op = profile.op(1, Kind.B)
    assert {o.clocks for o in op.options} == {
        (1410, 7000),
        (1410, 5000),
        (1200, 7000),
        (1200, 5000),
    }
    for writer, name in ((write_profile_csv, "again.csv"), (write_profile_json, "again.json")):
        writer(profile, tmp_path / name)
        again = read_profile(tmp_path / name)
        assert again.ops == profile.ops and again.sha256 == profile.sha256
    # a file without the column is written without it
    write_profile_csv(load_profile("a100"), tmp_path / "plain.csv")
    assert "mem_freq_mhz" not in (tmp_path / "plain.csv").read_text().splitlines()[0]


def test_bad_memory_cells_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_text(HEADER + ROWS.replace(",5000\n", ",fast\n", 1))
    with pytest.raises(ProfileError, match=r"p\.csv:3: mem_freq_mhz 'fast' is not an integer"):
        read_profile(path)
    path.write_text(HEADER + ROWS.replace(",5000\n", ",\n", 1))  # default memory clock + pairs
    with pytest.raises(ProfileError, match="some rows of this op name a memory clock"):
        read_profile(path)


@pytest.fixture(scope="module")
def pair_job():
    profile = with_memory_clocks(load_profile("a40"), A40_MEMORY)
    return make_job(profile, "1f1b", 8, 8, blocking_power_w=70.38)


def _pair_plan(job, mem_mhz: int = 5001):
    ops = [[[int(f), mem_mhz, 0]] for f in job.allmax().tolist()]
    return job.point(ops)


def test_phased_plans_round_trip_as_schema_3(tmp_path: Path, pair_job) -> None:
    point = _pair_plan(pair_job)
    assert point.memory_clocks_mhz == {5001}
    assert point.freqs_mhz[0][0] == ((1740, 5001, 0),)
    frontier = pair_job.frontier([pair_job.point(pair_job.allmax()), point])
    write_frontier(frontier, tmp_path / "f.json")
    doc = json.loads((tmp_path / "f.json").read_text())
    assert doc["schema_version"] == 3 and doc["points"][-1]["freqs_mhz"][0][0] == [[1740, 5001, 0]]
    again = read_frontier(tmp_path / "f.json")
    ev = pair_job.evaluate(pair_job.flat(again.points[-1]))
    assert (ev.time_s, ev.energy_j) == (point.time_s, point.energy_j)
    # phased ops in a file that claims version 2 are refused
    doc["schema_version"] = 2
    doc["points_sha256"] = None
    doc.pop("points_sha256")
    (tmp_path / "v2.json").write_text(json.dumps(doc))
    with pytest.raises(PlanError, match="need schema_version 3"):
        read_frontier(tmp_path / "v2.json")


def test_memory_clock_on_a_profile_without_them_is_a_plan_error() -> None:
    job = make_job(load_profile("a40"), "1f1b", 8, 8, blocking_power_w=70.38)
    ops = [[[int(f), 5001, 0]] for f in job.allmax().tolist()]
    with pytest.raises(PlanError, match=r"1740/5001 MHz .* at the one memory clock"):
        job.evaluate(ops)


def test_zeus_export_keeps_the_sm_clock_and_warns(tmp_path: Path, pair_job, caplog) -> None:
    point = _pair_plan(pair_job)
    frontier = pair_job.frontier([point])
    with caplog.at_level(logging.WARNING, logger="perseus"):
        files = write_zeus_pfo(frontier, point, tmp_path)
    assert any("memory clocks [5001]" in r.getMessage() for r in caplog.records)
    schedules = json.loads(files[0].read_text())
    assert schedules[0]["frequencies"][0] == ["forward", 1740]
    assert "memory clocks [5001] MHz, which Zeus" in files[1].read_text()
    # an op that switches SM clock mid-op still cannot be exported
    ops = [[[int(f), 5001, 0]] for f in pair_job.allmax().tolist()]
    bad = frontier.with_points([point.model_copy(update={"freqs_mhz": pair_job.nested(ops)})])
    two_sm = ((1740, 5001, 0), (1200, 5001, 3))
    bad_point = bad.points[0].model_copy(
        update={
            "freqs_mhz": ((two_sm, *bad.points[0].freqs_mhz[0][1:]), *bad.points[0].freqs_mhz[1:])
        }
    )
    with pytest.raises(PlanError, match="two-clock setting"):
        zeus_frequency_schedules(frontier, bad_point)


def test_phases_out_of_order_are_refused_on_read(tmp_path: Path, pair_job) -> None:
    frontier = pair_job.frontier([_pair_plan(pair_job)])
    write_frontier(frontier, tmp_path / "f.json")
    doc = json.loads((tmp_path / "f.json").read_text())
    doc["points"][0]["freqs_mhz"][0][0] = [[1740, 5001, 2], [1200, 5001, 1]]
    doc.pop("points_sha256")
    doc["schema_version"] = 1  # no digest to fail first
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(PlanError, match=r"phases start at layer 0 .* first layers \[2, 1\]"):
        read_frontier(tmp_path / "bad.json")


def test_cli_plans_pairs_and_phases_from_flags_and_config(tmp_path: Path, capsys) -> None:
    from perseus.cli.main import main
    from perseus.runtime.emulation import take_stages

    profile = tmp_path / "a40-pairs.csv"
    write_profile_csv(take_stages(with_memory_clocks(load_profile("a40"), A40_MEMORY), 4), profile)
    out = tmp_path / "f.json"
    base = [
        "frontier",
        str(profile),
        "--stages",
        "4",
        "--microbatches",
        "4",
        "--blocking-power-w",
        "70.38",
        "--layers-per-stage",
        "6",
        "-o",
        str(out),
    ]
    assert main([*base, "--switch-stall-s", "0.002", "--max-clocks-per-op", "3"]) == 0
    assert "memory:      the no-slowdown plan sets memory clocks" in capsys.readouterr().out
    frontier = read_frontier(out)
    assert frontier.job.switch_stall_s == 0.002 and frontier.schema_version == 3
    assert any(p.memory_clocks_mhz for p in frontier.points)
    assert main(["evaluate", str(profile), "--plan", str(out)]) == 0
    config = tmp_path / "job.toml"
    config.write_text(
        'profile = "a40-pairs.csv"\nstages = 4\nmicrobatches = 4\nblocking_power_w = 70.38\n'
        "layers_per_stage = 6\nswitch_stall_s = 0.003\nmax_clocks_per_op = 4\n"
    )
    assert main(["frontier", "--config", str(config), "-o", str(out)]) == 0
    assert read_frontier(out).job.switch_stall_s == 0.003
