"""What does this GPU look like to perseus? The doctor's measurements as a table.

Runs ``perseus doctor --json`` in a subprocess (observe-only unless ``--allow-clock-changes``)
and prints the measured figures as Markdown, ready for ``benchmarks/README.md``: driver, energy
counter resolution and update period, set latency (only with clock changes), and per clock the
forward/backward time of a bf16 transformer block with the SM clock read back during the ops.

    python benchmarks/gpu_doctor.py                        # observe-only: no set/reset call
    python benchmarks/gpu_doctor.py --allow-clock-changes  # also set latency, three clocks
    python benchmarks/gpu_doctor.py --json doctor.json     # keep the raw report

Prints only what was measured; a probe that could not run is printed as such.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def _fmt(value: Any, unit: str = "", digits: int = 2) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}{unit}"
    return f"{value}{unit}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--allow-clock-changes", action="store_true")
    p.add_argument("--json", type=Path, help="also write the doctor's JSON report here")
    p.add_argument("--energy-window-s", type=float, default=5.0)
    p.add_argument("--iterations", type=int, default=20)
    args = p.parse_args(argv)
    cmd = [
        sys.executable,
        "-m",
        "perseus.cli",
        "doctor",
        "--json",
        "--energy-window-s",
        str(args.energy_window_s),
        "--iterations",
        str(args.iterations),
    ]
    if not args.allow_clock_changes:
        cmd.append("--no-clock-changes")
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode not in (0, 1) or not proc.stdout.strip():
        print(f"perseus doctor failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
        return 1
    report = json.loads(proc.stdout)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1))
    print(f"command: {' '.join(cmd[2:])}")
    return print_report(report)


def print_report(report: dict[str, Any]) -> int:
    """Print the doctor's report as Markdown; 1 when there was no GPU to report on."""
    if report.get("no_gpu"):
        print(report["no_gpu"])
        return 1
    versions = report.get("nvml") or {}
    print(f"driver {versions.get('driver')}, CUDA driver {versions.get('cuda_driver')}")
    for gpu in report["gpus"]:
        checks = {c["name"]: c for c in gpu["checks"]}
        ident = checks.get("gpu", {}).get("data", {})
        print(f"\n### GPU {gpu['index']}: {ident.get('name', '?')} ({ident.get('architecture')})\n")
        print("| figure | value |\n|---|---|")
        for name in ("supported clocks", "clock locking", "power"):
            if name in checks:
                print(f"| {name} | {checks[name]['summary']} |")
        energy = checks.get("energy counter", {})
        e = energy.get("data", {})
        print(
            f"| energy counter | step {_fmt(e.get('smallest_step_mj'), ' mJ')}, update every "
            f"{_fmt(e.get('median_interval_ms'), ' ms')} (median, {e.get('updates')} updates in "
            f"{e.get('window_s')} s) |"
        )
        lat = checks.get("set latency", {})
        print(f"| set latency | {lat.get('summary', 'n/a')} |")
        cuda = checks.get("cuda check", {})
        rows = cuda.get("data", {}).get("rows")
        if not rows:
            print(f"| cuda check | {cuda.get('summary', 'n/a')} |")
            continue
        print(f"\n{cuda['data'].get('model')}; torch {cuda['data'].get('torch')}\n")
        print("| requested | F ms | F SM clock (median, min-max) | B ms | B SM clock | reasons |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            want = "current" if r["requested_mhz"] is None else f"{r['requested_mhz']} MHz"
            cells = []
            for op in ("F", "B"):
                o = r[op]
                cells.append(_fmt(o["time_ms_median"]))
                cells.append(
                    f"{_fmt(o['sm_clock_mhz_median'])} ({o['sm_clock_mhz_min']}-"
                    f"{o['sm_clock_mhz_max']}, {o['samples']} samples)"
                )
            reasons = sorted(
                set(r["F"]["clock_event_reasons"]) | set(r["B"]["clock_event_reasons"])
            )
            print(f"| {want} | {' | '.join(cells)} | {', '.join(reasons) or 'none'} |")
    print(f"\nverdict: {report['verdict']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
