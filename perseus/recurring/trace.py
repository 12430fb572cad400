"""Read Zeus-format traces (``summary_train.csv``, ``summary_power_<gpu>.csv``) into workloads.

A seed is a (learning_rate, run) pair of the train trace; errors name file, line and field.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from perseus.errors import ConfigError
from perseus.io.reading import INPUT_LIMITS, decode_text, read_bounded
from perseus.recurring.workload import ZEUS_JOBS, EpochCost, JobSpec, Workload

__all__ = ["load_jobs", "load_workloads"]

_NAME = ("dataset", "network", "batch_size", "optimizer")
_TRAIN_FIELDS = (*_NAME, "run", "target_metric", "target_epoch")
_POWER_FIELDS = (*_NAME, "power_limit", "time_per_epoch", "average_power")
_JOBS = ("dataset", "network", "optimizer", "target_metric", "max_epochs", "default_batch_size")
_TRACE_WHAT = "the right `trace_dir` (Zeus-format summary CSVs)"
# job key -> batch size -> seed -> epochs to the target (None: never reached)
_Paths = dict[str, dict[int, dict[tuple[str, str], int | None]]]
_Epochs = dict[str, dict[tuple[int, int], EpochCost]]  # job key -> (batch size, limit W) -> cost


def _rows(
    path: Path, fields: Sequence[str], kind: str, what: str
) -> Iterator[tuple[int, dict[str, str]]]:
    """The CSV's rows with their line numbers (a bounded read of a regular file)."""
    data = read_bounded(path, limit_bytes=INPUT_LIMITS[kind], what=what)
    reader = csv.DictReader(io.StringIO(decode_text(path, data, what, ConfigError, "utf-8-sig")))
    try:
        missing = [c for c in fields if c not in (reader.fieldnames or [])]
        if missing:
            raise ConfigError(
                f"{path}: missing column(s) {', '.join(missing)}; the header must name "
                f"{', '.join(fields)}"
            )
        for row in reader:
            short = [c for c in fields if row.get(c) is None]
            if short:
                raise ConfigError(
                    f"{path}:{reader.line_num}: row has no {', '.join(short)} field; every row "
                    f"needs {len(reader.fieldnames or ())} comma-separated fields"
                )
            yield reader.line_num, row
    except csv.Error as e:
        raise ConfigError(f"{path}:{reader.line_num}: malformed CSV ({e}); fix the row") from None


def _number(
    path: Path, line: int, row: dict[str, str], name: str, *, integer: bool, low: float = 0.0
) -> float:
    """The field as a number >= ``low`` (with ``low`` > 0: also at most 1e9, so that costs
    stay finite and nonzero)."""
    text = (row.get(name) or "").strip()
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    high = 1e9 if low > 0 else math.inf
    if not (math.isfinite(value) and low <= value <= high) or (integer and value != int(value)):
        kind = "a non-negative integer" if integer else "a finite non-negative number"
        kind = f"a number in [{low:g}, {high:g}]" if low > 0 else kind
        raise ConfigError(f"{path}:{line}: field {name}={text!r} must be {kind}; fix the row")
    return value


def load_jobs(path: Path) -> tuple[JobSpec, ...]:
    """Job definitions from a CSV with columns dataset, network, optimizer, target_metric,
    max_epochs and default_batch_size."""
    jobs = []
    for line, row in _rows(path, _JOBS, "jobs", "a --jobs CSV of job definitions"):
        max_epochs = int(_number(path, line, row, "max_epochs", integer=True))
        b0 = int(_number(path, line, row, "default_batch_size", integer=True))
        if max_epochs < 1 or b0 < 1:
            raise ConfigError(f"{path}:{line}: max_epochs and default_batch_size must be >= 1")
        dataset, network, optimizer = (row[k].strip() for k in ("dataset", "network", "optimizer"))
        metric = _number(path, line, row, "target_metric", integer=False)
        jobs.append(JobSpec(dataset, network, optimizer, metric, max_epochs, b0))
    if not jobs:
        raise ConfigError(f"{path}: no job rows; add one row per recurring job")
    return tuple(jobs)


