"""The online sweep: clock order, medians, early stop, rows, cache keys."""

from __future__ import annotations

import pytest

from perseus.errors import ConfigError
from perseus.io import load_profile
from perseus.runtime.online_profile import OnlineProfiler, profile_cache_path
from perseus.schedule import Kind


def _sweep(profiler: OnlineProfiler, truth, samples: int = 3) -> int:
    iterations = 0
    while not profiler.done:
        for s, k in profiler.sweeps:
            o = truth.op(s, k).at(profiler.clock_for(s, k))
            for _ in range(samples):
                profiler.record(s, k, o.time_s, o.energy_j)
        profiler.end_iteration()
        iterations += 1
    return iterations


def test_sweep_recovers_rows_and_stops_early_on_the_a100_profile():
    truth = load_profile("a100")
    clocks = [o.freq_mhz for o in truth.op(0, Kind.F).options]
    profiler = OnlineProfiler([(0, Kind.F), (0, Kind.B), (7, Kind.B)], clocks)
    iterations = _sweep(profiler, truth)
    counts = profiler.clocks_profiled()
    assert iterations == max(counts.values()) < len(clocks)
    for s, k, f, t, e in profiler.rows():
        ref = truth.op(s, k).at(f)
        assert (t, e) == (ref.time_s, ref.energy_j)
    # Every row the sweep skipped is slower and costlier than the cheapest row it kept.
    for (s, k), n in counts.items():
        kept = truth.op(s, k).options[:n]
        best = min(o.energy_j for o in kept)
        assert min(o.energy_j for o in truth.op(s, k).options) >= best - 1e-9


def test_median_ignores_one_delayed_sample():
    profiler = OnlineProfiler([(0, Kind.F)], [1410, 1395])
    for t in (1.0, 1.0, 5.0):
        profiler.record(0, Kind.F, t, 10.0)
    profiler.end_iteration()
    assert profiler.rows()[0][3] == 1.0


def test_no_early_stop_before_the_first_third():
    clocks = list(range(1500, 900, -15))  # 40 clocks
    profiler = OnlineProfiler([(0, Kind.F)], clocks, patience=2, min_fraction=0.5)
    for i in range(len(clocks)):
        profiler.record(0, Kind.F, 1.0, 1.0 + i)  # energy rises from the start
        profiler.end_iteration()
        if profiler.done:
            break
    assert len(profiler.rows()) == 20


def test_bad_parameters_are_config_errors():
    with pytest.raises(ConfigError):
        OnlineProfiler([(0, Kind.F)], [])
    with pytest.raises(ConfigError):
        OnlineProfiler([(0, Kind.F)], [1410], patience=0)


def test_cache_path_depends_on_every_config_field(tmp_path):
    a = profile_cache_path(tmp_path, model="m", stages=4)
    assert a == profile_cache_path(tmp_path, stages=4, model="m")
    assert a != profile_cache_path(tmp_path, model="m", stages=8)
    assert a.suffix == ".csv"
