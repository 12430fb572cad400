"""The clock seam: a virtual clock moves only when slept on, fires periodic callbacks at their
due times, and never rounds a wait to nothing."""

from __future__ import annotations

import time

import pytest

from perseus.device.clock import REAL_CLOCK, Clock, RealClock, VirtualClock, WallClock, retry


def test_every_clock_implements_the_protocol() -> None:
    for clock in (REAL_CLOCK, RealClock(), WallClock(), VirtualClock()):
        assert isinstance(clock, Clock)
    assert REAL_CLOCK.real_time and not VirtualClock().real_time


def test_virtual_clock_moves_only_when_slept_on_and_never_waits() -> None:
    clock = VirtualClock(5.0)
    t0 = time.perf_counter()
    clock.sleep(3600.0)
    assert time.perf_counter() - t0 < 1.0  # an hour of virtual time costs nothing
    assert clock.now() == 3605.0
    clock.sleep(-1.0)
    assert clock.now() == 3605.0
    assert clock.sleeps == 2


def test_a_wait_too_small_for_the_float_still_moves_the_clock() -> None:
    """A waiter polling ``until - now`` would spin forever if a tiny sleep left now alone."""
    clock = VirtualClock(1e9)
    before = clock.now()
    clock.sleep(1e-12)  # below the float's resolution at 1e9 s
    assert clock.now() > before


def test_periodic_callbacks_fire_at_their_due_times_in_order() -> None:
    clock = VirtualClock(0.0)
    seen: list[tuple[str, float]] = []
    clock.call_every(0.3, lambda: seen.append(("a", clock.now())))
    waits = iter([0.25, 0.5, 0.25, 0.5])
    clock.call_every(lambda: next(waits), lambda: seen.append(("b", clock.now())))
    clock.sleep(1.0)
    assert clock.now() == 1.0
    assert [name for name, _ in seen] == ["b", "a", "a", "b", "a", "b"]
    assert [t for _, t in seen] == pytest.approx([0.25, 0.3, 0.6, 0.75, 0.9, 1.0])
    with pytest.raises(ValueError):
        clock.call_every(0.0, lambda: None)


def test_a_periodic_callback_stops_when_cancelled_even_from_inside_a_call() -> None:
    clock = VirtualClock(0.0)
    seen: list[float] = []
    cancel = clock.call_every(0.1, lambda: seen.append(clock.now()))
    clock.sleep(0.25)
    cancel()
    cancel()  # idempotent
    clock.sleep(1.0)
    assert seen == pytest.approx([0.1, 0.2])

    def once() -> None:  # the only timer cancels itself while the clock fires it
        seen.append(clock.now())
        stop()

    stop = clock.call_every(0.5, once)
    clock.sleep(2.0)
    assert seen[2:] == pytest.approx([1.75]) and clock.now() == pytest.approx(3.25)


def test_a_callback_sleeping_on_the_clock_never_moves_it_back() -> None:
    """A sampler's counter read sleeps its latency on the device's clock (a fake NVML's 3 ms)
    from inside the timer: the clock stays at least where that left it."""
    clock = VirtualClock(0.0)
    seen: list[float] = []

    def read() -> None:
        clock.sleep(0.003)  # the read's latency
        seen.append(clock.now())

    clock.call_every(0.005, read)
    clock.sleep(0.006)
    assert seen == pytest.approx([0.008])
    assert clock.now() >= seen[-1]
    before = clock.now()
    clock.sleep(0.001)
    assert clock.now() == pytest.approx(before + 0.001)


def test_retry_sleeps_its_back_off_on_the_clock_and_returns_the_first_success() -> None:
    clock = VirtualClock()
    calls: list[float] = []

    def flaky() -> str:
        calls.append(clock.now())
        if len(calls) < 3:
            raise TimeoutError("transient")
        return "ok"

    def transient(e: Exception) -> bool:
        return isinstance(e, TimeoutError)

    assert retry(flaky, transient=transient, backoff_s=(0.01, 0.05), clock=clock) == "ok"
    assert calls == pytest.approx([0.0, 0.01, 0.06])


def test_retry_raises_the_last_error_and_never_retries_another() -> None:
    clock = VirtualClock()
    tries: list[int] = []

    def failing(error: Exception) -> None:
        tries.append(1)
        raise error

    with pytest.raises(TimeoutError):
        retry(
            lambda: failing(TimeoutError()), transient=lambda e: True, backoff_s=(1, 2), clock=clock
        )
    assert len(tries) == 3 and clock.now() == 3.0  # the first try and two more, 1 s and 2 s apart
    clock = VirtualClock()
    tries.clear()
    with pytest.raises(PermissionError):
        retry(
            lambda: failing(PermissionError()),
            transient=lambda e: isinstance(e, TimeoutError),
            backoff_s=(1, 2),
            clock=clock,
        )
    assert len(tries) == 1 and clock.now() == 0.0
