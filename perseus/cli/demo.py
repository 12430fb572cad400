"""``perseus demo``: frontier, baselines, straggler what-if and report for the bundled GPT-3
175B A100 profile (or ``--config``), no GPU needed.

While the solver's numba kernels are not compiled yet, a job of up to ``_UNCOMPILED_MAX_OPS``
ops is solved by the walk's numpy stand-in (the same frontier) while another process compiles
them: first the plan kernels this run needs too, which it loads as they land in numba's cache
(:class:`_KernelLoader`) instead of compiling them itself, then, at the lowest priority, the
walk for the next run. A larger job compiles them first, on a small copy of the job, and the
printed time leaves that out.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perseus.cli._args import add_output_arg, check_output_dir, nonempty_arg
from perseus.cli._job_args import CONFIG_FIELDS, job_from_args, job_int
from perseus.cli._progress import progress_bar
from perseus.cli.report import add_whatif_arguments
from perseus.log import get_logger, phase

if TYPE_CHECKING:
    from perseus.job import PlanningJob

__all__ = ["DEMO_JOB", "register", "run"]

logger = get_logger(__name__)

#: The demo job when no --config is given.
DEMO_JOB: dict[str, str | int | float] = {
    "profile": "a100",
    "schedule": "1f1b",
    "stages": 8,
    "microbatches": 24,
    "blocking_power_w": 83.64,
    "pipelines": 16,
}
#: Jobs up to this many ops are solved uncompiled while the walk kernel is not in numba's
#: cache (benchmarks/README.md, *First run, solved uncompiled*).
_UNCOMPILED_MAX_OPS = 640


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "demo",
        help="frontier, baselines, straggler what-if and report for GPT-3 175B on A100 (no GPU)",
        description="Plan GPT-3 175B on the bundled A100 profile (1F1B, 8 stages x 24 "
        "microbatches) and write a report. No GPU and no arguments needed.",
    )
    p.set_defaults(handler=run)
    add_output_arg(
        p,
        "DIR",
        "report directory (default perseus-report/; replaced atomically)",
        "perseus-report",
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        type=nonempty_arg,
        help="plan this TOML job config instead (see configs/)",
    )
    p.add_argument(
        "--microbatches", type=job_int("microbatches"), help="override the job's microbatch count"
    )
    add_whatif_arguments(p, pipelines=None)
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def _job_namespace(args: argparse.Namespace) -> tuple[argparse.Namespace, int]:
    """Arguments for :func:`job_from_args` and the pipeline count, from --config or DEMO_JOB."""
    from perseus.io.config import read_job_config

    ns = argparse.Namespace(profile=None, config=args.config, **dict.fromkeys(CONFIG_FIELDS))
    pipelines = int(DEMO_JOB["pipelines"])
    if args.config is None:
        for key in ("profile", *CONFIG_FIELDS):
            setattr(ns, key, DEMO_JOB.get(key, getattr(ns, key)))
    else:
        config, _ = read_job_config(args.config)
        pipelines = config.pipelines if config.pipelines is not None else pipelines
    if args.microbatches is not None:
        ns.microbatches = args.microbatches
    return ns, args.pipelines if args.pipelines is not None else pipelines


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    from perseus.io.atomic import atomic_directory
    from perseus.report import REPORT_FILES, ReportInputs, format_summary, write_report
    from perseus.report.build import LEGACY_REPORT_FILES
    from perseus.runtime.straggler.sweep import parse_factors, straggler_sweep
    from perseus.solver import baseline_plans, global_clock_plans, trace

    out = check_output_dir(args.out, (*REPORT_FILES, *LEGACY_REPORT_FILES))
    factors = parse_factors(args.factors)
    ns, pipelines = _job_namespace(args)
    job = job_from_args(ns)
    s = job.spec
    logger.info(
        "job: %s on %s, %d stages x %d microbatches, %d ops",
        s.schedule,
        s.profile_name,
        s.stages,
        s.microbatches,
        job.graph.num_nodes,
    )
    uncompiled = job.graph.num_nodes <= _UNCOMPILED_MAX_OPS and not _walk_kernel_cached()
    compile_s = 0.0
    loader = _KernelLoader()
    if uncompiled:
        _compile_in_background()
        loader.start()
    else:
        compile_s = _compile_kernels(job, enabled=not args.no_progress)
    started += compile_s
    method = "reference" if uncompiled else "compiled"
    with progress_bar("frontier", enabled=not args.no_progress, solve=not uncompiled) as update:
        try:
            frontier = trace(job, progress=update, method=method).frontier
        finally:
            loader.stop()
    solve_s = time.perf_counter() - started
    logger.info("frontier: %d points in %.1f s", len(frontier.points), solve_s)
    with phase("baselines and straggler what-if"):
        baselines = baseline_plans(job)
        sweep = straggler_sweep(frontier, pipelines=pipelines, factors=factors)
    inputs = ReportInputs(
        frontier=frontier,
        job=job,
        baselines=baselines,
        global_clock=global_clock_plans(job),
        sweep=sweep,
        pipelines=pipelines,
        title=f"Perseus demo: {job.spec.profile_name}",
        details={"solve time (s, this machine)": f"{solve_s:.1f}"},
    )
    with phase("writing the report"), atomic_directory(out) as tmp:
        summary = write_report(inputs, tmp)
    print(format_summary(summary))
    print(f"wrote {out}/ ({', '.join(REPORT_FILES)}); {_took(started, compile_s, uncompiled)}")
    return 0


def _took(started: float, compile_s: float, uncompiled: bool) -> str:
    """What the demo's time counts (planning and the report; not start-up, nor a compile)."""
    planning = "planning"
    if uncompiled:
        planning += (
            " (solver kernels not compiled yet: solved uncompiled, compiling them for next time)"
        )
    left_out = "start-up"
    if compile_s > 0:
        left_out += f" and {compile_s:.1f} s compiling the solver kernels (first run only)"
    took = time.perf_counter() - started
    return f"{planning} and the report, {left_out} not counted, in {took:.1f} s"


