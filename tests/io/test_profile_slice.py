"""Re-cutting a profile to fewer stages: sums per shared clock, in work linear in the options."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from perseus.cli.main import main
from perseus.errors import ProfileError
from perseus.io.bundled import load_profile
from perseus.io.profile_files import (
    MAX_FILE_BYTES,
    read_profile,
    write_profile_csv,
    write_profile_json,
)
from perseus.io.profile_slice import slice_profile
from perseus.profile.model import OpOption, OpProfile, Profile, build_profile
from perseus.schedule.actions import Kind


def _profile(stages: int, clocks: int, mem: bool) -> Profile:
    """Each stage misses one clock of the others (so merging intersects the clocks); with
    ``mem``, every SM clock is measured at two memory clocks."""
    rows = []
    for s in range(stages):
        for kind in (Kind.F, Kind.B):
            for f in range(clocks):
                if f == s % clocks:
                    continue
                for m in (5001, 7251) if mem else (None,):
                    t = 0.01 * (s + 1) * (1 + f / clocks) * (1.1 if m == 5001 else 1.0)
                    rows.append((s, kind, 1000 + f, t, 3.0 * t + s, m))
    return build_profile(rows, source="p.csv")


@pytest.mark.parametrize("mem", [False, True])
def test_merged_stages_sum_their_shared_clocks(mem: bool) -> None:
    profile = _profile(6, 9, mem)
    merged = slice_profile(profile, 2)
    assert merged.num_stages == 2
    for new, block in ((0, range(0, 3)), (1, range(3, 6))):
        for kind in (Kind.F, Kind.B):
            ops = [profile.op(s, kind) for s in block]
            shared = set.intersection(*({o.clocks for o in op.options} for op in ops))
            got = merged.op(new, kind).options
            assert {o.clocks for o in got} == shared
            for o in got:
                parts = [op.at(o.freq_mhz, o.mem_freq_mhz) for op in ops]
                assert o.time_s == sum(p.time_s for p in parts)
                assert o.energy_j == sum(p.energy_j for p in parts)


def test_merging_scans_each_option_a_bounded_number_of_times(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """OpProfile.at scans an op's options: a lookup per shared clock made merging
    O(stages x clocks^2) (64 stages x 6,096 clocks, a 16 MB profile, to 1 stage: 191 s)."""
    profile = _profile(8, 400, mem=False)
    total = sum(len(op.options) for op in profile.ops.values())
    scanned = [0]
    at = OpProfile.at

    def counting_at(self: OpProfile, freq_mhz: int, mem_freq_mhz: int | None = None) -> OpOption:
        option = at(self, freq_mhz, mem_freq_mhz)
        scanned[0] += self.options.index(option) + 1
        return option

    monkeypatch.setattr(OpProfile, "at", counting_at)
    merged = slice_profile(profile, 1)
    assert len(merged.op(0, Kind.F).options) == 400 - 8
    assert scanned[0] <= total


def test_slice_refuses_to_write_a_profile_perseus_cannot_read(tmp_path: Path) -> None:
    """`profile slice a100 --stages 2048 -o p.json` wrote 21.5 MB of JSON (4096 to CSV:
    18 MB), which every command then refused as "larger than 16 MB"."""
    out = tmp_path / "p.json"
    assert main(["profile", "slice", "a100", "--stages", "2048", "-o", str(out)]) == 2
    assert list(tmp_path.iterdir()) == []
    assert main(["profile", "slice", "a100", "--stages", "512", "-o", str(out)]) == 0
    assert read_profile(out).num_stages == 512  # what is written reads back


@pytest.mark.parametrize(
    ("rows", "stages", "match"),
    [
        (
            "0,forward,1410,9e5,9e8\n1,forward,1410,9e5,9e8\n",
            "1",
            r"time 1\.8e\+06 s, .*more stages",
        ),
        ("0,forward,1410,1e-8,1e-3\n", "100", r"time 1e-10 s, .*fewer stages"),
    ],
)
def test_slice_refuses_figures_a_profile_cannot_hold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], rows: str, stages: str, match: str
) -> None:
    """Merged sums past 1e6 s / 1e9 J, or split shares below 1 ns / 1 nJ, were written (exit
    0) as a profile that every command then refused."""
    src, out = tmp_path / "in.csv", tmp_path / "out.csv"
    src.write_text(
        "stage,instruction,frequency,time,energy\n" + rows.replace("forward", "backward") + rows
    )
    assert main(["profile", "slice", str(src), "--stages", stages, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith(f"error: --stages {stages}: ")
    assert re.search(match, err) and not out.exists()


@pytest.mark.parametrize("write", [write_profile_csv, write_profile_json])
def test_profile_writers_refuse_more_than_max_bytes(tmp_path: Path, write: Any) -> None:
    path = tmp_path / "p.out"
    profile = load_profile("a100")
    with pytest.raises(ProfileError, match=r"p\.out: 0\.\d MB of profile .*nothing was written"):
        write(profile, path, max_bytes=1000)
    assert list(tmp_path.iterdir()) == []
    write(profile, path, max_bytes=MAX_FILE_BYTES)
    assert path.exists()
