"""Train a small MLP split into pipeline stages with perseus, on emulated GPUs (CPU + gloo).

Run with torchrun (one process per pipeline rank)::

    torchrun --nproc-per-node 4 examples/train_pipeline.py --emulate --schedule 1f1b \\
        --microbatches 8 --iterations 6 --summary summary.json

or without torchrun (the script spawns the processes itself)::

    python examples/train_pipeline.py --spawn 4 --emulate --schedule 1f1b --microbatches 8 \\
        --iterations 6 --summary summary.json

Each rank's simulated GPU is built from a profile (default: the bundled, measured A100 one, cut
to the pipeline's stage count) and runs through the same agent -> controller -> device path as a
real GPU: every action is launched as an op on the simulated GPU's stream, the agent changes
clocks on the device's timeline (set latency lognormal, median 5 ms / p99 12 ms), ops carry
seeded time/power noise and the blocking power is off by a seeded error the planner does not
know (``--no-noise`` turns both off), and the energy counter is published every 100 ms. The host
waits for each op's output on the device before sending it (CPU-stretching). The script runs an all-max
phase and a phase with the deployed plan (``--plan PLAN.json``, ``--online-profile``, or by
default the fastest point of the frontier computed from the profile) and writes the predicted
and measured figures of both to ``--summary``.

With ``--data-parallel D`` there are D pipelines (world = D x ranks); ``--straggler PIPE:FACTOR``
slows pipeline PIPE's GPUs from ``--straggler-from`` to ``--straggler-until`` (iterations of
each straggler phase), and the summary compares an adaptive run (the other pipelines switch
plans) with a baseline that keeps the fastest plan.

``--time-scale`` multiplies every simulated time and energy (power unchanged), the set latency
and the counter period, so that tests can run short iterations; relative figures (savings) do
not change. The default is 1 (the profile's real op times).

The simulated GPUs live in ``$PERSEUS_SIM_DIR`` when it is set (so ``perseus device info`` shows
their locks during a run), else in a fresh temporary directory. Watchdog and signal handling
are on, as in any ``PerseusPipeline``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from _engine_common import choose_point, show_summary, write_math  # this folder's helpers
from torch import nn

from perseus.device.simulated import SimNoise, SimulatedGPU
from perseus.errors import ConfigError
from perseus.io import default_blocking_power_w, load_profile, write_profile_csv
from perseus.io.atomic import atomic_write_text
from perseus.plan import Frontier
from perseus.runtime.emulation import EmulationOverrunWarning, scale_profile, take_stages
from perseus.runtime.engines.torch_pp import build_torch_schedule, job_store, torch_class_for
from perseus.runtime.pipeline import PerseusPipeline, SessionOptions
from perseus.runtime.planning import OfflineProfile, OnlineProfile, PlanFile
from perseus.runtime.power.cap import set_cap
from perseus.runtime.profiling.sweep import profile_cache_path
from perseus.runtime.straggler.switching import StragglerRuntime, raw_store
from perseus.schedule import SCHEDULE_NAMES, build_schedule


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--emulate", action="store_true", help="simulated GPUs (required on CPU)")
    p.add_argument("--schedule", choices=SCHEDULE_NAMES, default="1f1b")
    p.add_argument(
        "--torch-schedule",
        help="run this torch class instead (e.g. ZBVZeroBubble, InterleavedZeroBubble), two "
        "stages per rank; perseus reads its order and plans it",
    )
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--iterations", type=int, default=6, help="measured iterations per phase")
    p.add_argument("--warmup", type=int, default=2, help="unmeasured iterations per phase")
    p.add_argument("--summary", type=Path)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--plan", type=Path, help="plan/frontier JSON to deploy")
    src.add_argument("--online-profile", action="store_true", help="profile clocks while training")
    p.add_argument("--profile", default="a100", help="profile of the simulated GPU (default a100)")
    p.add_argument("--blocking-power-w", type=float)
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--profile-cache", type=Path, help="directory for online profiles")
    p.add_argument("--dump-profile", type=Path, help="write the emulated profile CSV and exit")
    p.add_argument("--point", default="fastest", help="fastest, min-energy or a point index")
    p.add_argument("--data-parallel", type=int, default=1)
    p.add_argument("--straggler", help="PIPE:FACTOR, e.g. 1:1.2")
    p.add_argument("--straggler-from", type=int, default=0)
    p.add_argument("--straggler-until", type=int)
    p.add_argument("--spawn", type=int, metavar="NPROC", help="spawn NPROC processes (no torchrun)")
    p.add_argument("--hidden", type=int, default=16)
    p.add_argument("--microbatch-size", type=int, default=2)
    p.add_argument("--no-noise", action="store_true", help="exact simulated GPUs (no noise)")
    p.add_argument("--seed", type=int, default=0, help="seed of the simulated GPUs' noise")
    p.add_argument(
        "--no-perseus",
        action="store_true",
        help="run the same steps without perseus (all-max and plan phases' count)",
    )
    p.add_argument("--math", type=Path, help="write a digest of the final parameters (JSON)")
    p.add_argument(
        "--layers-per-stage",
        type=int,
        metavar="N",
        help="layers per stage: plan two-clock ops (one mid-op clock switch at a layer boundary)",
    )
    p.add_argument(
        "--power-schedule",
        type=Path,
        help="plan schedule JSON (perseus plan schedule) over --plan's frontier: the run follows "
        "it from its first iteration (no all-max phase)",
    )
    p.add_argument(
        "--cap-at",
        metavar="ITER:W",
        help="set a pipeline power cap of W watts in the job's store before iteration ITER starts "
        "(as `perseus power set --cap-w W` would): read at the end of iteration ITER, in force "
        "from ITER+1; the run follows caps (no all-max phase)",
    )
    p.add_argument(
        "--fleet",
        metavar="URL:NAME",
        help="join the fleet in this database under NAME (perseus fleet serve): the fleet's plan "
        "is this job's power cap (no all-max phase)",
    )
    p.add_argument(
        "--counter-period-ms",
        type=float,
        help="energy counter update period of the simulated GPUs (default 100, NVML's; online "
        "profiling fits op energy to the counter's windows); scaled by --time-scale",
    )
    args = p.parse_args(argv)
    if not args.emulate:
        p.error("only --emulate is supported on machines without GPUs; pass --emulate")
    if args.fleet is not None and args.plan is None:
        p.error("--fleet registers the job's frontier with the fleet: pass it with --plan")
    return args


# --------------------------------------------------------------------------------------------
# Setup


def emulated_profile(args: argparse.Namespace, num_stages: int) -> Any:
    """The simulated GPU's profile: bundled/path profile cut to the stages, split, scaled."""
    profile = take_stages(load_profile(args.profile), num_stages)
    if args.schedule == "zb" or "ZeroBubble" in (args.torch_schedule or ""):
        profile = profile.split_backward(0.5)
    return scale_profile(profile, args.time_scale)


