"""Memory clocks read back: where a plan sets one, the worker reads the memory clock the GPU
runs in the same read as the SM clock, and an op whose memory clock is not the plan's counts
as held (the simulated GDDR GPU, and the fake NVML's ``nvmlDeviceGetClockInfo``)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

from perseus.device.base import ObserveOnlyWarning
from perseus.device.clock import VirtualClock
from perseus.errors import DeviceNotSupportedError
from perseus.plan import PlanOp
from perseus.runtime.agent.rank_agent import RankAgent
from perseus.runtime.agent.readback import (
    ClockHeldWarning,
    HeldOp,
    OpReading,
    clock_delivery,
)
from perseus.runtime.agent.records import IterationRecord
from perseus.schedule import Kind, build_schedule
from tests.runtime.test_memory_clock_runtime import BWD, FWD, HI, LO, _gpu, _op_time, _pairs, _plan


def test_an_op_off_its_planned_memory_clock_is_held():
    readings = [
        OpReading("0F0", 1740, 1740, 1740, 0, 1.0, LO, LO, LO),  # delivered
        OpReading("0F1", 1740, 1740, 1740, 0, 2.0, LO, None, HI),  # no lock in force (refused)
        OpReading("0B0", 1410, 1410, 1410, 0, 4.0, LO, LO, 405),  # locked, ran another
        OpReading("0B1", 1410, 1410, 1410, 0, 8.0, LO, HI, HI),  # its change not made yet
    ]
    delivery = clock_delivery(readings)
    assert delivery is not None and delivery.ops_read == 3
    assert delivery.share_at_plan == pytest.approx(1.0 / 7.0)
    assert delivery.held == (
        HeldOp("0F1", 1740, 1740, ("memory_not_locked",), LO, HI),
        HeldOp("0B0", 1410, 1410, ("no_reason_reported",), LO, 405),
    )
    assert str(delivery.held[0]) == (
        "0F1 planned 1740 MHz, ran 1740 MHz, memory planned 5001 MHz, ran 7251 MHz "
        "(memory clock not locked)"
    )


# ------------------------------------------------------------------------------------------
# The simulated A40 (GDDR) through the agent


def _run(tmp_path: Path, ops: tuple[PlanOp, PlanOp], **faults: Any) -> list[IterationRecord]:
    """Rank 0 of a 4-stage 1F1B job on the simulated A40, forwards at ``ops[0]``, backwards
    at ``ops[1]``, for two iterations."""
    clock = VirtualClock(1000.0)
    profile = _pairs()
    actions = build_schedule("1f1b", 4, 8).rank_actions[0]
    names = tuple(f"{a.kind.value}{a.microbatch_index}" for a in actions)
    gpu = _gpu(profile, tmp_path, clock)
    for method, error in faults.items():
        gpu.inject_error(method, error)
    plan = _plan(tuple(ops[a.kind is not Kind.F] for a in actions), names)
    agent = RankAgent(
        plan,
        gpu,
        0,
        watchdog=False,
        handle_signals=False,
        op_time_s=_op_time(profile),
        clock=clock,
    )
    with agent:
        for _ in range(2):
            agent.step_begin()
            for a in actions:
                with agent.op(a.kind, a.microbatch_index):
                    gpu.launch(a.stage_index, a.kind)
            agent.step_end()
    return list(agent.records.iterations)


def test_a_refused_memory_lock_shows_as_held_at_the_memory_clock_run(tmp_path: Path):
    refused = DeviceNotSupportedError("NOT_SUPPORTED")
    ops: tuple[PlanOp, PlanOp] = (((1740, LO, 0),), ((1410, LO, 0),))
    with (
        pytest.warns(ObserveOnlyWarning, match="cannot lock memory clocks"),
        pytest.warns(ClockHeldWarning, match="memory planned 5001 MHz, ran 7251 MHz") as caught,
    ):
        records = _run(tmp_path, ops, set_memory_locked_clock=refused)
    assert len([w for w in caught if w.category is ClockHeldWarning]) == 1  # said once
    for record in records:
        delivery = record.clock_delivery
        assert delivery is not None and delivery.ops_read == 16 and delivery.share_at_plan == 0.0
        assert {(h.planned_mem_mhz, h.applied_mem_mhz, h.reasons) for h in delivery.held} == {
            (LO, HI, ("memory_not_locked",))
        }
        assert {(h.planned_mhz, h.applied_mhz) for h in delivery.held} == {
            (1740, 1740),
            (1410, 1410),
        }


def test_a_plan_whose_memory_clocks_are_applied_is_fully_delivered(tmp_path: Path):
    """Phased ops included: each op is read in the phase that runs when it is read (its last:
    the later phases' clocks are set first), against that phase's planned clocks."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no hold warned
        records = _run(tmp_path, (FWD, BWD))
    for record in records[1:]:
        delivery = record.clock_delivery
        assert delivery is not None and delivery.ops_read == 16
        assert delivery.share_at_plan == 1.0 and delivery.held == ()


# ------------------------------------------------------------------------------------------
# NVML (fake): nvmlDeviceGetClockInfo(handle, NVML_CLOCK_MEM) in the worker's read


@pytest.mark.parametrize("busy_mem_mhz", [None, 405])
def test_the_nvml_worker_reads_the_memory_clock_beside_the_sm_clock(
    tmp_path: Path, busy_mem_mhz: int | None
):
    """An A40 locked at 5001 MHz memory: read back as locked, or (a GeForce-like board in its
    P2 state under load) running 405 MHz whatever the lock: held, with the clock run."""

    from perseus.device.fake_nvml import FakeDevice, FakeNvml
    from perseus.device.nvml import NvmlGPU
    from tests.runtime.test_readback import host_timed_worker, run_one_op

    device = FakeDevice(
        "GPU-a40",
        name="NVIDIA A40",
        memory_clocks=(HI, LO, 810, 405),
        graphics_clocks=tuple(range(1740, 209, -15)),
        busy_memory_clock_mhz=busy_mem_mhz,
    )
    nvml = FakeNvml(devices=[device])
    gpu = NvmlGPU("GPU-a40", nvml_module=nvml, privileged=True, lock_dir=tmp_path).open()

    ctl = host_timed_worker(gpu, 1740, LO)
    device.busy = True
    job = run_one_op(ctl, 0.05, mem_next_mhz=LO)
    gpu.close()
    ran_mem = LO if busy_mem_mhz is None else busy_mem_mhz
    report = job.report
    assert (report.asked_mem_mhz, report.read_mem_mhz) == (LO, ran_mem)
    assert ("nvmlDeviceGetClockInfo", (device, FakeNvml.NVML_CLOCK_MEM)) in nvml.calls
    reading = OpReading(
        "F0", 1740, report.asked_mhz, report.read_mhz, report.read_reasons, 1.0, LO,
        report.asked_mem_mhz, report.read_mem_mhz,
    )  # fmt: skip
    delivery = clock_delivery([reading])
    assert delivery is not None
    if busy_mem_mhz is None:
        assert delivery.share_at_plan == 1.0 and delivery.held == ()
    else:
        assert delivery.held == (HeldOp("F0", 1740, 1740, ("no_reason_reported",), LO, 405),)
