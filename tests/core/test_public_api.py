"""Every public module keeps a complete, sorted ``__all__``."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import perseus


def _modules():
    for info in pkgutil.walk_packages(perseus.__path__, "perseus."):
        name = info.name
        if any(part.startswith("_") for part in name.split(".")[1:]) or name.startswith(
            "perseus.cli"
        ):
            continue
        yield importlib.import_module(name)


def _isort_key(name: str) -> tuple[int, str]:
    """ruff's RUF022 order: SCREAMING_CASE, then CamelCase, then the rest."""
    if name.isupper() and len(name) > 1:
        return (0, name)
    return (1, name) if name[0].isupper() else (2, name)


def test_all_is_sorted_and_complete():
    for module in [perseus, *_modules()]:
        exported = getattr(module, "__all__", None)
        assert exported is not None, f"{module.__name__} has no __all__"
        assert list(exported) == sorted(exported, key=_isort_key), (
            f"{module.__name__}.__all__ is not sorted"
        )
        for name in exported:
            assert hasattr(module, name), f"{module.__name__}.__all__ names missing {name}"


def test_the_top_level_is_a_short_public_face():
    import perseus.dag

    names = set(perseus.__all__)
    assert len(perseus.__all__) <= 32, f"{len(perseus.__all__)} top-level names"
    # where a running job's plan comes from is part of the face ...
    assert {"PlanFile", "OfflineProfile", "OnlineProfile"} <= names
    # ... the operation graph and its evaluator are not: they live under perseus.dag
    assert not names & set(perseus.dag.__all__)
    # every lazily loaded name is public, and every public name resolves
    assert set(perseus._LAZY) <= names
    assert all(getattr(perseus, name) is not None for name in names)


@pytest.mark.parametrize("package", ["perseus", "perseus.runtime", "perseus.recurring"])
def test_lazy_names_are_typed(package: str) -> None:
    """Each name a package loads on first access is also imported under ``TYPE_CHECKING``, so
    a type checker sees its real type (a module ``__getattr__`` alone gives ``Any``)."""
    module = importlib.import_module(package)
    assert module.__file__ is not None
    tree = ast.parse(Path(module.__file__).read_text())
    typed = {
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
        for stmt in ast.walk(node)
        if isinstance(stmt, ast.ImportFrom)
        for alias in stmt.names
    }
    assert set(module._LAZY) <= typed, sorted(set(module._LAZY) - typed)