def counter_period_s(args: argparse.Namespace) -> float:
    """NVML's 100 ms, online profiling included (it fits op energy to the counter's windows)."""
    if args.counter_period_ms is not None:
        return float(args.counter_period_ms) / 1000.0
    return 0.1


def blocking_power(args: argparse.Namespace) -> float:
    if args.blocking_power_w is not None:
        return float(args.blocking_power_w)
    power = default_blocking_power_w(load_profile(args.profile))
    if power is None:
        raise ConfigError(f"{args.profile}: pass --blocking-power-w for a non-bundled profile")
    return power


def make_groups(world: int, d: int) -> tuple[list[Any], list[Any]]:
    r = world // d
    pipes = [dist.new_group(list(range(k * r, (k + 1) * r))) for k in range(d)]
    dps = [dist.new_group([k * r + i for k in range(d)]) for i in range(r)] if d > 1 else []
    return pipes, dps


def stages_per_rank(args: argparse.Namespace) -> int:
    return 2 if (args.schedule == "interleaved" or args.torch_schedule) else 1


def build_stages(args: argparse.Namespace, prank: int, ranks: int, v: int, group: Any) -> list[Any]:
    from torch.distributed.pipelining import PipelineStage

    num_stages = ranks * v
    v_shape = args.torch_schedule in ("ZBVZeroBubble", "DualPipeV")
    stages = []
    for k in range(v):
        index = (2 * ranks - 1 - prank if k else prank) if v_shape else k * ranks + prank
        torch.manual_seed(index)
        module = nn.Sequential(nn.Linear(args.hidden, args.hidden), nn.Tanh())
        stages.append(PipelineStage(module, index, num_stages, torch.device("cpu"), group=group))
    return stages


