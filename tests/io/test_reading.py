"""Bounded reads: regular files only, at most the cap + 1 byte, and data files that never name
an arbitrary path."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from perseus.cli.main import main
from perseus.errors import ConfigError, PlanError, ProfileError
from perseus.io import load_profile, read_frontier, read_profile, write_frontier
from perseus.io.bundled import resolve_plan_profile
from perseus.io.config import JobConfig, read_job_config, resolve_config_profile
from perseus.io.profile_files import write_profile_csv
from perseus.io.reading import INPUT_LIMITS, read_bounded
from perseus.job import make_job

A100 = load_profile("a100")


def test_reads_a_regular_file_and_refuses_one_over_the_cap(tmp_path: Path) -> None:
    p = tmp_path / "f.txt"
    p.write_bytes(b"x" * 100)
    assert read_bounded(p, limit_bytes=100, what="a file") == b"x" * 100
    with pytest.raises(ConfigError, match=r"f.txt: larger than 99 bytes, the most"):
        read_bounded(p, limit_bytes=99, what="a file")


def test_a_size_of_zero_is_not_trusted() -> None:
    """/proc files say st_size 0 and hold more: the cap holds whatever the size says."""
    assert os.stat("/proc/self/status").st_size == 0
    with pytest.raises(ConfigError, match="larger than 10 bytes"):
        read_bounded("/proc/self/status", limit_bytes=10, what="a file")
    assert b"Name:" in read_bounded("/proc/self/status", limit_bytes=1 << 20, what="a file")


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    done = threading.Event()
    errors: list[Exception] = []

    def read() -> None:
        try:
            read_bounded(fifo, limit_bytes=100, what="a profile")
        except ConfigError as e:
            errors.append(e)
        done.set()

    threading.Thread(target=read, daemon=True).start()
    assert done.wait(10), "reading a FIFO blocked"
    assert "is a FIFO (named pipe), not a regular file" in str(errors[0])


def test_a_device_is_refused_without_being_opened(tmp_path: Path) -> None:
    zero = tmp_path / "zero"
    try:
        os.mknod(zero, 0o666 | stat.S_IFCHR, os.makedev(1, 5))  # a private /dev/zero
    except PermissionError:
        pytest.skip("creating a device node needs root (CAP_MKNOD)")
    for reader in (read_profile, read_frontier, read_job_config):
        with pytest.raises(ConfigError, match="is a character device, not a regular file"):
            reader(zero)


def test_missing_and_directory_inputs(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="file not found"):
        read_profile(tmp_path / "nope.csv")
    with pytest.raises(ProfileError, match="is a directory"):
        read_profile(tmp_path)
    with pytest.raises(ConfigError, match="config file not found"):
        read_job_config(tmp_path / "nope.toml")


def test_a_path_with_a_nul_byte_is_one_line(tmp_path: Path) -> None:
    """os.open raises ValueError for a NUL byte (an in-process caller's path, a --plan flag)."""
    with pytest.raises(PlanError, match=r"^'.*plan\\x00.json': .*NUL byte; pass a plan"):
        read_frontier(f"{tmp_path}/plan\0.json")
    with pytest.raises(ConfigError, match="NUL byte"):
        read_job_config("job\0.toml")


def test_caps_refuse_oversized_inputs_of_every_kind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = tmp_path / "big.json"
    big.write_bytes(b" " * 2000)
    monkeypatch.setitem(INPUT_LIMITS, "config", 1000)
    with pytest.raises(ConfigError, match="larger than 1000 bytes"):
        read_job_config(big)
    import perseus.io.frontier_files as ff
    import perseus.io.profile_files as pf

    monkeypatch.setattr(ff, "MAX_FILE_BYTES", 1000)
    monkeypatch.setattr(pf, "MAX_FILE_BYTES", 1000)
    with pytest.raises(PlanError, match="larger than"):
        read_frontier(big)
    with pytest.raises(ProfileError, match="larger than"):
        read_profile(big)


# ------------------------------------------------------------ names read from data files


def _plan(tmp_path: Path, profile_name: str) -> Path:
    job = make_job(A100, "1f1b", 8, 4, blocking_power_w=83.64, profile_name=profile_name)
    plan = tmp_path / "plan.json"
    write_frontier(job.frontier([job.point(job.allmax())]), plan)
    return plan


def test_a_plan_names_a_bundled_profile_or_a_file_beside_it(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    assert resolve_plan_profile("a100", plan, "p").name == "gpt3-175b+a100_sxm_bf16.csv"
    write_profile_csv(A100, tmp_path / "mine.csv")
    assert resolve_plan_profile("mine", plan, "p") == tmp_path / "mine.csv"
    assert resolve_plan_profile("mine.csv", plan, "p") == tmp_path / "mine.csv"
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "shadow").write_text("root:$6$hash\n")
    (tmp_path / "link.csv").symlink_to(secret / "shadow")
    for name in (str(secret / "shadow"), "secret/shadow", "../shadow", "link.csv", "..", ""):
        with pytest.raises(ConfigError, match=r"field job\.profile_name"):
            resolve_plan_profile(name, plan, "p")


def test_a_plans_profile_errors_never_quote_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from perseus.cli.main import main

    (tmp_path / "notes.csv").write_text("stage,instruction\nsecret-line-1,secret\n")
    plan = _plan(tmp_path, "notes")
    assert main(["evaluate", "--plan", str(plan)]) == 2
    err = capsys.readouterr().err
    assert "field job.profile_name" in err and "notes.csv is not a valid profile" in err
    assert "secret" not in err
    plan = _plan(tmp_path, "/etc/passwd")
    assert main(["evaluate", "--plan", str(plan)]) == 2
    err = capsys.readouterr().err
    assert "neither a bundled profile" in err and "root:" not in err


def test_a_configs_profile_stays_under_its_directory(tmp_path: Path) -> None:
    config = tmp_path / "job.toml"
    for name in ("/etc/passwd", "../x.csv", "sub/../../x.csv"):
        with pytest.raises(ConfigError, match=r"key profile.*without '\.\.'"):
            resolve_config_profile(JobConfig(profile=name, microbatches=4), config)
    with pytest.raises(ConfigError, match=r"key profile: 'nope\.csv' is neither"):
        resolve_config_profile(JobConfig(profile="nope.csv", microbatches=4), config)


def test_a_profile_name_too_long_for_the_file_system_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Path.exists() raises ENAMETOOLONG: the message named neither the config nor its key
    (a config), or said "choose another path" (PROFILE)."""
    name = "a" * 300
    with pytest.raises(ConfigError, match=r"job\.toml: key profile: 'a{20}.*File name too long"):
        resolve_config_profile(JobConfig(profile=name, microbatches=4), tmp_path / "job.toml")
    assert main(["profile", "show", name]) == 2
    assert "cannot read file (File name too long); pass a profile" in capsys.readouterr().err