def _read_train(path: Path, jobs: Iterable[JobSpec]) -> _Paths:
    by_name = {(j.dataset, j.network, j.optimizer): j for j in jobs}
    out: _Paths = {}
    for line, row in _rows(path, _TRAIN_FIELDS, "trace", _TRACE_WHAT):
        job = by_name.get((row["dataset"], row["network"], row["optimizer"]))
        if job is None:
            continue
        bs = int(_number(path, line, row, "batch_size", integer=True))
        metric = _number(path, line, row, "target_metric", integer=False)
        raw = (row.get("target_epoch") or "").strip().lower()
        # "nan" (or empty): this seed never reached this metric
        reached = raw not in ("", "nan")
        epoch = int(_number(path, line, row, "target_epoch", integer=True)) if reached else 0
        seeds = out.setdefault(job.key, {}).setdefault(bs, {})
        seed = (row.get("learning_rate", ""), row["run"])
        seeds.setdefault(seed, None)
        on_target = math.isclose(metric, job.target_metric, rel_tol=1e-9)
        if on_target and reached and 1 <= epoch <= job.max_epochs:
            previous = seeds[seed]
            seeds[seed] = epoch if previous is None else min(previous, epoch)
    return out


def _read_power(path: Path, jobs: Iterable[JobSpec]) -> tuple[_Epochs, float]:
    by_name = {(j.dataset, j.network, j.optimizer): j for j in jobs}
    out: _Epochs = {}
    max_power_w = 0.0
    for line, row in _rows(path, _POWER_FIELDS, "trace", _TRACE_WHAT):
        limit = _number(path, line, row, "power_limit", integer=False, low=1.0)
        max_power_w = max(max_power_w, limit)
        job = by_name.get((row["dataset"], row["network"], row["optimizer"]))
        if job is None:
            continue
        bs = int(_number(path, line, row, "batch_size", integer=True))
        time_s = _number(path, line, row, "time_per_epoch", integer=False, low=1e-3)
        power_w = _number(path, line, row, "average_power", integer=False, low=1e-3)
        out.setdefault(job.key, {})[(bs, round(limit))] = EpochCost(time_s, power_w)
    if max_power_w <= 0:
        raise ConfigError(f"{path}: no power-limit rows; the power trace is empty")
    return out, max_power_w


def _workload(
    job: JobSpec, gpu: str, train: _Paths, power: _Epochs, max_power_w: float
) -> Workload | None:
    """``job``'s workload, or None when the traces share no batch size for it."""
    paths, epochs = train.get(job.key), power.get(job.key)
    traced_sizes = {b for b, _ in epochs or ()}
    traced = sorted(b for b in paths or () if b in traced_sizes)
    if not paths or not epochs or not traced:
        return None
    below = [b for b in traced if b <= job.default_batch_size]
    return Workload(
        spec=job,
        gpu=gpu,
        max_power_w=max_power_w,
        paths={b: tuple(s[k] for k in sorted(s)) for b, s in paths.items()},
        epochs=epochs,
        default_batch_size=below[-1] if below else traced[0],
    )


def load_workloads(
    trace_dir: str | Path,
    gpu: str,
    *,
    jobs: Sequence[JobSpec] = ZEUS_JOBS,
    workload: str | None = None,
) -> list[Workload]:
    """Every job of ``jobs`` that both traces in ``trace_dir`` hold, for GPU ``gpu`` (``b0``
    capped at the largest batch size both hold, as in Zeus's evaluation; a ``b0`` they do not
    hold becomes the next smaller size they do, or their smallest).

    Raises:
        ConfigError: unreadable or malformed files, an unknown ``workload``, or no job found.
    """
    trace_dir = Path(trace_dir)
    if workload is not None:
        jobs = [j for j in jobs if j.key == workload]
        if not jobs:
            raise ConfigError(
                f"`workload` {workload!r} is not a known job; use one of "
                f"{', '.join(j.key for j in ZEUS_JOBS)} or pass `jobs` defining it"
            )
    train_path = trace_dir / "summary_train.csv"
    power_path = trace_dir / f"summary_power_{gpu}.csv"
    train = _read_train(train_path, jobs)
    power, max_power_w = _read_power(power_path, jobs)
    found = (_workload(job, gpu, train, power, max_power_w) for job in jobs)
    out = [w for w in found if w is not None]
    if not out:
        wanted = workload or ", ".join(j.key for j in jobs)
        raise ConfigError(
            f"{train_path} and {power_path}: no rows for {wanted}; check the dataset, network "
            "and optimizer columns or pass `jobs` defining the job"
        )
    return out
