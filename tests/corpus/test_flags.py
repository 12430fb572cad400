"""Malformed flag values and output paths, for every command and flag."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ._harness import Case, check

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
            "--min-gap-fraction": ["nan", "inf", "-1", "1", "abc", "", "1e-8"],
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
    "two-clock": (
        ["frontier", "a100", "--microbatches", "4", "-o", "{out}"],
        {"--layers-per-stage": ["0", "1025", "100000", "abc", "", "12,0", "12,,12"]},
    ),
    "recurring-simulate": (
        ["recurring", "simulate", "--trace", "{trace}", "--gpu", "a40"],
        {
            "--recurrences": [*POSITIVE_INT, "100001", *BIG_INT],
            "--seeds": [*POSITIVE_INT, "1001", *BIG_INT],
            "--eta": ["nan", "inf", "-0.1", "1.5", "abc"],
            "--beta": ["1", "0.5", "nan", "inf", "1000", "abc"],
            "--profile-share": ["nan", "-0.1", "1.1", "inf"],
            "--jobs": [""],
            "--plot": [""],
        },
    ),
    "doctor": (
        ["doctor", "--no-cuda"],
        {
            "--clocks": ["0", "65", "abc", *BIG_INT],
            "--iterations": ["0", "1001", "1e9", *BIG_INT],
            "--energy-window-s": ["inf", "nan", "0", "-1", "61", "1e308"],
            "--gpu": ["-1", "1024", "abc"],
        },
    ),
    "straggler-wait": (
        ["straggler", "set", "--store", "127.0.0.1:1", "--pipeline", "0", "--time-s", "1"],
        {"--wait-s": ["nan", "inf", "-1", "3601", "abc"]},
    ),
}


_SIMULATE = ["recurring", "simulate", "--trace", "{trace}", "--gpu", "a40"]


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
        Case(
            "recurring simulate recurrences x seeds",
            [*_SIMULATE, "--recurrences", "100000", "--seeds", "1000"],
            ["--seeds", "200,000"],
        )
    )
    cases.append(
        Case(
            "recurring simulate default recurrences x seeds",
            ["recurring", "simulate", "--trace", "{trace}", "--gpu", "a40", "--seeds", "1000"],
            ["--seeds", "(default)"],
        )
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


def _dot(_work: Path, _valid: dict[str, Path]) -> dict[str, str]:
    return {"target": "."}


def _socket(work: Path, _valid: dict[str, Path]) -> dict[str, str]:
    import socket

    path = work / "sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))  # the socket node stays on disk after close
    return {"target": str(path)}


def _link_out(work: Path, _valid: dict[str, Path]) -> dict[str, str]:
    outside = work.parent / "victim.txt"
    outside.write_text("keep me\n")
    (work / "shared").mkdir()
    (work / "shared" / "out.json").symlink_to(outside)
    return {"target": str(work / "shared" / "out.json")}


def _link_dir(work: Path, _valid: dict[str, Path]) -> dict[str, str]:
    (work / "real").mkdir()
    (work / "linked").symlink_to(work / "real")
    return {"target": str(work / "linked")}


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
            ("dot", _dot),
            ("socket", _socket),
            ("link out of its directory", _link_out),
        ]:
            cases.append(Case(f"{name} -o {what}", argv, ["-o"], setup))
    for name, argv in DIR_OUTPUTS.items():
        for what, setup in [
            ("regular file", _make_file("afile")),
            ("under a regular file", _make_file("afile", "report")),
            ("empty", _empty),
            ("directory with foreign files", _foreign_dir),
            ("current directory", _dot),
            ("symbolic link", _link_dir),
        ]:
            cases.append(Case(f"{name} -o {what}", argv, ["-o"], setup))
    plot = ["recurring", "simulate", "--trace", "{trace}", "--gpu", "a40", "--plot", "{target}"]
    for what, setup in [
        ("regular file", _make_file("afile")),
        ("under a regular file", _make_file("afile", "plots")),
        ("symbolic link", _link_dir),
    ]:
        cases.append(Case(f"recurring --plot {what}", plot, ["--plot"], setup))
    return cases


CASES = _flag_cases() + _output_cases()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_exit_2(
    case: Case,
    tmp_path: Path,
    valid_files: dict[str, Path],
    capsys: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    check(case, tmp_path, valid_files, capsys, monkeypatch)
