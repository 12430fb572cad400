"""Energy from counter windows: publish detection, attribution, and the simulated counter."""

from __future__ import annotations

import itertools
import math
import random
import statistics
from pathlib import Path

import pytest

from perseus.device.clock import VirtualClock
from perseus.device.simulated import SimNoise, SimulatedGPU
from perseus.errors import ConfigError
from perseus.io import load_profile
from perseus.runtime.emulation import take_stages
from perseus.runtime.profiling.energy_attribution import OpSpan, fit_group_power, time_shares
from perseus.runtime.profiling.energy_windows import (
    CounterInterval,
    CounterSample,
    CounterSampler,
    counter_intervals,
    publish_times,
)
from perseus.schedule import Kind

F, B = (0, Kind.F), (0, Kind.B)


def _synthetic(
    powers: dict[object, float], idle_w: float, gap_w: float, period_s: float, iterations: int = 6
):
    """Iterations of F/B ops (different lengths) with bubbles inside and idle between, and the
    exact energy of each counter window: (windows, spans)."""
    rng = random.Random(1)
    spans: list[OpSpan] = []
    t = 0.0
    for it in range(iterations):
        for _ in range(4):
            for g, d in ((F, 0.031), (B, 0.057)):
                spans.append(OpSpan(g, t, t + d, it))
                t += d + rng.uniform(0.0, 0.01)  # a bubble (gap power)
        t += 0.04  # between iterations (idle power)
    end = t

    def energy(a: float, b: float) -> float:
        e = 0.0
        its: dict[int, list[float]] = {}
        for s in spans:
            e += powers[s.group] * max(0.0, min(b, s.end_s) - max(a, s.start_s))
            lo_hi = its.setdefault(s.iteration, [s.start_s, s.end_s])
            lo_hi[1] = s.end_s
        inside = sum(max(0.0, min(b, hi) - max(a, lo)) for lo, hi in its.values())
        busy = sum(max(0.0, min(b, s.end_s) - max(a, s.start_s)) for s in spans)
        return e + gap_w * (inside - busy) + idle_w * ((b - a) - inside)

    n = int(end / period_s)
    windows = [
        CounterInterval(k * period_s, (k + 1) * period_s, energy(k * period_s, (k + 1) * period_s))
        for k in range(n)
    ]
    return windows, spans


def test_attribution_recovers_exact_powers_from_synthetic_windows() -> None:
    powers = {F: 310.0, B: 455.0}
    windows, spans = _synthetic(powers, idle_w=70.0, gap_w=95.0, period_s=0.1, iterations=12)
    fit = fit_group_power(windows, spans, ridge=0.0)
    assert fit.power_w[F] == pytest.approx(310.0, rel=1e-9)
    assert fit.power_w[B] == pytest.approx(455.0, rel=1e-9)
    assert fit.gap_power_w == pytest.approx(95.0, rel=1e-6)
    # Enough windows lie wholly inside iterations: the time between them is not fitted.
    assert fit.outside_power_w == 0.0
    # The default ridge moves them little, even with a blocking-power prior (83 W) off the
    # true gap power (95 W): each window holds about one F and one B, so the pull towards
    # their mean and the prior move them by about 3 %.
    fit = fit_group_power(windows, spans, idle_power_w=83.0)
    assert fit.power_w[F] == pytest.approx(310.0, rel=0.04)
    assert fit.power_w[B] == pytest.approx(455.0, rel=0.04)


def test_what_runs_between_iterations_does_not_move_the_op_powers() -> None:
    """Between iterations the device runs whatever the host does (an optimizer step, a
    stalled process): windows touching that time are left out when enough lie inside."""
    powers = {F: 310.0, B: 455.0}
    windows, spans = _synthetic(powers, idle_w=70.0, gap_w=95.0, period_s=0.1, iterations=12)
    bounds: dict[int, list[float]] = {}
    for x in spans:
        lo_hi = bounds.setdefault(x.iteration, [x.start_s, x.end_s])
        lo_hi[1] = x.end_s
    env = sorted(bounds.values())
    rng = random.Random(7)
    noisy = []
    for w in windows:
        inside = sum(max(0.0, min(w.end_s, hi) - max(w.start_s, lo)) for lo, hi in env)
        outside = (w.end_s - w.start_s) - inside
        extra_w = rng.uniform(0.0, 900.0)  # an optimizer step here, nothing there
        noisy.append(CounterInterval(w.start_s, w.end_s, w.energy_j + extra_w * outside))
    fit = fit_group_power(noisy, spans, ridge=0.0)
    assert fit.power_w[F] == pytest.approx(310.0, rel=0.01)
    assert fit.power_w[B] == pytest.approx(455.0, rel=0.01)


