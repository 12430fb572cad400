from __future__ import annotations

from perseus.cli.main import main
from perseus.io import load_profile, read_frontier, write_profile_csv
from perseus.job import make_job
from perseus.profile import build_profile
from perseus.schedule import Kind


def _profile_csv(tmp_path):
    rows = []
    for s in range(2):
        for kind, scale in ((Kind.F, 1.0), (Kind.B, 2.0)):
            for f, t, p in ((1400, 1.0, 300.0), (1200, 1.1, 230.0), (1000, 1.3, 180.0)):
                rows.append((s, kind, f, scale * t * (1 + 0.05 * s), scale * t * p))
    path = tmp_path / "p.csv"
    write_profile_csv(build_profile(rows, source="t"), path)
    return path


def test_frontier_writes_an_exact_frontier(tmp_path, capsys):
    prof = _profile_csv(tmp_path)
    out = tmp_path / "f.json"
    argv = [
        "frontier",
        str(prof),
        "--microbatches",
        "4",
        "--blocking-power-w",
        "80",
        "-o",
        str(out),
    ]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "points:" in text and "no-slowdown saving" in text
    frontier = read_frontier(out)
    job = make_job(load_profile(prof), "1f1b", 2, 4, blocking_power_w=80.0)
    job.check_frontier(frontier)
    for p in frontier.points:
        ev = job.evaluate(job.flat(p))
        assert (p.time_s, p.energy_j) == (ev.time_s, ev.energy_j)
    assert frontier.fastest.time_s <= frontier.baseline.time_s + 1e-9


def test_frontier_all_points_and_schedules(tmp_path):
    prof = _profile_csv(tmp_path)
    for schedule in ("gpipe", "zb"):
        out = tmp_path / f"{schedule}.json"
        argv = [
            "frontier",
            str(prof),
            "--schedule",
            schedule,
            "--microbatches",
            "3",
            "--blocking-power-w",
            "50",
            "--all-points",
            "-o",
            str(out),
        ]
        assert main(argv) == 0
        assert read_frontier(out).job.schedule == schedule


def test_frontier_bad_quantum_is_exit_2(tmp_path, capsys):
    prof = _profile_csv(tmp_path)
    argv = [
        "frontier",
        str(prof),
        "--microbatches",
        "2",
        "--blocking-power-w",
        "80",
        "--time-quantum-s",
        "-1",
        "-o",
        str(tmp_path / "x.json"),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--time-quantum-s" in err
    assert not (tmp_path / "x.json").exists()


def test_frontier_requires_output(tmp_path):
    assert main(["frontier", str(_profile_csv(tmp_path)), "--microbatches", "2"]) == 2


def test_frontier_fold_always_says_so_and_stays_exact(tmp_path, capsys):
    prof = _profile_csv(tmp_path)
    out = tmp_path / "f.json"
    argv = ["frontier", str(prof), "--microbatches", "24", "--fold", "always", "-o", str(out)]
    assert main([*argv, "--blocking-power-w", "80"]) == 0
    assert "folded:      walked 2 stages x 10 microbatches" in capsys.readouterr().out
    frontier = read_frontier(out)
    job = make_job(load_profile(prof), "1f1b", 2, 24, blocking_power_w=80.0)
    for p in frontier.points:
        ev = job.evaluate(job.flat(p))
        assert (p.time_s, p.energy_j) == (ev.time_s, ev.energy_j)
    assert frontier.fastest.time_s <= frontier.baseline.time_s + 1e-9
    assert main(["frontier", str(prof), "--microbatches", "4", "--fold", "sometimes"]) == 2


def test_frontier_larger_than_perseus_reads_is_exit_2_nothing_written(
    tmp_path, capsys, monkeypatch
):
    """A frontier over the plan read limit is refused in one line (exit 2) and neither -o nor
    --power-curve is written: perseus never writes a plan it then refuses to read."""
    from perseus.io import frontier_files

    monkeypatch.setattr(frontier_files, "MAX_FILE_BYTES", 1000)
    out, curve = tmp_path / "f.json", tmp_path / "c.csv"
    argv = ["frontier", str(_profile_csv(tmp_path)), "--microbatches", "4", "--blocking-power-w"]
    argv += ["80", "--no-progress", "-o", str(out), "--power-curve", str(curve)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{out}: " in err and "more than perseus reads back" in err
    assert not out.exists() and not curve.exists()
