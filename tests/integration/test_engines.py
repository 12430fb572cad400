"""End-to-end emulation of the engine examples: Megatron-Core's and DeepSpeed's own schedules on
CPU/gloo with perseus's hooks and RankSession, checked against the frontier's predictions.

One check reads all the examples' ``--summary`` (train_pipeline.py's format): time and energy
within 2 % of predicted, saving within 1 point, for the all-max run and the deployed (fastest)
plan. The simulated GPUs are honest (the emulator's timeline is independent of host jitter, but
engine overhead between actions is real CPU time and counts), so the figures can disagree.

Every example runs at full profile time (``--time-scale 1.0``): the engines spend CPU time
between and around the steps (DeepSpeed's ``train_batch`` a few milliseconds per iteration for
its loss broadcast and bookkeeping, Megatron's schedule its Python bookkeeping per step), which
is a few percent of a 0.25-scaled iteration but well under 1 % of a full one on an idle machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.integration._summary import check_summary

pytest.importorskip("torch.distributed.pipelining")

EXAMPLES = REPO / "examples"

CASES = [
    # (example, extra args, engine package) - 1F1B at 8 microbatches, interleaved at 4 (x2).
    (
        "train_pipeline.py",
        ("--schedule", "1f1b", "--microbatches", "8", "--time-scale", "1.0"),
        None,
    ),
    (
        "train_megatron.py",
        ("--schedule", "1f1b", "--microbatches", "8", "--time-scale", "1.0"),
        "megatron.core",
    ),
    (
        "train_megatron.py",
        ("--schedule", "interleaved", "--microbatches", "4", "--time-scale", "1.0"),
        "megatron.core",
    ),
    (
        "train_deepspeed.py",
        ("--schedule", "1f1b", "--microbatches", "8", "--time-scale", "1.0"),
        "deepspeed",
    ),
]


@pytest.mark.parametrize(("example", "args", "package"), CASES, ids=lambda c: str(c))
def test_engine_example_matches_prediction(tmp_path: Path, example, args, package):
    if package is not None:
        pytest.importorskip(package)
    summary = tmp_path / "summary.json"
    cmd = [
        sys.executable,
        str(EXAMPLES / example),
        "--spawn",
        "2",
        "--emulate",
        "--iterations",
        "5",
        "--warmup",
        "1",
        "--summary",
        str(summary),
        *args,
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    s = json.loads(summary.read_text())
    assert s["ranks_per_pipeline"] == 2
    check_summary(s)


MATH_CASES = [
    ("train_pipeline.py", ("--schedule", "1f1b"), None),
    ("train_pipeline.py", ("--torch-schedule", "DualPipeV"), None),
    ("train_megatron.py", ("--schedule", "interleaved", "--microbatches", "4"), "megatron.core"),
    ("train_deepspeed.py", ("--schedule", "1f1b"), "deepspeed"),
]


@pytest.mark.parametrize(("example", "args", "package"), MATH_CASES, ids=lambda c: str(c))
def test_engine_math_is_bit_identical_with_and_without_perseus(
    tmp_path: Path, example, args, package
):
    """The same training steps (all-max and plan phases) with perseus in emulation and with
    no perseus at all end with bit-identical parameters on every rank."""
    if package is not None:
        pytest.importorskip(package)
    digests = []
    for extra in ((), ("--no-perseus",)):
        out = tmp_path / f"math{len(extra)}.json"
        cmd = [
            sys.executable,
            str(EXAMPLES / example),
            "--spawn",
            "2",
            "--emulate",
            "--iterations",
            "2",
            "--warmup",
            "0",
            "--time-scale",
            "0.25",
            "--math",
            str(out),
            *args,
            *extra,
        ]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=400)
        assert proc.returncode == 0, proc.stderr[-4000:]
        digests.append(json.loads(out.read_text()))
    assert len(digests[0]) == 2 and digests[0] == digests[1]
