"""The malformed-input corpus: every entry point, every file format, every flag.

Each case breaks one thing in an otherwise valid command line and asserts the contract of
``perseus``'s CLI for bad input: exit code 2, exactly one line on stderr that names the file or
flag (and the field, for files), no traceback, and nothing written or removed. Cases are
generated from small tables (bad values per kind of flag, mutations per file format), so that
a new flag or field is one table row away from being covered.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from perseus.cli.main import main


@dataclass(frozen=True)
class Case:
    id: str
    argv: list[str]
    mentions: list[str]
    #: Writes the malformed input; returns extra placeholders (e.g. {"bad": path}).
    setup: Callable[[Path, dict[str, Path]], dict[str, str]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _snapshot(root: Path) -> set[tuple[str, int]]:
    return {
        (str(p.relative_to(root)), p.stat().st_size if p.is_file() else -1) for p in root.rglob("*")
    }


def run_case(case: Case, tmp_path: Path, valid: dict[str, Path], capsys: Any) -> None:
    work = tmp_path / "work"
    work.mkdir()
    ctx = {k: str(v) for k, v in valid.items()}
    ctx.update(out=str(work / "out.json"), outdir=str(work / "outdir"), tmp=str(work))
    if case.setup is not None:
        ctx.update(case.setup(work, valid))
    before = _snapshot(work)
    argv = [a.format(**ctx) for a in case.argv]
    capsys.readouterr()
    rc = main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "Traceback" not in out
    lines = err.splitlines()
    assert rc == 2, f"exit {rc}; stderr: {err!r}"
    assert len(lines) == 1, f"expected one stderr line, got {len(lines)}: {err[:2000]!r}"
    assert len(lines[0]) <= 800, f"stderr line of {len(lines[0])} characters"
    for m in case.mentions:
        assert m.format(**ctx) in lines[0], f"{m.format(**ctx)!r} not in {lines[0]!r}"
    assert _snapshot(work) == before, "files were written or removed"


# ---------------------------------------------------------------- flags: bad values by kind
_NOT_NUMBERS = ["abc", "", "true", "1,5", "0x1p3", "1 2"]
_NON_FINITE = ["nan", "inf", "-inf", "1e309", "-nan", "Infinity"]
POSITIVE_FLOAT = _NOT_NUMBERS + _NON_FINITE + ["0", "-1", "-1e-9"]
NONNEG_FLOAT = _NOT_NUMBERS + _NON_FINITE + ["-1", "-0.001", "1e308"]
FRACTION = _NOT_NUMBERS + _NON_FINITE + ["0", "1", "1.5", "-0.5"]
POSITIVE_INT = [
    "²",
    "1_000",
    " ",
    "0",
    "-1",
    "1.5",
    "1e3",
    "abc",
    "",
    "true",
    "nan",
    "99999999999999999999999",
    "0x10",
]
BIG_INT = ["1000000000000", "2361183241434822606848"]  # 10**12, 2**71
FACTORS = [
    "nan",
    "1:inf:0.1",
    "0.5",
    "1:2:0",
    "2:1:0.1",
    "abc",
    "",
    "1:1000000:0.0001",
    "1e308",
    "1,,x",
    "1:2",
    "inf,1.1",
]

# command -> (argv before the flag, {flag: bad values}); {out}/{outdir} keep outputs in tmp.
FLAG_TABLE: dict[str, tuple[list[str], dict[str, list[str]]]] = {
    "frontier": (
        ["frontier", "a100", "--microbatches", "4", "-o", "{out}"],
        {
            "--stages": [*POSITIVE_INT, "5000"],
            "--microbatches": POSITIVE_INT + BIG_INT,
            "--virtual-stages": POSITIVE_INT,
            "--blocking-power-w": NONNEG_FLOAT,
            "--p2p-latency-s": NONNEG_FLOAT,
            "--backward-split": FRACTION,
            "--time-quantum-s": POSITIVE_FLOAT,
            "--min-gap-fraction": ["nan", "inf", "-1", "1", "abc", ""],
            "--schedule": ["bogus", "", "1F1B "],
            "--fold": ["sometimes", ""],
        },
    ),
    "evaluate": (
        ["evaluate", "a100", "--microbatches", "4"],
        {
            "--stages": ["0", "abc", "1e3", "true"],
            "--microbatches": ["0", "-1", "1.5", "true", *BIG_INT],
            "--blocking-power-w": ["nan", "inf", "1e308", "-1", "abc"],
            "--p2p-latency-s": ["nan", "inf", "-1", "1e308"],
            "--backward-split": ["nan", "0", "1"],
        },
    ),
    "demo": (
        ["demo", "-o", "{outdir}", "--no-progress"],
        {
            "--microbatches": ["0", "-1", "abc", "1.5", *BIG_INT],
            "--pipelines": ["1", "0", "-3", "abc", "nan", "2.5"],
            "--factors": FACTORS,
        },
    ),
    "plan-pick": (
        ["plan", "pick", "{frontier}", "-o", "{out}"],
        {
            "--time-s": POSITIVE_FLOAT,
            "--slowdown": ["0.5", "nan", "inf", "abc", "", "0", "1e308"],
            "--straggler-time-s": ["nan", "inf", "0", "-2", "abc"],
        },
    ),
    "export": (
        ["export", "{frontier}", "--format", "zeus-pfo", "-o", "{outdir}"],
        {
            "--max-time-s": ["nan", "inf", "-1", "0", "abc", "", "1e-9"],
            "--plan": ["7", "cheapest", "", "-1", "1e3", "99999999999999999999", "1.0"],
        },
    ),
    "report": (
        ["report", "{frontier}", "-o", "{outdir}"],
        {"--pipelines": ["1", "0", "abc", "1e6.5"], "--factors": FACTORS[:6]},
    ),
    "straggler-sweep": (
        ["straggler-sweep", "{frontier}", "-o", "{out}", "--pipelines", "4"],
        {"--pipelines": ["1", "abc", "-4"], "--factors": FACTORS},
    ),
    "straggler-set": (
        ["straggler", "set", "--store", "127.0.0.1:1", "--pipeline", "0", "--time-s", "1"],
        {
            "--store": [
                "HOST:99999",
                "localhost",
                ":29500",
                "host:abc",
                "host:0",
                "",
                "host:-1",
                "a b:1",
                "host:1234567",
            ],
            "--pipeline": ["-1", "abc", "1.5", "99999999999"],
            "--timeout-s": ["nan", "inf", "0", "-1", "1e9"],
            "--time-s": ["nan", "inf", "0", "-1", "abc"],
        },
    ),
    "straggler-clear": (
        ["straggler", "clear", "--store", "127.0.0.1:1", "--pipeline", "0"],
        {"--pipeline": ["-1", "x"], "--timeout-s": ["nan", "-1"], "--store": ["HOST:99999"]},
    ),
    "profile-slice": (
        ["profile", "slice", "a100", "-o", "{out}"],
        {"--stages": ["0", "-1", "abc", "3.5", "5000", "12"]},
    ),
}


def _flag_cases() -> list[Case]:
    cases = []
    for command, (base, flags) in FLAG_TABLE.items():
        for flag, values in flags.items():
            for value in dict.fromkeys(values):
                argv = list(base)
                if flag in argv:
                    i = argv.index(flag)
                    argv = argv[:i] + argv[i + 2 :]
                argv += [flag, value]
                # `profile slice` needs --stages; a bad value is the only one given.
                cases.append(Case(f"{command} {flag} {value!r}", argv, [flag]))
    for value in ["0", "inf", "nan", "-1", "abc", "1e9"]:
        cases.append(
            Case(f"device slowdown 0 {value!r}", ["device", "slowdown", "0", value], ["factor"])
        )
    cases.append(
        Case("plan pick no deadline", ["plan", "pick", "{frontier}", "-o", "{out}"], ["--time-s"])
    )
    cases.append(
        Case(
            "plan pick two deadlines",
            ["plan", "pick", "{frontier}", "-o", "{out}", "--time-s", "9", "--slowdown", "1"],
            ["--slowdown"],
        )
    )
    cases.append(Case("unknown command", ["frobnicate"], ["frobnicate"]))
    cases.append(
        Case(
            "unknown flag",
            ["frontier", "a100", "--microbatchs", "4", "-o", "{out}"],
            ["--microbatchs"],
        )
    )
    cases.append(Case("frontier without -o", ["frontier", "a100", "--microbatches", "4"], ["-o"]))
    cases.append(
        Case(
            "frontier without microbatches", ["frontier", "a100", "-o", "{out}"], ["--microbatches"]
        )
    )
    cases.append(
        Case(
            "frontier unknown profile",
            ["frontier", "a101", "--microbatches", "4", "-o", "{out}"],
            ["a101"],
        )
    )
    cases.append(
        Case(
            "frontier huge job",
            ["frontier", "a100", "--microbatches", "9000000", "-o", "{out}"],
            ["--microbatches", "GB"],
        )
    )
    cases.append(
        Case(
            "evaluate huge job",
            ["evaluate", "a100", "--microbatches", "9000000"],
            ["--microbatches", "GB"],
        )
    )
    cases.append(
        Case(
            "frontier --stages mismatch",
            ["frontier", "a100", "--stages", "4", "--microbatches", "4", "-o", "{out}"],
            ["--stages", "perseus profile slice"],
        )
    )
    cases.append(
        Case(
            "frontier split for 1f1b",
            ["frontier", "a100", "--microbatches", "4", "--backward-split", "0.3", "-o", "{out}"],
            ["--backward-split"],
        )
    )
    cases.append(
        Case(
            "frontier virtual for 1f1b",
            ["frontier", "a100", "--microbatches", "4", "--virtual-stages", "2", "-o", "{out}"],
            ["--virtual-stages"],
        )
    )
    cases.append(
        Case(
            "interleaved bad virtual",
            [
                "frontier",
                "a100",
                "--schedule",
                "interleaved",
                "--virtual-stages",
                "3",
                "--microbatches",
                "4",
                "-o",
                "{out}",
            ],
            ["--virtual-stages"],
        )
    )
    cases.append(
        Case(
            "interleaved bad rounds",
            [
                "frontier",
                "a100",
                "--schedule",
                "interleaved",
                "--virtual-stages",
                "2",
                "--microbatches",
                "9",
                "-o",
                "{out}",
            ],
            ["--microbatches"],
        )
    )
    cases.append(
        Case(
            "evaluate --plan and --stages",
            ["evaluate", "--plan", "{plan}", "--stages", "8"],
            ["--stages"],
        )
    )
    cases.append(
        Case(
            "export below T_min",
            [
                "export",
                "{frontier}",
                "--format",
                "zeus-pfo",
                "-o",
                "{outdir}",
                "--max-time-s",
                "0.001",
            ],
            ["--max-time-s", "frontier.json"],
        )
    )
    cases.append(
        Case(
            "plan pick below T_min",
            ["plan", "pick", "{frontier}", "-o", "{out}", "--time-s", "0.001"],
            ["--time-s", "frontier.json"],
        )
    )
    cases.append(
        Case(
            "plan pick straggler below T_min",
            ["plan", "pick", "{frontier}", "-o", "{out}", "--straggler-time-s", "0.001"],
            ["--straggler-time-s"],
        )
    )
    return cases


# ---------------------------------------------------------------- output paths
def _make_dir(name: str) -> Callable[[Path, dict[str, Path]], dict[str, str]]:
    def setup(work: Path, _valid: dict[str, Path]) -> dict[str, str]:
        (work / name).mkdir()
        return {"target": str(work / name)}

    return setup


def _make_file(name: str, under: str = "") -> Callable[[Path, dict[str, Path]], dict[str, str]]:
    def setup(work: Path, _valid: dict[str, Path]) -> dict[str, str]:
        (work / name).write_text("keep me\n")
        return {"target": str(work / name / under) if under else str(work / name)}

    return setup


def _foreign_dir(work: Path, _valid: dict[str, Path]) -> dict[str, str]:
    (work / "mine").mkdir()
    (work / "mine" / "thesis.tex").write_text("precious\n")
    return {"target": str(work / "mine")}


def _empty(_work: Path, _valid: dict[str, Path]) -> dict[str, str]:
    return {"target": ""}


FILE_OUTPUTS = {
    "frontier": ["frontier", "a100", "--microbatches", "4", "-o", "{target}"],
    "plan-pick": ["plan", "pick", "{frontier}", "--slowdown", "1", "-o", "{target}"],
    "straggler-sweep": ["straggler-sweep", "{frontier}", "--pipelines", "4", "-o", "{target}"],
    "profile-slice": ["profile", "slice", "a100", "--stages", "4", "-o", "{target}"],
}
DIR_OUTPUTS = {
    "demo": ["demo", "--no-progress", "-o", "{target}"],
    "report": ["report", "{frontier}", "-o", "{target}"],
    "export": ["export", "{frontier}", "--format", "zeus-pfo", "-o", "{target}"],
}


def _output_cases() -> list[Case]:
    cases = []
    for name, argv in FILE_OUTPUTS.items():
        for what, setup in [
            ("existing directory", _make_dir("adir")),
            ("under a regular file", _make_file("afile", "out.json")),
            ("empty", _empty),
            ("under a file, deeper", _make_file("afile", "x/y/out.json")),
        ]:
            cases.append(Case(f"{name} -o {what}", argv, ["-o"], setup))
    for name, argv in DIR_OUTPUTS.items():
        for what, setup in [
            ("regular file", _make_file("afile")),
            ("under a regular file", _make_file("afile", "report")),
            ("empty", _empty),
            ("directory with foreign files", _foreign_dir),
        ]:
            cases.append(Case(f"{name} -o {what}", argv, ["-o"], setup))
    return cases


# ---------------------------------------------------------------- profile files
def _csv_lines(valid: dict[str, Path]) -> list[str]:
    return valid["csv"].read_text().splitlines()


def _write_bad(work: Path, name: str, data: str | bytes) -> dict[str, str]:
    p = work / name
    if isinstance(data, bytes):
        p.write_bytes(data)
    else:
        p.write_text(data)
    return {"bad": str(p), "badname": name}


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


# ---------------------------------------------------------------- frontier / plan files
def _frontier(
    mutate: Callable[[dict[str, Any]], Any], redigest: bool = False, which: str = "frontier"
) -> Callable[[Path, dict[str, Path]], dict[str, str]]:
    def setup(work: Path, valid: dict[str, Path]) -> dict[str, str]:
        doc = json.loads(valid[which].read_text())
        mutate(doc)
        if redigest and "points_sha256" in doc:
            # the digest of a hand-made file: canonical JSON of the points as written
            text = json.dumps(doc["points"], sort_keys=True, separators=(",", ":"))
            doc["points_sha256"] = hashlib.sha256(text.encode()).hexdigest()
        return _write_bad(work, "bad.json", json.dumps(doc))

    return setup


def _frontier_raw(
    fn: Callable[[str], str | bytes],
) -> Callable[[Path, dict[str, Path]], dict[str, str]]:
    def setup(work: Path, valid: dict[str, Path]) -> dict[str, str]:
        return _write_bad(work, "bad.json", fn(valid["frontier"].read_text()))

    return setup


def _break_line_3(text: str) -> str:
    lines = text.split("\n")
    lines[2] = lines[2].replace(":", "::", 1)
    return "\n".join(lines)


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = doc
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return mutate


def _scale(path: str, factor: float) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = doc
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        node[last] *= factor

    return mutate


FRONTIER_CASES = [
    # edits caught by the digest
    ("edited point time", _frontier(_scale("points.0.time_s", 0.9)), ["points", "regenerate"]),
    ("edited point energy", _frontier(_scale("points.1.energy_j", 0.5)), ["points", "regenerate"]),
    ("edited clock", _frontier(_set("points.0.freqs_mhz.0.0", 1005)), ["points", "regenerate"]),
    ("dropped point", _frontier(lambda d: d["points"].pop()), ["points", "regenerate"]),
    ("digest removed", _frontier(lambda d: d.pop("points_sha256")), ["points_sha256"]),
    ("digest garbage", _frontier(_set("points_sha256", "abc")), ["points_sha256"]),
    ("digest on schema 1", _frontier(_set("schema_version", 1)), ["points_sha256"]),
    # values refused by the schema (digest recomputed: a hand-made, consistent file)
    (
        "clock 10**30",
        _frontier(_set("points.0.freqs_mhz.0.0", 10**30), True),
        ["points.0.freqs_mhz"],
    ),
    ("clock 0", _frontier(_set("points.0.freqs_mhz.0.0", 0), True), ["points.0.freqs_mhz"]),
    (
        "clock string",
        _frontier(_set("points.0.freqs_mhz.0.0", "1410"), True),
        ["points.0.freqs_mhz"],
    ),
    (
        "clock float",
        _frontier(_set("points.0.freqs_mhz.0.0", 1410.0), True),
        ["points.0.freqs_mhz"],
    ),
    ("clock bool", _frontier(_set("points.0.freqs_mhz.0.0", True), True), ["points.0.freqs_mhz"]),
    ("negative time", _frontier(_set("points.0.time_s", -1.0), True), ["points.0.time_s"]),
    ("time string", _frontier(_set("points.0.time_s", "1.0"), True), ["points.0.time_s"]),
    ("points unsorted", _frontier(lambda d: d["points"].reverse(), True), ["sorted"]),
    ("points empty", _frontier(_set("points", []), True), ["points"]),
    ("freqs shape", _frontier(lambda d: d["points"][0]["freqs_mhz"][0].pop(), True), ["freqs_mhz"]),
    (
        "baseline Infinity",
        _frontier_raw(
            lambda t: t.replace('"baseline":{"time_s":', '"baseline":{"time_s":Infinity,"x":', 1)
        ),
        ["baseline"],
    ),
    (
        "baseline NaN energy",
        _frontier(_set("baseline.energy_j", float("nan"))),
        ["baseline.energy_j"],
    ),
    ("baseline zero", _frontier(_set("baseline.time_s", 0)), ["baseline.time_s"]),
    # the job must describe stage_ops
    ("schema_version 3", _frontier(_set("schema_version", 3)), ["schema_version"]),
    ("schema_version string", _frontier(_set("schema_version", "2")), ["schema_version"]),
    ("job.stages string", _frontier(_set("job.stages", "8")), ["job.stages"]),
    ("job.microbatches true", _frontier(_set("job.microbatches", True)), ["job.microbatches"]),
    ("job.microbatches wrong", _frontier(_set("job.microbatches", 5)), ["stage_ops"]),
    ("job.microbatches huge", _frontier(_set("job.microbatches", 10**9)), ["job", "GB"]),
    ("job.ranks 0", _frontier(_set("job.ranks", 0)), ["job.ranks"]),
    ("job.ranks wrong", _frontier(_set("job.ranks", 4)), ["ranks"]),
    ("job.schedule unknown", _frontier(_set("job.schedule", "bogus")), ["job.schedule"]),
    ("job.schedule other builder", _frontier(_set("job.schedule", "gpipe")), ["stage_ops"]),
    ("job.virtual_stages 2 for 1f1b", _frontier(_set("job.virtual_stages", 2)), ["job"]),
    (
        "job.backward_split for 1f1b",
        _frontier(_set("job.backward_split", 0.5)),
        ["job.backward_split"],
    ),
    (
        "job.blocking_power_w nan",
        _frontier(_set("job.blocking_power_w", float("nan"))),
        ["job.blocking_power_w"],
    ),
    ("job.p2p_latency_s -1", _frontier(_set("job.p2p_latency_s", -1)), ["job.p2p_latency_s"]),
    (
        "job.blocking_power_w 1e308",
        _frontier(_set("job.blocking_power_w", 1e308)),
        ["job.blocking_power_w"],
    ),
    ("baseline 1e300", _frontier(_set("baseline.energy_j", 1e300)), ["baseline.energy_j"]),
    ("point time 1e300", _frontier(_set("points.1.time_s", 1e300), True), ["points.1.time_s"]),
    ("job extra field", _frontier(_set("job.gpus", 8)), ["job.gpus"]),
    ("garbage op name", _frontier(_set("stage_ops.0.0", "X0")), ["stage_ops"]),
    ("op F99", _frontier(_set("stage_ops.0.0", "F99")), ["stage_ops"]),
    ("stage index 1000000", _frontier(_set("stage_ops.0.0", "F0@1000000")), ["stage_ops"]),
    ("op names swapped", _frontier(lambda d: d["stage_ops"][0].reverse()), ["stage_ops"]),
    (
        "torch-style schedule with a duplicated op",
        _frontier(
            lambda d: (
                d["job"].update(schedule="ScheduleX"),
                d["stage_ops"][0].__setitem__(1, "F0"),
            )
        ),
        ["stage_ops"],
    ),
    (
        "torch-style schedule with F99",
        _frontier(
            lambda d: (
                d["job"].update(schedule="ScheduleX"),
                d["stage_ops"][0].__setitem__(0, "F99"),
            )
        ),
        ["stage_ops"],
    ),
    ("extra top-level field", _frontier(_set("code", "__import__('os')")), ["code"]),
    ("stage_ops missing", _frontier(lambda d: d.pop("stage_ops")), ["stage_ops"]),
    ("syntax error on line 3", _frontier_raw(_break_line_3), ["bad.json:3:"]),
    ("truncated", _frontier_raw(lambda t: t[: len(t) // 2]), ["bad.json:", "invalid JSON"]),
    ("empty", _frontier_raw(lambda t: ""), ["empty"]),
    ("binary", _frontier_raw(lambda t: b"\x89PNG\x00\x00\xff"), ["bad.json"]),
    ("top-level list", _frontier_raw(lambda t: "[1, 2]"), ["bad.json"]),
    (
        "a profile instead",
        _frontier_raw(lambda t: '{"schema_version": 1, "rows": []}'),
        ["bad.json"],
    ),
]

FIGURE_CASES = [
    ("edited baseline", _frontier(_scale("baseline.energy_j", 0.9)), ["baseline"]),
    ("edited baseline time", _frontier(_scale("baseline.time_s", 1.1)), ["baseline"]),
    (
        "unprofiled clock",
        _frontier(_set("points.0.freqs_mhz.0.0", 1007), True),
        ["points.0.freqs_mhz"],
    ),
    ("consistent lie", _frontier(_scale("points.0.energy_j", 0.9), True), ["points.0"]),
    ("other blocking power", _frontier(_set("job.blocking_power_w", 50.0)), ["baseline"]),
]

FRONTIER_COMMANDS = {
    "plan-pick": ["plan", "pick", "{bad}", "--slowdown", "1", "-o", "{out}"],
    "export": ["export", "{bad}", "--format", "zeus-pfo", "-o", "{outdir}"],
    "report": ["report", "{bad}", "-o", "{outdir}"],
    "straggler-sweep": ["straggler-sweep", "{bad}", "--pipelines", "4", "-o", "{out}"],
    "evaluate": ["evaluate", "--plan", "{bad}"],
}


def _frontier_cases() -> list[Case]:
    cases = []
    for i, (name, setup, mentions) in enumerate(FRONTIER_CASES):
        for j, (command, argv) in enumerate(FRONTIER_COMMANDS.items()):
            # every case through plan pick; each other command sees every third case
            if command == "plan-pick" or (i + j) % 3 == 0:
                cases.append(
                    Case(f"{command} frontier: {name}", argv, ["{badname}", *mentions], setup)
                )
    for command, argv in FRONTIER_COMMANDS.items():
        cases.append(
            Case(
                f"{command} frontier not found",
                [a.replace("{bad}", "{tmp}/missing.json") for a in argv],
                ["missing.json"],
            )
        )
    # figures the digest does not cover, checked against the exact evaluator where the
    # profile is at hand (evaluate, report)
    for command in ("evaluate", "report"):
        for name, setup, mentions in FIGURE_CASES:
            cases.append(
                Case(
                    f"{command} frontier figures: {name}",
                    FRONTIER_COMMANDS[command],
                    ["{badname}", *mentions],
                    setup,
                )
            )
    cases.append(
        Case(
            "evaluate --plan of another job",
            ["evaluate", "a40", "--microbatches", "4", "--plan", "{plan}"],
            ["plan.json", "job"],
        )
    )
    cases.append(
        Case(
            "evaluate --plan with another profile",
            ["evaluate", "a40", "--plan", "{plan}"],
            ["plan.json", "profile"],
        )
    )
    cases.append(
        Case(
            "report --profile of another job",
            ["report", "{frontier}", "-o", "{outdir}", "--profile", "a40"],
            ["frontier.json", "job"],
        )
    )
    return cases


# ---------------------------------------------------------------- run summaries
def _run(
    mutate: Callable[[dict[str, Any]], Any],
) -> Callable[[Path, dict[str, Path]], dict[str, str]]:
    def setup(work: Path, valid: dict[str, Path]) -> dict[str, str]:
        doc = json.loads(valid["run"].read_text())
        mutate(doc)
        return _write_bad(work, "run.json", json.dumps(doc))

    return setup


RUN_CASES = [
    ("another job's run", _run(_scale("allmax.predicted.time_s", 0.7)), ["allmax.predicted"]),
    (
        "another job's run, energy",
        _run(_scale("allmax.predicted.energy_j", 1.3)),
        ["allmax.predicted"],
    ),
    (
        "no allmax, foreign prediction",
        _run(lambda d: (d.pop("allmax"), d["predicted"].update(time_s=1.0))),
        ["predicted"],
    ),
    ("a report summary", _run(lambda d: d.update(kind="perseus.report-summary")), ["kind"]),
    ("unknown kind", _run(lambda d: d.update(kind="something")), ["kind"]),
    ("measured NaN", _run(_set("measured.time_s", float("nan"))), ["measured.time_s"]),
    ("measured negative", _run(_set("measured.energy_j", -5.0)), ["measured.energy_j"]),
    ("measured string", _run(_set("measured.time_s", "2.0")), ["measured.time_s"]),
    ("predicted missing", _run(lambda d: d.pop("predicted")), ["predicted"]),
    (
        "job of another schedule",
        _run(
            lambda d: d.update(
                job={
                    "schedule": "gpipe",
                    "ranks": 8,
                    "stages": 8,
                    "microbatches": 4,
                    "blocking_power_w": 83.64,
                    "profile_sha256": "x",
                }
            )
        ),
        ["job"],
    ),
    ("job malformed", _run(lambda d: d.update(job={"schedule": 3})), ["job"]),
]


def _run_cases() -> list[Case]:
    argv = ["report", "{frontier}", "-o", "{outdir}", "--summary", "{bad}"]
    cases = [
        Case(f"report --summary: {name}", argv, ["{badname}", *m], setup)
        for name, setup, m in RUN_CASES
    ]
    cases.append(
        Case(
            "report --summary syntax error",
            argv,
            ["run.json:2:"],
            lambda work, _v: _write_bad(work, "run.json", '{\n"predicted": }\n'),
        )
    )
    cases.append(
        Case(
            "report --summary empty",
            argv,
            ["run.json"],
            lambda work, _v: _write_bad(work, "run.json", ""),
        )
    )
    return cases


ALL_CASES = (
    _flag_cases()
    + _output_cases()
    + _profile_cases()
    + _toml_cases()
    + _frontier_cases()
    + _run_cases()
)


def test_corpus_is_large() -> None:
    assert len(ALL_CASES) >= 200
    assert len({c.id for c in ALL_CASES}) == len(ALL_CASES), "duplicate case ids"


@pytest.mark.parametrize("case", ALL_CASES, ids=[c.id for c in ALL_CASES])
def test_bad_input_is_one_line_exit_2(
    case: Case,
    tmp_path: Path,
    valid_files: dict[str, Path],
    capsys: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PERSEUS_SIM_DIR", str(tmp_path / "sim"))
    os.environ.pop("RANK", None)
    run_case(case, tmp_path, valid_files, capsys)
