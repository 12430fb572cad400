"""How much does the rank agent cost the training thread, and how fast are clocks applied?

Question 1: time added to the training thread per ``with agent.op(...)`` (target: median
≤ 50 µs). Measured as the wall time of an empty ``with agent.op(...)`` block minus an empty
``with nullcontext()``, over many ops, for:

* ``memory, device events``: an in-memory GPU whose calls and events cost nothing (the agent's
  own overhead with device timing: two events recorded and one boundary posted per op);
* ``sim, device events``: the simulated GPU, its stream's events (the default path);
* ``sim, host timing``: the pre-issue-14 path (clock requests and energy reads on the host);
* ``null``: the :class:`NullAgent`.

Each case runs with a plan whose clock changes at every op (worst case: every op posts a
change to the controller) and with a constant clock. The per-iteration event wait in
``step_end`` is not part of the per-op figure (it is once per iteration).

Question 2: the controller's clock-apply delay (request on the training thread → driver call
returned), for set-call latencies of 0 and 5 ms (the notes' median).

Usage: ``python benchmarks/agent_overhead.py [--ops 20000]``. Prints figures; no assertions.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from pathlib import Path

from perseus.device.simulated import SimulatedGPU
from perseus.plan import Baseline, Frontier, JobSpec, PlanPoint
from perseus.runtime.agent.controller import FrequencyController
from perseus.runtime.agent.rank_agent import NullAgent, RankAgent

OPS_PER_ITERATION = 64


class MemoryGPU:
    """A GPU whose every call is free: isolates the agent's own overhead."""

    uuid = "GPU-memory"
    name = "in-memory"

    def __init__(self) -> None:
        self._locked: int | None = None
        self._energy = 0

    def supported_clocks_mhz(self) -> tuple[int, ...]:
        return tuple(range(1410, 209, -15))

    def set_locked_clock(self, freq_mhz: int) -> int:
        self._locked = freq_mhz
        return freq_mhz

    def reset_locked_clock(self) -> None:
        self._locked = None

    def locked_clock_mhz(self) -> int | None:
        return self._locked

    def current_clock_mhz(self) -> int:
        return self._locked or 1410

    def energy_mj(self) -> int:
        self._energy += 1
        return self._energy

    def power_w(self) -> float:
        return 0.0


class _DoneEvent:
    """An event that has always completed (the in-memory device has no queue)."""

    __slots__ = ("_t", "energy_mj")

    def __init__(self, t: float) -> None:
        self._t = t
        self.energy_mj: int | None = 0

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def device_time_s(self) -> float:
        return self._t


class MemoryEventGPU(MemoryGPU):
    """:class:`MemoryGPU` with free device events."""

    def record_event(self) -> _DoneEvent:
        return _DoneEvent(time.perf_counter())

    def timeline_now_s(self) -> float:
        return time.perf_counter()


def _plan(alternating: bool) -> Frontier:
    ops = tuple(f"{'FB'[i % 2]}{i // 2}" for i in range(OPS_PER_ITERATION))
    freqs = tuple((1410 if i % 2 else 1095) if alternating else 1095 for i in range(len(ops)))
    job = JobSpec(
        schedule="bench",
        ranks=1,
        stages=1,
        microbatches=OPS_PER_ITERATION // 2,
        blocking_power_w=80.0,
        profile_sha256="0" * 64,
    )
    return Frontier(
        job=job,
        stage_ops=(ops,),
        baseline=Baseline(time_s=1.0, energy_j=1.0),
        points=(PlanPoint(time_s=1.0, energy_j=1.0, freqs_mhz=(freqs,)),),
    )


def _time_ops(agent: RankAgent | NullAgent, plan: Frontier, n_ops: int) -> list[float]:
    names = [(name[0], int(name[1:])) for name in plan.stage_ops[0]]
    samples: list[float] = []
    clock = time.perf_counter
    while len(samples) < n_ops:
        agent.step_begin()
        for kind, mb in names:
            t0 = clock()
            with agent.op(kind, mb):
                pass
            samples.append(clock() - t0)
        agent.step_end()
    return samples


def _baseline(n_ops: int) -> float:
    clock = time.perf_counter
    samples = []
    null = contextlib.nullcontext()
    for _ in range(n_ops):
        t0 = clock()
        with null:
            pass
        samples.append(clock() - t0)
    return statistics.median(samples)


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _agent_overhead(n_ops: int, state_dir: Path) -> None:
    base = _baseline(n_ops)
    print(f"empty `with nullcontext()`: {base * 1e6:.2f} µs (subtracted below)")
    print(f"{'case':34s} {'clocks':12s} {'median µs':>10s} {'p99 µs':>10s}")
    for alternating in (True, False):
        plan = _plan(alternating)
        label = "change/op" if alternating else "constant"

        def sim() -> SimulatedGPU:
            return SimulatedGPU.from_preset("a100", state_dir=state_dir, set_latency_s=0.0)

        cases: list[tuple[str, RankAgent | NullAgent]] = [
            (
                "memory, device events",
                RankAgent(plan, MemoryEventGPU(), 0, watchdog=False, handle_signals=False),
            ),
            ("sim, device events", RankAgent(plan, sim(), 0, handle_signals=False)),
            (
                "sim, host timing",
                RankAgent(plan, sim(), 0, handle_signals=False, timing="host"),
            ),
            ("null", NullAgent(plan, None, 0)),
        ]
        for name, agent in cases:
            with agent:
                _time_ops(agent, plan, min(n_ops, 2000))  # warm-up
                samples = [s - base for s in _time_ops(agent, plan, n_ops)]
            print(
                f"{name:34s} {label:12s} {statistics.median(samples) * 1e6:10.2f} "
                f"{_pct(samples, 0.99) * 1e6:10.2f}"
            )


def _apply_delay(state_dir: Path, requests: int) -> None:
    print(
        f"\n{'set-call latency':18s} {'applied':>8s} {'stale':>6s} {'median ms':>10s} "
        f"{'p99 ms':>8s} {'max ms':>8s}"
    )
    for latency_s in (0.0, 0.005):
        gpu = SimulatedGPU.from_preset("a100", state_dir=state_dir, set_latency_s=latency_s)
        ctl = FrequencyController(gpu)
        ctl.start()
        for i in range(requests):
            ctl.request(1095 if i % 2 else 1410)
            ctl.flush()  # one request at a time: the delay of an isolated clock change
        stats = ctl.stats()
        ctl.close()
        gpu.reset_locked_clock()
        print(
            f"{latency_s * 1e3:15.1f} ms {stats.applied:8d} {stats.skipped_stale:6d} "
            f"{stats.median_delay_s * 1e3:10.3f} {stats.p99_delay_s * 1e3:8.3f} "
            f"{stats.max_delay_s * 1e3:8.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=20_000, help="ops timed per case")
    parser.add_argument("--requests", type=int, default=200, help="clock changes timed")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="perseus-bench-") as tmp:
        _agent_overhead(args.ops, Path(tmp))
        _apply_delay(Path(tmp), args.requests)


if __name__ == "__main__":
    main()
