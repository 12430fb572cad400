"""``perseus --help`` and every subcommand's ``--help`` print without loading the heavy stack.

Help is the first thing a user runs, and a shell completes it on every tab: building the
parsers must not import numpy, scipy, numba, pydantic, matplotlib, torch or tqdm (the command
modules import those inside the function that runs the command). Checked in fresh interpreters:
``perseus --help`` and ``perseus frontier --help`` alone, then every command's help in turn in
one process (nothing heavy may be loaded after any of them, so the first culprit is named).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from perseus.cli.main import build_parser

HEAVY = ("numpy", "scipy", "numba", "pydantic", "matplotlib", "torch", "tqdm")

_CODE = f"""
import contextlib, io, json, sys
from perseus.cli.main import main
results = []
for command in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            code = main([*command.split(), "--help"])
        except SystemExit as e:  # argparse's --help exits 0 after printing
            code = e.code
    loaded = [m for m in {HEAVY!r} if m in sys.modules]
    results.append([command, code, len(out.getvalue()), loaded])
print(json.dumps(results))
"""


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[str]:
    """Every command path (``"plan pick"``), the bare program first."""
    yield " ".join(path)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _commands(child, (*path, name))


def _help(commands: list[str]) -> list[list[object]]:
    proc = subprocess.run(
        [sys.executable, "-c", _CODE, json.dumps(commands)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    results: list[list[object]] = json.loads(proc.stdout.strip().splitlines()[-1])
    return results


@pytest.mark.parametrize("commands", [[""], ["frontier"], list(_commands(build_parser()))])
def test_help_loads_no_heavy_module(commands: list[str]) -> None:
    assert {"", "frontier", "plan pick", "doctor"} <= set(_commands(build_parser()))
    for command, code, printed, loaded in _help(commands):
        assert code == 0, f"`perseus {command} --help` exited {code}"
        assert printed, f"`perseus {command} --help` printed nothing"
        assert loaded == [], f"`perseus {command} --help` loaded {loaded}"