def _walk_kernel_cached() -> bool:
    """Whether numba's disk cache holds the compiled walk for this source and this CPU (read
    from numba's private cache index; if that fails, assume so: a wrong guess costs only time)."""
    try:
        from perseus.solver.compiled import walk_kernel

        return bool(_cached_signatures(walk_kernel))
    except Exception:
        return True


def _cached_signatures(kernel: Any) -> list[Any]:
    """The signatures numba's disk cache holds compiled for ``kernel`` (a numba dispatcher)
    for this source and this CPU, each written out (read from numba's private cache index;
    a data file older than the index may be a stale one about to be replaced)."""
    cache = kernel._cache
    files = cache._cache_file
    codegen = kernel.targetctx.codegen()
    index = files._load_index()
    if not index:
        return []
    written = os.stat(files._index_path).st_mtime_ns
    out = []
    for key, data_name in index.items():
        data = Path(files._cache_path) / data_name
        fresh = data.is_file() and data.stat().st_mtime_ns >= written
        if fresh and key == cache._index_key(key[0], codegen):
            out.append(key[0])
    return out


class _KernelLoader:
    """Loads the plan kernels (:mod:`perseus.solver.plan_kernels`) into this process from
    numba's disk cache as the background compile writes them (:meth:`poll` every 0.1 s on a
    thread), so that the solve finds them loaded rather than compiling them itself; a kernel
    it needs before is compiled here as usual."""

    def __init__(self) -> None:
        from perseus.solver import plan_kernels

        self._pending = [getattr(plan_kernels, name) for name in plan_kernels.__all__]
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="perseus-kernel-loader")
        self._thread.daemon = True

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join()

    def poll(self) -> bool:
        """Load the kernels now in the cache; whether some are still to come."""
        for kernel in list(self._pending):
            try:
                signatures = _cached_signatures(kernel)
                for signature in signatures:
                    kernel.compile(signature)  # loads it: numba reads its cache first
            except Exception as e:  # not tried again: compiled when first used
                logger.debug("loading %s from numba's cache failed: %s", kernel, e)
                self._pending.remove(kernel)
                continue
            if signatures:
                self._pending.remove(kernel)
        return bool(self._pending)

    def _run(self) -> None:
        while not self._stopped.wait(0.1) and self.poll():
            pass


def _compile_in_background() -> subprocess.Popen[bytes]:
    """Start a process compiling the solver kernels into numba's cache: first the plan kernels
    (at this run's priority: it loads them as they land), then the walk for the next run at
    the lowest priority. It starts a session of its own (Ctrl-C here leaves it be): Linux
    schedules each session as one group, so on a busy machine the plan kernels get a share of
    their own rather than half of this run's; for the walk it lowers its group's weight too."""
    code = "from perseus.cli.demo import compile_kernels; compile_kernels(renice=True)"
    return subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _lowest_priority() -> None:
    """This process at nice 19, and its session's scheduling group too (Linux autogroups)."""
    if hasattr(os, "nice"):
        os.nice(19)
    with contextlib.suppress(OSError):
        Path("/proc/self/autogroup").write_text("19")


def compile_kernels(renice: bool = False, walk: bool = True) -> None:
    """Compile the solver kernels into numba's cache on a tiny job (one microbatch: its
    uncompiled walk takes a fraction of a second): first those the uncompiled walk uses too,
    in the order it needs them (so a concurrent first run may load them), then (``walk``;
    ``renice``: at the lowest priority) the walk."""
    from perseus.io.bundled import load_profile
    from perseus.job import make_job
    from perseus.solver import trace

    stages, power = int(DEMO_JOB["stages"]), float(DEMO_JOB["blocking_power_w"])
    profile = load_profile(str(DEMO_JOB["profile"]))
    tiny = make_job(profile, "1f1b", stages, 1, blocking_power_w=power)
    trace(tiny, method="reference")
    if not walk:
        return
    if renice:
        _lowest_priority()
    trace(tiny)


def _compile_kernels(job: PlanningJob, enabled: bool) -> float:
    """Seconds spent compiling the solver kernels on a small 1F1B job of the same stages, 0
    when numba's disk cache holds them."""
    from perseus.cli._progress import solver_kernels_cached
    from perseus.job import make_job
    from perseus.solver import trace_frontier

    if solver_kernels_cached():
        return 0.0
    started = time.perf_counter()
    s = job.spec
    tiny = make_job(job.profile, "1f1b", s.stages, s.stages, blocking_power_w=s.blocking_power_w)
    with progress_bar("frontier", enabled=enabled, solve=True):
        trace_frontier(tiny)
    return time.perf_counter() - started
