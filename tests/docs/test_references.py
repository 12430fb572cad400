"""Every cross-reference in perseus's docstrings and comments leads somewhere.

Three kinds are checked, in every module under ``perseus/``:

* dotted names (``perseus.solver.cut_network.INF_CAP``, ``compiled._step_length``): a full
  ``perseus.…`` path, a Sphinx role (:func:, :meth:, :class:, ...) resolved from the module it is
  written in, or ``module._private`` where ``module`` is the last part of a perseus module;
* citations of the hardware notes, ``docs/hardware.md#anchor``: the page has that anchor;
* paths of repository files cited as ``docs/….md`` or ``benchmarks/….py``: the file exists.
"""

from __future__ import annotations

import builtins
import importlib
import io
import re
import sys
import tokenize
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "perseus"

#: Dotted strings that name something other than Python objects.
#: Optional libraries (pyproject extras) the docstrings refer to; absent ones are not checked.
_EXTRAS = {"torch", "deepspeed", "megatron", "prometheus_client", "pynvml", "psycopg", "tqdm"}
NOT_OBJECTS = {
    "perseus.phase": "the logger that announces long steps (perseus.log.PHASE_LOGGER)",
}

_FULL = re.compile(r"(?<![\w/.-])perseus(?:\.[A-Za-z_]\w*)+(?![\w-])")
_ROLE = re.compile(r":(?:func|meth|class|mod|attr|data|exc|obj):`~?([A-Za-z_][\w.]*)`")
_PRIVATE = re.compile(r"(?<![\w/.])([a-z_][a-z0-9_]*)\.(_[A-Za-z]\w*)")
_LITERAL = re.compile(r"``.*?``")  # other objects' private parts (torch's schedule._stage)
_HARDWARE = re.compile(r"docs/hardware\.md#([\w-]+)")
_REPO_FILE = re.compile(r"(?<![\w/.-])((?:docs|benchmarks)/[\w./-]+\.(?:md|py))")


def _modules() -> dict[str, Path]:
    names = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(REPO).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        elif parts[-1] == "__main__":
            continue  # running it is importing it
        names[".".join(parts)] = path
    return names


MODULES = _modules()
_BASENAMES: dict[str, list[str]] = {}
for _name in MODULES:
    _BASENAMES.setdefault(_name.rsplit(".", 1)[-1], []).append(_name)


def _has(obj: object, attr: str) -> bool:
    if hasattr(obj, attr):
        return True
    # dataclass / pydantic / NamedTuple fields and slots without class-level values
    for table in ("__annotations__", "model_fields", "__slots__", "_fields"):
        if attr in (getattr(obj, table, None) or ()):
            return True
    return False


def _walk(obj: object, parts: list[str]) -> bool:
    for attr in parts:
        if not _has(obj, attr):
            return False
        obj = getattr(obj, attr, None)
    return True


def _resolve_full(ref: str) -> bool:
    parts = ref.split(".")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        if name in MODULES:
            return _walk(importlib.import_module(name), parts[i:])
    return False


def _resolve_in(module: types.ModuleType, ref: str) -> bool:
    if ref.startswith("perseus."):
        return _resolve_full(ref)
    parts = ref.split(".")
    if _walk(module, parts):
        return True
    package = module.__name__ if hasattr(module, "__path__") else module.__name__.rpartition(".")[0]
    while package:
        if _resolve_full(f"{package}.{ref}"):
            return True
        package = package.rpartition(".")[0]
    return False


def _defined_anywhere(name: str) -> bool:
    """``name`` is a top-level name or a class attribute of some perseus module."""
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        if _has(module, name):
            return True
        for value in vars(module).values():
            if isinstance(value, type) and value.__module__ == module_name and _has(value, name):
                return True
    return False


