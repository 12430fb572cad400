"""The simulated GPU's record of the set calls it received: what, when it took effect, refusals,
a bounded log, and a call that returns after its change landed."""

from __future__ import annotations

import pytest

from perseus.device.clock import VirtualClock
from perseus.device.simulated import SetCall, SimulatedGPU
from perseus.errors import ConfigError, DeviceError, DevicePermissionError


def _gpu(tmp_path, **kw) -> SimulatedGPU:  # type: ignore[no-untyped-def]
    kw.setdefault("set_latency_s", 0.005)
    kw.setdefault("set_latency_p99_s", 0.005)
    return SimulatedGPU.from_preset("a40", state_dir=tmp_path, clock=VirtualClock(100.0), **kw)


def test_every_set_and_reset_call_is_recorded_with_its_times_and_refusals(tmp_path) -> None:
    gpu = _gpu(tmp_path, record_set_calls=10, set_return_lag_s=0.002)
    assert gpu.set_calls == []
    assert gpu.set_locked_clock(1402) == 1395
    # The clock landed after the 5 ms latency; the call returned 2 ms later.
    assert gpu.clock_applied_s() == pytest.approx(100.005)
    assert gpu.timeline_now_s() == pytest.approx(100.007)
    gpu.set_memory_locked_clock(5001)
    gpu.inject_error("set_locked_clock", DeviceError("GPU_IS_LOST"))
    with pytest.raises(DeviceError, match="GPU_IS_LOST"):
        gpu.set_locked_clock(1200)
    gpu.set_power_limit_w(250.0)
    gpu.reset_power_limit()
    gpu.reset_locked_clock()  # also resets the memory lock: a call of its own
    assert [(c.method, c.requested, c.applied, c.ok) for c in gpu.set_calls] == [
        ("set_locked_clock", 1402, 1395, True),
        ("set_memory_locked_clock", 5001, 5001, True),
        ("set_locked_clock", 1200, None, False),
        ("set_power_limit_w", 250.0, 250.0, True),
        ("reset_power_limit", None, None, True),
        ("reset_locked_clock", None, None, True),
        ("reset_memory_locked_clock", None, None, True),
    ]
    first, refused = gpu.set_calls[0], gpu.set_calls[2]
    assert first == SetCall(
        "set_locked_clock", 1402, 1395, 100.0, pytest.approx(100.005), pytest.approx(100.007)
    )
    assert refused.error == "GPU_IS_LOST" and refused.applied_s is None
    assert refused.returned_s == refused.issued_s  # refused at once, no latency
    assert gpu.set_calls[1].issued_s == pytest.approx(first.returned_s)
    sm_reset, mem_reset = gpu.set_calls[-2:]  # each took effect within its own call
    assert sm_reset.applied_s == pytest.approx(gpu.clock_applied_s())
    assert sm_reset.returned_s <= mem_reset.issued_s


def test_the_record_is_off_by_default_bounded_and_counts_permission_refusals(tmp_path) -> None:
    quiet = _gpu(tmp_path / "a")
    quiet.set_locked_clock(1395)
    assert quiet.set_calls == []
    gpu = _gpu(tmp_path / "b", record_set_calls=3, privileged=False)
    for freq in (1740, 1395, 1200, 1005):
        with pytest.raises(DevicePermissionError):
            gpu.set_locked_clock(freq)
    assert [c.requested for c in gpu.set_calls] == [1395, 1200, 1005]  # the last three
    assert all("NO_PERMISSION" in (c.error or "") for c in gpu.set_calls)
    with pytest.raises(ConfigError, match="record_set_calls"):
        _gpu(tmp_path / "c", record_set_calls=-1)
    with pytest.raises(ConfigError, match="set_return_lag_s"):
        _gpu(tmp_path / "c", set_return_lag_s=-0.001)
    # A twin of the GPU (emulation's placed()) records as the original does.
    twin = _gpu(tmp_path / "d", record_set_calls=2).placed(index=1)
    twin.set_locked_clock(1395)
    assert [c.applied for c in twin.set_calls] == [1395]