# --------------------------------------------------------------------------------------------
# Worker


def worker(rank: int, world: int, args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    warnings.simplefilter("default", EmulationOverrunWarning)  # report, never abort
    show_summary()
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=rank, world_size=world)
    d = args.data_parallel
    if world % d:
        raise ConfigError(f"world size {world} is not a multiple of --data-parallel {d}")
    ranks = world // d
    pipe, prank = divmod(rank, ranks)
    v = stages_per_rank(args)
    num_stages = ranks * v
    pipes, dps = make_groups(world, d)
    pp_group, dp_group = pipes[pipe], (dps[prank] if dps else None)

    profile = emulated_profile(args, num_stages)
    power_mode = any(a is not None for a in (args.power_schedule, args.cap_at, args.fleet))
    power = blocking_power(args)
    scale = args.time_scale
    # The session gives each process its own simulated GPU (index = rank) in a directory of
    # this job's own ($PERSEUS_SIM_DIR when set) and runs the cross-rank timeline.
    gpu = SimulatedGPU.from_profile(
        profile,
        blocking_power_w=power,
        set_latency_s=0.005 * scale,  # notes §5.1: lognormal, median 5 ms, p99 12 ms
        publish_interval_s=counter_period_s(args) * scale,
        noise=None if args.no_noise else SimNoise(seed=args.seed),
        seed=args.seed,
    )

    stages = build_stages(args, prank, ranks, v, pp_group)
    params = [p for s in stages for p in s.submod.parameters()]
    optimizer = torch.optim.SGD(params, lr=1e-3)
    if args.torch_schedule:
        torch_schedule = torch_class_for(args.torch_schedule)(
            stages, args.microbatches, loss_fn=nn.functional.mse_loss
        )
    else:
        schedule = build_schedule(args.schedule, num_stages, args.microbatches, virtual_stages=v)
        torch_schedule = build_torch_schedule(schedule, stages, loss_fn=nn.functional.mse_loss)

    cache = None
    if args.online_profile and args.profile_cache is not None:
        cache = profile_cache_path(
            args.profile_cache,
            model=f"mlp{args.hidden}",
            schedule=args.schedule,
            stages=num_stages,
            microbatches=args.microbatches,
            gpu=gpu.name,
            profile=profile.sha256,
        )
    source: Any
    if args.online_profile:
        source = OnlineProfile(cache=cache)
    elif args.plan is not None:
        source = PlanFile(args.plan, profile)
    else:
        source = OfflineProfile(
            profile, layers_per_stage=args.layers_per_stage, switch_latency_s=0.005 * scale
        )
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.microbatches * args.microbatch_size, args.hidden, generator=g)
    y = torch.randn(args.microbatches * args.microbatch_size, args.hidden, generator=g)
    has_first = any(s.is_first for s in stages)
    has_last = any(s.is_last for s in stages)
    slowdown = 1.0

    def plain_step() -> None:
        torch_schedule.step(*((x,) if has_first else ()), target=y if has_last else None)
        if dp_group is not None:
            for p in params:
                if p.grad is not None:
                    dist.all_reduce(p.grad, group=dp_group)
        optimizer.step()
        optimizer.zero_grad()

    if args.no_perseus:  # the same steps without perseus, to compare the math
        for _ in range(2 * (args.warmup + args.iterations)):
            plain_step()
        write_math(args, params)
        dist.destroy_process_group()
        return

    session = PerseusPipeline(
        torch_schedule,
        stages,
        gpu=gpu,
        plan=source,
        options=SessionOptions(
            blocking_power_w=power,
            group=pp_group,
            power_schedule=args.power_schedule,
            power_store=(fleet_member(args, rank) if args.fleet else job_store())
            if power_mode
            else None,
        ),
    ).start()
    gpu = session.gpu  # this rank's simulated GPU

    def train_step() -> None:
        with session.iteration():
            plain_step()

    phases: list[tuple[str, int, int]] = []  # (name, first history index, count)
    while session.profiling:
        train_step()
    profile_iterations = len(session.history)

    frontier = session.frontier
    assert frontier is not None  # set once profiling or planning is done
    point = choose_point(frontier, args.point)

    def run_phase(name: str, plan: Frontier, index: int, runtime: StragglerRuntime | None) -> None:
        nonlocal slowdown
        session.deploy(plan, index)
        if runtime is not None:
            session.add_boundary_hook(runtime)
        first = session.next_iteration
        n = args.warmup + args.iterations
        for i in range(n):
            if straggler is not None and pipe == straggler[0]:
                until = args.straggler_until if args.straggler_until is not None else n
                want = straggler[1] if args.straggler_from <= i < until else 1.0
                if want != slowdown:
                    gpu.set_slowdown(want)
                    slowdown = want
            train_step()
        phases.append((name, first, n))
        if runtime is not None:
            session.remove_boundary_hook(runtime)

    straggler = None
    if args.straggler:
        k, f = args.straggler.split(":")
        straggler = (int(k), float(f))
    if power_mode:
        run_power(args, session, train_step, rank)
        return
    run_phase("allmax", session.allmax_plan(), 0, None)
    if straggler is None:
        run_phase("plan", frontier, point, None)
        runtimes: dict[str, StragglerRuntime] = {}
    else:
        runtimes = {}
        for name, adaptive in (("baseline", False), ("adaptive", True)):
            rt = StragglerRuntime(
                frontier,
                pipeline_index=pipe,
                num_pipelines=d,
                store=job_store(),
                adaptive=adaptive,
            )
            runtimes[name] = rt
            run_phase(name, frontier, 0, rt)
    if straggler is not None and slowdown != 1.0:
        gpu.set_slowdown(1.0)
    agent = session.agent
    mid_switches = [r.mid_op_switches for r in agent.records.iterations] if agent else []
    mid_missed = [r.mid_op_switches_missed for r in agent.records.iterations] if agent else []
    session.close()
    write_math(args, params)

    mine = {
        "rank": rank,
        "pipe": pipe,
        "prank": prank,
        "history": [
            (s.iteration, s.point_index, s.time_s, s.energy_j, s.compute_time_s)
            for s in session.history
        ],
        "phases": phases,
        "profile_iterations": profile_iterations,
        "clocks_profiled": {f"{s}{k.value}": n for (s, k), n in session.clocks_profiled.items()},
        "overruns": session.emulation_overruns,
        "mid_op_switches": mid_switches,
        "mid_op_switches_missed": mid_missed,
        "decisions": {
            name: [
                (dd.iteration, dd.point_index, dd.straggler, list(dd.pipeline_times_s))
                for dd in rt.decisions
            ]
            for name, rt in runtimes.items()
        },
    }
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, mine)
    if rank == 0 and args.summary is not None:
        summary = make_summary(args, gathered, session, frontier, point, profile, power, ranks)
        atomic_write_text(args.summary, json.dumps(summary, indent=2) + "\n")
    dist.barrier()
    dist.destroy_process_group()