def _resolve_role(module: types.ModuleType, ref: str) -> bool:
    """As Sphinx would, roughly: from the module, its classes, its packages, or anywhere."""
    if _resolve_in(module, ref):
        return True
    parts = ref.split(".")
    if parts[0] != "perseus" and not hasattr(builtins, parts[0]):
        try:  # a reference into another library (time.perf_counter, torch.overrides...)
            importlib.import_module(parts[0])
            return True
        except ImportError:
            if parts[0] in _EXTRAS:  # an optional library not installed here: not checkable
                return True
    classes = [v for v in vars(module).values() if isinstance(v, type)]
    if any(_walk(cls, parts) for cls in classes):
        return True
    return len(parts) == 1 and _defined_anywhere(ref)


def prose_lines(source: str) -> dict[int, str]:
    """The comments and string literals of ``source``, by line: where references are written."""
    lines: dict[int, list[str]] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.COMMENT, tokenize.STRING):
            text = token.string.splitlines() or [""]
            for offset, part in enumerate(text):
                lines.setdefault(token.start[0] + offset, []).append(part)
    return {number: " ".join(parts) for number, parts in lines.items()}


def _anchors(page: Path) -> set[str]:
    return set(re.findall(r"\{#([\w-]+)\}", page.read_text(encoding="utf-8")))


def dangling_references(module: types.ModuleType, source: str) -> list[str]:
    """Each reference in ``source`` (``module``'s text) that leads nowhere, as ``line: ref``."""
    hardware = _anchors(REPO / "docs" / "hardware.md")
    bad = []
    for number, line in sorted(prose_lines(source).items()):
        for match in _FULL.finditer(line):
            ref = match.group(0)
            if ref not in NOT_OBJECTS and not _resolve_full(ref):
                bad.append(f"{number}: {ref}")
        for match in _ROLE.finditer(line):
            if not _resolve_role(module, match.group(1)):
                bad.append(f"{number}: {match.group(1)}")
        for match in _PRIVATE.finditer(_LITERAL.sub("", line)):
            base, attr = match.groups()
            candidates = _BASENAMES.get(base)
            if candidates and not any(_resolve_full(f"{c}.{attr}") for c in candidates):
                bad.append(f"{number}: {base}.{attr}")
        for match in _HARDWARE.finditer(line):
            if match.group(1) not in hardware:
                bad.append(f"{number}: docs/hardware.md#{match.group(1)}")
        for match in _REPO_FILE.finditer(line):
            if not (REPO / match.group(1)).is_file():
                bad.append(f"{number}: {match.group(1)}")
    return list(dict.fromkeys(bad))  # a role's full path is found twice


@pytest.mark.parametrize("module_name", sorted(MODULES))
def test_no_dangling_reference(module_name: str) -> None:
    module = importlib.import_module(module_name)
    source = MODULES[module_name].read_text(encoding="utf-8")
    assert dangling_references(module, source) == [], MODULES[module_name]


def test_the_checker_finds_moved_names() -> None:
    # The references this repository once had to modules and methods that had moved.
    source = (
        '"""Folded as in :mod:`perseus.solver.maxflow`; see frontier._step_length, and\n'
        ":meth:`ClockSweep.finished_everywhere`; docs/hardware.md#no-such-section;\n"
        'benchmarks/no_such_script.py; fine: compiled._step_length."""\n'
        "from perseus.runtime.profiling.sweep import ClockSweep\n"
    )
    module = types.ModuleType("perseus.runtime.profiling._probe")
    exec(compile(source, "<probe>", "exec"), module.__dict__)
    assert dangling_references(module, source) == [
        "1: perseus.solver.maxflow",
        "1: frontier._step_length",
        "2: ClockSweep.finished_everywhere",
        "2: docs/hardware.md#no-such-section",
        "3: benchmarks/no_such_script.py",
    ]


def test_a_reference_into_an_optional_library_that_is_absent_is_not_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import perseus.job

    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` fails as if not installed
    source = (
        '"""Maps devices in a :class:`torch.overrides.TorchFunctionMode`; see :func:`nowhere`."""\n'
    )
    assert dangling_references(perseus.job, source) == ["1: nowhere"]
