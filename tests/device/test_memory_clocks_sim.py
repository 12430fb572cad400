"""The simulated GPU's memory clock: its power and time model, locks, and resets."""

from __future__ import annotations

from pathlib import Path

import pytest

from perseus.device import ownership
from perseus.device.power_model import with_memory_clocks
from perseus.device.presets import A40_MEMORY
from perseus.device.simulated import SimulatedGPU
from perseus.errors import DeviceNotSupportedError, DevicePermissionError
from perseus.io import load_profile
from perseus.schedule import Kind


def _a40(tmp_path: Path, **kwargs: object) -> SimulatedGPU:
    return SimulatedGPU.from_preset(
        "a40", state_dir=tmp_path, set_latency_s=0.0, publish_interval_s=0.0, **kwargs
    )


def test_a_lower_memory_clock_costs_the_memory_bound_share_and_saves_memory_power(
    tmp_path: Path,
) -> None:
    gpu = _a40(tmp_path, power_cap_w=None)
    assert gpu.supported_memory_clocks_mhz() == (7251, 5001, 810, 405)
    gpu.set_locked_clock(1200)
    base = {k: gpu.op_cost(0, k) for k in (Kind.F, Kind.W)}
    assert gpu.set_memory_locked_clock(5000) == 5001
    assert gpu.locked_memory_clock_mhz() == 5001
    slow = {k: gpu.op_cost(0, k) for k in (Kind.F, Kind.W)}
    stretch = 7251 / 5001 - 1
    ref = {Kind.F: 0.112, Kind.W: 0.1385}  # the preset's op times at the highest clocks
    for kind, beta in ((Kind.F, 0.20), (Kind.W, 0.10)):
        (t0, e0), (t1, e1) = base[kind], slow[kind]
        assert t1 - t0 == pytest.approx(beta * ref[kind] * stretch)
        saved_w = A40_MEMORY.power_w(7251) - A40_MEMORY.power_w(5001)
        assert e1 / t1 == pytest.approx(e0 / t0 - saved_w)
    # the compute-bound op (weight gradient) loses a smaller share of its time
    assert slow[Kind.W][0] / base[Kind.W][0] < slow[Kind.F][0] / base[Kind.F][0]
    gpu.reset_locked_clock()  # resets the memory lock with the SM lock
    assert gpu.locked_memory_clock_mhz() is None
    gpu.set_locked_clock(1200)
    assert gpu.op_cost(0, Kind.F) == base[Kind.F]


def test_a_pair_profile_runs_at_its_rows(tmp_path: Path) -> None:
    pairs = with_memory_clocks(load_profile("a40"), A40_MEMORY)
    gpu = SimulatedGPU.from_profile(
        pairs, blocking_power_w=70.38, state_dir=tmp_path, set_latency_s=0.0
    )
    op = pairs.op(2, Kind.B)
    gpu.set_locked_clock(1200)
    assert gpu.op_cost(2, Kind.B) == (op.at(1200).time_s, op.at(1200).energy_j)  # default memory
    gpu.set_memory_locked_clock(5001)
    assert gpu.op_cost(2, Kind.B) == (op.at(1200, 5001).time_s, op.at(1200, 5001).energy_j)


def test_hbm_and_unprivileged_gpus_refuse(tmp_path: Path) -> None:
    hbm = SimulatedGPU.from_preset("a100", state_dir=tmp_path / "a", set_latency_s=0.0)
    with pytest.raises(DeviceNotSupportedError, match="one memory clock"):
        hbm.set_memory_locked_clock(1593)
    locked_out = _a40(tmp_path / "b", privileged=False)
    with pytest.raises(DevicePermissionError):
        locked_out.set_memory_locked_clock(5001)


def test_the_watchdog_reset_clears_a_simulated_memory_lock(tmp_path: Path) -> None:
    gpu = _a40(tmp_path)
    gpu.set_memory_locked_clock(810)
    ownership.reset_from_spec(gpu.watchdog_spec())  # what the watchdog and next owner run
    assert gpu.locked_memory_clock_mhz() is None
