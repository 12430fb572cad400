"""Phase-level profile CSVs: rows per (stage, instruction, layers, clock pair), read through
perseus.io.profile_files with the same bounded reads and one-line errors, round-tripped."""

from __future__ import annotations

import pytest

from perseus.errors import ProfileError
from perseus.io.profile_files import (
    read_phase_profile,
    read_profile,
    write_phase_profile_csv,
)
from perseus.job import make_job
from perseus.schedule import Kind

HEADER = "stage,instruction,frequency,time,energy,first_layer,last_layer,mem_freq_mhz\n"


def _rows() -> str:
    """Two stages of 6 layers: forwards in phases 0-1, 2-3, 4-5; backwards in 0-2, 3-5; at
    (1740, 7251), (1740, 5001) and (1200, 5001)."""
    lines = []
    for stage in (0, 1):
        for freq, mem, slow in ((1740, "7251", 1.0), (1740, "5001", 1.1), (1200, "5001", 1.3)):
            for first, last, t in ((0, 1, 0.01), (2, 3, 0.03), (4, 5, 0.02)):
                e = 300 * t * slow
                lines.append(f"{stage},forward,{freq},{t * slow!r},{e!r},{first},{last},{mem}")
            for first, last, t in ((0, 2, 0.05), (3, 5, 0.07)):
                e = 280 * t * slow
                lines.append(f"{stage},backward,{freq},{t * slow!r},{e!r},{first},{last},{mem}")
    return HEADER + "\n".join(lines) + "\n"


def test_phase_rows_sum_to_ops_and_give_layer_shares(tmp_path):
    path = tmp_path / "phases.csv"
    path.write_text(_rows())
    pp = read_phase_profile(path)
    f = pp.profile.op(0, Kind.F).at(1740, 7251)
    assert f.time_s == pytest.approx(0.06) and f.energy_j == pytest.approx(18.0)
    b = pp.profile.op(1, Kind.B).at(1200)  # the highest memory clock profiled at 1200
    assert b.time_s == pytest.approx(0.12 * 1.3)
    assert pp.layers_per_stage == (6, 6)
    # Per layer at the highest pair: forward 0.005/0.015/0.01 per layer, backward 0.05/3 and
    # 0.07/3 per layer; over a stage total of 0.18 s.
    want = [0.005 + 0.05 / 3] * 2 + [0.015 + 0.05 / 3, 0.015 + 0.07 / 3] + [0.01 + 0.07 / 3] * 2
    assert pp.layer_time_fractions[0] == pytest.approx([w / 0.18 for w in want])
    # read_profile reads the same file as its op-level profile.
    assert read_profile(path).ops == pp.profile.ops
    # The planner takes it as it is.
    job = make_job(
        pp.profile,
        "1f1b",
        2,
        4,
        blocking_power_w=70.0,
        layers_per_stage=pp.layers_per_stage,
        layer_time_fractions=pp.layer_time_fractions,
    )
    assert job.spec.layers_per_stage == (6, 6)


def test_phase_profile_round_trips(tmp_path):
    path = tmp_path / "phases.csv"
    path.write_text(_rows())
    pp = read_phase_profile(path)
    again = tmp_path / "again.csv"
    write_phase_profile_csv(pp, again)
    back = read_phase_profile(again)
    assert back.rows == pp.rows
    assert back.profile.ops == pp.profile.ops
    assert back.layer_time_fractions == pp.layer_time_fractions


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            ("0,forward,1740,0.01,3.0,0,1,7251", "0,forward,1740,0.01,3.0,0,2,7251"),
            "overlap at layer 2",
        ),
        (
            ("0,forward,1740,0.01,3.0,0,1,7251", "0,forward,1740,0.01,3.0,0,0,7251"),
            "gap at layer 1",
        ),
        (
            ("0,forward,1740,0.01,3.0,0,1,7251", "0,forward,1740,0.01,3.0,1,0,7251"),
            "last_layer 0 is before",
        ),
        (
            ("0,forward,1740,0.01,3.0,0,1,7251", "0,forward,1740,0.01,3.0,x,1,7251"),
            "first_layer 'x'",
        ),
    ],
)
def test_bad_phases_are_refused_in_one_line(tmp_path, edit, message):
    text = _rows()
    old, new = edit
    assert old in text
    path = tmp_path / "bad.csv"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(ProfileError, match=message) as info:
        read_phase_profile(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_phases_must_match_across_clocks_and_instructions(tmp_path):
    text = _rows()
    # (1740, 5001): the forward's last two phases merged into one (layers 2-5).
    lines = text.splitlines()
    at = [i for i, ln in enumerate(lines) if ln.startswith("0,forward,1740") and ",5001" in ln]
    lines[at[1]] = lines[at[1]].replace(",2,3,", ",2,5,")
    del lines[at[2]]
    path = tmp_path / "bad.csv"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ProfileError, match="differ from the op's phases at another clock"):
        read_phase_profile(path)
    # A backward covering 5 layers where the forward covers 6.
    text2 = text.replace("0,backward,1740,0.07,19.6,3,5,7251", "0,backward,1740,0.07,19.6,3,4,7251")
    assert text2 != text
    path.write_text(text2)
    with pytest.raises(ProfileError, match="5 layers, but stage 0"):
        read_phase_profile(path)


def test_duplicate_phase_names_both_lines(tmp_path):
    text = _rows()
    first = text.splitlines()[1]
    path = tmp_path / "dup.csv"
    path.write_text(text + first + "\n")
    with pytest.raises(ProfileError, match=r"duplicate phase from layer 0 .*first on line 2"):
        read_phase_profile(path)


def test_an_op_level_file_is_not_a_phase_profile(tmp_path):
    path = tmp_path / "ops.csv"
    path.write_text("stage,instruction,frequency,time,energy\n0,forward,1410,0.1,20\n")
    with pytest.raises(ProfileError, match="not a phase-level profile"):
        read_phase_profile(path)


def test_a_quoted_header_is_still_a_phase_profile(tmp_path):
    """A header of quoted names (as some CSV writers quote every cell) was taken for an
    op-level file: "not a phase-level profile", or each phase a "duplicate row"."""
    path = tmp_path / "quoted.csv"
    header, rest = _rows().split("\n", 1)
    path.write_text(",".join(f'"{name}"' for name in header.split(",")) + "\n" + rest)
    assert read_phase_profile(path).layers_per_stage == (6, 6)
    assert read_profile(path).ops == read_phase_profile(path).profile.ops
    path.write_text("x" * 200_000 + "\n" + rest)  # one cell past the csv module's limit
    with pytest.raises(ProfileError, match=r"quoted.csv:1: cannot read the CSV header"):
        read_profile(path)
