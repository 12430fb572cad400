"""The simulated GPU: exact profile costs, the notes' A100 table, counter publishing, power cap,
shared out-of-process state and injected errors."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import os
from pathlib import Path

import pytest

from perseus.device.base import GPU, ManagedGPU
from perseus.device.clock import VirtualClock
from perseus.device.presets import PRESETS, get_preset
from perseus.device.sim_costs import profile_costs
from perseus.device.simulated import SimNoise, SimulatedGPU
from perseus.errors import ConfigError, DeviceError, DeviceLostError, DevicePermissionError
from perseus.io import load_profile
from perseus.profile import build_profile
from perseus.schedule import Kind

# notes §4.2: f -> (power W, t/t(1410), E/E(1410)), A100 SXM GPT-3 stages (500 W board).
A100_TABLE = {
    1410: (476, 1.000, 1.000),
    1395: (474, 1.001, 0.998),
    1350: (454, 1.011, 0.965),
    1305: (426, 1.035, 0.928),
    1260: (386, 1.066, 0.865),
    1215: (354, 1.100, 0.819),
    1170: (326, 1.139, 0.780),
    1125: (306, 1.180, 0.759),
    1080: (283, 1.227, 0.730),
    1035: (275, 1.276, 0.737),
    990: (265, 1.332, 0.742),
    945: (253, 1.395, 0.743),
    900: (246, 1.452, 0.750),
    855: (236, 1.531, 0.760),
}


def _from_profile(tmp_path: Path, clock: VirtualClock, **kwargs: object) -> SimulatedGPU:
    return SimulatedGPU.from_profile(
        load_profile("a100"),
        blocking_power_w=83.64,
        state_dir=tmp_path,
        publish_interval_s=0.0,
        set_latency_s=0.0,
        clock=clock,
        **kwargs,  # type: ignore[arg-type]
    )


def test_implements_protocols(tmp_path: Path) -> None:
    gpu = SimulatedGPU.from_preset("a100", state_dir=tmp_path)
    assert isinstance(gpu, GPU)
    assert isinstance(gpu, ManagedGPU)
    assert gpu.uuid.startswith("GPU-")
    assert not list(tmp_path.iterdir()), "constructor must not touch the state dir"


def test_profile_gpu_costs_exactly_the_profile_at_every_clock(tmp_path: Path) -> None:
    profile = load_profile("a100")
    clock = VirtualClock(1000.0)
    gpu = _from_profile(tmp_path, clock)
    clocks = sorted({o.freq_mhz for op in profile.ops.values() for o in op.options}, reverse=True)
    assert gpu.supported_clocks_mhz() == tuple(clocks)
    for (stage, kind), op in profile.ops.items():
        for i, option in enumerate(op.options):
            gpu.set_locked_clock(option.freq_mhz)
            assert gpu.op_cost(stage, kind) == (option.time_s, option.energy_j)
            if i % 4:
                continue  # the stream path below on a quarter of the clocks
            before = gpu.exact_energy_j()
            start = gpu.record_event()
            gpu.launch(stage, kind)
            end = gpu.record_event()
            assert not end.query()  # the launch returned at once; the device runs it later
            assert gpu.current_clock_mhz() == option.freq_mhz
            clock.advance(option.time_s)
            assert end.query()
            assert end.device_time_s() - start.device_time_s() == pytest.approx(option.time_s)
            assert gpu.exact_energy_j() - before == pytest.approx(option.energy_j, rel=1e-9)
            assert gpu.energy_mj() == math.floor(gpu.exact_energy_j() * 1000)


def test_idle_device_draws_blocking_power(tmp_path: Path) -> None:
    clock = VirtualClock(1000.0)
    gpu = _from_profile(tmp_path, clock)
    gpu.set_locked_clock(1410)
    before = gpu.exact_energy_j()
    gpu.launch(0, Kind.F)
    duration, energy = gpu.op_cost(0, Kind.F)
    assert gpu.power_w() == pytest.approx(energy / duration)
    clock.advance(duration + 0.5)
    assert gpu.power_w() == pytest.approx(83.64)
    assert gpu.exact_energy_j() - before == pytest.approx(energy + 83.64 * 0.5)


def test_queued_ops_run_back_to_back_and_events_mark_the_stream(tmp_path: Path) -> None:
    clock = VirtualClock(1000.0)
    gpu = _from_profile(tmp_path, clock)
    gpu.set_locked_clock(1410)
    t_f, _ = gpu.op_cost(0, Kind.F)
    t_b, _ = gpu.op_cost(0, Kind.B)
    start = gpu.record_event()
    gpu.launch(0, Kind.F)
    middle = gpu.record_event()
    gpu.launch(0, Kind.B)
    end = gpu.record_event()
    clock.advance(t_f + t_b)
    assert middle.device_time_s() - start.device_time_s() == pytest.approx(t_f)
    assert end.device_time_s() - middle.device_time_s() == pytest.approx(t_b)


@pytest.mark.parametrize("parts", [False, True], ids=["whole", "in-parts"])
def test_an_op_spanning_a_clock_change_is_priced_piece_by_piece(
    tmp_path: Path, parts: bool
) -> None:
    """Half an op's work at 1410 MHz, the rest at 1095 MHz: launched whole, the clock changed
    at its middle; or launched in parts as emulation does (the host late, the clock changed
    meanwhile, the rest backdated to the first part's end): one op either way."""
    clock = VirtualClock(1000.0)
    gpu = _from_profile(tmp_path, clock, trace_ops=True)
    gpu.set_locked_clock(1095)
    slow_t, slow_e = gpu.op_cost(0, Kind.F)
    gpu.set_locked_clock(1410)
    fast_t, fast_e = gpu.op_cost(0, Kind.F)
    before, t0 = gpu.exact_energy_j(), clock.now()
    start = gpu.record_event()
    gpu.launch(0, Kind.F, until=0.5 if parts else 1.0)
    if parts:
        clock.advance(fast_t)  # the host gets back long after the first half ended
        gpu.set_locked_clock(1095)
        gpu.backdate(0.0)
        gpu.launch(0, Kind.F)
    end = gpu.record_event()
    if not parts:
        clock.advance(fast_t / 2)  # half the work at 1410 MHz ...
        gpu.set_locked_clock(1095)  # ... the rest at 1095 MHz
    clock.advance(10.0)
    op_t, op_e = fast_t / 2 + slow_t / 2, fast_e / 2 + slow_e / 2
    assert end.device_time_s() - start.device_time_s() == pytest.approx(op_t)
    idle_j = 83.64 * (clock.now() - t0 - op_t)
    assert gpu.exact_energy_j() - before == pytest.approx(op_e + idle_j)
    (trace,) = gpu.op_trace
    assert [c for c, _ in trace.pieces] == [1410, 1095]
    assert [t for _, t in trace.pieces] == pytest.approx([fast_t / 2, slow_t / 2])


def test_an_op_launched_in_parts_draws_its_noise_once(tmp_path: Path) -> None:
    def time_s(path: Path, parts: tuple[float, ...]) -> float:
        clock = VirtualClock(1000.0)
        gpu = _from_profile(path, clock, noise=SimNoise(seed=7))
        start = gpu.record_event()
        for until in parts:
            gpu.launch(0, Kind.F, until=until)
        end = gpu.record_event()
        clock.advance(1.0)
        return end.device_time_s() - start.device_time_s()

    assert time_s(tmp_path / "parts", (0.25, 1.0)) == pytest.approx(
        time_s(tmp_path / "whole", (1.0,))
    )


def test_noise_is_seeded_and_the_blocking_power_is_off_by_a_seeded_error(tmp_path: Path) -> None:
    def run(seed: int) -> tuple[float, float]:
        clock = VirtualClock(1000.0)
        gpu = _from_profile(tmp_path / str(seed), clock, noise=SimNoise(seed=seed))
        start = gpu.record_event()
        gpu.launch(0, Kind.F)
        end = gpu.record_event()
        clock.advance(1.0)
        return end.device_time_s() - start.device_time_s(), gpu.true_blocking_power_w

    nominal = load_profile("a100").op(0, Kind.F).options[0].time_s
    (t1, p1), (t1b, p1b), (t2, _) = run(1), run(1), run(2)
    assert (t1, p1) == (t1b, p1b)  # seeded
    assert t1 != t2 and t1 != nominal and abs(t1 / nominal - 1) < 0.05
    assert p1 != 83.64 and abs(p1 / 83.64 - 1) <= 0.02


@pytest.mark.parametrize("freq", sorted(A100_TABLE))
def test_a100_preset_reproduces_the_notes_table(tmp_path: Path, freq: int) -> None:
    preset = get_preset("a100-500w")
    power_w, t_ratio, e_ratio = A100_TABLE[freq]
    assert preset.power.compute_power_w(freq, 1.0) == pytest.approx(power_w, rel=0.05)
    gpu = SimulatedGPU.from_preset(
        "a100-500w", state_dir=tmp_path, set_latency_s=0.0, clock=VirtualClock(1000.0)
    )
    gpu.set_locked_clock(1410)
    t0, e0 = gpu.op_cost(0, Kind.F)
    gpu.set_locked_clock(freq)
    t, e = gpu.op_cost(0, Kind.F)
    assert t / t0 == pytest.approx(t_ratio, rel=0.05)
    assert e / e0 == pytest.approx(e_ratio, rel=0.05)


def test_a100_energy_minimum_near_the_knee(tmp_path: Path) -> None:
    gpu = SimulatedGPU.from_preset(
        "a100-500w", state_dir=tmp_path, set_latency_s=0.0, clock=VirtualClock(1000.0)
    )
    energies = {}
    for f in range(855, 1411, 15):
        gpu.set_locked_clock(f)
        energies[f] = gpu.op_cost(0, Kind.B)[1]
    best = min(energies, key=energies.__getitem__)
    assert 1035 <= best <= 1110
    assert energies[best] / energies[1410] == pytest.approx(0.73, abs=0.02)


def test_counter_moves_only_in_publish_steps(tmp_path: Path) -> None:
    clock = VirtualClock(2000.0)
    gpu = SimulatedGPU.from_preset(
        "a100", state_dir=tmp_path, set_latency_s=0.0, publish_interval_s=0.1, clock=clock
    )
    gpu.set_locked_clock(1095)
    seen: list[tuple[float, int]] = []
    for step in range(60):  # 600 ms in 10 ms steps, with ops queued in between
        if step % 7 == 0:
            gpu.launch(0, Kind.F)
        seen.append((clock.now(), gpu.energy_mj()))
        clock.advance(0.01)
    changes = [t for (t, e), (_, prev) in zip(seen[1:], seen, strict=False) if e != prev]
    assert len(changes) >= 5
    for t in changes:  # every change happens in the first 10 ms step after a 100 ms tick
        assert (t + 1e-9) % 0.1 < 0.01 + 1e-6
    # Between changes the value is frozen even though the exact integral grows.
    assert gpu.exact_energy_j() * 1000 > gpu.energy_mj()


def test_counter_is_the_floor_of_the_integral_at_the_tick(tmp_path: Path) -> None:
    clock = VirtualClock(3000.0)
    gpu = SimulatedGPU.from_preset(
        "a100", state_dir=tmp_path, set_latency_s=0.0, publish_interval_s=0.1, clock=clock
    )
    gpu.energy_mj()  # create the state at t = 3000.0
    clock.advance(0.25)  # to 3000.25
    # Idle all along: blocking power from 3000.0 to the tick at 3000.2.
    assert gpu.energy_mj() == math.floor(83.64 * 0.2 * 1000 + 1e-6)


def test_power_cap_clamps_the_effective_clock(tmp_path: Path) -> None:
    gpu = SimulatedGPU.from_preset(
        "a100", state_dir=tmp_path, activity=1.0, set_latency_s=0.0, clock=VirtualClock(1000.0)
    )
    gpu.set_locked_clock(1410)
    assert gpu.effective_clock_mhz(0, Kind.F) == 1275  # notes: ≈1275 MHz under 400 W
    preset = get_preset("a100")
    assert preset.power.compute_power_w(1275, 1.0) <= 400 < preset.power.compute_power_w(1290, 1.0)
    t_capped = gpu.op_cost(0, Kind.F)[0]
    gpu.set_locked_clock(1275)
    assert gpu.op_cost(0, Kind.F)[0] == t_capped  # asking for more than the cap changes nothing
    gpu.set_locked_clock(1000)
    assert gpu.effective_clock_mhz(0, Kind.F) == 1005  # 1000 snaps to 1005, under the cap


def test_power_cap_on_a_profile_gpu(tmp_path: Path) -> None:
    clock = VirtualClock(1000.0)
    gpu = _from_profile(tmp_path, clock, power_cap_w=300.0)
    gpu.set_locked_clock(1410)
    op = load_profile("a100").op(0, Kind.F)
    fitting = [o for o in op.options if o.energy_j / o.time_s <= 300.0]
    assert gpu.effective_clock_mhz(0, Kind.F) == fitting[0].freq_mhz
    assert gpu.op_cost(0, Kind.F) == (fitting[0].time_s, fitting[0].energy_j)


def test_the_capped_clock_is_read_back_with_the_power_cap_reason(tmp_path: Path) -> None:
    """What runs, not what was asked: the clock read back while an op runs is the capped
    one, with NVML's SW power cap reason (0x4); idle reads carry the idle reason (0x1)."""
    from perseus.device.base import ClockReadbackGPU

    clock = VirtualClock(1000.0)
    gpu = _from_profile(tmp_path, clock, power_cap_w=300.0)
    assert isinstance(gpu, ClockReadbackGPU)
    gpu.set_locked_clock(1410)
    assert gpu.clock_event_reasons() == 0x1 and gpu.current_clock_mhz() == 1410  # idle
    gpu.launch(0, Kind.F)
    clock.advance(1e-4)
    capped = gpu.effective_clock_mhz(0, Kind.F)
    assert capped < 1410
    assert (gpu.current_clock_mhz(), gpu.clock_event_reasons()) == (capped, 0x4)
    clock.advance(10.0)  # the op is done
    gpu.set_locked_clock(capped)  # asking for what fits: delivered, no reason
    gpu.launch(0, Kind.F)
    clock.advance(1e-4)
    assert (gpu.current_clock_mhz(), gpu.clock_event_reasons()) == (capped, 0)


def test_h100_is_marked_estimated() -> None:
    assert PRESETS["h100"].estimated
    assert not PRESETS["a100"].estimated
    assert len(PRESETS["a100"].clocks_mhz) == 81
    assert PRESETS["a100"].clocks_mhz[-1] == 210


def test_state_is_shared_between_objects_and_outlives_them(tmp_path: Path) -> None:
    clock = VirtualClock(1000.0)
    first = _from_profile(tmp_path, clock)
    first.set_locked_clock(1100)
    del first
    second = _from_profile(tmp_path, clock)
    assert second.locked_clock_mhz() == 1095
    other_model = SimulatedGPU.from_preset("a100", state_dir=tmp_path, clock=clock)
    assert other_model.uuid == second.uuid
    assert other_model.locked_clock_mhz() == 1095
    other_model.set_slowdown(1.5)
    assert second.slowdown == 1.5
    second.reset_locked_clock()
    assert other_model.locked_clock_mhz() is None


def test_slowdown_scales_time_and_energy(tmp_path: Path) -> None:
    clock = VirtualClock(1000.0)
    gpu = _from_profile(tmp_path, clock)
    gpu.set_locked_clock(1410)
    t, e = gpu.op_cost(1, Kind.B)
    gpu.slowdown = 2.0
    assert gpu.op_cost(1, Kind.B) == pytest.approx((2 * t, 2 * e))
    before = gpu.exact_energy_j()
    start = gpu.record_event()
    gpu.launch(1, Kind.B)
    end = gpu.record_event()
    clock.advance(2 * t)
    assert end.device_time_s() - start.device_time_s() == pytest.approx(2 * t)
    assert gpu.exact_energy_j() - before == pytest.approx(2 * e)
    with pytest.raises(ConfigError):
        gpu.set_slowdown(0.0)


def test_snapping_and_out_of_range(tmp_path: Path) -> None:
    gpu = SimulatedGPU.from_preset("a100", state_dir=tmp_path, set_latency_s=0.0)
    assert gpu.snap_clock_mhz(1102) == 1095
    assert gpu.snap_clock_mhz(1103) == 1110
    assert gpu.snap_clock_mhz(5000) == 1410
    strict = SimulatedGPU.from_preset(
        "a100", state_dir=tmp_path, set_latency_s=0.0, clamp_out_of_range=False
    )
    with pytest.raises(DeviceError, match="INVALID_ARGUMENT"):
        strict.set_locked_clock(100)


def test_unlocked_gpu_runs_ops_at_max_and_idles_at_idle_clock(tmp_path: Path) -> None:
    clock = VirtualClock(1000.0)
    gpu = SimulatedGPU.from_preset("a100", state_dir=tmp_path, set_latency_s=0.0, clock=clock)
    assert gpu.locked_clock_mhz() is None
    assert gpu.current_clock_mhz() == 210
    gpu.launch(0, Kind.F)
    assert gpu.current_clock_mhz() == 1410


def test_permission_and_injected_errors(tmp_path: Path) -> None:
    gpu = SimulatedGPU.from_preset("a100", state_dir=tmp_path, privileged=False)
    with pytest.raises(DevicePermissionError, match="NO_PERMISSION"):
        gpu.set_locked_clock(1095)
    with pytest.raises(DevicePermissionError):
        gpu.reset_locked_clock()
    ok = SimulatedGPU.from_preset("a100", state_dir=tmp_path, set_latency_s=0.0)
    ok.inject_error("energy_mj", DeviceLostError("GPU_IS_LOST"), times=2)
    for _ in range(2):
        with pytest.raises(DeviceLostError):
            ok.energy_mj()
    assert ok.energy_mj() >= 0


def test_set_latency_blocks_the_caller_for_a_lognormal_time(tmp_path: Path) -> None:
    clock = VirtualClock()
    gpu = SimulatedGPU.from_preset("a100", state_dir=tmp_path, set_latency_s=0.005, clock=clock)
    waited: list[float] = []
    for call in [lambda: gpu.set_locked_clock(1095)] * 400 + [gpu.reset_locked_clock]:
        start = clock.now()
        call()
        waited.append(clock.now() - start)
    waited.sort()
    assert waited[len(waited) // 2] == pytest.approx(0.005, rel=0.15)  # notes: median 5 ms
    assert waited[int(0.99 * len(waited))] == pytest.approx(0.012, rel=0.3)  # p99 12 ms
    assert min(waited) > 0
    exact = SimulatedGPU.from_preset("a100", state_dir=tmp_path, set_latency_s=0.0, clock=clock)
    n = clock.sleeps
    exact.set_locked_clock(1095)
    assert clock.sleeps == n  # no latency, no sleep


def test_unknown_stage_is_a_profile_error(tmp_path: Path) -> None:
    profile = build_profile(
        [(0, Kind.F, 1410, 0.1, 30.0), (0, Kind.B, 1410, 0.2, 60.0)], source="tiny.csv"
    )
    gpu = SimulatedGPU.from_profile(profile, blocking_power_w=80.0, state_dir=tmp_path)
    with pytest.raises(ConfigError, match="stage 3"):
        gpu.op_cost(3, Kind.F)


def test_unknown_preset() -> None:
    with pytest.raises(ConfigError, match="a100"):
        get_preset("v100")


def test_a_profile_file_and_its_measured_blocking_power_build_a_gpu(tmp_path: Path) -> None:
    """Device modules read no files: perseus.io reads the profile, the caller builds the GPU."""
    from perseus.io.bundled import default_blocking_power_w

    profile = load_profile("a40")
    power = default_blocking_power_w(profile)
    assert power is not None
    gpu = SimulatedGPU.from_profile(
        profile, blocking_power_w=power, state_dir=tmp_path, set_latency_s=0.0
    )
    assert gpu.blocking_power_w == pytest.approx(70.38)
    option = profile.op(2, Kind.B).options[3]
    gpu.set_locked_clock(option.freq_mhz)
    assert gpu.op_cost(2, Kind.B) == (option.time_s, option.energy_j)
    csv = tmp_path / "p.csv"
    csv.write_text(
        "stage,instruction,frequency,time,energy\n0,forward,1410,0.1,30\n0,backward,1410,0.2,60\n"
    )
    profile = load_profile(csv)
    assert default_blocking_power_w(profile) is None  # not bundled: the caller must say
    assert SimulatedGPU.from_profile(profile, blocking_power_w=50.0).supported_clocks_mhz() == (
        1410,
    )


def test_discovery_lists_and_reopens_simulated_gpus(tmp_path: Path) -> None:
    from perseus.device.discovery import open_simulated, simulated_devices

    a = SimulatedGPU.from_preset("a40", index=1, state_dir=tmp_path, set_latency_s=0.0)
    b = SimulatedGPU.from_preset("h100", index=0, state_dir=tmp_path, set_latency_s=0.0)
    a.set_locked_clock(1200)
    b.energy_mj()
    infos = simulated_devices(tmp_path)
    assert [(i.index, i.name) for i in infos] == [
        (0, "Simulated NVIDIA H100 80GB HBM3"),
        (1, "Simulated NVIDIA A40"),
    ]
    assert infos[1].locked_mhz == 1200 and infos[1].owner_pid is None
    assert infos[0].clocks_mhz[0] == 1980
    handle = open_simulated(1, tmp_path)
    assert handle.supported_clocks_mhz() == a.supported_clocks_mhz()
    handle.reset_locked_clock()
    assert a.locked_clock_mhz() is None
    with pytest.raises(ConfigError, match="no simulated GPU 5"):
        open_simulated(5, tmp_path)


def test_concurrent_writer_process_never_tears_reads(tmp_path: Path) -> None:
    """Another process rewrites the state while we read: every read is whole and the counter
    never goes backwards (the seqlock at work)."""
    import subprocess
    import sys

    writer = (
        "import sys\n"
        "from perseus.device.simulated import SimNoise, SimulatedGPU\n"
        "from perseus.schedule import Kind\n"
        "g = SimulatedGPU.from_preset('a100', state_dir=sys.argv[1], set_latency_s=0.0,"
        " publish_interval_s=0.0)\n"
        "print('go', flush=True)\n"
        "for i in range(1500):\n"
        "    g.set_locked_clock(1410 - 15 * (i % 50))\n"
        "    if i % 100 == 0: g.launch(0, Kind.F)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", writer, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "go"
    gpu = SimulatedGPU.from_preset("a100", state_dir=tmp_path, publish_interval_s=0.0)
    last = -1
    reads = 0
    while proc.poll() is None:
        value = gpu.energy_mj()
        assert value >= last
        locked = gpu.locked_clock_mhz()
        assert locked is None or 675 <= locked <= 1410
        last = value
        reads += 1
    proc.communicate()
    assert proc.returncode == 0
    assert reads > 10


def test_backdated_op_counts_from_its_start(tmp_path: Path) -> None:
    clock = VirtualClock(1000.0)
    gpu = _from_profile(tmp_path, clock)
    gpu.set_locked_clock(1410)
    start = gpu.exact_energy_j()
    duration, energy = gpu.op_cost(0, Kind.F)
    clock.advance(0.32)  # the host reaches the op 20 ms after the GPU could have started it
    gpu.backdate(1000.3)
    first = gpu.record_event()
    gpu.launch(0, Kind.F)
    end = gpu.record_event()
    assert first.device_time_s() == pytest.approx(1000.3)
    clock.advance(1000.3 + duration - clock.now())
    assert end.device_time_s() == pytest.approx(1000.3 + duration)
    assert gpu.exact_energy_j() - start == pytest.approx(83.64 * 0.3 + energy)
    # Never before the last event: that span is already accounted for.
    clock.advance(0.01)
    gpu.backdate(1000.0)
    second = gpu.record_event()
    assert second.device_time_s() == pytest.approx(end.device_time_s())


def test_an_event_recorded_after_a_stalled_host_marks_the_end_of_the_op_launched_before() -> None:
    """Emulation: the host launches an op and records its end event; a host stalled between
    the two (a loaded CPU) must not stretch the op to the moment it got to the record, or the
    op's device time swallows the idle time after it (online profiling then fits a lower power
    to it: a four-rank run's rows came out 5-13 % low). Only the first event after a launch
    is dated back: the next one is recorded now."""
    import tempfile

    from perseus.device.clock import VirtualClock

    clock = VirtualClock(1000.0)
    with tempfile.TemporaryDirectory() as state_dir:
        gpu = SimulatedGPU.from_profile(
            load_profile("a100"),
            blocking_power_w=83.64,
            state_dir=state_dir,
            publish_interval_s=0.0,
            set_latency_s=0.0,
            clock=clock,
        )
        t_f, _ = gpu.op_cost(0, Kind.F)
        start = gpu.record_event()
        gpu.launch(0, Kind.F)
        clock.sleep(t_f + 0.030)  # the host stalls 30 ms past the op's end
        end = gpu.record_event()
        later = gpu.record_event()
        assert end.device_time_s() - start.device_time_s() == pytest.approx(t_f)
        assert later.device_time_s() == pytest.approx(1000.0 + t_f + 0.030)


def test_predictions_through_a_chain_of_cross_stream_waits_are_cheap(tmp_path: Path) -> None:
    """Four streams, each op waiting on the previous stream's op (a pipeline in one process):
    predicting the last event plans each stream once per change, not once per path."""
    from perseus.device.clock import VirtualClock
    from perseus.device.sim_stream import SimStream

    clock = VirtualClock(1000.0)
    gpus = [
        SimulatedGPU.from_profile(
            load_profile("a100"),
            blocking_power_w=83.64,
            index=i,
            state_dir=tmp_path,
            publish_interval_s=0.0,
            set_latency_s=0.0,
            clock=clock,
        )
        for i in range(4)
    ]
    t_f, _ = gpus[0].op_cost(0, Kind.F)
    ends: list[list[object]] = [[] for _ in gpus]
    for mb in range(12):
        for i, gpu in enumerate(gpus):
            if i:
                gpu.wait_event(ends[i - 1][mb])  # type: ignore[arg-type]
            gpu.launch(0, Kind.F)
            ends[i].append(gpu.record_event())
    calls = 0
    plan = SimStream._plan

    def counting(self: SimStream, stop_at: object = None) -> object:
        nonlocal calls
        calls += 1
        return plan(self, stop_at)  # type: ignore[arg-type]

    SimStream._plan = counting  # type: ignore[method-assign,assignment]
    try:
        last = ends[3][-1]
        predicted = gpus[3]._stream._predict(last)  # type: ignore[arg-type]
    finally:
        SimStream._plan = plan  # type: ignore[method-assign]
    assert predicted == pytest.approx(1000.0 + (12 + 3) * t_f)
    assert calls < 100, calls  # 4 streams x 12 waits: thousands of plans without the cache


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("NVIDIA A100-SXM4-80GB (500 W)", "a100-500w"),  # the longer key wins over a100
        ("a100_pipeline_profile", "a100"),
        ("Simulated NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA A40 profile", "a40"),
        ("NVIDIA L4", None),
    ],
)
def test_preset_for_name_finds_the_preset_a_name_mentions(name: str, key: str | None) -> None:
    from perseus.device.presets import preset_for_name

    found = preset_for_name(name)
    assert (found.key if found is not None else None) == key


def _open_fds_on(path: Path) -> int:
    """How many of this process's descriptors are open on ``path``."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/self/fd/{fd}") == str(path)
    return count


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_a_dropped_gpu_closes_its_state_file(tmp_path: Path) -> None:
    """A simulated GPU has no close(): its state file's descriptor goes with the object
    (each dropped GPU kept one open: a process making GPUs in a loop ran out of them)."""
    path = None
    for _ in range(20):
        gpu = SimulatedGPU.from_preset("a100", state_dir=tmp_path, set_latency_s=0.0)
        gpu.set_locked_clock(1095)
        path = gpu._store().path
        del gpu
    gc.collect()
    assert path is not None and _open_fds_on(path) == 0
    gpu = SimulatedGPU.from_preset("a100", state_dir=tmp_path, set_latency_s=0.0)
    assert gpu.locked_clock_mhz() == 1095  # the state outlives the objects, like a driver's
    assert _open_fds_on(path) == 1
    store = gpu._store()
    store.close()
    store.close()  # idempotent
    assert _open_fds_on(path) == 0
    assert gpu.locked_clock_mhz() == 1095 and _open_fds_on(path) == 1  # reopened on use


class _CountedOptions(tuple):  # type: ignore[type-arg]
    """An op's options that count the passes made over them."""

    passes = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        _CountedOptions.passes += 1
        return super().__iter__()


def test_a_profiled_gpu_reads_each_ops_options_in_a_few_passes() -> None:
    """``from_profile`` read an op's cost at each clock with a scan of its options (81 clocks:
    81 scans per op, 2.8 s at the 4,096-stage limit); a few passes per op now, same costs."""
    profile = build_profile(
        (stage, kind, f, 0.05 * 1410 / f, 20.0 + f / 100, mem)
        for stage in range(3)
        for kind in (Kind.F, Kind.B)
        for f in range(1410, 200, -15)
        for mem in (1593, 1215)
    )
    ops = {
        key: dataclasses.replace(op, options=_CountedOptions(op.options))
        for key, op in profile.ops.items()
    }
    counted = dataclasses.replace(profile, ops=ops)
    _CountedOptions.passes = 0
    clocks, cost, mem_clocks, _ = profile_costs(counted)
    assert _CountedOptions.passes <= 4 * len(ops)  # was 81 + a few per op
    assert len(clocks) == 81 and mem_clocks == (1593, 1215)
    for kind in (Kind.F, Kind.B):
        for f in (1410, 1095, 210):
            option = profile.ops[(1, kind)].at(f)  # the highest memory clock's
            assert cost(1, kind, f) == (option.time_s, option.energy_j)