def test_attribution_with_swapped_ops_is_far_off() -> None:
    """The check above can fail: label every F as B and vice versa and the fit is far off."""
    windows, spans = _synthetic({F: 310.0, B: 455.0}, idle_w=70.0, gap_w=95.0, period_s=0.1)
    swapped = [OpSpan(B if s.group == F else F, s.start_s, s.end_s, s.iteration) for s in spans]
    fit = fit_group_power(windows, swapped, ridge=0.0)
    assert abs(fit.power_w[F] / 310.0 - 1) > 0.2
    assert abs(fit.power_w[B] / 455.0 - 1) > 0.2


def test_indistinguishable_groups_share_the_energy_by_time() -> None:
    """Ops much shorter than a window: every window holds F and B in the same proportion, so
    their powers cannot be told apart; the ridge gives both the mean and the total holds."""
    spans = []
    t = 0.0
    for _ in range(400):
        spans.append(OpSpan(F, t, t + 0.001))
        spans.append(OpSpan(B, t + 0.001, t + 0.003))
        t += 0.003
    windows = [
        CounterInterval(k * 0.1, (k + 1) * 0.1, 0.1 / 3 * 300 + 0.2 / 3 * 450) for k in range(12)
    ]
    fit = fit_group_power(windows, spans)
    total = sum(fit.power_w[s.group] * (s.end_s - s.start_s) for s in spans if s.end_s <= 1.2)
    assert total == pytest.approx(sum(w.energy_j for w in windows), rel=0.01)
    assert fit.power_w[F] == pytest.approx(fit.power_w[B], rel=0.05)


def test_time_shares_of_a_samplers_windows_touch_only_the_overlapping_pairs() -> None:
    """A step of 200 iterations of 64 ops over 2,000 windows: every (window, span) pair made a
    25.6M-cell matrix per iteration (0.2 GB; 2.5 GB at the sampler's 25,000 windows). Windows
    in time order are searched per span; in another order every pair still counts, alike."""
    import tracemalloc

    import numpy as np

    windows = [CounterInterval(0.1 * k, 0.1 * (k + 1), 1.0) for k in range(2000)]
    spans = [
        OpSpan(k % 8, i + (k + 0.1) / 64, i + (k + 0.9) / 64, i)
        for i in range(200)
        for k in range(64)
    ]
    tracemalloc.start()
    try:
        groups, shares = time_shares(windows, spans)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * len(windows) * len(spans) / 20  # far below one dense matrix
    assert groups == list(range(8)) and shares.shape == (2000, 10)
    assert shares.sum() == pytest.approx(200.0)  # every second of the windows, once
    order = list(range(0, 40, 2)) + list(range(1, 40, 2))  # not in time order: every pair
    few = [s for s in spans if s.iteration < 4]
    _, sorted_shares = time_shares(windows[:40], few)
    _, shuffled = time_shares([windows[k] for k in order], few)
    np.testing.assert_array_equal(shuffled, sorted_shares[order])


def test_publish_instants_snap_to_the_grid_and_fall_back_to_bracket_middles() -> None:
    rng = random.Random(0)
    period, phase = 0.1, 0.0373
    samples, t, k = [], 0.0, 0
    while t < 3.0:
        before = t
        after = t + rng.uniform(0.0005, 0.003)  # a read takes 0.5-3 ms (NVML: ~3 ms)
        # the counter as of some instant inside the read
        r = rng.uniform(before, after)
        samples.append(CounterSample(before, after, 1000 * math.floor((r - phase) / period)))
        t += 0.0125 + rng.uniform(-0.004, 0.004)
        k += 1
    windows = counter_intervals(samples)
    assert len(windows) >= 25
    for w in windows:
        assert (w.start_s - phase) / period == pytest.approx(
            round((w.start_s - phase) / period), abs=0.02
        )
        assert w.energy_j == pytest.approx(1.0 * round(w.length_s / period))
    # Irregular publishes: no grid fits, the middles of the brackets are used.
    brackets = [(x, x + 0.01) for x in (0.0, 0.1, 0.23, 0.3, 0.47, 0.5)]
    assert publish_times(brackets) == [x + 0.005 for x, _ in brackets]


