"""The GPU's energy counter as a series of windows: a background sampler and publish detection.

NVML's energy counter (``nvmlDeviceGetTotalEnergyConsumption``, mJ) is *published* every
~100 ms (docs/hardware.md#sim-defaults) and one read costs ~3 ms of driver time on an H100
(benchmarks/README.md, ``gpu_session.py``). Reading it at op boundaries gives 0 J or one whole
100 ms step per op, so op energy has to come from the windows between publishes instead:

* :class:`CounterSampler` reads the counter every ``period_s`` on its own thread (never the
  training thread; on a :class:`~perseus.device.clock.VirtualClock`, as the clock's timer, so
  emulation and tests run on virtual time) and stamps each read with the times just before and after it on the device
  timeline (:meth:`~perseus.device.base.EventSource.timeline_now_s`, the clock that device
  event times are on), so the reading is known to reflect the counter at some instant between
  the two stamps.
* :func:`counter_intervals` finds the publish instants (where the value changes between two
  reads) and returns the windows between consecutive publishes with the energy that the
  counter says was spent in each (:class:`CounterInterval`). A publish is only known to lie
  between the last read with the old value and the first with the new one (a bracket as wide
  as the sampling period); when the brackets fit a regular publish grid (the counter is
  published at a fixed period, as on the simulated GPU) the instants are placed on the fitted
  grid, which pins them far more tightly than one sampling period; otherwise each instant is
  the middle of its bracket.

:mod:`perseus.runtime.profiling.energy_attribution` turns windows plus the ops' device-time spans into
per-op power. The same code runs on a real GPU and on the simulated one.
"""

from __future__ import annotations

import collections
import itertools
import logging
import math
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
    """The window between two consecutive detected publishes and the energy spent in it."""

    start_s: float
    end_s: float
    energy_j: float

    @property
    def length_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def power_w(self) -> float:
        """Mean power over the window."""
        return self.energy_j / self.length_s if self.length_s > 0 else 0.0


def publish_times(brackets: Sequence[tuple[float, float]], *, grid: bool = True) -> list[float]:
    """Estimated publish instants from their brackets ``(lo, hi)`` (publish in ``(lo, hi]``).

    With ``grid`` and at least three brackets, fits ``t = t0 + P * n`` to the bracket middles
    (``n`` from the median spacing) and, if the latest grid point inside every bracket exists,
    returns those grid points; otherwise (or without ``grid``) the bracket middles. O(n).
    """
    mids = [0.5 * (lo + hi) for lo, hi in brackets]
    if not grid or len(brackets) < 3:
        return mids
    m = np.asarray(mids)
    lo = np.asarray([b[0] for b in brackets])
    hi = np.asarray([b[1] for b in brackets])
    p0 = float(np.median(np.diff(m)))
    if not p0 > 0:
        return mids
    # Fit on the narrow brackets only: a read delayed by the GIL or the driver widens its
    # bracket, and a bracket wider than a period may hold two publishes.
    narrow = (hi - lo) <= 0.5 * p0
    if int(narrow.sum()) < 3:
        return mids
    mn = m[narrow] - m[0]
    # The period whose grid the narrow brackets' middles agree on best (phase concentration),
    # searched around the median spacing, then refined by a linear fit of the indexed middles.
    candidates = p0 * np.linspace(0.8, 1.25, 2251)
    phases = np.exp(2j * np.pi * mn[None, :] / candidates[:, None])
    concentration = np.abs(phases.mean(axis=1))
    best = int(np.argmax(concentration))
    period = float(candidates[best])
    t0 = float(np.angle(phases[best].mean())) / (2 * np.pi) * period
    n = np.round((mn - t0) / period)
    if np.any(np.diff(n) < 1):
        return mids  # two changes within one period: not a regular grid
    period, t0 = (float(x) for x in np.polyfit(n, mn, 1))
    if not period > 0:
        return mids
    # The middles of brackets are biased when the reads drift in phase against the publishes:
    # take the grid deepest inside every narrow bracket instead (a 3-variable LP: maximise the
    # margin s with lo + s <= t0 + n P <= hi - s). Infeasible: keep the least-squares grid.
    period, t0 = _deepest_grid(n, lo[narrow] - m[0], hi[narrow] - m[0], period, t0)
    t0 += float(m[0])
    # The latest grid point at or before each bracket's end (a stalled sampler's bracket may
    # hold several publishes: the value read is the last one's).
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
    res = linprog(
        c=[0.0, 0.0, -1.0],
        A_ub=a_ub,
        b_ub=b_ub,
        bounds=[(None, None), (0.5 * period, 2.0 * period), (None, None)],
        method="highs",
    )
    if res.status != 0 or res.x[2] < 0:
        return period, t0
    return float(res.x[1]), float(res.x[0])


