"""Online profiling on the simulated GPU vs the profile it was built from.

One pipeline rank runs 1F1B through ``RankSession(online_profile=OnlineProfile(...))`` on a simulated GPU: the
real agent -> controller -> device path, op energy from the energy counter read on a
background thread (published every 100 ms x ``--time-scale``, the ops scaled alike), per-op
noise, a blocking-power error and a counter gain error on. Each profiled row is compared with
the truth (the profile the simulated GPU charges, times the counter gain for energy: a uniform
gain no profiler can see, and one that does not move a plan).

    python benchmarks/online_profile.py [--time-scale 0.1] [--gain 0.95] [--clock-step 2]

Prints the median and max relative error of time and energy per row, the rows, the sweep
steps and windows used, and the error the old per-op counter stamps would have had.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings

from perseus.device.simulated import SimNoise, SimulatedGPU
from perseus.io import load_profile
from perseus.profile.model import Profile, build_profile
from perseus.runtime.emulation import EmulationOverrunWarning, scale_profile, take_stages
from perseus.runtime.planning import OnlineProfile
from perseus.runtime.session import RankSession
from perseus.schedule import build_schedule


def truth_profile(scale: float, clock_step: int, f_power: float) -> Profile:
    """The bundled A100 stage 0, every ``clock_step``-th clock, F energy times ``f_power``."""
    base = scale_profile(take_stages(load_profile("a100"), 1), scale)
    rows = []
    for (stage, kind), op in base.ops.items():
        for i, o in enumerate(sorted(op.options, key=lambda o: -o.freq_mhz)):
            if i % clock_step == 0:
                e = o.energy_j * (f_power if kind.value == "F" else 1.0)
                rows.append((stage, kind, o.freq_mhz, o.time_s, e))
    return build_profile(rows, source=f"a100 stage 0 x{scale}")


def run(args: argparse.Namespace) -> dict[str, float]:
    truth = truth_profile(args.time_scale, args.clock_step, args.f_power)
    with tempfile.TemporaryDirectory() as state_dir:
        gpu = SimulatedGPU.from_profile(
            truth,
            blocking_power_w=83.64,
            state_dir=state_dir,
            set_latency_s=0.005 * args.time_scale,
            publish_interval_s=0.1 * args.time_scale,
            noise=SimNoise(seed=args.seed, counter_gain=args.gain),
            clock=time.perf_counter,
        )
        schedule = build_schedule("1f1b", 1, args.microbatches)
        session = RankSession(
            schedule,
            0,
            gpu=gpu,
            blocking_power_w=83.64,
            online_profile=OnlineProfile(min_windows=args.min_windows),
            watchdog=False,
            handle_signals=False,
        )
        t0 = time.perf_counter()
        with session:
            while session.profiling:
                with session.iteration():
                    for action in schedule.rank_actions[0]:
                        with session.op(action):
                            pass
            agent = session.agent
            assert agent is not None
            records = agent.records.ops
        wall_s = time.perf_counter() - t0
    profiled = session.profiled
    assert profiled is not None
    e_err, t_err = [], []
    print("stage kind  MHz   time err  energy err")
    for (stage, kind), op in sorted(profiled.ops.items(), key=lambda x: x[0][1].value):
        for o in op.options:
            ref = truth.op(stage, kind).at(o.freq_mhz)
            te = o.time_s / ref.time_s - 1
            ee = o.energy_j / (args.gain * ref.energy_j) - 1
            t_err.append(abs(te))
            e_err.append(abs(ee))
            if args.rows:
                print(f"{stage:5d} {kind.value:4s} {o.freq_mhz:5d} {te:+9.2%} {ee:+10.2%}")
    # What the old path would have fed the sweep: per-op counter stamps at the op's clock.
    old = []
    for r in records:
        kind = r.name[0]
        op = next(v for (s, k), v in truth.ops.items() if k.value == kind)
        if r.iteration < len(session.history) and session.history[r.iteration].phase == "profile":
            old.append(abs(r.energy_j / (args.gain * op.at(r.freq_mhz).energy_j) - 1))
    out = {
        "rows": len(e_err),
        "profile_iterations": sum(1 for h in session.history if h.phase == "profile"),
        "wall_s": wall_s,
        "time_median": statistics.median(t_err),
        "time_max": max(t_err),
        "energy_median": statistics.median(e_err),
        "energy_max": max(e_err),
        "old_per_op_energy_median": statistics.median(old),
    }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--time-scale", type=float, default=0.1)
    p.add_argument("--gain", type=float, default=0.95)
    p.add_argument("--clock-step", type=int, default=2, help="profile every N-th clock")
    p.add_argument("--f-power", type=float, default=0.8, help="F energy factor (F != B power)")
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-windows", type=int, default=20, help="counter windows per sweep step")
    p.add_argument("--rows", action="store_true", help="print every row")
    args = p.parse_args()
    warnings.simplefilter("ignore", EmulationOverrunWarning)
    out = run(args)
    print(
        f"time scale {args.time_scale} (counter every {100 * args.time_scale:g} ms, ops "
        f"{50 * args.time_scale:.3g}-{99 * args.time_scale:.3g} ms), gain {args.gain}, "
        f"F power x{args.f_power}, noise on"
    )
    for k, v in out.items():
        print(f"{k:28s} {v:.4g}" if isinstance(v, float) else f"{k:28s} {v}")


if __name__ == "__main__":
    main()
