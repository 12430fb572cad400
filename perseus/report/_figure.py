"""The one place matplotlib is set up: figures on an explicit Agg canvas (no pyplot, so no
global registry and no change to the backend of a process that imports perseus), PNG bytes."""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Iterator
from typing import Any

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

__all__ = ["FIGSIZE_IN", "PNG_DPI", "new_figure", "to_png"]

#: Report size: 10 x 6 inches at 120 dpi (1200 x 720 pixels), legible in the HTML page.
FIGSIZE_IN = (10.0, 6.0)
PNG_DPI = 120

_STYLE: dict[str, Any] = {
    "font.size": 11,
    "axes.titlesize": 13,
    "axes.labelsize": 12,
    "xtick.labelsize": 11,
    "ytick.labelsize": 11,
    "legend.fontsize": 10,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
}


@contextlib.contextmanager
def new_figure(figsize: tuple[float, float] = FIGSIZE_IN) -> Iterator[Figure]:
    """A blank figure on an Agg canvas, the report's fonts and grid applied to everything
    drawn inside the block."""
    # rc_context's stub wants literal keys; these are checked by matplotlib at run time.
    with matplotlib.rc_context(_STYLE):  # type: ignore[arg-type]
        fig = Figure(figsize=figsize, layout="constrained")
        FigureCanvasAgg(fig)
        yield fig


def to_png(fig: Figure) -> bytes:
    """Render ``fig`` to PNG bytes at the report's resolution."""
    buf = io.BytesIO()
    with warnings.catch_warnings():  # a name from a file in a script the font lacks: drawn as boxes
        warnings.filterwarnings("ignore", r"Glyph \d+ .*missing from font", UserWarning)
        fig.savefig(buf, format="png", dpi=PNG_DPI)
    return buf.getvalue()
