"""Where does the agent's training-thread time per op go on a real GPU? (observe-only)

``gpu_session.py`` measured ~114 µs of training-thread time per ``session.op`` on an H100
against ~2 µs on the simulated GPU. This script takes the cost apart, on one CUDA device, with
a matmul chain keeping the GPU busy between ops (as training does), in one process:

* ``event``: ``torch.cuda.Event(enable_timing=True)`` + ``record`` on the current stream;
* the same while another Python thread polls ``event.query()`` every 200 µs / 2 ms (the
  controller's old and new polling), or blocks in ``event.synchronize()``;
* ``agent.op`` (enter + exit) through :class:`~perseus.runtime.agent.rank_agent.RankAgent` on
  ``NvmlGPU(control=False)`` (no NVML set or reset call is made): the real path;
* the iteration's NVML counter reads (``energy_mj``) on the training thread.

    python benchmarks/gpu_overhead.py [--ops 2000] [--d-model 4096]

Prints median and p99 per case; no assertions. Needs a GPU with CUDA and NVML.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

from _gpu_common import TransformerOps, one_clock_plan

from perseus.device.base import ObserveOnlyWarning
from perseus.device.nvml import NvmlGPU
from perseus.plan import Frontier
from perseus.runtime.agent import controller as controller_mod
from perseus.runtime.agent.rank_agent import RankAgent
from perseus.schedule import build_schedule


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _plan(n_ops: int, clock_mhz: int) -> Frontier:
    return one_clock_plan(build_schedule("1f1b", 1, n_ops // 2), clock_mhz)


class _Poller:
    """A thread that polls the newest event like the controller does."""

    def __init__(self, mode: str, period_s: float) -> None:
        self.mode = mode
        self.period_s = period_s
        self.latest: Any = None
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Poller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop = True
        self._thread.join()

    def _run(self) -> None:
        while not self._stop:
            event = self.latest
            if event is None:
                time.sleep(self.period_s)
                continue
            if self.mode == "sync":
                event.synchronize()
                time.sleep(0.0001)
            else:
                while not self._stop and not event.query():
                    time.sleep(self.period_s)
                time.sleep(self.period_s)


def _layer_cases(torch: Any, gpu: NvmlGPU, rows: list[tuple[str, list[float]]], args: Any) -> None:
    """gpu_session.py's setting: a bf16 transformer layer, 1F1B, 8 microbatches; the
    training-thread time of entering and leaving the op scope, three ways."""
    from perseus.runtime.session import RankSession, SessionOptions

    n_mb = 8
    layer = TransformerOps(2048, 1024, n_mb)
    schedule = build_schedule("1f1b", 1, n_mb)
    actions = schedule.rank_actions[0]

    def run_op(action: Any) -> None:
        layer.run(action.kind, action.microbatch_index)

    class _Events:
        def __init__(self) -> None:
            self.start: Any = None

        def __enter__(self) -> None:
            self.start = torch.cuda.Event(enable_timing=True)
            self.start.record()

        def __exit__(self, *exc: object) -> None:
            torch.cuda.Event(enable_timing=True).record()

    def loop(name: str, scope_for: Callable[[Any], Any], begin: Any, end: Any) -> None:
        samples: list[float] = []
        for it in range(12):
            begin()
            for action in actions:
                scope = scope_for(action)
                t0 = time.perf_counter()
                scope.__enter__()
                t1 = time.perf_counter()
                run_op(action)
                t2 = time.perf_counter()
                scope.__exit__(None, None, None)
                t3 = time.perf_counter()
                if it >= 2:
                    samples.append(((t1 - t0) + (t3 - t2)) * 1e6)
            end()
        rows.append((f"layer d=2048: {name}", samples))

    events = _Events()
    loop("a CUDA event pair, no agent", lambda a: events, lambda: None, torch.cuda.synchronize)
    plan = _plan(2 * n_mb, max(gpu.supported_clocks_mhz()))
    for variant in ("", "controller gets no jobs", "POLL_S 2 ms", "no controller thread"):
        saved = controller_mod.POLL_S
        if variant == "POLL_S 2 ms":
            controller_mod.POLL_S = 0.002
        try:
            with RankAgent(plan, gpu, 0, watchdog=False, handle_signals=False) as agent:
                ctl = agent.controller
                if variant == "controller gets no jobs" and ctl is not None:
                    ctl.post = lambda job: None  # type: ignore[method-assign]
                if variant == "no controller thread" and ctl is not None:
                    ctl.close()
                    ctl.post = lambda job: None  # type: ignore[method-assign]
                loop(
                    f"agent.op {variant}".strip(),
                    lambda a: agent.op(a.kind, a.microbatch_index),
                    agent.step_begin,
                    agent.step_end,
                )
        finally:
            controller_mod.POLL_S = saved
    with RankSession(
        schedule,
        0,
        gpu=gpu,
        plan=plan,
        options=SessionOptions(blocking_power_w=75.0, watchdog=False, handle_signals=False),
    ) as session:
        holder: list[Any] = []

        def begin() -> None:
            holder.append(session.iteration())
            holder[-1].__enter__()

        def end() -> None:
            holder.pop().__exit__(None, None, None)

        loop("RankSession.op", session.op, begin, end)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ops", type=int, default=2000)
    p.add_argument("--d-model", type=int, default=4096)
    p.add_argument("--matmuls", type=int, default=4, help="matmuls launched per op")
    args = p.parse_args()

    import torch

    warnings.simplefilter("ignore", ObserveOnlyWarning)
    torch.cuda.set_device(0)
    device = torch.device("cuda", 0)
    a = torch.randn(args.d_model, args.d_model, device=device, dtype=torch.bfloat16)
    stream = torch.cuda.current_stream(device)

    def work() -> None:
        x = a
        for _ in range(args.matmuls):
            x = x @ a

    # Device time of one op's work, for scale.
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(20):
        work()
    s.record(stream)
    for _ in range(100):
        work()
    e.record(stream)
    e.synchronize()
    op_ms = s.elapsed_time(e) / 100
    # Host launch time of one op's work.
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(100):
        work()
    launch_us = (time.perf_counter() - t0) / 100 * 1e6
    torch.cuda.synchronize()
    print(
        f"GPU: {torch.cuda.get_device_name(0)}; torch {torch.__version__}; op = {args.matmuls} "
        f"bf16 matmuls of {args.d_model}: {op_ms:.3f} ms on the device, {launch_us:.1f} us to launch"
    )
    rows: list[tuple[str, list[float]]] = []

    def timed(name: str, body: Callable[[], Any], poller: _Poller | None = None) -> None:
        samples: list[float] = []
        for i in range(args.ops):
            work()
            t0 = time.perf_counter()
            out = body()
            samples.append((time.perf_counter() - t0) * 1e6)
            if poller is not None and out is not None:
                poller.latest = out
            if i % 64 == 63:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
        rows.append((name, samples))

    def record() -> Any:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(torch.cuda.current_stream(device))
        return ev

    def record_no_stream_lookup() -> Any:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(stream)
        return ev

    pool = [torch.cuda.Event(enable_timing=True) for _ in range(256)]
    for ev in pool:
        ev.record(stream)
    torch.cuda.synchronize()
    cursor = [0]

    def record_pooled() -> Any:
        ev = pool[cursor[0] % len(pool)]
        cursor[0] += 1
        ev.record(stream)
        return None

    def record_default() -> Any:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    timed("nothing (perf_counter pair)", lambda: None)
    timed("event create + record() (no stream argument)", record_default)
    timed("pooled event re-record (stream cached)", record_pooled)
    timed("event create + record (current_stream lookup)", record)
    timed("event create + record (stream cached)", record_no_stream_lookup)
    for period in (0.0002, 0.002):
        with _Poller("query", period) as poller:
            timed(
                f"event + record, a thread polls query() every {period * 1e6:.0f} us",
                record,
                poller,
            )
    with _Poller("sync", 0.0) as poller:
        timed("event + record, a thread blocks in synchronize()", record, poller)

    gpu = NvmlGPU.for_cuda_device(0, control=False)
    gpu.supported_clocks_mhz()  # opens the NVML device
    reads: list[float] = []
    for _ in range(50):
        t0 = time.perf_counter()
        gpu.energy_mj()
        reads.append((time.perf_counter() - t0) * 1e6)
    rows.append(("NVML energy_mj() read", reads))

    plan = _plan(64, max(gpu.supported_clocks_mhz()))
    ops = plan.stage_ops[0]
    for poll_s in (controller_mod.POLL_S, 0.002):
        saved = controller_mod.POLL_S
        controller_mod.POLL_S = poll_s
        samples: list[float] = []
        step_us: list[float] = []
        try:
            with RankAgent(plan, gpu, 0, watchdog=False, handle_signals=False) as agent:
                done = 0
                while done < args.ops:
                    t0 = time.perf_counter()
                    agent.step_begin()
                    step_us.append((time.perf_counter() - t0) * 1e6)
                    for name in ops:
                        scope = agent.op(name[0], int(name[1:]))
                        t0 = time.perf_counter()
                        scope.__enter__()
                        t1 = time.perf_counter()
                        work()
                        t2 = time.perf_counter()
                        scope.__exit__(None, None, None)
                        t3 = time.perf_counter()
                        samples.append(((t1 - t0) + (t3 - t2)) * 1e6)
                        done += 1
                    t0 = time.perf_counter()
                    agent.step_end()
                    step_us.append((time.perf_counter() - t0) * 1e6)
        finally:
            controller_mod.POLL_S = saved
        rows.append((f"agent.op enter+exit, controller POLL_S {poll_s * 1e6:.0f} us", samples))
        rows.append((f"  step_begin / step_end (each), POLL_S {poll_s * 1e6:.0f} us", step_us))

    _layer_cases(torch, gpu, rows, args)

    width = max(len(n) for n, _ in rows)
    print(f"{'case':<{width}}  {'median us':>10}  {'p99 us':>10}  {'n':>6}")
    for name, samples in rows:
        print(
            f"{name:<{width}}  {statistics.median(samples):>10.1f}  {_pct(samples, 0.99):>10.1f}  "
            f"{len(samples):>6}"
        )
    print(f"locked clock after all: {gpu.locked_clock_mhz()} (None: never locked)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
