"""How much memory does the largest input perseus accepts take to read?

Every input file is read with a cap (:data:`perseus.io.reading.INPUT_LIMITS`). For each kind,
this writes files just under the cap, shaped as a real file and as an adversary would shape
them to maximise the objects per byte (tiny points, one-character values, short rows), reads
each in a fresh process with perseus's own reader, and prints the process's peak resident
memory (``ru_maxrss``), the memory an import alone takes, and the ratio of the difference to
the file's size. The plan is also read the way perseus read plans before (stdlib syntax check
and pydantic's JSON parser), for comparison.

Usage::

    python benchmarks/input_limits.py                   # every kind (~1 min, ~0.5 GB of /tmp)
    python benchmarks/input_limits.py --kinds frontier --keep /tmp/inputs
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from perseus.io.reading import INPUT_LIMITS, MB

REPO = Path(__file__).resolve().parent.parent

# ------------------------------------------------------------------------------ generators


def _write_frontier(path: Path, stages: int, microbatches: int, points: Iterator[dict]) -> None:
    """A 1F1B frontier file as perseus writes it (schema 3, one point per line, the ops of the
    job's schedule) with a valid digest."""
    from perseus.schedule.builders import build_schedule

    ops = [list(r) for r in build_schedule("1f1b", stages, microbatches).stage_ops()]
    digest = hashlib.sha256(b"[")
    job = {
        "schedule": "1f1b",
        "ranks": stages,
        "stages": stages,
        "microbatches": microbatches,
        "virtual_stages": 1,
        "blocking_power_w": 80.0,
        "profile_sha256": "0" * 64,
    }
    head = {"schema_version": 3, "job": job, "stage_ops": ops}
    head |= {"baseline": {"time_s": 1.0, "energy_j": 1.0}}
    body = []
    for i, point in enumerate(points):
        if i:
            digest.update(b",")
        digest.update(json.dumps(point, sort_keys=True, separators=(",", ":")).encode())
        body.append(json.dumps(point, separators=(",", ":")))
    digest.update(b"]")
    head["points_sha256"] = digest.hexdigest()
    text = json.dumps(head, separators=(",", ":"))[:-1] + ',"points":[\n' + ",\n".join(body)
    path.write_text(text + "\n]}\n")


def frontier_real(path: Path, cap: int) -> None:
    """32 stages x 512 microbatches of 1F1B (a large real job): as many points as fit."""
    stages, microbatches = 32, 512
    clocks = list(range(1005, 1411, 15))
    ops_per_rank = 2 * microbatches
    per_point = stages * ops_per_rank * 5 + 64  # "1230," per op
    count = (cap - 400_000) // per_point

    def points() -> Iterator[dict]:
        for i in range(count):
            freqs = [
                [clocks[(i + j + r) % len(clocks)] for j in range(ops_per_rank)]
                for r in range(stages)
            ]
            yield {"time_s": 10.0 + i, "energy_j": 1e6 - i, "freqs_mhz": freqs}

    _write_frontier(path, stages, microbatches, points())


def frontier_tiny_points(path: Path, cap: int) -> None:
    """One rank, two ops, as many one-clock points as fit (objects per byte: points)."""
    count = (cap - 1000) // 58

    def points() -> Iterator[dict]:
        for i in range(count):
            yield {"time_s": 1.0 + i, "energy_j": 1.0, "freqs_mhz": [[1, 1]]}

    _write_frontier(path, 1, 1, points())


def frontier_short_values(path: Path, cap: int) -> None:
    """The largest job perseus plans (1M ops: one stage x 500,000 microbatches) with one-digit
    clocks in as many points as fit (objects per byte: values)."""
    n = 1_000_000
    names_bytes = sum(len(f'"F{i}",') + len(f'"B{i}",') for i in range(n // 2))
    count = (cap - names_bytes - 1000) // (2 * n + 60)

    def points() -> Iterator[dict]:
        for i in range(count):
            yield {"time_s": 1.0 + i, "energy_j": 1.0, "freqs_mhz": [[1] * n]}

    _write_frontier(path, 1, n // 2, points())


def profile_real(path: Path, cap: int) -> None:
    """A CSV like the bundled ones: stages x {forward, backward} x clocks, real-looking rows."""
    with path.open("w") as f:
        f.write("stage,instruction,frequency,time,energy\n")
        size, stage = 40, 0
        while size < cap - 10_000 and stage < 4096:
            for kind in ("forward", "backward"):
                for freq in range(210, 1411, 15):
                    row = f"{stage},{kind},{freq},{0.012345678 * freq / 1000:.9f},{42.123456:.6f}\n"
                    f.write(row)
                    size += len(row)
            stage += 1


def profile_short_rows(path: Path, cap: int) -> None:
    """The shortest distinct valid rows (objects per byte: rows): every stage has forward and
    backward rows at the same clocks."""
    stages = 64
    row_bytes = len("63,backward,99999,1,1\n") + len("63,forward,99999,1,1\n")
    clocks = min((cap - 100) // (stages * row_bytes), 99_999)
    with path.open("w") as f:
        f.write("stage,instruction,frequency,time,energy\n")
        for stage in range(stages):
            for freq in range(1, clocks + 1):
                f.write(f"{stage},forward,{freq},1,1\n{stage},backward,{freq},1,1\n")


def config_long_list(path: Path, cap: int) -> None:
    """A TOML config with a layer_time_fractions of one-digit values up to the cap."""
    n = (cap - 200) // 2
    path.write_text(
        'profile = "a100"\nmicrobatches = 4\nlayer_time_fractions = [['
        + ",".join(["1"] * n)
        + "]]\n"
    )


def summary_junk(path: Path, cap: int) -> None:
    """A run summary whose extra key (ignored by the reader) holds one-character strings."""
    n = (cap - 300) // 4
    doc = {
        "predicted": {"time_s": 1.0, "energy_j": 1.0},
        "measured": {"time_s": 1.0, "energy_j": 1.0},
    }
    text = json.dumps(doc)[:-1] + ',"iterations":[' + ",".join(['"a"'] * n) + "]}"
    path.write_text(text)


def jobs_rows(path: Path, cap: int) -> None:
    """A --jobs CSV of distinct short job rows."""
    with path.open("w") as f:
        f.write("dataset,network,optimizer,target_metric,max_epochs,default_batch_size\n")
        size, i = 72, 0
        while size < cap - 100:
            row = f"d,n{i},o,1,1,1\n"
            f.write(row)
            size += len(row)
            i += 1


def trace_rows(path: Path, cap: int) -> None:
    """A summary_train.csv of rows for one job (a real trace's shape), up to the cap."""
    (path).mkdir()
    src = REPO / "perseus" / "data" / "traces" / "zeus-nsdi23"
    (path / "summary_power_a40.csv").write_bytes((src / "summary_power_a40.csv").read_bytes())
    with (path / "summary_train.csv").open("w") as f:
        f.write(
            "dataset,network,batch_size,optimizer,learning_rate,run,target_metric,target_epoch\n"
        )
        size, i = 90, 0
        while size < cap - 200:
            row = f"cifar100,shufflenetv2,{32 << (i % 6)},adadelta,0.1,{i},0.6,{1 + i % 50}\n"
            f.write(row)
            size += len(row)
            i += 1


# ------------------------------------------------------------------------------ readers

_READERS = {
    "frontier": "from perseus.io.frontier_files import read_frontier as read",
    "frontier-before": (
        "import json\n"
        "from perseus.plan import Frontier\n"
        "def read(p):\n"
        "    text = open(p, 'rb').read().decode()\n"
        "    json.loads(text)\n"
        "    return Frontier.model_validate_json(text, strict=True)"
    ),
    "profile": "from perseus.io.profile_files import read_profile as read",
    "config": "from perseus.io.config import read_job_config as read",
    "summary": "from perseus.cli.report import _read_measured as read",
    "jobs": (
        "from pathlib import Path\n"
        "from perseus.recurring.trace import load_jobs\n"
        "def read(p): return load_jobs(Path(p))"
    ),
    "trace": (
        "from perseus.recurring.trace import load_workloads\n"
        "def read(p): return load_workloads(p, 'a40')"
    ),
}

# VmHWM is this process's own peak (ru_maxrss would include the parent's, from before exec).
_CHILD = """
import sys, time
{reader}
def hwm_kb():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
before = hwm_kb()
t0 = time.perf_counter()
try:
    read(sys.argv[1])
    outcome = "accepted"
except Exception as e:
    outcome = "refused: " + str(e).splitlines()[0].partition(": ")[2][:60]
elapsed = time.perf_counter() - t0
print(before, hwm_kb(), elapsed, outcome, sep="\\t")
"""

Case = tuple[str, str, Callable[[Path, int], None], str]
CASES: list[Case] = [
    ("frontier", "32x512, real clocks", frontier_real, "frontier"),
    ("frontier", "32x512, real clocks (before)", frontier_real, "frontier-before"),
    ("frontier", "tiny points", frontier_tiny_points, "frontier"),
    ("frontier", "1M ops, 1-digit clocks", frontier_short_values, "frontier"),
    ("profile", "real rows", profile_real, "profile"),
    ("profile", "shortest rows", profile_short_rows, "profile"),
    ("config", "1-digit list", config_long_list, "config"),
    ("summary", "1-char junk", summary_junk, "summary"),
    ("jobs", "short rows", jobs_rows, "jobs"),
    ("trace", "real-shaped rows", trace_rows, "trace"),
]


def measure(reader: str, path: Path) -> tuple[float, float, float, str]:
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD.format(reader=_READERS[reader]), str(path)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=True,
    )
    before, peak, elapsed, outcome = proc.stdout.strip().split("\t")
    return int(before) / 1024, int(peak) / 1024, float(elapsed), outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", default=",".join(dict.fromkeys(c[0] for c in CASES)))
    parser.add_argument("--keep", type=Path, help="write the inputs here (default: a temp dir)")
    args = parser.parse_args()
    kinds = set(args.kinds.split(","))
    folder = args.keep or Path(tempfile.mkdtemp(prefix="perseus-input-limits-"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"load average {os.getloadavg()[0]:.1f}, {time.strftime('%Y-%m-%d %H:%M')}")
    print(
        "| input | shape | cap MB | file MB | outcome | import MB | peak MB | (peak-import)/size | read s |"
    )
    print("|---|---|---:|---:|---|---:|---:|---:|---:|")
    made: dict[tuple[str, str], Path] = {}
    for kind, shape, generate, reader in CASES:
        if kind not in kinds:
            continue
        cap = INPUT_LIMITS[kind]
        key = (kind, shape.removesuffix(" (before)"))
        path = made.get(key)
        if path is None:
            path = folder / f"{kind}-{len(made)}"
            generate(path, cap)
            made[key] = path
        target = path / "summary_train.csv" if path.is_dir() else path
        size_mb = target.stat().st_size / MB
        arg = path if path.is_dir() else target
        before, peak, elapsed, outcome = measure(reader, arg)
        ratio = (peak - before) / size_mb if size_mb else float("nan")
        print(
            f"| {kind} | {shape} | {cap / MB:.0f} | {size_mb:.1f} | {outcome} | {before:.0f} | "
            f"{peak:.0f} | {ratio:.1f} | {elapsed:.1f} |",
            flush=True,
        )
    if args.keep is None:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
