"""Summaries of trace replays: the ``--json`` document (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from perseus.recurring.replay import POLICIES, WorkloadSummary

__all__ = ["summary_json", "workload_json"]

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
