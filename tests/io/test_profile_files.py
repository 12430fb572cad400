from __future__ import annotations

from pathlib import Path

import pytest

from perseus.errors import ProfileError
from perseus.io import load_profile, read_profile, write_profile_csv, write_profile_json

HEADER = "stage,instruction,frequency,time,energy\n"
GOOD = HEADER + "".join(
    f"{s},{k},{f},{t},{e}\n"
    for s in range(2)
    for k, t, e in (("forward", 0.1, 10.0), ("backward", 0.2, 20.0))
    for f in (1410, 1200)
)


def _write(tmp_path: Path, text: str | bytes, name: str = "p.csv") -> Path:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def test_good_csv_with_extra_columns(tmp_path):
    text = "note," + HEADER.replace("\n", ",extra\n")
    text += "".join(f"x,{line},y\n" for line in GOOD.splitlines()[1:])
    profile = read_profile(_write(tmp_path, text))
    assert profile.num_stages == 2


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (
            HEADER.replace(",energy", "") + "0,forward,1410,0.1\n",
            r"p\.csv:1: missing column\(s\) energy",
        ),
        (GOOD + "0,sideways,1410,0.1,1\n", r"p\.csv:10: unknown instruction 'sideways'"),
        (GOOD + "1,backward,1200,0.3,30\n", r"p\.csv:10: duplicate row .*first on line 9"),
        (
            GOOD.replace("0,forward,1410,0.1,", "0,forward,1410,nan,"),
            r"p\.csv:2: time must be a finite",
        ),
        (
            GOOD.replace("0,forward,1410,0.1,10.0", "0,forward,1410,0.1,-3"),
            r"p\.csv:2: energy must be",
        ),
        (GOOD.replace("0,forward,1410,0.1,", "0,forward,1410,0,"), r"p\.csv:2: time must be"),
        (
            "".join(line + "\n" for line in GOOD.splitlines() if not line.startswith("1,backward")),
            r"stage 1 has no 'backward' rows",
        ),
        (GOOD.replace("1,", "2,"), r"stage\(s\) \[1\] have no rows"),
        (
            GOOD.replace("0,forward,1410,", "0,forward,1410.5,"),
            r"p\.csv:2: frequency '1410\.5' is not an integer",
        ),
        ("", r"p\.csv: file is empty"),
        (HEADER, r"p\.csv: no data rows"),
        (
            GOOD.replace("0,forward,1410,0.1,10.0", "0,forward,1410,0.1"),
            r"p\.csv:2: expected 5 fields",
        ),
        (
            GOOD.replace("0,forward,1410", "zero,forward,1410"),
            r"p\.csv:2: stage 'zero' is not an integer",
        ),
        (
            GOOD.replace("0,forward,1410,0.1,10.0", "0,forward,1410,fast,10.0"),
            r"p\.csv:2: time 'fast' is not a number",
        ),
        (
            GOOD.replace("0,forward,1410", "+-0,forward,1410"),
            r"p\.csv:2: stage '\+-0' is not an integer",
        ),
    ],
    ids=[
        "missing-column",
        "unknown-kind",
        "duplicate",
        "nan-time",
        "negative-energy",
        "zero-time",
        "stage-missing-kind",
        "stage-without-rows",
        "non-integer-clock",
        "empty",
        "header-only",
        "short-row",
        "bad-stage",
        "non-numeric-time",
        "two-signs-stage",
    ],
)
def test_bad_csv_is_one_line_naming_file_and_line(tmp_path, text, match):
    with pytest.raises(ProfileError, match=match) as info:
        read_profile(_write(tmp_path, text))
    assert "\n" not in str(info.value)


def test_many_missing_stages_are_counted_not_listed(tmp_path):
    text = HEADER + "4095,forward,1410,0.1,10.0\n4095,backward,1410,0.2,20.0\n"
    with pytest.raises(ProfileError) as info:
        read_profile(_write(tmp_path, text))
    message = str(info.value)
    assert "stage(s) [0, 1, 2, 3, 4, 5, 6, 7] and 4087 more have no rows" in message
    assert message.endswith("without gaps)") and len(message) < 300


def test_binary_junk(tmp_path):
    with pytest.raises(ProfileError, match=r"p\.csv: file is binary"):
        read_profile(_write(tmp_path, bytes(range(256)) * 4))
    with pytest.raises(ProfileError, match=r"p\.csv:1: not valid UTF-8"):
        read_profile(_write(tmp_path, b"\xff\xfe\xfa garbage"))


def test_missing_file(tmp_path):
    with pytest.raises(ProfileError, match="file not found"):
        read_profile(tmp_path / "nope.csv")


def test_json_integer_of_thousands_of_digits_is_one_line(tmp_path):
    path = _write(tmp_path, '{"rows": [{"stage": ' + "9" * 5000 + "}]}", "p.json")
    with pytest.raises(ProfileError, match=r"p\.json: invalid JSON \(") as info:
        read_profile(path)
    assert "\n" not in str(info.value)


def test_bad_json_names_field(tmp_path):
    path = _write(
        tmp_path,
        '{"schema_version": 1, "rows": [{"stage": 0, "instruction": "forward", '
        '"frequency": 1410, "time": -1, "energy": 2}]}',
        "p.json",
    )
    with pytest.raises(ProfileError, match=r"p\.json: field rows\.0\.time"):
        read_profile(path)


@pytest.mark.parametrize("writer", [write_profile_csv, write_profile_json])
def test_round_trip(tmp_path, writer):
    original = load_profile("a40")
    path = tmp_path / ("out.json" if writer is write_profile_json else "out.csv")
    writer(original, path)
    again = read_profile(path)
    assert again.ops == original.ops
    assert again.sha256 == original.sha256
