"""What examples/train_megatron.py and examples/train_deepspeed.py share with train_pipeline.py:
the flags, the emulated GPU, the all-max and plan phases, the ``--summary`` JSON, the launcher.

Each rank runs a :class:`~perseus.runtime.session.RankSession` on the schedule the engine
runs; the engine adapter puts every forward/backward inside ``session.op``. The summary has the
keys train_pipeline.py writes (``predicted``, ``measured``, ``errors``, ``saving``, ``allmax``,
``iterations``...), so one check reads all three examples.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import socket
import statistics
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from perseus.device.simulated import SimNoise, SimulatedGPU
from perseus.errors import ConfigError
from perseus.io import default_blocking_power_w, load_profile
from perseus.io.atomic import atomic_write_text
from perseus.plan import Frontier
from perseus.runtime.emulation import EmulationOverrunWarning, scale_profile, take_stages
from perseus.runtime.engines.base import EngineAdapter
from perseus.runtime.planning import OfflineProfile, PlanFile
from perseus.runtime.session import RankSession, SessionOptions
from perseus.schedule import Schedule

#: ``step()`` runs one training iteration of the engine (all microbatches + optimizer).
Step = Callable[[], None]


def parse_args(description: str, schedules: tuple[str, ...], argv: list[str] | None) -> Any:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--emulate", action="store_true", help="simulated GPUs (required on CPU)")
    p.add_argument("--schedule", choices=schedules, default=schedules[0])
    p.add_argument("--virtual-stages", type=int, default=2, help="chunks per rank (interleaved)")
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--iterations", type=int, default=6, help="measured iterations per phase")
    p.add_argument("--warmup", type=int, default=2, help="unmeasured iterations per phase")
    p.add_argument("--summary", type=Path)
    p.add_argument("--plan", type=Path, help="plan/frontier JSON to deploy")
    p.add_argument("--profile", default="a100", help="profile of the simulated GPU (default a100)")
    p.add_argument("--blocking-power-w", type=float)
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--point", default="fastest", help="fastest, min-energy or a point index")
    p.add_argument("--spawn", type=int, metavar="NPROC", help="spawn NPROC processes (no torchrun)")
    p.add_argument("--hidden", type=int, default=16)
    p.add_argument("--microbatch-size", type=int, default=2)
    p.add_argument("--no-noise", action="store_true", help="exact simulated GPUs (no noise)")
    p.add_argument("--seed", type=int, default=0, help="seed of the simulated GPUs' noise")
    p.add_argument("--no-perseus", action="store_true", help="run the same steps without perseus")
    p.add_argument("--math", type=Path, help="write a digest of the final parameters (JSON)")
    args = p.parse_args(argv)
    if not args.emulate:
        p.error("only --emulate is supported on machines without GPUs; pass --emulate")
    return args


def blocking_power(args: Any) -> float:
    if args.blocking_power_w is not None:
        return float(args.blocking_power_w)
    power = default_blocking_power_w(load_profile(args.profile))
    if power is None:
        raise ConfigError(f"{args.profile}: pass --blocking-power-w for a non-bundled profile")
    return power


def emulated_setup(args: Any, num_stages: int) -> tuple[Any, Any, float]:
    """(profile, simulated GPU, blocking power) of one rank."""
    warnings.simplefilter("default", EmulationOverrunWarning)  # report, never abort
    show_summary()
    profile = scale_profile(take_stages(load_profile(args.profile), num_stages), args.time_scale)
    power = blocking_power(args)
    scale = args.time_scale
    # The honest simulated GPU of train_pipeline.py: ops on an asynchronous stream, clock sets
    # with lognormal latency, seeded time/power noise and a blocking-power error the planner
    # does not know, a 100 ms energy counter. The session gives each process its own
    # (index = rank) in a directory of this job's own, and runs the cross-rank timeline.
    gpu = SimulatedGPU.from_profile(
        profile,
        blocking_power_w=power,
        set_latency_s=0.005 * scale,
        publish_interval_s=0.1 * scale,
        noise=None if args.no_noise else SimNoise(seed=args.seed),
        seed=args.seed,
    )
    return profile, gpu, power


def show_summary() -> None:
    """Print the session's one-line summary, logged at close (INFO, pipeline rank 0)."""
    log = logging.getLogger("perseus.runtime.session")
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
    log.setLevel(logging.INFO)


def make_session(
    args: Any, engine: EngineAdapter, gpu: Any, profile: Any, power: float
) -> RankSession:
    """The session as a user writes it: the engine's adapter, the GPU, a plan source."""
    plan = PlanFile(args.plan, profile) if args.plan is not None else OfflineProfile(profile)
    return RankSession(engine, gpu=gpu, plan=plan, options=SessionOptions(blocking_power_w=power))


def total_steps(args: Any) -> int:
    """Training steps of a run: the all-max phase and the plan phase."""
    return 2 * (args.warmup + args.iterations)


def run_plain(args: Any, step: Step) -> None:
    """The same steps as a perseus run, without perseus (to compare the math)."""
    for _ in range(total_steps(args)):
        step()


