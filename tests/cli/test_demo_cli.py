"""``perseus demo``: a full report on a small job; bad arguments leave nothing behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from perseus.cli.main import main
from perseus.report import REPORT_FILES
from tests.conftest import REPO

SMALL = str(REPO / "configs" / "small-ci.toml")


@pytest.mark.slow
def test_demo_on_small_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report"
    assert main(["demo", "--config", SMALL, "--out", str(out), "--no-progress"]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(REPORT_FILES)
    for name in ("frontier.png", "timeline.png", "straggler.png"):
        assert (out / name).read_bytes().startswith(b"\x89PNG")
    summary = json.loads((out / "report-summary.json").read_text())
    assert summary["job"]["microbatches"] == 8
    assert summary["straggler"]["pipelines"] == 4  # from the config
    printed = capsys.readouterr().out
    assert f"{100 * summary['fastest']['energy_saving']:.1f} %" in printed
    assert "energy saved at T*" in printed and "straggler" in printed
    # Running again replaces the previous report (it only holds files perseus wrote).
    assert (
        main(["demo", "--config", SMALL, "--out", str(out), "--no-progress", "--pipelines", "8"])
        == 0
    )
    assert json.loads((out / "report-summary.json").read_text())["straggler"]["pipelines"] == 8
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no temp dirs left"


@pytest.mark.slow
def test_demo_says_its_time_leaves_out_the_first_compile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import perseus.cli._progress as progress
    from perseus.cli import demo

    argv = ["demo", "--config", SMALL, "--out", str(tmp_path / "r"), "--no-progress"]
    monkeypatch.setattr(demo, "_UNCOMPILED_MAX_OPS", 0)  # this job compiles its kernels first
    monkeypatch.setattr(progress, "solver_kernels_cached", lambda: False)
    assert main(argv) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert "; planning and the report, start-up and " in last
    assert " s compiling the solver kernels (first run only) not counted, in " in last
    monkeypatch.setattr(progress, "solver_kernels_cached", lambda: True)
    assert main(argv) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert "; planning and the report, start-up not counted, in " in last


@pytest.mark.slow
def test_demo_without_the_walk_kernel_solves_uncompiled_to_the_same_frontier(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # No walk kernel in numba's cache: the numpy walk solves (the same frontier, point for
    # point) and the kernels are compiled in the background for the next run.
    from perseus.cli import demo
    from perseus.solver import walk

    walks: list[str] = []
    background: list[bool] = []
    for name in ("compiled", "reference"):
        core = walk.METHODS[name]
        monkeypatch.setitem(
            walk.METHODS, name, lambda *a, core=core, name=name: walks.append(name) or core(*a)
        )
    monkeypatch.setattr(demo, "_compile_in_background", lambda: background.append(True))
    frontiers = {}
    for cached in (False, True):
        monkeypatch.setattr(demo, "_walk_kernel_cached", lambda cached=cached: cached)
        out = tmp_path / f"cached-{cached}"
        assert main(["demo", "--config", SMALL, "--out", str(out), "--no-progress"]) == 0
        frontiers[cached] = json.loads((out / "frontier.json").read_text())
        last = capsys.readouterr().out.strip().splitlines()[-1]
        assert ("solved uncompiled, compiling them for next time" in last) is not cached
    assert walks == ["reference", "compiled"]
    assert background == [True]
    assert frontiers[False]["points"] == frontiers[True]["points"]
    assert frontiers[False]["points_sha256"] == frontiers[True]["points_sha256"]


@pytest.mark.slow
def test_walk_kernel_cache_is_read_from_numba_and_filled_by_the_background_compile(
    tmp_path: Path,
) -> None:
    # An empty cache is seen as empty; the background compile's work fills it.
    code = (
        "from perseus.cli.demo import _walk_kernel_cached as cached, compile_kernels\n"
        "print(cached()); compile_kernels(); print(cached())\n"
    )
    proc = _python_with_cache(code, tmp_path, timeout_s=900)
    assert proc.stdout.split() == ["False", "True"]


@pytest.mark.slow
def test_a_first_run_loads_the_plan_kernels_another_process_compiled(tmp_path: Path) -> None:
    # While another process compiles the plan kernels into an empty cache, the first run's
    # loader finds each one there and loads it: none is compiled a second time in this one.
    code = (
        "import subprocess, sys\n"
        "from perseus.cli.demo import _KernelLoader\n"
        "from perseus.solver import plan_kernels\n"
        "loader = _KernelLoader()\n"
        "assert loader.poll(), 'nothing compiled yet'\n"
        "compile = 'from perseus.cli.demo import compile_kernels; compile_kernels(walk=False)'\n"
        "subprocess.run([sys.executable, '-c', compile], check=True)\n"
        "assert not loader.poll(), 'all loaded'\n"
        "for name in plan_kernels.__all__:\n"
        "    stats = getattr(plan_kernels, name).stats\n"
        "    print(name, sum(stats.cache_hits.values()), sum(stats.cache_misses.values()))\n"
    )
    proc = _python_with_cache(code, tmp_path, timeout_s=600)
    loaded = {name: (int(h), int(m)) for name, h, m in map(str.split, proc.stdout.splitlines())}
    assert set(loaded) == {"backward_pass", "evaluate_kernel", "forward_pass",
                           "neighbour_kernel", "reclaim_kernel", "tighten_kernel"}  # fmt: skip
    assert all(hits >= 1 and misses == 0 for hits, misses in loaded.values()), loaded


def test_the_background_compile_runs_in_a_session_of_its_own_then_at_the_lowest_priority(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Its own session (a scheduling group of its own while the first run loads its plan
    # kernels); for the walk kernel it lowers itself and that group to nice 19.
    from perseus.cli import demo

    started: list[tuple[list[str], dict[str, object]]] = []

    def popen(argv: list[str], **kw: object) -> None:
        started.append((argv, kw))

    monkeypatch.setattr(subprocess, "Popen", popen)
    demo._compile_in_background()
    monkeypatch.undo()  # Popen is subprocess's own
    [(argv, kw)] = started
    assert "compile_kernels(renice=True)" in argv[-1] and kw["start_new_session"] is True
    code = (
        "import os\n"
        "from perseus.cli.demo import _lowest_priority\n"
        "os.setsid(); _lowest_priority(); print(os.nice(0))\n"
        "if os.path.exists('/proc/self/autogroup'): print(open('/proc/self/autogroup').read())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "19"
    if len(lines) > 1:  # Linux with autogroups
        assert lines[1].endswith("nice 19")


def test_demo_defaults_are_the_issue_job() -> None:
    from perseus.cli.demo import DEMO_JOB

    assert DEMO_JOB["profile"] == "a100" and DEMO_JOB["schedule"] == "1f1b"
    assert (DEMO_JOB["stages"], DEMO_JOB["microbatches"]) == (8, 24)


@pytest.mark.parametrize(
    "extra",
    [
        ["--microbatches", "0"],
        ["--pipelines", "1"],
        ["--factors", "1.5:1.0:0.1"],
        ["--factors", "x"],
        ["--config", "does-not-exist.toml"],
        ["--bogus"],
    ],
)
def test_bad_arguments_exit_2_without_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str]
) -> None:
    out = tmp_path / "report"
    argv = ["demo", "--out", str(out), "--no-progress", *extra]
    if "--config" not in extra:
        argv += ["--config", SMALL]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_bad_config_file_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('profile = "a100"\nmicrobatches = 8\ncolour = "red"\n')
    assert main(["demo", "--config", str(bad), "--out", str(tmp_path / "r")]) == 2
    assert "unknown key 'colour'" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_refuses_to_replace_foreign_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("precious")
    assert main(["demo", "--config", SMALL, "--out", str(out), "--no-progress"]) == 2
    assert "did not write" in capsys.readouterr().err
    assert (out / "thesis.tex").read_text() == "precious"
    file_out = tmp_path / "file"
    file_out.write_text("x")
    assert main(["demo", "--config", SMALL, "--out", str(file_out), "--no-progress"]) == 2
    assert file_out.read_text() == "x"


def _python_with_cache(
    code: str, cache_dir: Path, timeout_s: float
) -> subprocess.CompletedProcess[str]:
    """``code`` run by a fresh interpreter on this checkout with numba's cache in
    ``cache_dir``; asserts it succeeded."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache_dir), "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True,
        timeout=timeout_s,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc
