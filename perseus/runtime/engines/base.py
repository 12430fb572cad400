"""The protocol every engine adapter implements, and the version check they share.

A new engine is one module here whose engine-private names stay behind
:func:`check_engine_version`.
"""

from __future__ import annotations

import contextlib
import importlib
import types
import warnings
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from perseus.errors import ConfigError
from perseus.schedule.actions import Action, Schedule

__all__ = [
    "EngineAdapter",
    "ManualEngine",
    "OpContextFactory",
    "adapter_for",
    "attach_hooks",
    "check_engine_version",
    "refuse_eval",
]

#: ``factory(action)`` returns the context manager that surrounds one compute action.
OpContextFactory = Callable[[Action], AbstractContextManager[Any]]


@runtime_checkable
class EngineAdapter(Protocol):
    """What :class:`~perseus.runtime.session.RankSession` needs from a training engine."""

    @property
    def schedule(self) -> Schedule:
        """Every rank's compute actions, in the order the engine runs them."""

    @property
    def rank(self) -> int:
        """This process's pipeline rank (an index into ``schedule.rank_actions``)."""

    @property
    def group(self) -> Any:
        """The pipeline's process group (None: the default group, or no distribution)."""

    @property
    def step_call(self) -> str:
        """The call that runs one training iteration, as the user writes it."""

    def attach(self, op: OpContextFactory, in_iteration: Callable[[], bool]) -> Callable[[], None]:
        """Run every training compute action of the engine inside ``op(action)``; return the
        undo. ``in_iteration()`` says whether a training iteration is open (an adapter may
        refuse an evaluation pass inside one with a message about its own API)."""


@dataclass(frozen=True, slots=True)
class ManualEngine:
    """No engine: the training loop itself runs each action inside ``session.op(action)``."""

    schedule: Schedule
    rank: int
    group: Any = None
    step_call: str = "pass over schedule.rank_actions[rank]"

    def attach(self, op: OpContextFactory, in_iteration: Callable[[], bool]) -> Callable[[], None]:
        """Nothing to hook: the caller enters ``session.op`` itself."""
        return lambda: None


def adapter_for(engine: EngineAdapter | Schedule, rank: int | None, group: Any) -> EngineAdapter:
    """``engine``, or a :class:`ManualEngine` for a bare schedule and ``rank``; the rank checked.

    Raises:
        ConfigError: a bare schedule without ``rank``, an adapter with another one, or a rank
            out of the schedule's range.
    """
    if isinstance(engine, Schedule):
        if rank is None:
            raise ConfigError("RankSession(schedule, rank, ...): pass this process's rank")
        engine = ManualEngine(engine, rank, group)
    elif rank is not None and rank != engine.rank:
        raise ConfigError(
            f"rank={rank} differs from the engine adapter's rank {engine.rank}; drop rank="
        )
    if not 0 <= engine.rank < engine.schedule.num_ranks:
        raise ConfigError(
            f"rank {engine.rank} is out of range: the schedule has "
            f"{engine.schedule.num_ranks} ranks"
        )
    return engine


def attach_hooks(hooks: AbstractContextManager[Any]) -> Callable[[], None]:
    """Enter ``hooks`` (an adapter's instrumenting context manager); the result exits it."""
    stack = contextlib.ExitStack()
    stack.enter_context(hooks)
    return stack.close


def refuse_eval(in_iteration: Callable[[], bool], call: str) -> None:
    """Refuse an evaluation pass (``call``, in the engine's words) while ``in_iteration()``:
    its device time would count as the training iteration's."""
    if in_iteration():
        raise ConfigError(
            f"{call} ran inside `with session.iteration():`: an evaluation (forward-only) pass "
            "inside a training iteration; evaluate between iterations, where it runs untouched "
            "at the current clock"
        )


def check_engine_version(
    package: str,
    minimum: tuple[int, int],
    install: str,
    modules: Sequence[str],
    required: Iterable[tuple[int, str]],
    tested: str,
) -> list[types.ModuleType]:
    """Import an engine's modules and check every attribute an adapter uses, in one place.

    Args:
        package: The engine's top package (its ``__version__`` is checked).
        minimum: Oldest ``(major, minor)`` the adapter was written against.
        install: The install command named in the error.
        modules: Modules to import, returned in this order.
        required: ``(index into modules, dotted attribute path)`` of every name the adapter
            touches (``"PipelineEngine._exec_schedule"``).
        tested: The versions the adapter was tested with (named in the error).

    Raises:
        ConfigError: the engine is missing, too old, or lacks one of the attributes.
    """
    try:
        with warnings.catch_warnings():  # engines warn at import about optional extras
            warnings.simplefilter("ignore")
            top = importlib.import_module(package)
            loaded = [importlib.import_module(m) for m in modules]
    except ImportError as e:
        raise ConfigError(
            f"{package} is required for this perseus engine adapter; install it with `{install}`"
        ) from e
    version = str(getattr(top, "__version__", "0.0"))
    try:  # "2.13.0+cpu" -> (2, 13)
        major, minor = (int(p) for p in version.split("+")[0].split(".")[:2])
    except ValueError:
        major, minor = 0, 0
    if (major, minor) < minimum:
        raise ConfigError(
            f"{package} {version} is not supported by perseus's adapter; install {package} {tested}"
        )
    missing = []
    for position, path in required:
        obj: Any = loaded[position]
        for part in path.split("."):
            if not hasattr(obj, part):
                missing.append(f"{modules[position]}.{path}")
                break
            obj = getattr(obj, part)
    if missing:
        raise ConfigError(
            f"{package} {version} lacks {', '.join(missing)}, which perseus's adapter needs; "
            f"use {package} {tested} or report the new version"
        )
    return loaded
