"""A signal handler that resets a simulated GPU while its thread is writing the GPU's state
(an exit guard's reset: it runs at any bytecode) starts from the state being written, not from
the torn file, which would start the GPU afresh (counter, slowdown and limits lost)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from perseus.device.clock import VirtualClock
from perseus.device.sim_state import SimStateFile
from perseus.device.simulated import SimulatedGPU
from perseus.schedule import Kind


def _interrupt_first_write(monkeypatch: pytest.MonkeyPatch, handler: Callable[[], None]) -> None:
    """Run ``handler`` right after the next odd seqlock header is written, then raise
    KeyboardInterrupt there (what the exit guard's SIGINT path does)."""
    real = os.pwrite

    def pwrite(fd: int, data: Any, offset: int) -> int:
        written = real(fd, data, offset)
        if offset == 0 and int(bytes(data[:20])) % 2 == 1:
            monkeypatch.setattr(os, "pwrite", real)
            handler()
            raise KeyboardInterrupt
        return written

    monkeypatch.setattr(os, "pwrite", pwrite)


def test_a_reset_interrupting_a_state_write_keeps_the_counter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = VirtualClock(1000.0)
    gpu = SimulatedGPU.from_preset("a100", state_dir=tmp_path, clock=clock, set_latency_s=0.0)
    gpu.set_locked_clock(1200)
    gpu.set_slowdown(1.5)
    for _ in range(3):
        gpu.launch(0, Kind.F)
    clock.advance(10.0)
    gpu.synchronize()
    energy = gpu.exact_energy_j()
    assert energy > 100
    # The next state written is shorter than the last (one op queued, not three): the file
    # under the odd header is the old state cut short.
    _interrupt_first_write(monkeypatch, gpu.reset_locked_clock)
    with pytest.raises(KeyboardInterrupt):
        gpu.launch(0, Kind.B)
    assert gpu.locked_clock_mhz() is None  # the reset took
    assert gpu.slowdown == 1.5  # before: 1.0, the GPU started afresh
    assert gpu.exact_energy_j() == pytest.approx(energy)  # before: 0.0


def test_a_read_interrupting_a_write_gets_the_state_being_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SimStateFile(tmp_path, "GPU-x")
    store.update(lambda _: {"energy_j": 1.0, "note": "x" * 100})
    seen: list[Any] = []
    _interrupt_first_write(monkeypatch, lambda: seen.append(store.read()))
    with pytest.raises(KeyboardInterrupt):
        store.update(lambda s: {**(s or {}), "energy_j": 2.0, "note": ""})
    assert seen == [{"energy_j": 2.0, "note": ""}]  # before: None (torn)
    store.close()
