"""How close to the oracle does the recurring-job optimizer get, and how much does it save?

For every workload of the bundled Zeus traces (or ``--trace DIR``) on every GPU with a power
trace (A40, V100), at Zeus's N (2 × batch sizes × power limits) and at N = 50, this runs
``--seeds`` seeds of: perseus's optimizer (batch-size walk + shared-noise Thompson sampling +
JIT power-limit profiler), the default (b0 at the maximum power limit), the oracle (best fixed
configuration in hindsight among always-converging batch sizes), and a re-implementation of
Zeus's own batch-size policy (``_zeus_baseline.py``) in the same trace replay with the same
power-limit profiler, so the two policies are compared on equal terms. It prints Markdown
tables: cumulative energy and cost against the default and against the oracle, mean ± std
over seeds (each seed's ratio, then mean and std of the ratios).

Usage::

    python benchmarks/recurring.py                      # both GPUs, 10 seeds (~1 min)
    python benchmarks/recurring.py --seeds 20 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _zeus_baseline import ZeusPolicy

from perseus.recurring.replay import (
    default_recurrences,
    replay_optimizer,
    replay_workload,
)
from perseus.recurring.trace import load_workloads
from perseus.recurring.workload import Workload

BUNDLED = Path(__file__).resolve().parent.parent / "perseus" / "data" / "traces" / "zeus-nsdi23"


def _pct(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    r = 100.0 * (a / b - 1.0)
    return float(r.mean()), float(r.std())


def _fmt(x: tuple[float, float]) -> str:
    return f"{x[0]:+.1f} ± {x[1]:.1f}"


def bench_workload(w: Workload, n: int, seeds: range, eta: float, beta: float) -> dict[str, Any]:
    s = replay_workload(w, recurrences=n, seeds=seeds, eta=eta, beta=beta)
    zeus_cost, zeus_energy = [], []
    for seed in seeds:
        policy = ZeusPolicy(w.batch_sizes, w.default_batch_size, beta=beta)
        run = replay_optimizer(
            w, n, eta=eta, beta=beta, rng=np.random.default_rng([seed, 0]), policy=policy
        )
        zeus_cost.append(run.cum_cost[-1])
        zeus_energy.append(run.cum_energy_j[-1])
    opt_c, opt_e = s.final("optimizer", "cost"), s.final("optimizer", "energy_j")
    def_c, def_e = s.final("default", "cost"), s.final("default", "energy_j")
    ora_c, ora_e = s.final("oracle", "cost"), s.final("oracle", "energy_j")
    zc, ze = np.asarray(zeus_cost), np.asarray(zeus_energy)
    return {
        "workload": w.key,
        "recurrences": n,
        "oracle_config": list(s.oracle_config),
        "default_config": list(s.default_config),
        "perseus_energy_vs_default": _pct(opt_e, def_e),
        "perseus_cost_vs_default": _pct(opt_c, def_c),
        "perseus_energy_vs_oracle": _pct(opt_e, ora_e),
        "perseus_cost_vs_oracle": _pct(opt_c, ora_c),
        "zeus_energy_vs_default": _pct(ze, def_e),
        "zeus_cost_vs_oracle": _pct(zc, ora_c),
        "oracle_cost_vs_default": _pct(ora_c, def_c),
        "energy_j": {
            "perseus": float(opt_e.mean()),
            "zeus": float(ze.mean()),
            "default": float(def_e.mean()),
            "oracle": float(ora_e.mean()),
        },
        "cost": {
            "perseus": float(opt_c.mean()),
            "zeus": float(zc.mean()),
            "default": float(def_c.mean()),
            "oracle": float(ora_c.mean()),
        },
    }


def format_rows(gpu: str, rows: list[dict[str, Any]]) -> str:
    lines = [
        f"| {gpu} | N | perseus energy vs default | perseus cost vs default | "
        "perseus energy vs oracle | perseus cost vs oracle | Zeus policy cost vs oracle | "
        "oracle (b, W) |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['workload']} | {r['recurrences']} | {_fmt(r['perseus_energy_vs_default'])} % | "
            f"{_fmt(r['perseus_cost_vs_default'])} % | {_fmt(r['perseus_energy_vs_oracle'])} % | "
            f"**{_fmt(r['perseus_cost_vs_oracle'])} %** | {_fmt(r['zeus_cost_vs_oracle'])} % | "
            f"{r['oracle_config'][0]}, {r['oracle_config'][1]} |"
        )
    return "\n".join(lines)


def format_combined(out: dict[str, Any]) -> str:
    """One README table: every workload and GPU, at Zeus's N and at N = 50."""
    lines = [
        "| workload | GPU | N (Zeus) | energy vs default | cost vs default | cost vs oracle | "
        "Zeus policy vs oracle | cost vs oracle, N = 50 | Zeus policy, N = 50 |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for gpu, rows in out["gpus"].items():
        by_workload: dict[str, dict[str, dict[str, Any]]] = {}
        for r in rows:
            kind = "n50" if r["recurrences"] == 50 else "zeus"
            by_workload.setdefault(r["workload"], {})[kind] = r
        for key, v in by_workload.items():
            z, f = v.get("zeus", v["n50"]), v["n50"]
            lines.append(
                f"| {key} | {gpu.upper()} | {z['recurrences']} | "
                f"{_fmt(z['perseus_energy_vs_default'])} % | {_fmt(z['perseus_cost_vs_default'])} % | "
                f"{_fmt(z['perseus_cost_vs_oracle'])} % | {_fmt(z['zeus_cost_vs_oracle'])} % | "
                f"{_fmt(f['perseus_cost_vs_oracle'])} % | {_fmt(f['zeus_cost_vs_oracle'])} % |"
            )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", type=Path, default=BUNDLED)
    p.add_argument("--gpus", default=None, help="comma list (default: every power trace)")
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--eta", type=float, default=0.5)
    p.add_argument("--beta", type=float, default=2.0)
    p.add_argument("--json", type=Path, help="write every figure here")
    args = p.parse_args()
    gpus = (
        args.gpus.split(",")
        if args.gpus
        else sorted(
            f.stem.removeprefix("summary_power_") for f in args.trace.glob("summary_power_*.csv")
        )
    )
    seeds = range(args.seeds)
    out: dict[str, Any] = {"seeds": args.seeds, "eta": args.eta, "beta": args.beta, "gpus": {}}
    print(f"eta {args.eta}, beta {args.beta}, {args.seeds} seeds; mean ± std over seeds\n")
    for gpu in gpus:
        rows = []
        for w in load_workloads(args.trace, gpu):
            for n in sorted({default_recurrences(w), 50}, reverse=True):
                rows.append(bench_workload(w, n, seeds, args.eta, args.beta))
        out["gpus"][gpu] = rows
        print(format_rows(gpu, rows))
        for n_kind in ("zeus_n", "n50"):
            sel = [r for r in rows if (r["recurrences"] == 50) == (n_kind == "n50")]
            if not sel:
                continue
            p_ = [r["perseus_cost_vs_oracle"][0] for r in sel]
            z_ = [r["zeus_cost_vs_oracle"][0] for r in sel]
            label = "N = 50" if n_kind == "n50" else "Zeus's N"
            print(
                f"\n{gpu}, {label}: cost above oracle, perseus {min(p_):.1f}-{max(p_):.1f} % "
                f"(mean {np.mean(p_):.1f}), Zeus policy {min(z_):.1f}-{max(z_):.1f} % "
                f"(mean {np.mean(z_):.1f})"
            )
        print()
    print("All workloads (README table):\n")
    print(format_combined(out))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