def fleet_member(args: argparse.Namespace, rank: int) -> Any:
    """This job in the fleet (``--fleet URL:NAME``); rank 0 registers it and reads its plan."""
    from perseus.fleet.member import FleetMember
    from perseus.io.frontier_files import read_frontier

    url, _, name = args.fleet.rpartition(":")
    member = FleetMember(url, name, read_frontier(args.plan), lease_s=30.0)
    return member.start() if rank == 0 else member


def run_power(args: argparse.Namespace, session: Any, train_step: Any, rank: int) -> None:
    """Follow --power-schedule and --cap-at for warmup + iterations iterations; the summary
    lists every iteration's plan, measured pipeline power and the plan's predicted power."""
    cap_at = None
    if args.cap_at is not None:
        it, w = args.cap_at.split(":")
        cap_at = (int(it), float(w))
    first = session.next_iteration
    for i in range(args.warmup + args.iterations):
        if cap_at is not None and i == cap_at[0] and rank == 0:
            set_cap(raw_store(job_store()), cap_at[1])  # what `perseus power set` reaches
        train_step()
    power_rt = session.power
    frontier = session.frontier
    session.close()
    if args.fleet and rank == 0:
        session.power.store.close()  # finished: its power goes back to the fleet
    mine = [
        (s.iteration, s.point_index, s.time_s, s.energy_j, s.host_overruns)
        for s in session.history[first:]
    ]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    if rank == 0 and args.summary is not None:
        rows = []
        for j, (iteration, point, time_s, _, overruns) in enumerate(gathered[0]):
            energy_j = sum(g[j][3] for g in gathered)
            p = frontier.points[point]
            rows.append(
                {
                    "iteration": iteration - first,
                    "point": point,
                    "time_s": time_s,
                    "energy_j": energy_j,
                    "power_w": energy_j / time_s,
                    "predicted_time_s": p.time_s,
                    "predicted_power_w": p.avg_power_w,
                    # Emulation: the pipeline's host overruns (a late host, not the plan).
                    "host_overruns": overruns,
                }
            )
        decisions = [
            {"iteration": d.iteration - first, "point": d.point_index, "reason": d.reason,
             "cap_w": d.cap_w}
            for d in power_rt.decisions
        ]  # fmt: skip
        summary = {"power": {"iterations": rows, "decisions": decisions}}
        atomic_write_text(args.summary, json.dumps(summary, indent=2) + "\n")
    dist.barrier()
    dist.destroy_process_group()


