"""Progress bars for long CLI steps: a tqdm bar on a terminal, log lines (``-v``) otherwise;
the bar's label follows the phases the library announces (:func:`perseus.log.phase`)."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from perseus.log import PHASE_LOGGER, get_logger

__all__ = ["COMPILE_PHASE", "progress_bar", "solver_kernels_cached"]

logger = get_logger(__name__)

COMPILE_PHASE = "compiling solver kernels (first run only, ~20-50 s)"


def solver_kernels_cached() -> bool:
    """Whether the solver kernels need no compiling: built at install
    (:mod:`perseus.solver.aot`) or already in numba's on-disk cache."""
    import importlib.util

    from perseus.solver.aot import native_module

    if native_module() is not None:
        return True
    if os.environ.get("NUMBA_CACHE_DIR"):  # numba caches there only, in a path-mangled subfolder
        cache = Path(os.environ["NUMBA_CACHE_DIR"])
    else:
        spec = importlib.util.find_spec("perseus.solver")
        if spec is None or spec.origin is None:
            return False
        cache = Path(spec.origin).parent / "__pycache__"
    with contextlib.suppress(OSError):
        return cache.is_dir() and any(cache.rglob("*.nbi"))
    return False


class _PhaseListener(logging.Handler):
    def __init__(self, set_label: Callable[[str], None]) -> None:
        super().__init__(logging.INFO)
        self._set_label = set_label

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "perseus_phase", None) == "start":
            self._set_label(record.getMessage())


@contextlib.contextmanager
def progress_bar(
    label: str, enabled: bool = True, solve: bool = False
) -> Iterator[Callable[[float], None]]:
    """Yield ``update(fraction)`` for step ``label`` reported as fractions in [0, 1]; no bar
    when not ``enabled`` (log lines still go to the logger). A ``solve`` step is labelled as a
    compile until its first progress report when the kernels are not cached yet."""
    tty = enabled and sys.stderr.isatty()
    compiling = solve and not solver_kernels_cached()
    first = COMPILE_PHASE if compiling else label
    logger.info("%s", first)
    bar = None
    try:
        from tqdm import tqdm

        bar = tqdm(
            total=100,
            desc=first,
            unit="%",
            file=sys.stderr,
            disable=not tty,
            bar_format="{desc}: {percentage:3.0f}%|{bar}| [{elapsed}]",
        )
    except ModuleNotFoundError:  # the progress extra is optional: log lines (-v) only
        if tty:
            logger.warning(
                "no progress bar: pip install 'perseus-energy[progress]' (--no-progress: quiet)"
            )
    label_now = [first]
    logged = [0]

    def set_label(text: str) -> None:
        label_now[0] = text
        if bar is not None:
            bar.set_description_str(text)

    listener = _PhaseListener(set_label)
    phase_logger = logging.getLogger(PHASE_LOGGER)
    phase_logger.addHandler(listener)
    old_level, old_propagate = phase_logger.level, phase_logger.propagate
    if phase_logger.getEffectiveLevel() > logging.INFO:
        phase_logger.setLevel(logging.INFO)
        # Records raised to INFO for the bar must not reach other handlers below their level.
        phase_logger.propagate = False

    def update(fraction: float) -> None:
        target = round(100 * min(max(fraction, 0.0), 1.0))
        if target > 0 and label_now[0] == COMPILE_PHASE:
            logger.info("solver kernels compiled; %s", label)
            set_label(label)
        if bar is not None and target > bar.n:
            bar.update(target - bar.n)
        if target >= logged[0] + 10:
            logged[0] = target - target % 10
            logger.info("%s: %d %%", label, target)

    try:
        yield update
        update(1.0)
    finally:
        if bar is not None:
            bar.close()
        phase_logger.removeHandler(listener)
        phase_logger.setLevel(old_level)
        phase_logger.propagate = old_propagate
