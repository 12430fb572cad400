"""Malformed or edited frontier/plan files and run summaries."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ._harness import Case, _write_bad, check


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
    ("schema_version 4", _frontier(_set("schema_version", 4)), ["schema_version"]),
    ("schema_version string", _frontier(_set("schema_version", "2")), ["schema_version"]),
    ("job.stages string", _frontier(_set("job.stages", "8")), ["job.stages"]),
    ("job.microbatches true", _frontier(_set("job.microbatches", True)), ["job.microbatches"]),
    ("job.microbatches wrong", _frontier(_set("job.microbatches", 5)), ["stage_ops"]),
    ("job.microbatches huge", _frontier(_set("job.microbatches", 10**6)), ["job", "GB"]),
    ("job.microbatches 1e9", _frontier(_set("job.microbatches", 10**9)), ["job.microbatches"]),
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

# Every number bounded so that arithmetic on it cannot overflow (an internal error, or a plan
# accepted that no job can have).
FRONTIER_CASES += [
    (
        "layers per stage 1e30",
        _frontier(_set("job.layers_per_stage", [10**30] * 8)),
        ["job.layers_per_stage.0", "less than or equal to 1024"],
    ),
    (
        "layer weights 1e308",
        _frontier(
            lambda d: d["job"].update(
                layers_per_stage=[2] * 8, layer_time_fractions=[[1e308] * 2] * 8
            )
        ),
        ["job.layer_time_fractions.0.0", "less than or equal to 1000000"],
    ),
    (
        "two-clock op with 1e30 layers",
        _frontier(_set("points.0.freqs_mhz.0.0", [1410, 1200, 10**30]), True),
        ["points.0.freqs_mhz.0.0"],
    ),
    (
        "ranks 1e30",
        _frontier(_set("job.ranks", 10**30)),
        ["job.ranks", "less than or equal to 4096"],
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

# The job a plan file records, rebuilt by evaluate (report notes it and goes on without it).
JOB_CASES = [
    (
        "layers per stage past the bound",
        _frontier(_set("job.layers_per_stage", [100_000] * 8)),
        ["field job", "layers_per_stage", "1024"],
    ),
    (
        "profile named by path",
        _frontier(_set("job.profile_name", "/etc/passwd")),
        ["job.profile_name", "neither a bundled profile"],
    ),
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
    for name, setup, mentions in JOB_CASES:
        cases.append(
            Case(
                f"evaluate frontier job: {name}",
                FRONTIER_COMMANDS["evaluate"],
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


CASES = _frontier_cases() + _run_cases()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_exit_2(
    case: Case,
    tmp_path: Path,
    valid_files: dict[str, Path],
    capsys: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    check(case, tmp_path, valid_files, capsys, monkeypatch)
