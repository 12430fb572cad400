"""The subcommand modules; each contributes one ``register(subparsers)``."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["REGISTRY"]

Registrar = Callable[["argparse._SubParsersAction[Any]"], None]

# Order is the order of `perseus --help`.
_MODULES = (
    "demo",
    "frontier",
    "plan",
    "evaluate",
    "report",
    "export",
    "straggler_sweep",
    "straggler",
    "device",
)


def _load() -> list[Registrar]:
    registrars = []
    for name in _MODULES:
        try:
            module = importlib.import_module(f"perseus.cli.{name}")
        except ModuleNotFoundError as e:  # TEMPORARY while subcommands are being written
            if e.name != f"perseus.cli.{name}":
                raise
            continue
        registrars.append(module.register)
    return registrars


REGISTRY: list[Registrar] = _load()
