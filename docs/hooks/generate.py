"""MkDocs hook: pages generated at build time from the code, so they cannot drift from it.

* ``cli.md``: every ``perseus`` command, walked from :func:`perseus.cli.main.build_parser`
  (usage, description, each flag with its default and help);
* ``api.md``: one mkdocstrings block per public name of :mod:`perseus` (``perseus.__all__``),
  pointing at the module that defines it;
* ``benchmarks.md``: ``benchmarks/README.md``, the figures page, as it is in the repository.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parents[2]

__all__ = ["api_page", "cli_page", "on_files"]


def on_files(files: Files, config: Any) -> Files:
    pages = {
        "cli.md": cli_page(),
        "api.md": api_page(),
        "benchmarks.md": (REPO / "benchmarks" / "README.md").read_text(encoding="utf-8"),
    }
    for uri, content in pages.items():
        files.append(File.generated(config, uri, content=content))
    return files


# ---------------------------------------------------------------------------------------------
# CLI reference


def _subparsers(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            out = []
            for name, sub in action.choices.items():
                if sub.description is None and helps.get(name):
                    sub.description = helps[name]
                out.append((name, sub))
            return out
    return []


def _flag_row(action: argparse.Action) -> str | None:
    if action.help == argparse.SUPPRESS or isinstance(
        action, (argparse._HelpAction, argparse._SubParsersAction)
    ):
        return None
    if action.option_strings:
        names = ", ".join(f"`{s}`" for s in action.option_strings)
        if action.nargs != 0:
            metavar = action.metavar or action.dest.upper()
            if isinstance(metavar, tuple):
                metavar = " ".join(metavar)
            names += f" `{metavar}`"
    else:
        names = f"`{action.metavar or action.dest}`"
    help_text = (action.help or "").replace("%(default)s", str(action.default))
    help_text = help_text.replace("%%", "%").replace("|", "\\|").replace("\n", " ")
    if action.choices is not None and not isinstance(action.choices, dict):
        help_text += " Choices: " + ", ".join(f"`{c}`" for c in action.choices) + "."
    default = action.default
    shown = (
        ""
        if default in (None, False, argparse.SUPPRESS) or not action.option_strings
        else f"`{default}`"
    )
    return f"| {names} | {shown} | {help_text} |"


def _command_section(path: str, parser: argparse.ArgumentParser, depth: int) -> list[str]:
    lines = [f"{'#' * depth} `{path}`", ""]
    if parser.description:
        lines += [parser.description.strip(), ""]
    usage = parser.format_usage().strip().removeprefix("usage: ")
    lines += ["```text", usage, "```", ""]
    rows = [r for r in map(_flag_row, parser._actions) if r is not None]
    if rows:
        lines += ["| argument | default | meaning |", "|---|---|---|", *rows, ""]
    if parser.epilog:
        lines += [parser.epilog.strip(), ""]
    for name, sub in _subparsers(parser):
        lines += _command_section(f"{path} {name}", sub, min(depth + 1, 4))
    return lines


def cli_page() -> str:
    """The CLI reference, from the parser ``perseus`` itself runs."""
    import os

    os.environ.setdefault("COLUMNS", "100")  # usage lines wrapped the same on every machine
    from perseus.cli.main import build_parser

    parser = build_parser()
    lines = [
        "# CLI reference",
        "",
        "Generated from the command's own argument parsers when this site is built; "
        "`perseus COMMAND --help` prints the same. Every command takes `-v` / `--log-level` "
        "before or after its name. Exit codes: 0 success, 1 an error while working, "
        "2 bad input (one line naming the flag, file or field), 130 Ctrl-C.",
        "",
    ]
    for name, sub in _subparsers(parser):
        lines += _command_section(f"perseus {name}", sub, 2)
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# API reference

_GROUPS = {
    "Planning": "perseus.schedule perseus.profile perseus.dag perseus.job perseus.solver",
    "Data model": "perseus.plan",
    "Files": "perseus.io",
    "Devices": "perseus.device.nvml perseus.device.simulated perseus.device.presets",
    "Plan sources": "perseus.runtime.planning",
    "Sessions": "perseus.runtime.pipeline perseus.runtime.session "
    "perseus.runtime.engines.torch_pp perseus.runtime.metrics",
    "Errors": "perseus.errors",
}


#: Classes whose page lists what they inherit (SimulatedGPU's shared-state base).
_WITH_INHERITED = {"SimulatedGPU"}


def api_page() -> str:
    """One mkdocstrings block per name in ``perseus.__all__``, grouped by what it is for."""
    import perseus

    where = dict(perseus._LAZY)
    for name in perseus.__all__:
        if name not in where and name != "__version__":
            where[name] = "perseus.errors"
    lines = [
        "# API reference",
        "",
        "Everything below is importable from `perseus` itself "
        "(`from perseus import trace_frontier, PerseusPipeline, SimulatedGPU`); each name is "
        "loaded on first use, so `import perseus` stays light and imports neither torch nor "
        "pynvml. Generated from the docstrings when this site is built.",
        "",
    ]
    placed: set[str] = set()
    for title, modules in _GROUPS.items():
        names = sorted(n for n, m in where.items() if m in modules.split())
        if not names:
            continue
        lines += [f"## {title}", ""]
        for name in names:
            lines += [f"::: {where[name]}.{name}", ""]
            if name in _WITH_INHERITED:  # methods from a base class of its own module family
                lines[-1:] = ["    options:", "      inherited_members: true", ""]
            placed.add(name)
    missing = sorted(set(where) - placed)
    if missing:
        raise RuntimeError(f"public names without a group in docs/hooks/generate.py: {missing}")
    return "\n".join(lines)
