"""No temporary file survives a SIGTERM: the signal side of :mod:`perseus.io.atomic`."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

__all__ = ["SignalCleanup"]


class SignalCleanup:
    """While temporaries exist, SIGTERM/SIGHUP remove them before the process ends.

    If the signal's action is the default (end the process), the temporaries are removed and
    the signal is delivered again with the default action. If the program installed a handler,
    it runs when the last temporary is gone (renamed into place or removed), so that a handler
    which only asks the program to stop does not find half a write. Only the main thread can
    install handlers; elsewhere exceptions still clean up.
    """

    SIGNALS = tuple(
        s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s
    )

    def __init__(self) -> None:
        self._removers: list[Callable[[], None]] = []
        self._previous: dict[int, Any] = {}
        self._pending: list[int] = []

    @contextlib.contextmanager
    def protect(self, remove: Callable[[], None]) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        if not self._removers:
            self._install()
        self._removers.append(remove)
        try:
            yield
        finally:
            self._removers.remove(remove)
            if not self._removers:
                self._uninstall()

    def _install(self) -> None:
        for sig in self.SIGNALS:
            previous = signal.getsignal(sig)
            if previous == signal.SIG_IGN:
                continue
            self._previous[int(sig)] = previous
            signal.signal(sig, self._on_signal)

    def _uninstall(self) -> None:
        for sig, previous in self._previous.items():
            if signal.getsignal(sig) == self._on_signal:
                signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()
        pending, self._pending = self._pending, []
        for sig in pending:  # the program's own handler, now that nothing is half-written
            signal.raise_signal(sig)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        previous = self._previous.get(signum, signal.SIG_DFL)
        if previous in (signal.SIG_DFL, None):
            for remove in reversed(self._removers):
                with contextlib.suppress(Exception):
                    remove()
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if signum not in self._pending:
            self._pending.append(signum)
