"""The README, walked as a newcomer walks it: its marked snippets run, in order, in one folder.

A fenced block right after an HTML comment is part of the walk:

* ``<!-- readme-test: run -->``: each command line runs in bash (``\\`` continues a line).
  Steps that install (``python3 -m venv``, ``. .venv/bin/activate``, ``pip install``) and the
  test suite itself (``python -m pytest``) are skipped: the walk runs in this environment;
* ``<!-- readme-test: file NAME -->``: the block is saved as ``NAME``;
* ``<!-- readme-test: output -->``: the output the README shows for the run block before it;
  it must be what that block printed (a trailing ``in N s`` wall time aside);
  ``output within 2%`` lets each number differ by 2 % (wall-clock emulation).

So every figure the README shows next to a command is what the command prints now.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"

_MARKED = re.compile(r"<!-- readme-test: (.+?) -->\n+```[^\n]*\n(.*?)```", re.S)
_SKIPPED = ("python3 -m venv", ". .venv/bin/activate", "pip install", "python -m pytest")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_WALL_TIME = re.compile(r" in \d+(?:\.\d+)? s$", re.M)


@dataclass(frozen=True)
class Snippet:
    kind: str  # "run", "file" or "output"
    arg: str  # the file name, or "within 2%"
    body: str


def snippets(text: str) -> list[Snippet]:
    """The README's marked blocks, in order."""
    out = []
    for match in _MARKED.finditer(text):
        kind, _, arg = match.group(1).strip().partition(" ")
        if kind not in ("run", "file", "output"):
            raise ValueError(f"README.md: unknown readme-test marker {match.group(1)!r}")
        out.append(Snippet(kind, arg, match.group(2)))
    return out


def commands(block: str) -> list[str]:
    """The block's commands, install and test-suite steps left out."""
    lines = block.replace("\\\n", " ").splitlines()
    out = []
    for line in lines:
        steps = [s.strip() for s in line.split(" && ") if s.strip()]
        kept = [s for s in steps if not s.startswith(_SKIPPED) and "pip install" not in s]
        if kept:
            out.append(" && ".join(kept))
    return out


def same_output(shown: str, printed: str, tolerance: float) -> bool:
    shown, printed = (_WALL_TIME.sub("", s.strip()) for s in (shown, printed))
    if tolerance == 0.0:
        return shown == printed
    if _NUMBER.sub("#", shown) != _NUMBER.sub("#", printed):
        return False
    pairs = zip(_NUMBER.findall(shown), _NUMBER.findall(printed), strict=True)
    return all(abs(float(a) - float(b)) <= tolerance * abs(float(a)) for a, b in pairs)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_snippets_are_found_and_the_walk_reaches_a_training_loop() -> None:
    walk = snippets(README.read_text(encoding="utf-8"))
    kinds = [(s.kind, s.arg) for s in walk]
    assert ("file", "train.py") in kinds
    run_text = " ".join(s.body for s in walk if s.kind == "run")
    assert "perseus demo" in run_text and "torchrun" in run_text
    # The quick start's demo runs; its install steps and the test suite do not.
    assert commands(walk[0].body) == ["perseus demo"]


def test_output_comparison() -> None:
    shown = "107 frontier points\nwrote perseus-report/ in 37.7 s"
    assert same_output(shown, "107 frontier points\nwrote perseus-report/ in 9.1 s", 0.0)
    assert not same_output(shown, "115 frontier points\nwrote perseus-report/ in 9.1 s", 0.0)
    assert same_output("iteration 2.90 s", "iteration 2.93 s", 0.02)
    assert not same_output("iteration 2.90 s", "iteration 3.10 s", 0.02)
    assert not same_output("iteration 2.90 s", "iteration 2.90 s, 1 J", 0.02)


@pytest.mark.slow
def test_readme_walk(tmp_path: Path) -> None:
    """From the demo to a wrapped training loop in emulation, using only what the README shows."""
    env = dict(os.environ)
    bin_dir = str(Path(sys.executable).parent)
    env.update(
        PATH=bin_dir + os.pathsep + env.get("PATH", ""),
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
        PERSEUS_SIM_DIR=str(tmp_path / "sim"),  # this walk's simulated GPUs, nobody else's
        PET_MASTER_PORT=str(_free_port()),  # torchrun's --master-port
        OMP_NUM_THREADS="1",
    )
    printed = None
    for snippet in snippets(README.read_text(encoding="utf-8")):
        if snippet.kind == "file":
            (tmp_path / snippet.arg).write_text(snippet.body, encoding="utf-8")
        elif snippet.kind == "run":
            printed = ""
            for command in commands(snippet.body):
                done = subprocess.run(
                    ["bash", "-c", f"set -euo pipefail; {command}"],
                    cwd=tmp_path,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
                assert done.returncode == 0, (
                    f"README command failed: {shlex.quote(command)}\n{done.stdout}\n{done.stderr}"
                )
                printed += done.stdout
        else:
            assert printed is not None, "README: an output block before any run block"
            tolerance = 0.02 if snippet.arg == "within 2%" else 0.0
            assert same_output(snippet.body, printed, tolerance), (
                f"README shows:\n{snippet.body}\nthe command printed:\n{printed}"
            )
    assert (tmp_path / "perseus-report" / "report.html").is_file()
