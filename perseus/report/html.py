"""``report.html``: one self-contained page (images inlined as base64, no scripts, no external
stylesheets or fonts), so that it can be mailed or attached to a ticket."""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping, Sequence

from perseus.report.frontier import BASELINE_LABELS
from perseus.report.summary import MeasuredRun, Summary
from perseus.runtime.straggler.sweep import StragglerCase

__all__ = ["render_html"]

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; max-width: 1200px;
       margin: 2em auto; padding: 0 1em; color: #222; line-height: 1.45; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; }
h2 { font-size: 1.25em; margin-top: 1.8em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.6em 0; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.7em; text-align: right; }
th { background: #f3f3f3; } td.l, th.l { text-align: left; }
.headline { font-size: 1.15em; background: #eef5ff; padding: 0.8em 1em; border-radius: 6px; }
img { max-width: 100%; border: 1px solid #eee; }
.note { color: #666; font-size: 0.92em; }
"""


def _pct(x: float) -> str:
    return f"{100 * x:+.1f} %"


def _kj(energy_j: float) -> str:
    return f"{energy_j / 1e3:.3f}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]], left: int = 1) -> str:
    def cell(tag: str, i: int, v: object) -> str:
        cls = ' class="l"' if i < left else ""
        return f"<{tag}{cls}>{html.escape(str(v))}</{tag}>"

    head = "".join(cell("th", i, h) for i, h in enumerate(headers))
    body = "".join(
        "<tr>" + "".join(cell("td", i, v) for i, v in enumerate(r)) + "</tr>" for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def render_html(
    summary: Summary,
    images: Mapping[str, bytes],
    *,
    title: str,
    details: Mapping[str, object],
    sweep: Sequence[StragglerCase] = (),
    measured: MeasuredRun | None = None,
    notes: Sequence[str] = (),
) -> str:
    """The report page: ``images`` are PNG bytes by name (any of ``_FIGURES`` may be absent),
    ``details`` the job table's rows."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        _headline(summary),
        "<h2>Job</h2>",
        _table(["", "value"], [(k, v) for k, v in details.items()], left=2),
        "<h2>Plans</h2>",
        _plans_table(summary),
    ]
    for key, (heading, caption) in _FIGURES.items():
        if key in images:
            data = base64.b64encode(images[key]).decode("ascii")
            img = f'<img src="data:image/png;base64,{data}" alt="{html.escape(heading)}">'
            parts += [f"<h2>{heading}</h2>", img, f'<p class="note">{caption}</p>']
    if sweep:
        headers = [
            "slowdown s",
            "T′ (s)",
            "plan time (s)",
            "saving vs all-max",
            "saving vs fastest",
        ]
        parts.append(_table(headers, [c.cells() for c in sweep]))
    if measured is not None:
        parts += ["<h2>Predicted vs measured</h2>", _measured_table(measured)]
    if notes:
        parts.append("".join(f'<p class="note">{html.escape(n)}</p>' for n in notes))
    parts.append("</body></html>\n")
    return "\n".join(parts)


#: The figures in page order: image name -> (heading, caption).
_FIGURES = {
    "frontier": (
        "Time–energy frontier",
        "Every point is a full frequency plan evaluated exactly on the job's DAG. T_min is the "
        "fastest plan's time, T* the minimum-energy plan's.",
    ),
    "timeline": (
        "One iteration, op by op",
        "Colour is the op's average power; hatched pale bars are blocking time "
        "(waiting on a neighbour at blocking power).",
    ),
    "power": (
        "Power",
        "Left: each plan's average (and peak) summed power against its iteration time, the "
        "fastest plan under any power budget. Right: the summed power of all GPUs over one "
        "iteration (the step function whose integral is the exact energy).",
    ),
    "straggler": (
        "One straggling pipeline",
        "Non-straggler pipelines run the cheapest plan that finishes within the straggler's "
        "time T′ (capped at T*) instead of running all-max and waiting.",
    ),
}


def _headline(summary: Summary) -> str:
    f, m, straggler = summary.fastest, summary.min_energy, summary.straggler
    text = (
        f"Energy saved at no slowdown: <b>{100 * f.energy_saving:.1f} %</b>. "
        f"At T* = {m.time_s:.3f} s: <b>{100 * m.energy_saving:.1f} %</b> "
        f"({100 * m.slowdown:.1f} % slower)."
    )
    if straggler:
        text += (
            f" With a {straggler.factor:g}× straggler among "
            f"{straggler.pipelines} pipelines: <b>{100 * straggler.saving_vs_allmax:.1f} %</b>."
        )
    return f'<p class="headline">{text}</p>'


def _plans_table(summary: Summary) -> str:
    plans = [
        ("All-max", summary.allmax),
        ("Perseus, fastest (T_min)", summary.fastest),
        ("Perseus, minimum energy (T*)", summary.min_energy),
        *[(BASELINE_LABELS.get(n, n), b) for n, b in summary.baselines.items() if n != "all-max"],
    ]
    # "+ 0.0": all-max's -0.0 shows as +0.0 %
    rows = [
        (name, f"{p.time_s:.4f}", _kj(p.energy_j), _pct(p.slowdown), _pct(-p.energy_saving + 0.0))
        for name, p in plans
    ]
    return _table(["plan", "time (s)", "energy (kJ)", "time vs all-max", "energy vs all-max"], rows)


def _measured_table(measured: MeasuredRun) -> str:
    headers = ["run", "predicted time (s)", "measured time (s)", "error"]
    headers += ["predicted energy (kJ)", "measured energy (kJ)", "error"]
    rows = [
        (
            name,
            f"{pred.time_s:.4f}",
            f"{meas.time_s:.4f}",
            _pct(meas.time_s / pred.time_s - 1),
            _kj(pred.energy_j),
            _kj(meas.energy_j),
            _pct(meas.energy_j / pred.energy_j - 1),
        )
        for name, pred, meas in measured.pairs
    ]
    return _table(headers, rows)
