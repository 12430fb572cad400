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
    "power",
    "profile",
    "device",
    "recurring",
    "fleet",
    "doctor",
)


def _load() -> list[Registrar]:
    # Subcommand modules import their own heavy dependencies lazily, inside ``run``.
    return [importlib.import_module(f"perseus.cli.{name}").register for name in _MODULES]


REGISTRY: list[Registrar] = _load()
