"""The documentation site: generated references cover the code, and the strict build passes."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import perseus
from perseus.cli.main import build_parser

REPO = Path(__file__).resolve().parents[2]


def _hook() -> ModuleType:
    pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]'")
    spec = importlib.util.spec_from_file_location(
        "_docs_hook", REPO / "docs" / "hooks" / "generate.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _commands(
    parser: argparse.ArgumentParser, path: str
) -> list[tuple[str, argparse.ArgumentParser]]:
    out = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _commands(sub, f"{path} {name}")
    return out


def test_cli_reference_has_every_command_and_flag() -> None:
    page = _hook().cli_page()
    commands = _commands(build_parser(), "perseus")[1:]
    assert len(commands) > 10
    for path, parser in commands:
        section = page.split(f"`{path}`\n", 1)
        assert len(section) == 2, f"no section for {path}"
        body = section[1].split("\n#", 1)[0]
        for action in parser._actions:
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
                continue
            for flag in action.option_strings:
                assert f"`{flag}`" in body, f"{path}: {flag} missing from the CLI reference"


def test_api_reference_has_every_public_name() -> None:
    page = _hook().api_page()
    blocks = {
        line.removeprefix("::: ").rsplit(".", 1)[1]
        for line in page.splitlines()
        if line.startswith("::: ")
    }
    assert blocks == set(perseus.__all__) - {"__version__"}


@pytest.mark.slow
def test_the_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    pytest.importorskip("mkdocstrings", reason="the docs extra: pip install -e '.[docs]'")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "cli" / "index.html").is_file()
    api = (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8")
    assert "trace_frontier" in api and "PerseusPipeline" in api
