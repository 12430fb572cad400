"""Malformed profile files (CSV, JSON, multi-rank CSV) and TOML job configs."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ._harness import Case, _write_bad, check


# ---------------------------------------------------------------- profile files
def _csv_lines(valid: dict[str, Path]) -> list[str]:
    return valid["csv"].read_text().splitlines()


def _csv_field(column: str, value: str) -> Callable[[Path, dict[str, Path]], dict[str, str]]:
    def setup(work: Path, valid: dict[str, Path]) -> dict[str, str]:
        lines = _csv_lines(valid)
        header = lines[0].split(",")
        row = lines[1].split(",")
        row[header.index(column)] = value
        lines[1] = ",".join(row)
        return _write_bad(work, "bad.csv", "\n".join(lines) + "\n")

    return setup


def _csv_text(
    fn: Callable[[list[str]], str | bytes],
) -> Callable[[Path, dict[str, Path]], dict[str, str]]:
    def setup(work: Path, valid: dict[str, Path]) -> dict[str, str]:
        return _write_bad(work, "bad.csv", fn(_csv_lines(valid)))

    return setup


def _drop(lines: list[str], pred: Callable[[list[str]], bool]) -> str:
    return "\n".join([lines[0]] + [ln for ln in lines[1:] if not pred(ln.split(","))]) + "\n"


def _with_columns(names: str, values: str) -> Callable[[Path, dict[str, Path]], dict[str, str]]:
    """The valid CSV with columns ``names`` appended, every row holding ``values``."""
    return _csv_text(
        lambda lines: (
            "\n".join([f"{lines[0]},{names}"] + [f"{ln},{values}" for ln in lines[1:]]) + "\n"
        )
    )


def _multi_rank(
    mutate: Callable[[list[str]], list[str]],
) -> Callable[[Path, dict[str, Path]], dict[str, str]]:
    """A Zeus/Merak-style CSV with 2 data-parallel ranks per stage, then ``mutate``d."""

    def setup(work: Path, valid: dict[str, Path]) -> dict[str, str]:
        lines = _csv_lines(valid)
        out = ["rank,dp_rank,pp_rank,tp_rank," + lines[0]]
        for ln in lines[1:]:
            stage = int(ln.split(",")[0])
            for dp in (0, 1):
                out.append(f"{stage * 2 + dp},{dp},{stage},0,{ln}")
        return _write_bad(work, "bad.csv", "\n".join(mutate(out)) + "\n")

    return setup


PROFILE_CSV_CASES: list[
    tuple[str, Callable[[Path, dict[str, Path]], dict[str, str]], list[str]]
] = [
    *[
        (f"time {v!r}", _csv_field("time", v), ["time"])
        for v in ["1e308", "1e30", "nan", "inf", "-1", "0", "abc", "", "-inf", "1e7", "1e-300"]
    ],
    *[
        (f"energy {v!r}", _csv_field("energy", v), ["energy"])
        for v in ["1e308", "1e30", "nan", "inf", "-1", "0", "abc", ""]
    ],
    *[
        (f"frequency {v!r}", _csv_field("frequency", v), ["frequency"])
        for v in ["1e30", "1410.5", "-1", "0", "abc", "nan", "", "1e308", "200000"]
    ],
    *[
        (f"stage {v!r}", _csv_field("stage", v), ["stage"])
        for v in ["1000000", "-1", "1.5", "abc", "", "99999999999999999999999", "1e3", "²"]
    ],
    *[
        (f"instruction {v!r}", _csv_field("instruction", v), ["instruction"])
        for v in ["fwd", "", "forward;", "x" * 5000]
    ],
    ("empty file", _csv_text(lambda lines: ""), ["empty"]),
    ("header only", _csv_text(lambda lines: lines[0] + "\n"), ["no data rows"]),
    (
        "missing column",
        _csv_text(lambda lines: "\n".join(ln.rsplit(",", 1)[0] for ln in lines) + "\n"),
        ["energy"],
    ),
    ("garbage header", _csv_text(lambda lines: "a,b,c\n1,2,3\n"), ["missing column"]),
    ("duplicate row", _csv_text(lambda lines: "\n".join([*lines, lines[1]]) + "\n"), ["duplicate"]),
    ("short row", _csv_text(lambda lines: "\n".join([*lines, "0,forward"]) + "\n"), ["fields"]),
    ("binary", _csv_text(lambda lines: b"\x00\x01\x02" * 100), ["binary"]),
    (
        "not utf-8",
        _csv_text(lambda lines: ("\n".join(lines[:3]) + "\n").encode() + b"\xff\xfe,1\n"),
        ["UTF-8"],
    ),
    ("gap in stages", _csv_text(lambda lines: _drop(lines, lambda r: r[0] == "3")), ["stage"]),
    (
        "no backward rows",
        _csv_text(lambda lines: _drop(lines, lambda r: r[1] == "backward")),
        ["backward"],
    ),
    (
        "one stage lacks backward",
        _csv_text(lambda lines: _drop(lines, lambda r: r[0] == "2" and r[1] == "backward")),
        ["stage 2"],
    ),
    (
        "unterminated quote",
        _csv_text(lambda lines: "\n".join(lines[:5]) + '\n0,"forward,1410,0.1,2\n'),
        ["bad.csv"],
    ),
    (
        "multi-rank: a rank missing at one clock",
        _multi_rank(lambda out: out[:2] + out[3:]),
        ["rank"],
    ),
    (
        "multi-rank: pp_rank differs from stage",
        _multi_rank(lambda out: [out[0], out[1].replace(",0,0,0,", ",0,5,0,", 1), *out[2:]]),
        ["pp_rank"],
    ),
    (
        "multi-rank: rank not a number",
        _multi_rank(lambda out: [out[0], "x" + out[1], *out[2:]]),
        ["rank"],
    ),
    ("multi-rank: duplicate rank row", _multi_rank(lambda out: [*out, out[1]]), ["duplicate"]),
    # Headers are read exactly: which of two same-named columns counts would be a guess, and a
    # lone phase column would be dropped and the file read as an op-level profile.
    (
        "mem_freq_mhz named twice",
        _with_columns("mem_freq_mhz,mem_freq_mhz", "1215,1593"),
        ["bad.csv:1:", "column mem_freq_mhz is named 2 times"],
    ),
    (
        "stage named twice (case differs)",
        _with_columns("Stage", "5"),
        ["bad.csv:1:", "column stage is named 2 times"],
    ),
    (
        "first_layer without last_layer",
        _with_columns("first_layer", "0"),
        ["bad.csv:1:", "missing column(s) last_layer; a phase-level header must contain"],
    ),
    (
        "last_layer without first_layer",
        _with_columns("last_layer", "0"),
        ["bad.csv:1:", "missing column(s) first_layer; a phase-level header must contain"],
    ),
    (
        "tp_rank without rank",
        _with_columns("tp_rank", "0"),
        ["bad.csv:1:", "column tp_rank without a rank column"],
    ),
]


def _json_profile(
    mutate: Callable[[dict[str, Any]], Any], raw: str | None = None
) -> Callable[[Path, dict[str, Path]], dict[str, str]]:
    def setup(work: Path, valid: dict[str, Path]) -> dict[str, str]:
        if raw is not None:
            return _write_bad(work, "bad.json", raw)
        doc = json.loads(valid["json"].read_text())
        result = mutate(doc)
        return _write_bad(work, "bad.json", json.dumps(result if isinstance(result, list) else doc))

    return setup


def _row0(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda d: d["rows"][0].update({key: value})


PROFILE_JSON_CASES = [
    (
        "syntax error line 3",
        _json_profile(lambda d: None, raw='{"schema_version": 1,\n"rows": [\n{"stage": 0,, }]}'),
        ["bad.json:3:"],
    ),
    (
        "time NaN",
        _json_profile(
            lambda d: None,
            raw='{"rows": [{"stage": 0, "instruction": "forward", "frequency": 1410, "time": NaN, "energy": 1}]}',
        ),
        ["rows.0.time"],
    ),
    (
        "energy Infinity",
        _json_profile(
            lambda d: None,
            raw='{"rows": [{"stage": 0, "instruction": "forward", "frequency": 1410, "time": 1, "energy": Infinity}]}',
        ),
        ["rows.0.energy"],
    ),
    ("stage as string", _json_profile(_row0("stage", "0")), ["rows.0.stage"]),
    ("stage true", _json_profile(_row0("stage", True)), ["rows.0.stage"]),
    ("stage huge", _json_profile(_row0("stage", 1000000)), ["rows.0.stage"]),
    ("frequency float", _json_profile(_row0("frequency", 1410.0)), ["rows.0.frequency"]),
    ("frequency 1e30", _json_profile(_row0("frequency", 10**30)), ["rows.0.frequency"]),
    ("time as string", _json_profile(_row0("time", "0.05")), ["rows.0.time"]),
    ("time 1e308", _json_profile(_row0("time", 1e308)), ["rows.0.time"]),
    ("extra key", _json_profile(_row0("comment", "x")), ["rows.0.comment"]),
    ("missing energy", _json_profile(lambda d: d["rows"][0].pop("energy")), ["rows.0.energy"]),
    ("rows empty", _json_profile(lambda d: d.update(rows=[])), ["rows"]),
    ("schema_version 2", _json_profile(lambda d: d.update(schema_version=2)), ["schema_version"]),
    ("top-level list", _json_profile(lambda d: [1, 2]), ["bad.json"]),
    ("instruction unknown", _json_profile(_row0("instruction", "fwd")), ["rows.0.instruction"]),
    ("json duplicate row", _json_profile(lambda d: d["rows"].append(d["rows"][0])), ["duplicate"]),
    (
        "json key named twice",
        _json_profile(
            lambda d: None,
            raw='{"rows": [{"stage": 0, "instruction": "forward", "frequency": 1410, "time": 1, '
            '"energy": 1, "time": 2}]}',
        ),
        ["bad.json: key 'time' appears twice"],
    ),
]

PROFILE_COMMANDS = {
    "frontier": [
        "frontier",
        "{bad}",
        "--microbatches",
        "4",
        "--blocking-power-w",
        "80",
        "-o",
        "{out}",
    ],
    "profile-slice": ["profile", "slice", "{bad}", "--stages", "4", "-o", "{out}"],
}


def _profile_cases() -> list[Case]:
    cases = []
    for command, argv in PROFILE_COMMANDS.items():
        for name, setup, mentions in PROFILE_CSV_CASES + PROFILE_JSON_CASES:
            cases.append(Case(f"{command} profile: {name}", argv, ["{badname}", *mentions], setup))
    for name, setup, mentions in PROFILE_CSV_CASES[::4]:
        argv = ["evaluate", "{bad}", "--microbatches", "4", "--blocking-power-w", "80"]
        cases.append(Case(f"evaluate profile: {name}", argv, ["{badname}", *mentions], setup))
    for name, setup, mentions in (PROFILE_CSV_CASES + PROFILE_JSON_CASES)[1::3]:
        argv = ["profile", "show", "{bad}"]
        cases.append(Case(f"profile show: {name}", argv, ["{badname}", *mentions], setup))
    for name, setup, mentions in PROFILE_CSV_CASES[2::5]:
        argv = ["report", "{frontier}", "-o", "{outdir}", "--profile", "{bad}"]
        cases.append(Case(f"report --profile: {name}", argv, ["{badname}", *mentions], setup))
    return cases


# ---------------------------------------------------------------- TOML job configs
_TOML_BASE = {"profile": '"a100"', "schedule": '"1f1b"', "microbatches": "4"}


def _toml(**changes: str | None) -> Callable[[Path, dict[str, Path]], dict[str, str]]:
    def setup(work: Path, _valid: dict[str, Path]) -> dict[str, str]:
        keys = dict(_TOML_BASE)
        for k, v in changes.items():
            if v is None:
                keys.pop(k, None)
            else:
                keys[k] = v
        text = "".join(f"{k} = {v}\n" for k, v in keys.items())
        return _write_bad(work, "job.toml", text)

    return setup


def _toml_raw(text: str | bytes) -> Callable[[Path, dict[str, Path]], dict[str, str]]:
    return lambda work, _valid: _write_bad(work, "job.toml", text)


TOML_CASES = [
    ("microbatches true", _toml(microbatches="true"), ["microbatches"]),
    ("microbatches string", _toml(microbatches='"4"'), ["microbatches"]),
    ("microbatches 0", _toml(microbatches="0"), ["microbatches"]),
    ("microbatches -1", _toml(microbatches="-1"), ["microbatches"]),
    ("microbatches float", _toml(microbatches="1.5"), ["microbatches"]),
    ("microbatches 1e9", _toml(microbatches="1000000000"), ["microbatches"]),
    ("microbatches 2**62", _toml(microbatches="4611686018427387904"), ["microbatches"]),
    ("microbatches nan", _toml(microbatches="nan"), ["microbatches"]),
    ("microbatches too big for memory", _toml(microbatches="9000000"), ["microbatches", "GB"]),
    ("microbatches missing", _toml(microbatches=None), ["microbatches"]),
    ("stages string", _toml(stages='"8"'), ["stages"]),
    ("stages true", _toml(stages="true"), ["stages"]),
    ("stages mismatch", _toml(stages="5"), ["job.toml", "stages"]),
    ("stages 0", _toml(stages="0"), ["stages"]),
    ("schedule unknown", _toml(schedule='"bogus"'), ["schedule"]),
    ("schedule number", _toml(schedule="1"), ["schedule"]),
    ("virtual stages for 1f1b", _toml(virtual_stages="2"), ["virtual_stages"]),
    ("virtual stages bool", _toml(virtual_stages="true"), ["virtual_stages"]),
    (
        "interleaved virtual stages not a divisor",
        _toml(schedule='"interleaved"', virtual_stages="3"),
        ["job.toml", "virtual_stages"],
    ),
    (
        "interleaved microbatches not whole rounds",
        _toml(schedule='"interleaved"', virtual_stages="2", microbatches="9"),
        ["job.toml", "microbatches"],
    ),
    ("backward split for 1f1b", _toml(backward_split="0.3"), ["backward_split"]),
    ("backward split 1", _toml(backward_split="1.0"), ["backward_split"]),
    ("backward split nan", _toml(backward_split="nan"), ["backward_split"]),
    ("blocking power nan", _toml(blocking_power_w="nan"), ["blocking_power_w"]),
    ("blocking power inf", _toml(blocking_power_w="inf"), ["blocking_power_w"]),
    ("blocking power -1", _toml(blocking_power_w="-1.0"), ["blocking_power_w"]),
    ("blocking power string", _toml(blocking_power_w='"83"'), ["blocking_power_w"]),
    ("blocking power bool", _toml(blocking_power_w="true"), ["blocking_power_w"]),
    ("blocking power 1e308", _toml(blocking_power_w="1e308"), ["blocking_power_w"]),
    ("p2p latency nan", _toml(p2p_latency_s="nan"), ["p2p_latency_s"]),
    ("p2p latency inf", _toml(p2p_latency_s="inf"), ["p2p_latency_s"]),
    ("p2p latency -1", _toml(p2p_latency_s="-1.0"), ["p2p_latency_s"]),
    ("unknown key", _toml(microbatchs="4"), ["microbatchs"]),
    ("profile missing", _toml(profile=None), ["profile"]),
    ("profile nonexistent", _toml(profile='"nope.csv"'), ["nope.csv"]),
    ("profile number", _toml(profile="3"), ["profile"]),
    ("profile empty", _toml(profile='""'), ["profile"]),
    ("pipelines 1", _toml(pipelines="1"), ["pipelines"]),
    ("description number", _toml(description="5"), ["description"]),
    ("schema_version 2", _toml(schema_version="2"), ["schema_version"]),
    ("syntax error", _toml_raw('profile = "a100"\nmicrobatches = = 4\n'), ["job.toml", "line 2"]),
    ("not utf-8", _toml_raw(b'profile = "a100"\nmicrobatches = 4 # \xff\n'), ["job.toml", "UTF-8"]),
    ("empty file", _toml_raw(""), ["job.toml"]),
    (
        "table instead of value",
        _toml_raw('profile = "a100"\n[microbatches]\nx = 1\n'),
        ["microbatches"],
    ),
]


def _toml_cases() -> list[Case]:
    cases = []
    for name, setup, mentions in TOML_CASES:
        cases.append(
            Case(
                f"frontier config: {name}",
                ["frontier", "--config", "{bad}", "-o", "{out}"],
                ["{badname}", *mentions],
                setup,
            )
        )
    for name, setup, mentions in TOML_CASES[::3]:
        cases.append(
            Case(
                f"demo config: {name}",
                ["demo", "--no-progress", "--config", "{bad}", "-o", "{outdir}"],
                ["{badname}", *mentions],
                setup,
            )
        )
    cases.append(
        Case(
            "config not found",
            ["frontier", "--config", "{tmp}/nope.toml", "-o", "{out}"],
            ["nope.toml"],
        )
    )
    cases.append(
        Case("config is a directory", ["frontier", "--config", "{tmp}", "-o", "{out}"], ["{tmp}"])
    )
    return cases


CASES = _profile_cases() + _toml_cases()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_exit_2(
    case: Case,
    tmp_path: Path,
    valid_files: dict[str, Path],
    capsys: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    check(case, tmp_path, valid_files, capsys, monkeypatch)