# --------------------------------------------------------------------------------------------
# Summary


def _phase_rows(gathered: list[Any], name: str, warmup: int) -> list[dict[str, Any]]:
    """Per measured iteration of phase ``name``: job time, per-pipeline time/energy/plans."""
    d = 1 + max(g["pipe"] for g in gathered)
    phase = {p[0]: p for p in gathered[0]["phases"]}[name]
    _, first, count = phase
    rows = []
    for i in range(count):
        per_pipe_time = [0.0] * d
        per_pipe_energy = [0.0] * d
        per_pipe_compute = [0.0] * d
        plans: list[list[int | None]] = [[] for _ in range(d)]
        for g in gathered:
            _, point, time_s, energy_j, compute_s = g["history"][first + i]
            k = g["pipe"]
            per_pipe_time[k] = max(per_pipe_time[k], time_s)
            per_pipe_energy[k] += energy_j
            per_pipe_compute[k] = max(per_pipe_compute[k], compute_s)
            plans[k].append(point)
        rows.append(
            {
                "iteration": i,
                "measured": i >= warmup,
                "job_time_s": max(per_pipe_time),
                "time_s": per_pipe_time,
                "energy_j": per_pipe_energy,
                "compute_time_s": per_pipe_compute,
                "plan": plans,
            }
        )
    return rows


def _mean_measured(rows: list[dict[str, Any]], pipes: list[int]) -> dict[str, float]:
    measured = [r for r in rows if r["measured"]]
    return {
        "time_s": statistics.fmean(r["job_time_s"] for r in measured),
        "energy_j": statistics.fmean(
            statistics.fmean(r["energy_j"][k] for k in pipes) for r in measured
        ),
    }


