"""``fleet.png``: a fleet's budget over time with the jobs' planned power stacked under it
(top) and each job's progress in iterations (bottom: a slowed or killed job flattens)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from perseus.report._figure import new_figure, to_png

__all__ = ["plot_fleet"]

#: One plan: from ``t_s`` on, the budget and each running job's (average power, iteration time).
FleetEvent = tuple[float, float | None, Mapping[str, tuple[float, float]]]


def plot_fleet(events: Sequence[FleetEvent], end_s: float, *, title: str = "fleet") -> bytes:
    """Render the budget, power and progress panels as PNG bytes; ``events`` are the plans in
    time order, each in force until the next (or ``end_s``)."""
    names = sorted({n for _, _, jobs in events for n in jobs})
    starts = [e[0] for e in events] + [end_s]
    with new_figure((8.0, 6.0)) as fig:
        top, bottom = fig.subplots(2, 1, sharex=True)
        edges = np.repeat(starts, 2)[1:-1]  # each plan's start and end
        budget = np.repeat([e[1] if e[1] is not None else np.nan for e in events], 2)
        power = np.array([[e[2].get(n, (0.0, 0.0))[0] for e in events] for n in names])
        top.stackplot(edges, np.repeat(power, 2, axis=1), labels=names, alpha=0.8)
        top.plot(edges, budget, color="black", linewidth=1.5, label="budget")
        top.set_ylabel("average power (W)")
        top.legend(loc="lower left", fontsize="small")
        top.set_title(title)
        for n in names:
            rate = np.array(
                [1.0 / e[2][n][1] if n in e[2] and e[2][n][1] > 0 else 0.0 for e in events]
            )
            done = np.concatenate([[0.0], np.cumsum(rate * np.diff(starts))])
            bottom.plot(starts, done, label=n)
        bottom.set_xlabel("time (s)")
        bottom.set_ylabel("iterations done")
        return to_png(fig)