def write_math(args: Any, params: list[Any]) -> None:
    """Rank 0 writes every rank's SHA-256 of its final parameters' bytes to ``--math``."""
    import hashlib

    digest = hashlib.sha256()
    for p in params:
        digest.update(p.detach().cpu().contiguous().numpy().tobytes())
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, digest.hexdigest())
    if dist.get_rank() == 0 and args.math is not None:
        atomic_write_text(args.math, json.dumps(gathered) + "\n")


def choose_point(frontier: Frontier, point: str) -> int:
    if point == "fastest":
        return 0
    if point == "min-energy":
        return frontier.points.index(frontier.min_energy)
    return int(point)


def run_and_summarise(
    args: Any, session: RankSession, step: Step, engine: str, schedule: Schedule
) -> None:
    """All-max phase, plan phase, then rank 0 writes ``--summary``."""
    frontier = session.frontier
    if frontier is None:
        raise ConfigError("no plan was deployed")
    point = choose_point(frontier, args.point)
    # Move everything the engine allocated at start-up out of the collector's reach: a full
    # collection over DeepSpeed's and torch's heaps pauses the host ~0.1 s, which the emulated
    # (synchronous) GPUs would count as pipeline time; a real GPU runs ahead of such pauses.
    gc.collect()
    gc.freeze()
    phases: dict[str, tuple[int, int]] = {}
    for name, plan, index in (
        ("allmax", session.allmax_plan(), 0),
        ("plan", frontier, point),
    ):
        session.deploy(plan, index)
        first = session.next_iteration
        n = args.warmup + args.iterations
        for _ in range(n):
            with session.iteration():
                step()
        phases[name] = (first, n)
    session.close()
    mine = {
        "history": [(s.time_s, s.energy_j) for s in session.history],
        "overruns": session.emulation_overruns,
    }
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    if dist.get_rank() == 0 and args.summary is not None:
        summary = _summary(args, gathered, phases, frontier, point, engine, schedule)
        atomic_write_text(args.summary, json.dumps(summary, indent=2) + "\n")
    dist.barrier()


def _rows(gathered: list[Any], first: int, count: int, warmup: int) -> list[dict[str, Any]]:
    rows = []
    for i in range(count):
        entries = [g["history"][first + i] for g in gathered]
        rows.append(
            {
                "iteration": i,
                "measured": i >= warmup,
                "job_time_s": max(t for t, _ in entries),
                "energy_j": sum(e for _, e in entries),
            }
        )
    return rows


def _mean(rows: list[dict[str, Any]]) -> dict[str, float]:
    measured = [r for r in rows if r["measured"]]
    return {
        "time_s": statistics.fmean(r["job_time_s"] for r in measured),
        "energy_j": statistics.fmean(r["energy_j"] for r in measured),
    }


def _summary(
    args: Any,
    gathered: list[Any],
    phases: dict[str, tuple[int, int]],
    frontier: Frontier,
    point: int,
    engine: str,
    schedule: Schedule,
) -> dict[str, Any]:
    allmax_rows = _rows(gathered, *phases["allmax"], args.warmup)
    rows = _rows(gathered, *phases["plan"], args.warmup)
    allmax_pred = {"time_s": frontier.baseline.time_s, "energy_j": frontier.baseline.energy_j}
    chosen = frontier.points[point]
    allmax_meas, meas = _mean(allmax_rows), _mean(rows)
    return {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "engine": engine,
        "schedule": schedule.name,
        "ranks_per_pipeline": schedule.num_ranks,
        "pipelines": 1,
        "frontier_points": len(frontier.points),
        "point_index": point,
        "overruns": sum(g["overruns"] for g in gathered),
        "allmax": {"predicted": allmax_pred, "measured": allmax_meas},
        "predicted": {"time_s": chosen.time_s, "energy_j": chosen.energy_j},
        "measured": meas,
        "errors": {
            "time": meas["time_s"] / chosen.time_s - 1,
            "energy": meas["energy_j"] / chosen.energy_j - 1,
            "allmax_time": allmax_meas["time_s"] / allmax_pred["time_s"] - 1,
            "allmax_energy": allmax_meas["energy_j"] / allmax_pred["energy_j"] - 1,
        },
        "saving": {
            "predicted": 1 - chosen.energy_j / allmax_pred["energy_j"],
            "measured": 1 - meas["energy_j"] / allmax_meas["energy_j"],
        },
        "iterations": {"allmax": allmax_rows, "plan": rows},
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spawned(rank: int, world: int, worker: Callable[[int, int, Any], None], args: Any) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    worker(rank, world, args)


def launch(worker: Callable[[int, int, Any], None], args: Any) -> int:
    """Run ``worker(rank, world, args)`` under torchrun, or on ``--spawn`` forked processes."""
    torch.set_num_threads(1)
    if args.spawn:
        import torch.multiprocessing as mp

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(_free_port())
        mp.start_processes(
            _spawned, args=(args.spawn, worker, args), nprocs=args.spawn, start_method="fork"
        )
        return 0
    worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
    return 0