def make_summary(
    args: argparse.Namespace,
    gathered: list[Any],
    session: PerseusPipeline,
    frontier: Frontier,
    point: int,
    profile: Any,
    power: float,
    ranks: int,
) -> dict[str, Any]:
    d = args.data_parallel
    allmax_pred = {"time_s": frontier.baseline.time_s, "energy_j": frontier.baseline.energy_j}
    chosen = frontier.points[point]
    summary: dict[str, Any] = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "schedule": session.job.spec.schedule if session.job else args.schedule,
        "torch_schedule": type(session.torch_schedule).__name__,
        "ranks_per_pipeline": ranks,
        "pipelines": d,
        "blocking_power_w": power,
        "frontier_points": len(frontier.points),
        "point_index": point,
        "overruns": sum(g["overruns"] for g in gathered),
    }
    allmax_rows = _phase_rows(gathered, "allmax", args.warmup)
    allmax_meas = _mean_measured(allmax_rows, list(range(d)))
    summary["allmax"] = {"predicted": allmax_pred, "measured": allmax_meas}
    if args.straggler is None:
        rows = _phase_rows(gathered, "plan", args.warmup)
        meas = _mean_measured(rows, list(range(d)))
        summary["predicted"] = {"time_s": chosen.time_s, "energy_j": chosen.energy_j}
        summary["measured"] = meas
        summary["errors"] = {
            "time": meas["time_s"] / chosen.time_s - 1,
            "energy": meas["energy_j"] / chosen.energy_j - 1,
            "allmax_time": allmax_meas["time_s"] / allmax_pred["time_s"] - 1,
            "allmax_energy": allmax_meas["energy_j"] / allmax_pred["energy_j"] - 1,
        }
        summary["saving"] = {
            "predicted": 1 - chosen.energy_j / allmax_pred["energy_j"],
            "measured": 1 - meas["energy_j"] / allmax_meas["energy_j"],
        }
        summary["iterations"] = {"allmax": allmax_rows, "plan": rows}

        # Mid-op clock switches per measured iteration of the plan (all ranks of all pipelines).
        def per_iteration(key: str) -> list[int]:
            if not all(len(g[key]) >= args.iterations for g in gathered):
                return []
            return [
                sum(g[key][-args.iterations :][i] for g in gathered) for i in range(args.iterations)
            ]

        summary["two_clock"] = {
            "layers_per_stage": args.layers_per_stage,
            "planned_mid_op_switches": chosen.num_two_clock_ops * d,
            "mid_op_switches_per_iteration": per_iteration("mid_op_switches"),
            # Not issued: their op ended before the clock worker issued them.
            "mid_op_switches_missed_per_iteration": per_iteration("mid_op_switches_missed"),
        }
    else:
        summary["predicted"] = {"time_s": chosen.time_s, "energy_j": chosen.energy_j}
        summary["straggler"] = straggler_summary(args, gathered, frontier, power, ranks)
        summary["measured"] = summary["straggler"]["adaptive"]["measured"]
    if args.online_profile:
        summary["online_profile"] = profile_summary(gathered, session, profile)
    return summary