def test_sampler_thread_reads_and_rejects_a_bad_period() -> None:
    values = iter(range(10**6))
    sampler = CounterSampler(lambda: next(values), lambda: 0.0, period_s=0.001)
    with sampler:
        while len(sampler.samples()) < 5:
            pass
    assert not sampler.running
    with pytest.raises(ConfigError):
        CounterSampler(lambda: 0, lambda: 0.0, period_s=0.0)


def test_sampler_on_a_virtual_clock_reads_at_its_due_times_without_a_thread() -> None:
    """On a virtual clock the reads are the clock's timer: each at its due virtual time as
    the sleeps pass it (no thread racing the training thread), and close() stops them."""
    import threading

    clock = VirtualClock(10.0)
    threads = threading.active_count()
    sampler = CounterSampler(lambda: 7, clock.now, period_s=0.01, clock=clock)
    with sampler:
        assert sampler.running and threading.active_count() == threads
        assert sampler.samples() == []  # nothing before the first period passed
        for _ in range(100):
            clock.sleep(0.01)
    reads = sampler.samples()
    assert not sampler.running and 99 <= len(reads) <= 101
    times = [r.before_s for r in reads]
    assert all(r.after_s == r.before_s and r.energy_mj == 7 for r in reads)
    assert times[0] > 10.0 and times[-1] <= 11.0
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) >= 0.5 * 0.01 - 1e-12 and max(gaps) <= 1.5 * 0.01 + 1e-12
    clock.sleep(1.0)
    assert len(sampler.samples()) == len(reads)  # stopped


def test_simulated_counter_windows_recover_op_energy_at_nvml_granularity(tmp_path: Path) -> None:
    """The real simulated GPU on a virtual clock: counter published every 100 ms, noise and a
    5 % gain error on, ops of 45-100 ms (the bundled A100 profile, unscaled) with host gaps,
    the counter read every 12.5 ms. Energies come out within 2 % of the gain times the truth;
    the old per-op counter stamps are 0 J or whole 100 ms steps."""
    truth = take_stages(load_profile("a100"), 1)
    clock = VirtualClock(100.0)
    gpu = SimulatedGPU.from_profile(
        truth,
        blocking_power_w=83.64,
        state_dir=tmp_path,
        set_latency_s=0.0,
        publish_interval_s=0.1,
        noise=SimNoise(seed=3, counter_gain=0.95),
        clock=clock,
    )
    sampler = CounterSampler(gpu.energy_mj, gpu.timeline_now_s, period_s=0.0125)
    rng = random.Random(2)
    spans, stamps = [], []
    next_read = clock.now()
    for i in range(40):
        kind = Kind.F if i % 2 == 0 else Kind.B
        gpu.backdate(0.0)
        start = gpu.record_event()
        gpu.launch(0, kind)
        end = gpu.record_event()
        while not end.query():  # the host waits for the op (virtual time), the sampler reads
            clock.advance(next_read - clock.now())
            sampler.sample()
            next_read += 0.0125 + rng.uniform(-0.003, 0.003)  # thread wake-up jitter
        spans.append(OpSpan((0, kind), start.device_time_s(), end.device_time_s()))
        assert start.energy_mj is not None and end.energy_mj is not None
        stamps.append((kind, (end.energy_mj - start.energy_mj) / 1000.0))
        clock.advance(rng.uniform(0.0, 0.004))  # host work between ops (the next op is backdated)
    windows = sampler.intervals(spans[0].start_s, spans[-1].end_s)
    assert len(windows) >= 25  # 40 ops of 45-100 ms
    assert statistics.median(w.length_s for w in windows) == pytest.approx(0.1, rel=1e-3)
    fit = fit_group_power(windows, spans, idle_power_w=83.64)
    for kind in (Kind.F, Kind.B):
        t = statistics.median(s.end_s - s.start_s for s in spans if s.group == (0, kind))
        ref = truth.op(0, kind).at(1410)
        assert fit.power_w[(0, kind)] * t == pytest.approx(0.95 * ref.energy_j, rel=0.02)
        # The per-op stamps: nothing like the op's energy.
        off = [abs(e / (0.95 * ref.energy_j) - 1) for k, e in stamps if k == kind]
        assert statistics.median(off) > 0.3


