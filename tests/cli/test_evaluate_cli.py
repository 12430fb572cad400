from __future__ import annotations

import subprocess
import sys

from perseus.cli.main import main
from perseus.io import load_profile, write_frontier
from perseus.job import make_job


def test_evaluate_allmax_on_bundled_profile(capsys):
    assert main(["evaluate", "a100", "--microbatches", "24"]) == 0
    out = capsys.readouterr().out
    job = make_job(load_profile("a100"), "1f1b", 8, 24, blocking_power_w=83.64)
    ev = job.evaluate(job.allmax())
    assert f"time_s:   {ev.time_s:.6f}" in out
    assert f"energy_j: {ev.energy_j:.3f}" in out


def test_evaluate_plan(tmp_path, capsys):
    job = make_job(load_profile("a100"), "1f1b", 8, 4, blocking_power_w=83.64)
    flat = job.allmax()
    flat[:] = 1200
    path = tmp_path / "plan.json"
    write_frontier(job.frontier([job.point(flat)]), path)
    assert main(["evaluate", "a100", "--microbatches", "4", "--plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"energy_j: {job.evaluate(flat).energy_j:.3f}" in out
    assert "vs all-max" in out


def test_plan_for_another_job_is_rejected(tmp_path, capsys):
    job = make_job(load_profile("a100"), "1f1b", 8, 4, blocking_power_w=83.64)
    path = tmp_path / "plan.json"
    write_frontier(job.frontier([job.point(job.allmax())]), path)
    assert main(["evaluate", "a100", "--microbatches", "6", "--plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert "job.microbatches: plan has 4, run has 6" in err
    assert err.count("\n") == 1


def test_custom_profile_needs_blocking_power(tmp_path, capsys):
    src = load_profile("a100")
    from perseus.io import write_profile_csv

    path = tmp_path / "mine.csv"
    rows = [
        (s, k, o.freq_mhz, o.time_s * 1.01, o.energy_j)
        for (s, k), op in src.ops.items()
        for o in op.options
    ]
    from perseus.profile import build_profile

    write_profile_csv(build_profile(rows), path)
    assert main(["evaluate", str(path), "--microbatches", "4"]) == 2
    assert "pass --blocking-power-w" in capsys.readouterr().err
    assert main(["evaluate", str(path), "--microbatches", "4", "--blocking-power-w", "80"]) == 0


def test_bad_arguments_exit_2(capsys):
    assert main(["evaluate", "a100"]) == 2
    assert "--microbatches" in capsys.readouterr().err
    assert main(["evaluate", "a100", "--microbatches", "4", "--schedule", "nope"]) == 2
    assert main(["evaluate", "missing.csv", "--microbatches", "4"]) == 2
    assert "missing.csv: profile file not found" in capsys.readouterr().err


def test_console_script_runs_without_traceback(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"\x00\x01junk")
    proc = subprocess.run(
        [sys.executable, "-m", "perseus.cli", "evaluate", str(bad), "--microbatches", "2"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "Traceback" not in proc.stderr
    assert "bad.csv: file is binary" in proc.stderr
