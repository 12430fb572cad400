"""The simulated GPU's compute stream: queued ops run in order on the device's own timeline.

A launch returns at once; the queue runs back to back at the effective clock of the moment,
so an op spanning a clock change is priced piece by piece. Nothing runs in the background:
every call commits the timeline up to "now" (exact: changes only ever happen now) and
publishes the planned segments to the shared state, so every process reads one energy counter.
"""

from __future__ import annotations

import contextlib
import math
import random
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from perseus.device.sim_state import State, publish_tick
from perseus.schedule.actions import Kind

if TYPE_CHECKING:
    from perseus.device.sim_shared import SimSharedState

__all__ = ["OpTrace", "SimEvent", "SimStream"]

#: Bumped by every change to any stream of the process: predicted event times are cached per
#: version (else predicting through chains of cross-stream waits is exponential in depth). A
#: list, not a class attribute: writing one invalidates the type's method cache.
_VERSION = [0]

#: Spin (instead of sleeping) for this long before an event's predicted time.
_SPIN_S = 0.0003


class SimEvent:
    """A point on a simulated stream (the :class:`~perseus.device.base.DeviceEvent` protocol).

    Attributes:
        energy_mj: The device's published energy counter as of the event's device time (None
            until it completed).
    """

    __slots__ = ("_stream", "_time_s", "energy_mj")

    def __init__(self, stream: SimStream) -> None:
        self._stream = stream
        self._time_s: float | None = None
        self.energy_mj: int | None = None

    def _complete(self, time_s: float, energy_mj: int) -> None:
        self._time_s = time_s
        self.energy_mj = energy_mj

    def query(self) -> bool:
        """True once the device has passed this point."""
        if self._time_s is not None:
            return True
        self._stream.poll()
        return self._time_s is not None

    def synchronize(self) -> None:
        """Block until the device has passed this point."""
        self._stream.wait_for(self)

    def wait(self, until_s: float) -> bool:
        """Block until the device has passed this point (True) or its clock reads ``until_s``
        (False); on a virtual clock, one step to the earlier of the two."""
        return self._stream.wait_for(self, until_s)

    def device_time_s(self) -> float:
        """When the device passed this point (the GPU's clock); waits for it if needed."""
        if self._time_s is None:
            self.synchronize()
        assert self._time_s is not None  # set by synchronize
        return self._time_s


@dataclass(frozen=True, slots=True)
class OpTrace:
    """How one op really ran: ``(clock_mhz, time_s)`` pieces, in order, one per clock."""

    seq: int
    stage_index: int
    kind: Kind
    start_s: float
    end_s: float
    pieces: tuple[tuple[int, float], ...]


@dataclass(slots=True, eq=False)
class _Op:
    seq: int
    stage_index: int
    kind: Kind
    time_mult: float
    power_mult: float
    done: float = 0.0  # fraction of the op's work completed
    until: float = 1.0  # the share of its work this launch runs to (the rest: a later one's)
    start_s: float | None = None
    pieces: list[tuple[int, float]] | None = None


@dataclass(slots=True, eq=False)
class _Wait:
    """The stream waits until ``until_s``, or until another stream's ``event`` completed."""

    until_s: float
    event: SimEvent | None = None

    def end_s(self) -> float:
        """When the wait ends: the event's time, else the other stream's prediction (commits
        nothing, so streams waiting on each other never re-enter one another)."""
        event = self.event
        if event is None:
            return self.until_s
        if event._time_s is not None:
            return event._time_s
        predicted = event._stream._predict(event)
        return math.inf if predicted is None else predicted


_Item = _Op | _Wait | SimEvent