def test_a_step_does_not_wait_for_a_counter_that_cannot_be_read() -> None:
    from perseus.errors import DeviceError
    from perseus.runtime.profiling.energy_attribution import SweepWindow

    def broken() -> int:
        raise DeviceError("NOT_SUPPORTED")

    sampler = CounterSampler(broken, lambda: 0.0, period_s=0.01)
    assert sampler.sample() is None and sampler.errors == 1
    step = SweepWindow(sampler)
    step.add_iteration([OpSpan(F, 0.0, 0.1), OpSpan(B, 0.1, 0.3)])
    assert step.ready() and step.fit() is None


def test_unequal_op_powers_and_a_counter_gain_error_leave_every_op_power_within_1_percent() -> None:
    """Forward and backward at different powers, the counter reading 95 % of the true energy
    (an A100's sensor gain) and the bubbles' prior at the nominal blocking power: the ridge
    and priors must not pull the ops (0.01 moved forward 2.5 % towards backward). Every op
    power is within 1 % of gain x the truth."""
    gain = 0.95
    powers = {F: 300.0, B: 420.0}
    windows, spans = _synthetic(powers, idle_w=83.64, gap_w=83.64, period_s=0.1, iterations=12)
    scaled = [CounterInterval(w.start_s, w.end_s, gain * w.energy_j) for w in windows]
    fit = fit_group_power(scaled, spans, idle_power_w=83.64)
    for g, p in powers.items():
        assert fit.power_w[g] == pytest.approx(gain * p, rel=0.01), (g, fit.power_w[g])


def test_sampler_reads_sweep_every_phase_of_the_publish_period() -> None:
    """Reads at a fixed period that divides the publish period meet every publish at the same
    phase, so the publish grid is never located better than one read period (a few ms off
    moved energy between ops on virtual time); dithered reads cover all phases."""
    sampler = CounterSampler(lambda: 0, lambda: 0.0, period_s=0.0125)
    t, phases = 0.0, set()
    waits = []
    for _ in range(400):
        wait = sampler.next_period_s()
        waits.append(wait)
        t += wait
        phases.add(int((t % 0.0125) / 0.0125 * 10))
    assert phases == set(range(10))
    assert statistics.fmean(waits) == pytest.approx(0.0125, rel=0.02)
    assert min(waits) >= 0.5 * 0.0125 and max(waits) <= 1.5 * 0.0125


def test_the_fit_says_when_two_groups_cannot_be_told_apart() -> None:
    """Groups always in the same proportion in every window: their split is unknowable, and
    the fit's standard error says so (a check_fit refusal instead of a silent guess)."""
    windows, spans = _synthetic({F: 300.0, B: 420.0}, 83.64, 83.64, 0.1, iterations=12)
    good = fit_group_power(windows, spans, idle_power_w=83.64)
    assert good.worst_relative_error() < 0.02
    merged = [OpSpan(s.group, s.start_s, s.end_s, s.iteration) for s in spans]
    # Windows ten iterations long hold F and B in nearly the same proportion.
    long = [
        CounterInterval(
            windows[k].start_s, windows[k + 9].end_s, sum(w.energy_j for w in windows[k : k + 10])
        )
        for k in range(0, len(windows) - 10, 10)
    ]
    poor = fit_group_power(long, merged, idle_power_w=83.64)
    assert poor.worst_relative_error() > good.worst_relative_error()


