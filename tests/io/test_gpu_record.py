"""The GPU record of profiles and frontiers: round trips, files without it, bad records."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest

from perseus.cli.main import main
from perseus.errors import ProfileError
from perseus.identity import GpuIdentity
from perseus.io import load_profile, read_frontier, write_frontier
from perseus.io.bundled import bundled_profile_path
from perseus.io.gpu_record import gpu_record_path
from perseus.io.profile_files import read_profile, write_profile_csv, write_profile_json
from perseus.job import make_job
from perseus.plan import points_sha256

H100 = GpuIdentity(
    name="NVIDIA H100 80GB HBM3",
    architecture="Hopper",
    clocks_mhz=tuple(range(1980, 344, -15)),
    default_power_limit_w=700.0,
)


def test_bundled_profiles_carry_their_gpu() -> None:
    a100, a40 = load_profile("a100").gpu, load_profile("a40").gpu
    assert a100 is not None and a100.name == "NVIDIA A100-SXM4-80GB"
    assert a100.clocks_mhz[0] == 1410 and a100.architecture == "Ampere"
    assert a40 is not None and a40.name == "NVIDIA A40" and a40.default_power_limit_w == 300.0
    assert not a100.same_gpu(a40) and not a100.same_gpu(H100)
    # A memory size or a power variant is the same kind of GPU.
    assert a100.same_gpu(GpuIdentity(name="NVIDIA A100-SXM4-40GB"))
    assert a100.same_gpu(GpuIdentity(name="NVIDIA A100-SXM4-80GB (500 W)"))


@pytest.mark.parametrize("suffix", [".csv", ".json"])
def test_profile_round_trip_keeps_the_record_and_the_hash(tmp_path: Path, suffix: str) -> None:
    profile = load_profile("a40").with_gpu(H100)
    path = tmp_path / f"p{suffix}"
    (write_profile_csv if suffix == ".csv" else write_profile_json)(profile, path)
    if suffix == ".csv":
        assert path.read_text().splitlines()[0] == "stage,instruction,frequency,time,energy"
        assert gpu_record_path(path) == tmp_path / "p.gpu.json"
    again = read_profile(path)
    assert again.gpu == H100 and again.sha256 == profile.sha256


def test_a_profile_without_the_record_reads_and_is_logged_unchecked(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = bundled_profile_path("a100")
    assert source is not None
    path = tmp_path / "old.csv"
    shutil.copy(source, path)
    with caplog.at_level(logging.INFO, logger="perseus.io.gpu_record"):
        profile = read_profile(path)
    assert profile.gpu is None and profile.sha256 == load_profile("a100").sha256
    assert "no GPU record (old.gpu.json)" in caplog.text and "unchecked" in caplog.text


def test_a_bad_record_is_one_line_naming_the_file_and_field(tmp_path: Path) -> None:
    source = bundled_profile_path("a40")
    assert source is not None
    path = tmp_path / "p.csv"
    shutil.copy(source, path)
    gpu_record_path(path).write_text(json.dumps({"name": "NVIDIA A40", "clocks_mhz": [-5]}))
    with pytest.raises(ProfileError, match=r"p\.gpu\.json") as info:
        read_profile(path)
    assert "clocks_mhz" in str(info.value) and "\n" not in str(info.value)


def test_frontier_record_leaves_the_points_digest_unchanged(tmp_path: Path) -> None:
    profile = load_profile("a100")
    job = make_job(profile, "1f1b", 8, 4, blocking_power_w=83.64)
    plan = job.frontier([job.point(job.allmax())])
    assert plan.job.gpu == profile.gpu
    bare = plan.model_copy(update={"job": plan.job.model_copy(update={"gpu": None})})
    with_record, without = tmp_path / "a.json", tmp_path / "b.json"
    write_frontier(plan, with_record)
    write_frontier(bare, without)
    digests = {json.loads(p.read_text())["points_sha256"] for p in (with_record, without)}
    assert digests == {points_sha256(plan.points)}
    assert read_frontier(with_record).job.gpu == profile.gpu
    assert read_frontier(without).job.gpu is None
    plan.check_job(bare.job)  # the record is not part of what makes a job another job


def test_a_sliced_profile_keeps_its_gpu_and_the_cli_writes_it_beside(tmp_path: Path) -> None:
    """`perseus profile slice` re-cuts one GPU's measurements: the record goes with them (it
    was dropped, so a plan from a sliced A100 profile ran unchecked on any GPU)."""
    import subprocess
    import sys

    from perseus.io.profile_slice import slice_profile

    a100 = load_profile("a100")
    assert slice_profile(a100, 1).gpu == a100.gpu is not None
    out = tmp_path / "one.csv"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "perseus.cli",
            "profile",
            "slice",
            "a100",
            "--stages",
            "1",
            "-o",
            str(out),
        ],
        check=True,
        capture_output=True,
    )
    assert read_profile(out).gpu == a100.gpu
    assert gpu_record_path(out).is_file()


@pytest.mark.parametrize("with_gpu", [True, False])
def test_a_json_profile_is_parsed_once_by_the_stdlib(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    with_gpu: bool,
) -> None:
    """The syntax check parses the text and the schema validates it; the GPU record is the
    validated ``gpu`` field, not a third parse of a file of up to 16 MB."""
    profile = load_profile("a40")
    path = tmp_path / "p.json"
    write_profile_json(profile.with_gpu(H100 if with_gpu else None), path)
    parses: list[int] = []
    real = json.loads

    def loads(text: str | bytes, **kw: object) -> object:
        parses.append(len(text))
        return real(text, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(json, "loads", loads)
    with caplog.at_level(logging.INFO, logger="perseus.io.gpu_record"):
        again = read_profile(path)
    assert parses == [path.stat().st_size]
    assert again.gpu == (H100 if with_gpu else None) and again.sha256 == profile.sha256
    assert ("no GPU record (p.json)" in caplog.text) is not with_gpu


def test_a_csv_name_too_long_for_its_record_reads_and_is_not_half_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`<stem>.gpu.json` is 5 bytes longer than `<stem>.csv`: at a 251-byte name, reading the
    profile failed (ENAMETOOLONG from is_file) and writing one left the CSV without its record
    and exit 2."""
    source = bundled_profile_path("a100")
    assert source is not None
    long = tmp_path / ("p" * 251 + ".csv")
    shutil.copy(source, long)
    assert read_profile(long).gpu is None  # no record can have that name: unchecked
    assert main(["profile", "slice", "a100", "--stages", "2", "-o", str(long)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "more than the 255 of a file name" in err
    assert long.read_bytes() == source.read_bytes()


def test_a_record_that_cannot_be_written_is_refused_before_the_csv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A directory at `<stem>.gpu.json` left the CSV written and exit 2; `-o /dev/stdout`
    (or /dev/null) wrote /dev/stdout.gpu.json."""
    (tmp_path / "x.gpu.json").mkdir()
    out = tmp_path / "x.csv"
    assert main(["profile", "slice", "a100", "--stages", "2", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "x.gpu.json' beside it (" in err
    assert not out.exists()
    read, write = os.pipe()
    try:
        assert main(["profile", "slice", "a100", "--stages", "2", "-o", f"/dev/fd/{write}"]) == 0
        os.close(write)
        assert os.read(read, 1 << 16).startswith(b"stage,instruction,frequency")
    finally:
        os.close(read)