def straggler_summary(
    args: argparse.Namespace, gathered: list[Any], frontier: Frontier, power: float, ranks: int
) -> dict[str, Any]:
    d = args.data_parallel
    k_slow, factor = args.straggler.split(":")
    k_slow_i, factor_f = int(k_slow), float(factor)
    others = [k for k in range(d) if k != k_slow_i]
    n = args.warmup + args.iterations
    until = args.straggler_until if args.straggler_until is not None else n
    # Iterations where the straggler is active and the others had 2 iterations to react.
    window = [i for i in range(n) if args.straggler_from + 2 <= i < until]
    out: dict[str, Any] = {
        "pipeline": k_slow_i,
        "factor": factor_f,
        "from": args.straggler_from,
        "until": until,
        "window": window,
    }
    t_slow = factor_f * frontier.fastest.time_s
    for name in ("baseline", "adaptive"):
        rows = _phase_rows(gathered, name, 0)
        win = [rows[i] for i in window]
        consistent = all(len(set(r["plan"][k])) == 1 for r in rows for k in range(d))
        out[name] = {
            "iterations": rows,
            "plans_consistent_within_pipelines": consistent,
            "measured": {
                "job_time_s": statistics.fmean(r["job_time_s"] for r in win) if win else None,
                "others_energy_j": statistics.fmean(
                    statistics.fmean(r["energy_j"][k] for k in others) for r in win
                )
                if win
                else None,
            },
        }
    # Prediction: other pipelines run plan p and wait for the straggler until T' at blocking
    # power on each of their ranks: E = E_p + P * ranks * (T' - T_p).
    win_plans = [
        r["plan"][others[0]][0] for r in out["adaptive"]["iterations"] if r["iteration"] in window
    ]
    p_adapt = max(set(win_plans), key=win_plans.count) if win_plans else 0

    def pred(p: int) -> float:
        pt = frontier.points[p]
        return pt.energy_j + power * ranks * max(0.0, t_slow - pt.time_s)

    e_base, e_adapt = pred(0), pred(p_adapt)
    mb, ma = out["baseline"]["measured"], out["adaptive"]["measured"]
    out["predicted"] = {
        "straggler_time_s": t_slow,
        "point_index": p_adapt,
        "others_energy_baseline_j": e_base,
        "others_energy_adaptive_j": e_adapt,
        "reduction": 1 - e_adapt / e_base,
    }
    if window and mb["others_energy_j"]:
        out["measured_reduction"] = 1 - ma["others_energy_j"] / mb["others_energy_j"]
        out["job_time_increase"] = ma["job_time_s"] / mb["job_time_s"] - 1
    first_switch = None
    for r in out["adaptive"]["iterations"]:
        if r["iteration"] >= args.straggler_from and r["plan"][others[0]][0] != 0:
            first_switch = r["iteration"]
            break
    out["first_switch_iteration"] = first_switch
    last = out["adaptive"]["iterations"][-1]
    # A plan reverts one iteration after the straggler recovers (iteration `until`).
    out["reverted"] = (until < n - 1) and all(p == 0 for k in range(d) for p in last["plan"][k])
    return out


def profile_summary(gathered: list[Any], session: PerseusPipeline, truth: Any) -> dict[str, Any]:
    profiled = session.profiled
    errors_t, errors_e = [], []
    if profiled is not None:
        for (s, k), op in profiled.ops.items():
            for o in op.options:
                ref = truth.op(s, k).at(o.freq_mhz)
                errors_t.append(abs(o.time_s / ref.time_s - 1))
                errors_e.append(abs(o.energy_j / ref.energy_j - 1))
    clocks: dict[str, int] = {}
    for g in gathered:
        if g["pipe"] == 0:
            clocks.update(g["clocks_profiled"])
    full = len({o.freq_mhz for op in truth.ops.values() for o in op.options})
    return {
        "iterations": gathered[0]["profile_iterations"],
        "clocks_profiled": clocks,
        "full_clock_list": full,
        "max_time_error": max(errors_t, default=None),
        "max_energy_error": max(errors_e, default=None),
        "mean_time_error": statistics.fmean(errors_t) if errors_t else None,
        "mean_energy_error": statistics.fmean(errors_e) if errors_e else None,
    }


# --------------------------------------------------------------------------------------------
# Launch


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spawned(rank: int, world: int, args: argparse.Namespace) -> None:
    worker(rank, world, args)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dump_profile is not None:
        v = stages_per_rank(args)
        ranks = (args.spawn or int(os.environ.get("WORLD_SIZE", 4))) // args.data_parallel
        write_profile_csv(emulated_profile(args, ranks * v), args.dump_profile)
        return 0
    if args.spawn:
        import torch.multiprocessing as mp

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(_free_port())
        # fork: the children inherit the imported modules instead of importing torch again.
        mp.start_processes(
            _spawned, args=(args.spawn, args), nprocs=args.spawn, join=True, start_method="fork"
        )
        return 0
    worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
