"""What the rank agent learns about each op on the device's timeline, to time clock changes.

A change for the op after op ``j`` should land at op ``j``'s end or in the idle gap after it.
Op times are averaged over the last :data:`HISTORY` iterations (ops jitter by ~1 %); the gap
is the smallest of the last :data:`HISTORY` (a change aimed into a gap that turns out shorter
lands inside the next op); a phased op's time is kept per unit of work over clock (time taken
as inversely proportional to the SM clock), to predict its layer boundaries without a profile.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from functools import partial

from perseus.device.base import DeviceEvent
from perseus.profile.model import Profile
from perseus.runtime.agent.boundary import Boundary
from perseus.runtime.agent.rank_plan import OpPhase
from perseus.schedule.actions import Kind

__all__ = ["HISTORY", "OpTimingHistory", "profiled_op_time_s"]

#: Iterations of op times and gaps kept per op.
HISTORY = 8

_recent: Callable[[], deque[float]] = partial(deque, maxlen=HISTORY)


class OpTimingHistory:
    """Per-op device times and idle gaps of recent iterations (see the module docstring)."""

    def __init__(self) -> None:
        # Each key's last HISTORY values (times: of one-clock runs only).
        self._times_s: defaultdict[tuple[int, int], deque[float]] = defaultdict(_recent)
        self._gaps_s: defaultdict[int, deque[float]] = defaultdict(_recent)
        self._unit_s: dict[tuple[int, tuple[OpPhase, ...]], float] = {}  # phased ops
        self._last_end: DeviceEvent | None = None  # the previous iteration's last op end
        # What predicted() returns, kept up to date by learn(): mean time, min gap.
        self._expected_s: dict[tuple[int, int], float] = {}
        self._gap_s: dict[int, float] = {}

    def predicted(self, j: int, freq_mhz: int) -> tuple[float | None, float]:
        """Op ``j``'s predicted device time at ``freq_mhz`` (None: never seen) and idle device
        time after it (0 when unknown); two lookups, on the training thread."""
        return self._expected_s.get((j, freq_mhz)), self._gap_s.get(j, 0.0)

    def phase_start_s(self, j: int, phases: tuple[OpPhase, ...], i: int) -> float | None:
        """Phased op ``j``: predicted device time from its start to phase ``i``'s start
        (None: the op was never seen with these phases)."""
        unit = self._unit_s.get((j, phases))
        if unit is None:
            return None
        return unit * _work_over_clock(phases, i, i)

    def forget_boundary(self) -> None:
        """The iteration was abandoned: the next one's first op has no predecessor."""
        self._last_end = None

    def learn(
        self,
        jobs: Sequence[Boundary],
        freqs_mhz: Sequence[int],
        phases: Sequence[tuple[OpPhase, ...]],
    ) -> list[tuple[int, float, float]]:
        """Learn from an iteration's completed boundaries (op ``j`` at index ``j``); returns
        each op's ``(index, device start, device end)``, in order (ops never ended left out)."""
        whole = bool(jobs) and len(jobs) == len(freqs_mhz)
        last = self._last_end
        if last is not None and whole:
            # The last op's change lands in the gap before the next iteration's first op.
            self._push_gap(len(jobs) - 1, jobs[0].start.device_time_s() - last.device_time_s())
        self._last_end = jobs[-1].end if whole else None
        done: list[tuple[int, float, float]] = []
        for j, job in enumerate(jobs):
            end = job.end
            if end is None:
                continue
            end_s = end.device_time_s()
            if j + 1 < len(jobs):
                self._push_gap(j, jobs[j + 1].start.device_time_s() - end_s)
            start_s = job.start.device_time_s()
            done.append((j, start_s, end_s))
            freq = freqs_mhz[j] if j < len(freqs_mhz) else 0
            self._learn_op(j, freq, phases[j] if j < len(phases) else (), end_s - start_s, job)
        return done

    def _learn_op(
        self, j: int, freq: int, op: tuple[OpPhase, ...], time_s: float, job: Boundary
    ) -> None:
        key = (j, freq)
        mids = job.report.mids_issued
        if not mids:
            times = self._times_s[key]
            times.append(max(0.0, time_s))
            self._expected_s[key] = sum(times) / len(times)
        elif key not in self._times_s:  # only phased runs seen: the last one
            self._expected_s[key] = time_s
        if len(op) > 1:
            # Phases 0..m ran (m: the mid-op changes issued), the last of them to the end:
            # time_s = unit * sum(work share / clock) when time scales as 1 / clock.
            m = min(mids, len(op) - 1)
            self._unit_s[(j, op)] = time_s / _work_over_clock(op, m + 1, m)

    def _push_gap(self, j: int, gap_s: float) -> None:
        gaps = self._gaps_s[j]
        gaps.append(max(0.0, gap_s))
        self._gap_s[j] = min(gaps)


def _work_over_clock(phases: tuple[OpPhase, ...], upto: int, last: int) -> float:
    """Sum of (work share / SM clock) over phases ``0 .. upto - 1``, phase ``last`` running
    to the end of the op when ``upto > last`` (else every phase to its planned end)."""
    total = 0.0
    for k in range(min(upto, len(phases))):
        p = phases[k]
        end = 1.0 if k == last or k + 1 >= len(phases) else phases[k + 1].start_share
        total += (end - p.start_share) / p.freq_mhz
    return total


def profiled_op_time_s(profile: Profile) -> Callable[..., float]:
    """An op's profiled time at a clock, or at a (SM, memory) clock pair (the nearest profiled
    clock when not profiled; without a memory clock, the default: the highest)."""

    def op_time_s(
        stage_index: int, kind: Kind, freq_mhz: int, mem_freq_mhz: int | None = None
    ) -> float:
        options = profile.op(stage_index, kind).options
        return min(
            options,
            key=lambda o: (
                abs(o.freq_mhz - freq_mhz),
                -o.freq_mhz,
                0 if mem_freq_mhz is None else abs((o.mem_freq_mhz or 0) - mem_freq_mhz),
                -(o.mem_freq_mhz or 0),
            ),
        ).time_s

    return op_time_s
