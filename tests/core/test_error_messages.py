"""Errors the library raises name parameters, never CLI flags (the CLI rewrites them)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PERSEUS = Path(__file__).resolve().parents[2] / "perseus"
FLAG = re.compile(r"(?<![\w`-])--[a-z][a-z0-9-]+")


def _raised_strings(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            for part in ast.walk(node.exc):
                if isinstance(part, ast.Constant) and isinstance(part.value, str):
                    yield node.lineno, part.value


def test_no_library_error_names_a_cli_flag() -> None:
    found = []
    for path in sorted(PERSEUS.rglob("*.py")):
        if "cli" in path.relative_to(PERSEUS).parts:
            continue
        for line, text in _raised_strings(ast.parse(path.read_text(), str(path))):
            if FLAG.search(text):
                found.append(f"{path.relative_to(PERSEUS.parent)}:{line}: {text!r}")
    assert not found, "name the parameter in backquotes instead:\n" + "\n".join(found)


def test_the_check_sees_a_flag() -> None:
    tree = ast.parse('raise ValueError(f"--stages must be >= 1, got {n}")')
    assert [FLAG.search(t) is not None for _, t in _raised_strings(tree)] == [True]