def test_a_step_fits_once_per_iteration_and_fit_returns_what_ready_judged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ready() builds the windows and their shares once and fits once, and the session's fit()
    that follows returns that fit: each of these is O(windows x spans), and a step's spans
    grow with its iterations (up to 200), so every extra one ran on the training thread at
    every iteration (3 windows, 3 shares, 2 fits per iteration before)."""
    from perseus.runtime.profiling import energy_attribution
    from perseus.runtime.profiling.energy_attribution import SweepWindow

    powers = {F: 300.0, B: 420.0}
    windows, spans = _synthetic(powers, idle_w=83.64, gap_w=83.64, period_s=0.1, iterations=12)
    total = [0.0]
    now = [0.0]
    edges = iter(windows)
    nxt = next(edges)

    def read() -> int:  # the counter as published at the end of each window
        nonlocal nxt
        while nxt is not None and nxt.end_s <= now[0]:
            total[0] += nxt.energy_j
            nxt = next(edges, None)
        return int(total[0] * 1000)

    sampler = CounterSampler(read, lambda: now[0], period_s=0.0125)
    t = 0.0
    while t < windows[-1].end_s:
        now[0] = t
        sampler.sample()
        t += sampler.next_period_s()
    step = SweepWindow(sampler, max_fit_error=math.inf, idle_power_w=83.64)
    for it in range(12):
        step.add_iteration([s for s in spans if s.iteration == it])
    calls = {"shares": 0, "windows": 0}
    real_shares, real_windows = energy_attribution.time_shares, sampler.intervals

    def shares(*args, **kwargs):
        calls["shares"] += 1
        return real_shares(*args, **kwargs)

    def counted(*args, **kwargs):
        calls["windows"] += 1
        return real_windows(*args, **kwargs)

    monkeypatch.setattr(energy_attribution, "time_shares", shares)
    monkeypatch.setattr(sampler, "intervals", counted)
    assert step.ready()
    fit = step.fit()
    assert calls == {"shares": 1, "windows": 1}
    assert fit is not None and fit.intervals >= 20
    again = fit_group_power(step.intervals(), step.spans, idle_power_w=83.64)
    assert fit == again  # the same fit as computed afresh
    step.add_iteration([])  # a new iteration: fit() no longer returns the judged one
    assert step.fit() is not fit
    step.reset()
    assert step.fit() is None


def test_publish_times_searches_a_bounded_number_of_brackets_with_the_same_estimates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The period search evaluated 2251 candidate phases for every bracket the step had kept,
    on the training thread at each sweep iteration: ~0.2 s per call late in a long step on
    an H100's 100 ms counter (0.9 GB for the sampler's 200,000 reads before it went by blocks).
    It looks at the first 128 narrow brackets whatever the count, and a line fit labels the
    rest: the same estimates as the search over them all, to the bit; with stalled reads
    (wide brackets, left out of the search), too."""
    import numpy as np

    from perseus.runtime.profiling import energy_windows

    def brackets(count: int, seed: int) -> list[tuple[float, float]]:
        rng = random.Random(seed)
        out = []
        for k in range(count):
            t = 0.1 * k + 0.0371
            stall = 0.08 if rng.random() < 0.02 else 0.0  # a delayed read
            out.append((t - rng.uniform(0.001, 0.012) - stall, t + rng.uniform(0.0, 0.012)))
        return out

    real_exp = np.exp
    work = {"phases": 0, "largest": 0}

    def exp(x, *args, **kwargs):
        work["phases"] += np.size(x)
        work["largest"] = max(work["largest"], np.size(x))
        return real_exp(x, *args, **kwargs)

    for count in (300, 3000):
        work.update(phases=0, largest=0)
        data = brackets(count, count)
        monkeypatch.setattr(energy_windows.np, "exp", exp)
        got = publish_times(data)
        monkeypatch.undo()
        assert work["phases"] <= 2251 * 128  # 2251 x the narrow brackets before
        assert work["largest"] <= 2**20
        # The search over every narrow bracket (the estimates before).
        monkeypatch.setattr(energy_windows, "_SEARCH_BRACKETS", 10**9, raising=False)
        whole = publish_times(data)
        monkeypatch.undo()
        assert got == whole
        assert got != [0.5 * (lo + hi) for lo, hi in data]  # a grid was fitted
