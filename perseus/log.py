"""perseus's logging: one ``perseus`` logger tree, quiet by default, rank-prefixed when asked.

The library only logs (``get_logger(__name__)``); :func:`configure_logging` installs the one
handler (the CLI's ``-v``, or a distributed program once per process with
``rank=rank_from_env()``). Long steps announce themselves with :func:`phase` on
:data:`PHASE_LOGGER`, where a progress bar may listen.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator
from typing import TextIO

__all__ = [
    "LOG_LEVELS",
    "PHASE_LOGGER",
    "configure_logging",
    "get_logger",
    "phase",
    "rank_from_env",
]

ROOT = "perseus"
#: The logger :func:`phase` reports on.
PHASE_LOGGER = "perseus.phase"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

# Silent unless configured (Python's last-resort handler would print warnings).
logging.getLogger(ROOT).addHandler(logging.NullHandler())


def get_logger(name: str) -> logging.Logger:
    """The logger for a module (``get_logger(__name__)``); names outside perseus go under it."""
    if name != ROOT and not name.startswith(ROOT + "."):
        name = f"{ROOT}.{name}"
    return logging.getLogger(name)


def rank_from_env() -> int | None:
    """The process's global rank from torchrun's ``RANK`` variable (None when not set/invalid)."""
    value = os.environ.get("RANK", "")
    return int(value) if value.isascii() and value.isdigit() and len(value) <= 9 else None


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler :func:`configure_logging` installed (a second call replaces it). Without a
    stream it writes to ``sys.stderr`` as it is at each record, so a replaced stderr (test
    capture, a redirecting launcher) does not break logging."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._follow_stderr = stream is None
        super().__init__(stream if stream is not None else sys.stderr)

    @property
    def stream(self) -> TextIO:
        return sys.stderr if self._follow_stderr else self._stream

    @stream.setter
    def stream(self, value: TextIO) -> None:
        self._stream = value


def configure_logging(
    level: str | int = "WARNING", rank: int | None = None, stream: TextIO | None = None
) -> None:
    """Send ``perseus.*`` records at ``level`` and above to ``stream`` (stderr), one per line.

    Args:
        level: A name from :data:`LOG_LEVELS` or a ``logging`` level number.
        rank: Prefix every line with ``[rank N]`` (distributed runs).
        stream: Where to write (default: ``sys.stderr`` as it is at each record).

    Raises:
        ValueError: for an unknown level name.
    """
    if isinstance(level, str):
        if level.upper() not in LOG_LEVELS:
            raise ValueError(f"unknown log level {level!r}; use one of {', '.join(LOG_LEVELS)}")
        level = level.upper()
    logger = logging.getLogger(ROOT)
    for h in list(logger.handlers):
        if isinstance(h, _Handler):
            logger.removeHandler(h)
    handler = _Handler(stream)
    prefix = f"[rank {rank}] " if rank is not None else ""
    handler.setFormatter(
        logging.Formatter(f"%(asctime)s {prefix}%(levelname)s %(name)s: %(message)s", "%H:%M:%S")
    )
    logger.addHandler(handler)
    logger.setLevel(level)


@contextlib.contextmanager
def phase(description: str) -> Iterator[None]:
    """Announce a long step on ``perseus.phase`` (INFO), and its duration when it ends."""
    logger = logging.getLogger(PHASE_LOGGER)
    logger.info("%s", description, extra={"perseus_phase": "start"})
    started = time.perf_counter()
    try:
        yield
    finally:
        logger.info(
            "%s: done in %.1f s",
            description,
            time.perf_counter() - started,
            extra={"perseus_phase": "end"},
        )