def counter_intervals(
    samples: Sequence[CounterSample], *, grid: bool = True
) -> list[CounterInterval]:
    """The windows between consecutive publishes seen in ``samples`` (in time order).

    The first window starts at the first detected publish: the energy before it is not known
    to belong to any window. A counter that went backwards (a driver reload) breaks the chain.
    """
    brackets: list[tuple[float, float]] = []
    reads: list[float] = []
    values: list[int] = []
    for prev, cur in itertools.pairwise(samples):
        if cur.energy_mj != prev.energy_mj:
            brackets.append((prev.before_s, cur.after_s))
            reads.append(cur.time_s)
            values.append(cur.energy_mj)
    if len(samples) >= 10 and len(values) >= 0.9 * (len(samples) - 1):
        # It moves on (nearly) every read: published at least as often as it is read, so
        # each value is as of its read (an exact counter) rather than of an earlier publish.
        times = reads
    else:
        times = publish_times(brackets, grid=grid)
    out: list[CounterInterval] = []
    for k in range(1, len(times)):
        delta_mj = values[k] - values[k - 1]
        if delta_mj < 0 or times[k] <= times[k - 1]:
            continue
        out.append(CounterInterval(times[k - 1], times[k], delta_mj / 1000.0))
    return out


class CounterSampler:
    """Reads a GPU's energy counter periodically on a background thread (or, on a
    :class:`~perseus.device.clock.VirtualClock`, as that clock's timer: each read at its due
    virtual time, as the training thread's waits pass it).

    Usage::

        sampler = CounterSampler(gpu.energy_mj, events.timeline_now_s, period_s=0.0125)
        sampler.start()
        ...
        windows = sampler.intervals(t0, t1)     # publish-to-publish windows inside [t0, t1]
        sampler.close()

    The constructor does no I/O. Tests may also call :meth:`sample` themselves instead of
    starting it.

    Args:
        read_mj: The counter (``GPU.energy_mj``).
        now_s: Now on the device timeline (``EventSource.timeline_now_s``).
        period_s: Time between reads. Keep it well under the counter's publish period (a
            publish is located within one period) and, on NVML, well over a read's ~3 ms.
        max_samples: Reads kept (oldest dropped first).
        clock: What paces the reads (default the process's monotonic clock; the device's own,
            :func:`~perseus.device.clock.clock_of`, for a simulated GPU). A
            :class:`~perseus.device.clock.VirtualClock` fires them as its timer; with any other
            clock a thread waits out each period in real time.

    Raises:
        ConfigError: for a non-positive period.
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
        """The wait before the next read: ``period_s`` on average, dithered between half and
        one and a half of it (a golden-ratio sequence). Reads at a fixed period that divides
        the counter's publish period (12.5 ms into NVML's 100 ms) meet every publish at the
        same phase, so the publish grid is never located better than one read period, and a
        grid off by a few milliseconds moves energy between the ops next to the bubbles
        (seen: a stage's forward rows 4-6 % low on virtual time). Dithered reads sweep every
        phase."""
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

    def samples(self, start_s: float = -math.inf, end_s: float = math.inf) -> list[CounterSample]:
        """The reads taken between ``start_s`` and ``end_s``, in time order."""
        with self._lock:
            return [s for s in self._samples if start_s <= s.before_s and s.after_s <= end_s]

    def intervals(
        self, start_s: float, end_s: float, *, grid: bool = True
    ) -> list[CounterInterval]:
        """The publish-to-publish windows lying wholly inside ``[start_s, end_s]``.

        Reads up to one publish period (estimated from the reads) outside the span are used
        to locate the publishes at its edges.
        """
        with self._lock:
            samples = list(self._samples)
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
    """How often ``gpu``'s energy counter publishes: ``publish_interval_s`` on the simulator,
    NVML's 100 ms otherwise (0: no GPU, no counter)."""
    if gpu is None:
        return 0.0
    return (
        float(gpu.publish_interval_s)
        if isinstance(gpu, CounterPeriodGPU)
        else NVML_PUBLISH_PERIOD_S
    )


def sample_period_for(gpu: object) -> float:
    """Time between counter reads for ``gpu``: an eighth of its publish period
    (``publish_interval_s`` on the simulator; NVML's 100 ms otherwise), within 0.5-20 ms.

    An eighth locates each publish within 12.5 ms on NVML before the grid fit, and costs about
    a quarter of one core at ~3 ms per read (an H100); an exact counter (period 0) is read
    every millisecond.
    """
    period = counter_period_s(gpu)
    if period <= 0:
        return 0.001
    return min(0.02, max(0.0005, float(period) / 8.0))


def _period_guess(samples: Sequence[CounterSample]) -> float:
    """The median time between value changes in the last reads (0 if fewer than two)."""
    tail = samples[-2000:]
    changes = [
        cur.time_s for prev, cur in itertools.pairwise(tail) if cur.energy_mj != prev.energy_mj
    ]
    if len(changes) < 2:
        return 0.0
    return float(np.median(np.diff(changes)))
