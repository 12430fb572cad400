"""Emulation pieces that need no process group: stretching, timeline, profile helpers, hooks."""

from __future__ import annotations

import time
import warnings

import pytest

from perseus.errors import ConfigError
from perseus.io import load_profile
from perseus.runtime.emulation import (
    ActionStretcher,
    EmulationOverrunWarning,
    VirtualTimeline,
    scale_profile,
    sleep_until,
    take_stages,
)
from perseus.runtime.hooks import instrument_stages
from perseus.schedule import Action, Kind, action_dependencies, build_schedule


class _Device:
    """Records begin/end calls; every op takes ``target_s``."""

    def __init__(self, target_s: float) -> None:
        self.target_s = target_s
        self.calls: list[tuple] = []

    def begin_op(self, stage_index, kind, start_s=None):
        self.calls.append(("begin", stage_index, kind, start_s))
        return self.target_s

    def end_op(self):
        self.calls.append(("end",))


def test_sleep_until_reaches_the_deadline():
    deadline = time.perf_counter() + 0.003
    sleep_until(deadline)
    assert time.perf_counter() >= deadline


def test_stretcher_holds_the_action_for_the_target_and_counts_no_overrun():
    device = _Device(0.004)
    stretcher = ActionStretcher(device)
    with stretcher.op(Action(2, Kind.B, 1)) as timing:
        pass
    assert timing.end_s - timing.begun_s >= 0.004
    assert device.calls == [("begin", 2, Kind.B, None)]  # end_op only cuts overruns short
    assert (stretcher.overruns, stretcher.actions) == (0, 1)


def test_stretcher_warns_once_on_overrun_and_counts_the_rest():
    device = _Device(0.0)
    stretcher = ActionStretcher(device)
    with pytest.warns(EmulationOverrunWarning), stretcher.op(Action(0, Kind.F, 0)):
        time.sleep(0.001)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with stretcher.op(Action(0, Kind.F, 1)):
            time.sleep(0.001)
    assert stretcher.overruns == 2


def test_stretcher_backdates_only_when_asked():
    device = _Device(0.001)
    start = time.perf_counter()
    with ActionStretcher(device, backdate=True).op(Action(0, Kind.F, 0), start_s=start):
        pass
    with ActionStretcher(device).op(Action(0, Kind.F, 1), start_s=start):
        pass
    assert device.calls[0][3] == start and device.calls[1][3] is None


def test_virtual_timeline_starts_actions_when_inputs_are_ready(tmp_path):
    schedule = build_schedule("1f1b", 2, 2)
    nodes = {a: i for i, a in enumerate(a for acts in schedule.rank_actions for a in acts)}
    path = tmp_path / "timeline.bin"
    VirtualTimeline.create(path, len(nodes))
    rank0 = VirtualTimeline(path, nodes.__getitem__, lambda a: action_dependencies(a, 2))
    rank1 = VirtualTimeline(path, nodes.__getitem__, lambda a: action_dependencies(a, 2))
    rank0.begin_iteration(10.0)
    rank1.begin_iteration(10.0)
    assert rank0.start_of(Action(0, Kind.F, 0), arrived_s=10.5) == 10.0
    rank0.finish(Action(0, Kind.F, 0), 11.0)
    # Rank 1's forward needs rank 0's: it starts at 11.0 even though its host came at 11.4.
    assert rank1.start_of(Action(1, Kind.F, 0), arrived_s=11.4) == 11.0
    # ... and never later than the host's arrival.
    assert rank1.start_of(Action(1, Kind.F, 0), arrived_s=10.9) == 10.9
    rank1.finish(Action(1, Kind.F, 0), 12.0)
    assert rank1.start_of(Action(1, Kind.B, 0), arrived_s=13.0) == 12.0


def test_scale_profile_keeps_power_and_take_stages_keeps_the_last_stage():
    a100 = load_profile("a100")
    small = take_stages(a100, 4)
    assert small.num_stages == 4
    assert small.op(3, Kind.F).options == a100.op(7, Kind.F).options
    assert small.op(1, Kind.B).options == a100.op(1, Kind.B).options
    scaled = scale_profile(small, 0.25)
    for (s, k), op in small.ops.items():
        for o, q in zip(op.options, scaled.op(s, k).options, strict=True):
            assert q.time_s == pytest.approx(0.25 * o.time_s)
            assert q.energy_j / q.time_s == pytest.approx(o.energy_j / o.time_s)
    with pytest.raises(ConfigError):
        scale_profile(small, 0.0)
    with pytest.raises(ConfigError):
        take_stages(a100, 0)


class _Stage:
    def __init__(self, index: int) -> None:
        self.stage_index = index
        self.has_backward = True
        self.ran: list[str] = []

    def forward_one_chunk(self, chunk, *args, **kwargs):
        self.ran.append(f"F{chunk}")
        return chunk

    def backward_one_chunk(self, chunk, loss=None, full_backward=True, last_backward=False):
        self.ran.append(f"B{chunk}")

    def backward_weight_one_chunk(self, chunk, last_backward=False):
        self.ran.append(f"W{chunk}")


def test_hooks_wrap_every_compute_call_and_restore():
    from contextlib import contextmanager

    seen = []

    @contextmanager
    def factory(action):
        seen.append(str(action))
        yield

    stage = _Stage(3)
    restore = instrument_stages([stage], factory)
    assert stage.forward_one_chunk(0, ()) == 0
    stage.backward_one_chunk(0, full_backward=False)
    stage.backward_weight_one_chunk(0)
    stage.has_backward = False
    stage.backward_one_chunk(1)  # eval: not an action
    assert seen == ["3F0", "3B0", "3W0"]
    assert stage.ran == ["F0", "B0", "W0", "B1"]
    restore()
    stage.forward_one_chunk(5, ())
    assert seen == ["3F0", "3B0", "3W0"]
