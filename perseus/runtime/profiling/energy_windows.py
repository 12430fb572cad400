"""The GPU's energy counter as a series of windows: a background sampler and publish detection.

NVML's counter is published every ~100 ms and a read costs ~3 ms (docs/timing.md), so op
energy comes from the windows between publishes: :class:`CounterSampler` reads the counter
and stamps each read with device-timeline times; :func:`counter_intervals` finds the publishes
(on a fitted regular grid when the brackets allow) and the energy between them.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from perseus.device.base import CounterPeriodGPU
from perseus.device.clock import REAL_CLOCK, Clock, VirtualClock
from perseus.errors import ConfigError, DeviceError

__all__ = [
    "NVML_PUBLISH_PERIOD_S",
    "CounterInterval",
    "CounterSample",
    "CounterSampler",
    "counter_intervals",
    "counter_period_s",
    "publish_times",
    "sample_period_for",
]

#: NVML's publish period (docs/hardware.md#sim-defaults), for GPUs that do not say theirs.
NVML_PUBLISH_PERIOD_S = 0.1

_log = logging.getLogger(__name__)

#: The golden ratio's fractional part: the sampler's read phases (see next_period_s).
_GOLDEN = 0.6180339887498949
#: Narrow brackets the period search of publish_times looks at (the first ones): 2251 phases
#: each (4.6 MB), whatever the step's length; a line fit labels the rest.
_SEARCH_BRACKETS = 128


@dataclass(frozen=True, slots=True)
class CounterSample:
    """One read of the energy counter: ``energy_mj`` held at some instant in
    ``[before_s, after_s]`` (device timeline)."""

    before_s: float
    after_s: float
    energy_mj: int

    @property
    def time_s(self) -> float:
        """The middle of the read."""
        return 0.5 * (self.before_s + self.after_s)


@dataclass(frozen=True, slots=True)
class CounterInterval:
    """The window between two consecutive publishes and the energy spent in it."""

    start_s: float
    end_s: float
    energy_j: float

    @property
    def length_s(self) -> float:
        return self.end_s - self.start_s


def publish_times(brackets: Sequence[tuple[float, float]], *, grid: bool = True) -> list[float]:
    """Estimated publish instants from their brackets ``(lo, hi)`` (publish in ``(lo, hi]``):
    with ``grid`` and at least three brackets, the latest point inside each of a grid
    ``t0 + P * n`` fitted to them, when it exists; otherwise the bracket middles."""
    mids = [0.5 * (lo + hi) for lo, hi in brackets]
    if not grid or len(brackets) < 3:
        return mids
    m = np.asarray(mids)
    lo, hi = np.asarray(brackets, dtype=float).T
    p0 = float(np.median(np.diff(m)))
    if not p0 > 0:
        return mids
    # Narrow brackets only: a delayed read widens its bracket, which may then hold two publishes.
    narrow = (hi - lo) <= 0.5 * p0
    if int(narrow.sum()) < 3:
        return mids
    mn = m[narrow] - m[0]
    # The period on whose grid the first middles agree best (phase concentration), then a line
    # fit, on a line-fitted stretch four times longer at a time: the search over every bracket
    # cost ~0.2 s per sweep iteration late in a long step, and its candidates' spacing drifted
    # off the grid past ~15,000 publishes.
    candidates = p0 * np.linspace(0.8, 1.25, 2251)
    means = np.exp(2j * np.pi * mn[None, :_SEARCH_BRACKETS] / candidates[:, None]).mean(axis=1)
    best = int(np.argmax(np.abs(means)))
    period = float(candidates[best])
    t0 = float(np.angle(means[best])) / (2 * np.pi) * period
    done = 0
    while done < mn.size:
        done = min(mn.size, max(4 * done, _SEARCH_BRACKETS))
        n = np.round((mn[:done] - t0) / period)
        if np.any(np.diff(n) < 1):
            return mids  # two changes within one period: not a regular grid
        period, t0 = (float(x) for x in np.polyfit(n, mn[:done], 1))
        if not period > 0:
            return mids
    # Middles are biased when reads drift in phase against publishes: take the grid deepest
    # inside every narrow bracket instead (an LP), or keep the line fit when none is.
    period, t0 = _deepest_grid(n, lo[narrow] - m[0], hi[narrow] - m[0], period, t0)
    t0 += float(m[0])
    # The latest grid point in each bracket (a stalled read's bracket may hold several).
    k = np.floor((hi - t0) / period + 1e-9)
    g = t0 + k * period
    slack = 0.1 * period  # the fitted grid is off by a little; estimates stay in brackets
    if np.all(g > lo - slack):
        return [float(x) for x in np.clip(g, lo, hi)]
    return mids


def _deepest_grid(
    n: np.ndarray, lo: np.ndarray, hi: np.ndarray, period: float, t0: float
) -> tuple[float, float]:
    """The grid ``t0 + n * period`` furthest inside all brackets ``(lo, hi)``, or the given
    one when no grid lies inside them all."""
    from scipy.optimize import linprog

    ones = np.ones_like(n)
    # t0 + n P + s <= hi  and  -(t0 + n P) + s <= -lo; maximise s.
    a_ub = np.vstack([np.column_stack([ones, n, ones]), np.column_stack([-ones, -n, ones])])
    b_ub = np.concatenate([hi, -lo])
    bounds = [(None, None), (0.5 * period, 2.0 * period), (None, None)]
    res = linprog([0.0, 0.0, -1.0], a_ub, b_ub, bounds=bounds, method="highs")
    if res.status != 0 or res.x[2] < 0:
        return period, t0
    return float(res.x[1]), float(res.x[0])


def counter_intervals(
    samples: Sequence[CounterSample], *, grid: bool = True
) -> list[CounterInterval]:
    """The windows between consecutive publishes seen in ``samples`` (in time order); a
    counter that went backwards (a driver reload) breaks the chain."""
    brackets: list[tuple[float, float]] = []
    reads: list[float] = []
    values: list[int] = []
    for prev, cur in itertools.pairwise(samples):
        if cur.energy_mj != prev.energy_mj:
            brackets.append((prev.before_s, cur.after_s))
            reads.append(cur.time_s)
            values.append(cur.energy_mj)
    if len(samples) >= 10 and len(values) >= 0.9 * (len(samples) - 1):
        # It moves on (nearly) every read: each value is as of its read (an exact counter).
        times = reads
    else:
        times = publish_times(brackets, grid=grid)
    return [
        CounterInterval(t0, t1, (v1 - v0) / 1000.0)
        for (t0, v0), (t1, v1) in itertools.pairwise(zip(times, values, strict=True))
        if v1 >= v0 and t1 > t0
    ]


class CounterSampler:
    """Reads a GPU's energy counter periodically on a background thread (or a virtual
    clock's timer); the constructor does no I/O.

    Args:
        read_mj: The counter (``GPU.energy_mj``).
        now_s: Now on the device timeline (``EventSource.timeline_now_s``).
        period_s: Time between reads: well under the publish period and, on NVML, well over
            a read's ~3 ms.
        max_samples: Reads kept (oldest dropped first).
        clock: What paces the reads.

    Raises:
        ConfigError: for a non-positive period, or ``max_samples`` below 2.
    """

    def __init__(
        self,
        read_mj: Callable[[], int],
        now_s: Callable[[], float],
        *,
        period_s: float = 0.0125,
        max_samples: int = 200_000,
        clock: Clock = REAL_CLOCK,
    ) -> None:
        if not period_s > 0 or max_samples < 2:
            raise ConfigError(
                f"counter sampling period must be > 0 and max_samples >= 2, got {period_s}, "
                f"{max_samples}"
            )
        self._read = read_mj
        self._now = now_s
        self.period_s = float(period_s)
        self.clock = clock
        self._samples: collections.deque[CounterSample] = collections.deque(maxlen=max_samples)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cancel: Callable[[], None] | None = None  # a virtual clock's timer
        self.errors = 0
        self._warned = False
        self._reads = 0

    def start(self) -> CounterSampler:
        """Start reading (idempotent): a thread, or a timer on a virtual clock."""
        if self.running:
            return self
        if isinstance(self.clock, VirtualClock):
            self._cancel = self.clock.call_every(self.next_period_s, self.sample)
        else:
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._run, name="perseus-energy-sampler", daemon=True
            )
            self._thread.start()
        return self

    def close(self, timeout_s: float = 1.0) -> None:
        """Stop reading (idempotent); the samples stay readable."""
        self._stop.set()
        cancel, self._cancel = self._cancel, None
        if cancel is not None:
            cancel()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    @property
    def running(self) -> bool:
        return self._thread is not None or self._cancel is not None

    def __enter__(self) -> CounterSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def next_period_s(self) -> float:
        """The wait before the next read: ``period_s`` dithered between half and one and a half
        of it (a golden-ratio sequence), so reads sweep every phase of the publish grid."""
        self._reads += 1
        return self.period_s * (0.5 + (self._reads * _GOLDEN) % 1.0)

    def _run(self) -> None:
        now = self.clock.now
        next_s = now()
        while not self._stop.is_set():
            self.sample()
            next_s += self.next_period_s()
            delay = next_s - now()
            if delay < 0:  # fell behind (a slow read): do not burst to catch up
                next_s = now()
                delay = 0.0
            self._stop.wait(delay)  # a real-time sleep that close() interrupts

    def sample(self) -> CounterSample | None:
        """Read the counter once (None if the read failed: counted in :attr:`errors`)."""
        before = self._now()
        try:
            value = int(self._read())
        except DeviceError as e:
            self.errors += 1
            if not self._warned:
                self._warned = True
                _log.warning("energy counter read failed (further failures counted): %s", e)
            return None
        after = self._now()
        sample = CounterSample(before, after, value)
        with self._lock:
            self._samples.append(sample)
        return sample

    def samples(self) -> list[CounterSample]:
        """The reads kept, in time order."""
        with self._lock:
            return list(self._samples)

    def intervals(
        self, start_s: float, end_s: float, *, grid: bool = True
    ) -> list[CounterInterval]:
        """The publish-to-publish windows wholly inside ``[start_s, end_s]`` (reads up to a
        publish period outside it locate the publishes at its edges)."""
        samples = self.samples()
        if len(samples) < 2:
            return []
        margin = max(2.0 * self.period_s, _period_guess(samples))
        samples = [s for s in samples if start_s - margin <= s.before_s <= end_s + margin]
        return [
            w
            for w in counter_intervals(samples, grid=grid)
            if w.start_s >= start_s and w.end_s <= end_s
        ]

    def discard_before(self, time_s: float) -> None:
        """Forget reads taken before ``time_s`` (keeps memory bounded between sweep steps)."""
        with self._lock:
            while self._samples and self._samples[0].after_s < time_s:
                self._samples.popleft()


def counter_period_s(gpu: object) -> float:
    """How often ``gpu``'s energy counter publishes (NVML's 100 ms unless it says; 0: no GPU)."""
    if isinstance(gpu, CounterPeriodGPU):
        return float(gpu.publish_interval_s)
    return 0.0 if gpu is None else NVML_PUBLISH_PERIOD_S


def sample_period_for(gpu: object) -> float:
    """Time between counter reads for ``gpu``: an eighth of its publish period, within
    0.5-20 ms (about a quarter of a core on an H100); 1 ms for an exact counter."""
    period = counter_period_s(gpu)
    return min(0.02, max(0.0005, period / 8.0)) if period > 0 else 0.001


def _period_guess(samples: Sequence[CounterSample]) -> float:
    """The median time between value changes in the last reads (0 if fewer than two)."""
    tail = samples[-2000:]
    changes = [
        cur.time_s for prev, cur in itertools.pairwise(tail) if cur.energy_mj != prev.energy_mj
    ]
    if len(changes) < 2:
        return 0.0
    return float(np.median(np.diff(changes)))
