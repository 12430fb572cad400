"""How the ``perseus`` process ends when its standard output cannot take what it printed.

stdout is block-buffered when it is a pipe or a file, so what a command prints is often still
in Python's buffer when the command returns; a flush that fails at the interpreter's exit (the
reader went away, a full disk) prints "Exception ignored ... BrokenPipeError" and exits 120.
The documented endings are 141 (the reader went away, quietly) and one error line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_ENTRY = "from perseus.cli.main import entry; entry()"


def _perseus(args: list[str], stdout: int) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-c", _ENTRY, *args],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        timeout=120,
    )


# `profile show` runs a command to its end; `--version` exits inside argparse; no argument
# prints the help.
COMMANDS = [["profile", "show", "a100"], ["--version"], []]


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_reader_gone_exits_141_quietly(args: list[str]) -> None:
    read, write = os.pipe()
    os.close(read)  # `perseus ... | true`: the reader is gone before anything is written
    try:
        proc = _perseus(args, write)
    finally:
        os.close(write)
    assert (proc.returncode, proc.stderr) == (141, "")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_full_stdout_is_one_error_line(args: list[str]) -> None:
    fd = os.open("/dev/full", os.O_WRONLY)
    try:
        proc = _perseus(args, fd)
    finally:
        os.close(fd)
    assert proc.returncode == 1
    assert proc.stderr == "error: No space left on device; nothing was written\n"


def test_interrupt_while_commands_load_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C in the first tenth of a second (the parser imports every command's module) ends
    as any other interrupt does: "interrupted", exit 130, no traceback."""
    from perseus.cli import main as cli_main

    def interrupted(name: str) -> object:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_main.importlib, "import_module", interrupted)
    assert cli_main.main(["profile", "show", "a100"]) == 130
    assert capsys.readouterr().err == "interrupted\n"