class SimStream:
    """One simulated GPU's stream: its queue and timeline; the shared state, prices and
    counter parameters are the device's.

    Thread-safe: one re-entrant lock serves every stream of the process (a stream waiting on
    another's event reads it under its own lock; a signal handler may reset the clock inside
    a stream call).
    """

    _LOCK = threading.RLock()

    def __init__(self, device: SimSharedState) -> None:
        self._dev = device
        self._now = device.clock.now
        self._top_mhz = device._clocks[0]
        self._idle_w = device.true_blocking_power_w
        self._interval_s = device.publish_interval_s
        self._gain = device.counter_gain
        self._lock = SimStream._LOCK
        self._times_cache: tuple[int, dict[int, float]] = (-1, {})
        self._queue: deque[_Item] = deque()
        self._t_dev: float | None = None  # the timeline is committed up to here
        self._lock_mhz: int | None = None  # the lock as the device applies it
        self._cap_w: float | None = device.power_cap_w  # the enforced power cap (limit or board's)
        self._energy_j = 0.0  # exact energy at _t_dev (this stream's own integral)
        self._tick_energy_j = 0.0  # exact energy at the last publish tick passed
        self._tick_s = -math.inf
        self._rng: random.Random | None = None
        self._seq = 0
        # The op launched last, if only up to a share of its work: launch() runs the rest.
        self._part: _Op | None = None
        self._idle_since = -math.inf  # when the queue last ran dry
        self._floor_s = -math.inf  # the latest completed event: nothing moves before it
        # The latest publish instant whose counter someone read (see observe()).
        self._observed_s = -math.inf
        self._last_backdated: SimEvent | None = None  # recorded at the pending backdate
        self._backdate: float | None = None
        # The end of the last op launched, once it ran: the next event recorded marks it.
        self._early_end: float | None = None
        # (start, energy then, power) pieces covering the span since the queue last ran dry.
        self._recent: list[tuple[float, float, float]] = []
        self._idle = True  # the queue is empty and _recent describes the idle span
        #: Completed ops with their clock pieces, when tracing (``trace_ops=True``).
        self.trace: list[OpTrace] | None = None
        #: When the last lock change took effect, on the device's clock (None: none yet).
        self.lock_applied_s: float | None = None

    def _clock_for(self, op: _Op) -> tuple[int, float, float]:
        """``(clock, time_s, power_w)`` of ``op`` run entirely at the current lock."""
        dev = self._dev
        target = self._top_mhz if self._lock_mhz is None else self._lock_mhz
        f_eff, t, e = dev._pricer.price(
            op.stage_index, op.kind, target, self._cap_w, dev._mem_locked
        )
        return f_eff, t * op.time_mult, (e / t) * op.power_mult

    def _start(self, now: float) -> None:
        if self._t_dev is None:
            state = self._dev._state()
            self._t_dev = now
            self._idle_since = self._floor_s = now  # no history before this stream existed
            self._recent = [(now, float(state["energy_j"]), self._idle_w)]
            self._lock_mhz = None if state["locked_mhz"] is None else int(state["locked_mhz"])
            self._cap_w = self._dev._cap_w(state)
            self._energy_j = float(state["energy_j"])
            self._tick_energy_j = self._energy_j
            self._tick_s = publish_tick(now, self._interval_s)

    def _integrate(self, a: float, b: float, power_w: float) -> None:
        """Add ``power_w`` over ``[a, b]`` to the stream's energy, noting publish ticks (each
        instant when publishing exactly)."""
        tick = publish_tick(b, self._interval_s)
        if tick > self._tick_s:
            self._tick_energy_j = self._energy_j + power_w * max(0.0, tick - a)
            self._tick_s = tick
        self._energy_j += power_w * (b - a)

    def _published_at_mj(self, t: float, now: float) -> int:
        """The counter as of a past time ``t`` since the queue last ran dry (a backdated
        event), from the power history of that span (``_recent``)."""
        recent = self._recent
        if t >= now or not recent or t < recent[0][0]:
            return self._published_mj()
        # not quite the tick before recent[0], but within one period of it
        tick = max(publish_tick(t, self._interval_s), recent[0][0])
        t0, e0, p = [seg for seg in recent if seg[0] <= tick][-1]  # the piece covering tick
        return math.floor((e0 + p * (tick - t0)) * 1000.0 * self._gain)

    def _published_mj(self) -> int:
        return math.floor(self._tick_energy_j * 1000.0 * self._gain)

    def _commit(self) -> float:
        """Run the queue from the committed time up to now at the current clock; returns now."""
        now = self._now()
        self._start(now)
        t = self._t_dev
        assert t is not None
        if now <= t:
            return now
        _VERSION[0] += 1
        queue = self._queue
        idle_w = self._idle_w
        while queue:
            item = queue[0]
            if isinstance(item, SimEvent):
                item._complete(t, self._published_mj())
                self._floor_s = t
                done = True
            elif isinstance(item, _Wait):
                t, done = self._run_wait(item, t, now, idle_w)
            else:
                t, done = self._run_op(item, t, now)
            if not done:
                break
            queue.popleft()
        if not queue and not self._idle:  # the queue just ran dry at t
            self._idle = True
            self._idle_since = t
            self._recent = [(t, self._energy_j, idle_w)]
        elif queue:
            self._idle = False
        if t < now:  # idle (nothing queued): blocking power
            self._integrate(t, now, idle_w)
        self._t_dev = now
        return now

    def _run_wait(self, item: _Wait, t: float, now: float, idle_w: float) -> tuple[float, bool]:
        """Wait from ``t`` towards ``now``: ``(time reached, whether the wait is over)``."""
        until = item.end_s()
        if until <= t:
            return t, True
        end = min(until, now)
        self._integrate(t, end, idle_w)
        return end, end >= until

    def _run_op(self, item: _Op, t: float, now: float) -> tuple[float, bool]:
        """Run the head op from ``t`` towards ``now``: ``(time reached, whether it ended)``."""
        f_eff, full_s, power_w = self._clock_for(item)
        remaining_s = (item.until - item.done) * full_s
        if item.start_s is None:
            item.start_s = t
        if t + remaining_s > now:
            self._integrate(t, now, power_w)
            self._piece(item, f_eff, now - t)
            item.done += (now - t) / full_s
            return now, False
        end = t + remaining_s
        self._integrate(t, end, power_w)
        self._piece(item, f_eff, remaining_s)
        if len(self._queue) == 1 and item.seq == self._seq - 1:
            # The queue runs dry on the last op launched before the host recorded the event
            # behind it: a GPU host would have enqueued it already, so it completes here.
            self._early_end = end
        self._trace(item, item.start_s, end)
        return end, True

    def _trace(self, op: _Op, start_s: float, end_s: float) -> None:
        """Keep a completed op's clock pieces when tracing (an op launched in parts: one)."""
        trace = self.trace
        if trace is None or op.pieces is None:
            return
        if trace and trace[-1].seq == op.seq:  # a later part of the last op: merge into it
            first, later = trace.pop(), op.pieces
            start_s, op.pieces = first.start_s, list(first.pieces)
            for clock_mhz, time_s in later:
                self._piece(op, clock_mhz, time_s)
        trace.append(OpTrace(op.seq, op.stage_index, op.kind, start_s, end_s, tuple(op.pieces)))

    def _piece(self, op: _Op, clock_mhz: int, time_s: float) -> None:
        if self.trace is None or time_s <= 0:
            return
        if op.pieces is None:
            op.pieces = []
        if op.pieces and op.pieces[-1][0] == clock_mhz:
            op.pieces[-1] = (clock_mhz, op.pieces[-1][1] + time_s)
        else:
            op.pieces.append((clock_mhz, time_s))

    def _predict(self, event: SimEvent) -> float | None:
        """When ``event`` completes if no clock changes again (no commit; None if unknown)."""
        if event._time_s is not None:
            return event._time_s
        if self._t_dev is None:
            return None
        version, times = self._times_cache
        if version != _VERSION[0]:
            times = {}
            self._times_cache = (_VERSION[0], times)
        key = id(event)
        if key not in times:
            # Up to the event only: a later wait may depend on this very event.
            times.update(self._plan(stop_at=event)[1])
        return times.get(key)

    def _plan(self, stop_at: SimEvent | None = None) -> tuple[list[list[float]], dict[int, float]]:
        """The future at the current clock: op segments and each queued event's time."""
        t = self._t_dev
        assert t is not None
        segments: list[list[float]] = []
        when: dict[int, float] = {}
        for item in tuple(self._queue):
            if isinstance(item, SimEvent):
                when[id(item)] = t
                if item is stop_at:
                    break
            elif isinstance(item, _Wait):
                t = max(t, item.end_s())
            else:
                f_eff, full_s, power_w = self._clock_for(item)
                end = t + (item.until - item.done) * full_s
                segments.append([t, end, power_w, float(f_eff)])
                t = end
        return segments, when

    def _publish(self, now: float, lock_changed: bool = False) -> None:
        """Write the planned segments (and the lock) to the shared state."""
        segments, _ = self._plan()
        lock = self._lock_mhz

        def change(state: State) -> None:
            state["segments"] = segments
            if lock_changed:
                state["locked_mhz"] = lock

        self._dev._update(change, now)

    def launch(self, stage_index: int, kind: Kind, until: float = 1.0) -> None:
        part = self._part
        if part is not None and (part.stage_index, part.kind) == (stage_index, kind):
            # The next part of the op launched last: the same op, noise and all.
            op = _Op(part.seq, stage_index, kind, part.time_mult, part.power_mult, part.until)
        else:
            dev = self._dev
            noise = dev.noise
            time_mult = power_mult = 1.0
            if noise is not None:
                if self._rng is None:
                    self._rng = noise.rng(dev.index)
                time_mult = math.exp(self._rng.gauss(0.0, noise.time_sigma))
                power_mult = math.exp(self._rng.gauss(0.0, noise.power_sigma))
            slowdown = float(dev._state()["slowdown"])
            op = _Op(-1, stage_index, kind, time_mult * slowdown, power_mult)
        op.until = until
        self._part = op if until < 1.0 else None
        with self._lock:
            if op.seq < 0:
                op.seq = self._seq
                self._seq += 1
            now = self._commit()
            start = self._backdate
            if start is not None and self._observed_s > start:
                # A counter read since backdate() fixed a later publish: the op starts there,
                # and so does the event recorded just before it (the op's start event).
                start = self._observed_s
                last = self._last_backdated
                if last is not None:
                    last._complete(start, self._published_at_mj(start, now))
                    self._floor_s = max(self._floor_s, start)
            self._last_backdated = self._backdate = self._early_end = None
            self._queue.append(op)
            _VERSION[0] += 1
            self._idle = False
            if start is not None and len(self._queue) == 1 and start < now:
                self._run_since(op, start, now)
                _VERSION[0] += 1
            self._publish(now)

    def _run_since(self, op: _Op, start: float, now: float) -> None:
        """The op has run since ``start`` (past idle time becomes op time), maybe to its end."""
        f_eff, full_s, power_w = self._clock_for(op)
        left_s = (op.until - op.done) * full_s
        span = min(now - start, left_s)
        op.start_s = start
        op.done += span / full_s
        self._piece(op, f_eff, span)
        idle_w = self._idle_w
        e_start = self._energy_j - idle_w * (now - start)
        extra_j = (power_w - idle_w) * span
        self._energy_j += extra_j
        if self._tick_s >= start:
            self._tick_energy_j += (power_w - idle_w) * min(span, self._tick_s - start)
        self._recent = [(start, e_start, power_w)]
        if span >= left_s:  # finished in the past
            self._queue.pop()
            end = start + left_s
            self._idle_since = self._early_end = end
            self._recent.append((end, e_start + power_w * left_s, idle_w))
            self._idle = True
            self._trace(op, start, end)

        def change(state: State) -> None:
            state["energy_j"] = float(state["energy_j"]) + extra_j
            # The value published at the last tick must include the op's work before it.
            tick = float(state["pub_tick"])
            if float(state["publish_interval_s"]) > 0 and tick > start:
                moved_j = (power_w - idle_w) * min(span, tick - start)
                gain = float(state.get("counter_gain", 1.0))
                state["pub_mj"] = int(state["pub_mj"]) + round(moved_j * 1000.0 * gain)

        self._dev._update(change, now)

    def backdate(self, ready_s: float) -> None:
        """See :meth:`.SimulatedGPU.backdate`."""
        with self._lock:
            now = self._commit()
            if self._queue:
                return  # busy: the op will start after the queued work anyway
            start = max(ready_s, self._idle_since, self._floor_s, self._observed_s)
            self._backdate = start if start < now else None

    def observe(self, time_s: float) -> None:
        """Someone read the energy counter at ``time_s``: backdated work may not start before
        that publish instant (the reader saw idle energy there). Call under the lock."""
        self._observed_s = max(self._observed_s, publish_tick(time_s, self._interval_s))

    def wait_until(self, time_s: float) -> None:
        self._enqueue_wait(_Wait(time_s))

    def wait_event(self, event: SimEvent) -> None:
        if event._stream is not self:  # a stream is ordered already
            self._enqueue_wait(_Wait(-math.inf, event))

    def _enqueue_wait(self, wait: _Wait) -> None:
        with self._lock:
            self._commit()
            _VERSION[0] += 1
            self._queue.append(wait)
            self._idle = False

    def record_event(self) -> SimEvent:
        event = SimEvent(self)
        self._part = None  # an op's parts are launched back to back
        with self._lock:
            now = self._commit()
            _VERSION[0] += 1
            self._last_backdated = None
            if self._queue:
                self._queue.append(event)
            else:
                when = now
                if self._backdate is not None:
                    when = self._backdate
                    self._last_backdated = event
                elif self._early_end is not None:
                    when = self._early_end  # right behind the last op launched
                self._early_end = None
                event._complete(when, self._published_at_mj(when, now))
                self._floor_s = when
        return event

    @contextlib.contextmanager
    def _changing(self, lock_changed: bool = False) -> Iterator[float]:
        """Run the queue up to now (yielded), let the caller change the stream, and publish
        the re-planned future."""
        with self._lock:
            now = self._commit()
            _VERSION[0] += 1  # the queued ops' prices may change: predictions are stale
            yield now
            self._publish(now, lock_changed=lock_changed)

    def set_lock(self, lock_mhz: int | None) -> None:
        """Apply a new lock now (the set call's latency has already passed)."""
        with self._changing(lock_changed=True) as now:
            self._lock_mhz = lock_mhz
            self.lock_applied_s = now

    def reprice(self) -> None:
        """Re-plan the queued ops now at unchanged lock and cap (a memory-clock change)."""
        with self._changing():
            pass

    def set_cap(self, cap_w: float | None) -> None:
        """Apply a new power cap now (a power limit set or reset; the clock follows at once)."""
        with self._changing():
            self._cap_w = cap_w

    def poll(self) -> None:
        with self._lock:
            self._commit()

    def wait_for(self, event: SimEvent, until_s: float = math.inf) -> bool:
        """Wait until ``event`` completed (True) or the clock reads ``until_s`` (False)."""
        clock = self._dev.clock
        while True:
            with self._lock:
                now = self._commit()
                if event._time_s is not None:
                    return True
                if now >= until_s:
                    return False
                predicted = self._plan()[1].get(id(event))  # if the clock does not change
            if predicted is None:
                return True
            remaining = min(predicted, until_s) - clock.now()
            # Virtual clock: one step of 1 ns at least; real: sleep, then spin the last stretch.
            clock.sleep(
                max(remaining, 1e-9) if not clock.real_time else max(0.0, remaining - _SPIN_S)
            )
