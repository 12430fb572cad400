"""The one place matplotlib is set up: figures on an explicit Agg canvas (no pyplot, so no
global registry and no change to the backend of a process that imports perseus), PNG bytes."""

from __future__ import annotations

import contextlib
import io
from typing import Any

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

__all__ = ["FIGSIZE_IN", "PNG_DPI", "new_figure", "report_style", "to_png"]

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


def report_style() -> contextlib.AbstractContextManager[None]:
    """Apply the report's fonts and grid to everything created inside the block."""
    # rc_context's stub wants literal keys; these are checked by matplotlib at run time.
    return matplotlib.rc_context(_STYLE)  # type: ignore[arg-type]


def new_figure(figsize: tuple[float, float] = FIGSIZE_IN) -> Figure:
    """A blank figure on an Agg canvas (call inside :func:`report_style`)."""
    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def to_png(fig: Figure) -> bytes:
    """Render ``fig`` to PNG bytes at the report's resolution."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=PNG_DPI)
    return buf.getvalue()
