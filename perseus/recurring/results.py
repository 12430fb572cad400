"""Summaries of trace simulations: the ``--json`` document and the README table (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from perseus.recurring.simulator import POLICIES, WorkloadSummary

__all__ = ["format_table", "summary_json", "workload_json"]

_METRICS = ("energy_j", "time_s", "cost")


def workload_json(summary: WorkloadSummary) -> dict[str, Any]:
    """``{"recurrences": N, "<policy>": {"energy_j", "time_s", "cost", ...}, ...}``.

    Each policy holds the mean over seeds of the cumulative totals, their standard deviation
    (``*_std``), and its configuration; the optimizer also holds the mean regret against the
    oracle after each recurrence (``regret``, fractions).
    """
    out: dict[str, Any] = {"recurrences": summary.recurrences, "seeds": len(summary.runs["oracle"])}
    for policy in POLICIES:
        block: dict[str, Any] = {}
        for m in _METRICS:
            values = summary.final(policy, m)
            block[m] = float(values.mean())
            block[f"{m}_std"] = float(values.std())
        out[policy] = block
    out["default"]["config"] = list(summary.default_config)
    out["oracle"]["config"] = list(summary.oracle_config)
    out["optimizer"]["regret"] = [round(float(r), 6) for r in summary.regret()]
    return out


def summary_json(gpu: str, summaries: Sequence[WorkloadSummary]) -> dict[str, Any]:
    """The CLI's ``--json`` document."""
    return {"gpu": gpu, "workloads": {s.workload: workload_json(s) for s in summaries}}


def _pct(a: np.ndarray, b: np.ndarray) -> str:
    """Mean ± std over seeds of ``a/b − 1`` in percent."""
    r = 100.0 * (a / b - 1.0)
    return f"{r.mean():+.1f} ± {r.std():.1f}"


def format_table(gpu: str, summaries: Sequence[WorkloadSummary]) -> str:
    """A Markdown table: per workload, the optimizer's cumulative energy and cost against the
    default and the oracle (mean ± std over seeds, in percent, same seeds paired)."""
    head = (
        f"| {gpu} workload | N | energy vs default | cost vs default | energy vs oracle | "
        "cost vs oracle | oracle (b, W) | default (b, W) |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    rows = [head]
    for s in summaries:
        e_opt, c_opt = s.final("optimizer", "energy_j"), s.final("optimizer", "cost")
        rows.append(
            f"| {s.workload} | {s.recurrences} | "
            f"{_pct(e_opt, s.final('default', 'energy_j'))} % | "
            f"{_pct(c_opt, s.final('default', 'cost'))} % | "
            f"{_pct(e_opt, s.final('oracle', 'energy_j'))} % | "
            f"{_pct(c_opt, s.final('oracle', 'cost'))} % | "
            f"{s.oracle_config[0]}, {s.oracle_config[1]} | "
            f"{s.default_config[0]}, {s.default_config[1]} |"
        )
    return "\n".join(rows)
