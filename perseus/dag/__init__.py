"""Schedule + profile -> operation DAG; the exact evaluator (pure)."""

from perseus.dag.evaluate import (
    Evaluation,
    allmax_freqs,
    evaluate_durations,
    evaluate_freqs,
    evaluate_many,
    longest_path,
    op_costs,
)
from perseus.dag.graph import KIND_CODES, OpGraph, build_dag

__all__ = [
    "KIND_CODES",
    "Evaluation",
    "OpGraph",
    "allmax_freqs",
    "build_dag",
    "evaluate_durations",
    "evaluate_freqs",
    "evaluate_many",
    "longest_path",
    "op_costs",
]
