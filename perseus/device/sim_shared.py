"""The simulated GPU's base (:class:`SimSharedState`): its model and the state it shares."""

from __future__ import annotations

import contextlib
import math
import os
import random
import threading
import uuid as _uuid
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from perseus.device.base import nearest_clock_mhz
from perseus.device.clock import WALL_CLOCK, Clock, RealClock, WallClock
from perseus.device.ownership import owner_lock_path
from perseus.device.private_dir import SIM_DIR_ENV
from perseus.device.sim_calls import SetCall, recorded_set_call
from perseus.device.sim_costs import MemCostFn, OpCostFn, OpPricer, SimNoise
from perseus.device.sim_state import (
    SimStateFile,
    State,
    advance,
    default_state_dir,
    energy_at,
    enforced_limit_w,
    write_info,
)
from perseus.device.sim_stream import SimStream
from perseus.errors import (
    ConfigError,
    DeviceError,
    DeviceNotSupportedError,
    DevicePermissionError,
    PerseusError,
)
from perseus.schedule.actions import Kind

__all__ = ["SimSharedState", "sim_uuid"]


def _clock_kind(clock: Clock) -> str:
    """How another process can read ``clock``: ``"wall"``, ``"monotonic"`` or ``"virtual"``
    (it cannot; :func:`.sim_state.now_for` reads each)."""
    if isinstance(clock, RealClock):
        return "wall" if isinstance(clock, WallClock) else "monotonic"
    return "virtual"


def _checked_p99_s(
    name: str,
    clocks_mhz: tuple[int, ...] | list[int],
    blocking_power_w: float,
    publish_interval_s: float,
    set_latency_s: float,
    set_latency_p99_s: float | None,
) -> float:
    """The set latency's 99th percentile (default 2.4 x the median), after checking inputs."""
    if not clocks_mhz:
        raise ConfigError(f"simulated GPU {name!r}: clock list is empty")
    if blocking_power_w < 0 or publish_interval_s < 0 or set_latency_s < 0:
        raise ConfigError(
            f"simulated GPU {name!r}: blocking_power_w, publish_interval_s and "
            "set_latency_s must be >= 0"
        )
    p99 = 2.4 * set_latency_s if set_latency_p99_s is None else set_latency_p99_s
    if set_latency_s > 0 and p99 < set_latency_s:
        raise ConfigError(
            f"simulated GPU {name!r}: set_latency_p99_s ({p99}) is below the median "
            f"set_latency_s ({set_latency_s})"
        )
    return float(p99)


def sim_uuid(index: int) -> str:
    """The stable UUID of simulated GPU ``index`` (every process finds the same GPU)."""
    return f"GPU-{_uuid.uuid5(_uuid.NAMESPACE_URL, f'perseus-sim/{index}')}"


class SimSharedState:
    """The base of :class:`~perseus.device.simulated.SimulatedGPU` (its constructor, whose
    arguments that class documents): the model's parameters, the state file every process
    shares (lock, energy, slowdown, memory lock, power limit), prices, error injection."""

    def __init__(
        self,
        *,
        name: str,
        clocks_mhz: tuple[int, ...] | list[int],
        op_cost_fn: OpCostFn,
        blocking_power_w: float,
        index: int = 0,
        state_dir: str | Path | None = None,
        publish_interval_s: float = 0.1,
        set_latency_s: float = 0.005,
        set_latency_p99_s: float | None = None,
        noise: SimNoise | None = None,
        power_cap_w: float | None = None,
        idle_clock_mhz: int | None = None,
        privileged: bool = True,
        clamp_out_of_range: bool = True,
        source: str = "",
        clock: Clock = WALL_CLOCK,
        seed: int = 0,
        trace_ops: bool = False,
        memory_clocks_mhz: tuple[int, ...] = (),
        mem_cost_fn: MemCostFn | None = None,
        record_set_calls: int = 0,
        set_return_lag_s: float = 0.0,
    ) -> None:
        # What this GPU was built from, so that placed() can build its twin.
        self._config: dict[str, Any] = {k: v for k, v in locals().items() if k != "self"}
        p99 = _checked_p99_s(
            name, clocks_mhz, blocking_power_w, publish_interval_s, set_latency_s, set_latency_p99_s
        )
        self._mem_clocks = tuple(sorted(set(memory_clocks_mhz), reverse=True))
        if len(self._mem_clocks) > 1 and mem_cost_fn is None:
            raise ConfigError(f"simulated GPU {name!r}: memory clocks need a mem_cost_fn")
        self._name = name
        self._clocks = tuple(sorted(set(clocks_mhz), reverse=True))
        self._ascending = tuple(reversed(self._clocks))
        self._cost_fn = op_cost_fn
        self._pricer = OpPricer(self._clocks, op_cost_fn, self._mem_clocks, mem_cost_fn)
        self._mem_locked: int | None = None  # this process's memory lock (also in the state)
        self.blocking_power_w = float(blocking_power_w)
        self.index = index
        self._state_dir = Path(state_dir) if state_dir is not None else None
        self.publish_interval_s = float(publish_interval_s)
        self.set_latency_s = float(set_latency_s)
        self.set_latency_p99_s = p99
        # lognormal sigma from the median and the 99th percentile (z_0.99 = 2.3263)
        self._latency_sigma = (
            math.log(p99 / set_latency_s) / 2.3263 if set_latency_s > 0 and p99 > 0 else 0.0
        )
        self._latency_rng = random.Random(f"perseus-sim-latency/{seed}/{index}")
        self.noise = noise
        self.power_cap_w = power_cap_w
        self._idle_clock = idle_clock_mhz if idle_clock_mhz is not None else self._clocks[-1]
        self.privileged = privileged
        self.clamp_out_of_range = clamp_out_of_range
        self.source = source
        self.clock = clock
        self._clock: Callable[[], float] = self.clock.now
        self._sleep: Callable[[float], None] = self.clock.sleep
        self._uuid = sim_uuid(index)
        self._file: SimStateFile | None = None
        self._injected: dict[str, list[DeviceError]] = {}
        self._last_mj = 0
        self._attach_lock = threading.Lock()
        self._stream = SimStream(self)
        if trace_ops:
            self._stream.trace = []
        if record_set_calls < 0 or set_return_lag_s < 0:
            raise ConfigError(
                "record_set_calls and set_return_lag_s must be >= 0, got "
                f"{record_set_calls}, {set_return_lag_s}"
            )
        self._set_calls: deque[SetCall] | None = (
            deque(maxlen=record_set_calls) if record_set_calls else None
        )
        self.set_return_lag_s = float(set_return_lag_s)

    @property
    def explicit_state_dir(self) -> bool:
        """Whether the state directory was chosen (argument or ``$PERSEUS_SIM_DIR``)."""
        return self._state_dir is not None or bool(os.environ.get(SIM_DIR_ENV))

    @property
    def uuid(self) -> str:
        return self._uuid

    @property
    def name(self) -> str:
        return self._name

    @property
    def state_dir(self) -> Path:
        """The directory holding this GPU's state."""
        if self._state_dir is None:
            self._state_dir = default_state_dir()
        return self._state_dir

    def owner_lock_path(self) -> Path:
        """Ownership lock file, next to the state."""
        return owner_lock_path(self.state_dir, self._uuid)

    def watchdog_spec(self) -> dict[str, str]:
        """What the watchdog needs to reset this GPU from another process."""
        return {"backend": "sim", "state_dir": str(self.state_dir), "uuid": self._uuid}

    def _info(self) -> State:
        return {
            "uuid": self._uuid,
            "index": self.index,
            "name": self._name,
            "source": self.source,
            "clocks_mhz": list(self._clocks),
            "idle_clock_mhz": self._idle_clock,
        }

    @property
    def true_blocking_power_w(self) -> float:
        """The blocking power this device really draws (with the noise's error)."""
        if self.noise is None:
            return self.blocking_power_w
        return self.blocking_power_w * (1.0 + self.noise.blocking_offset(self.index))

    @property
    def counter_gain(self) -> float:
        """The share of the true energy the counter reports (1 without noise)."""
        return 1.0 if self.noise is None else self.noise.counter_gain

    def _attach(self, state: State | None, now: float) -> State:
        """Create the state, or adopt one with this process's model parameters (keeping the
        clock locks, counter, slowdown and power limit: the "hardware")."""
        if state is None:
            state = {
                "uuid": self._uuid,
                "index": self.index,
                "locked_mhz": None,
                "power_limit_w": None,  # None: the default limit (power_cap_w)
                "slowdown": 1.0,
                "energy_j": 0.0,
                "t_last": now,
                "clock": _clock_kind(self.clock),
                "segments": [],
                "pub_tick": 0.0,
                "pub_mj": 0,
            }
        else:
            advance(state, now)  # at the old model's power
        state.update(
            idle_power_w=self.true_blocking_power_w,
            publish_interval_s=self.publish_interval_s,
            counter_gain=self.counter_gain,
            power_cap_w=self.power_cap_w,
        )
        # The board's default limit, what every reset restores; a handle without an op model
        # (no default known here) keeps the recorded one.
        default: float | None = None
        with contextlib.suppress(DeviceError):
            default = self.power_limit_range_w()[1]
        if default is not None or "default_power_limit_w" not in state:
            state["default_power_limit_w"] = default
        return state

    def _store(self) -> SimStateFile:
        f = self._file
        if f is None:
            with self._attach_lock:  # the clock worker and the training thread may race
                f = self._file
                if f is None:
                    f = SimStateFile(self.state_dir, self._uuid)
                    now = self._clock()
                    f.update(lambda s: self._attach(s, now))
                    write_info(self.state_dir, self._uuid, self._info())
                    self._file = f
        return f

    def _state(self) -> State:
        state = self._store().read()
        if state is None:  # the state dir was deleted: start afresh, like a driver reload
            self._file = None
            state = self._store().read()
        assert state is not None  # created just above
        return state

    def _update(self, change: Callable[[State], None], at_s: float | None = None) -> State:
        """Apply ``change`` to the shared state, advanced to now or to ``at_s`` (the stream's
        time of the change, so no sliver is integrated at the old plan's power)."""

        def apply(state: State | None) -> State:
            # under the lock: writers' times are ordered like their writes
            now = self._clock() if at_s is None else at_s
            state = self._attach(state, now) if state is None else state
            advance(state, now)
            change(state)
            return state

        new = self._store().update(apply)
        assert new is not None
        return new

    def inject_error(self, method: str, error: DeviceError, times: int = 1) -> None:
        """Make the next ``times`` calls of ``method`` raise ``error``."""
        self._injected.setdefault(method, []).extend([error] * times)

    def _check(self, method: str) -> None:
        queue = self._injected.get(method)
        if queue:
            raise queue.pop(0)

    #: Lowest accepted limit as a share of the default one (A100: 100 of 400 W).
    power_limit_min_share: float = 0.25

    def power_limit_range_w(self) -> tuple[float, float]:
        """``(min, max)``: ``power_limit_min_share`` of the default limit, and that limit
        (``power_cap_w``, else the largest op power at the top clock)."""
        top = self.power_cap_w
        if top is None:
            powers = []
            for kind in (Kind.F, Kind.B):
                with contextlib.suppress(PerseusError, KeyError):
                    t, e = self._cost_fn(0, kind, self._clocks[0])
                    powers.append(e / t)
            if not powers:
                raise DeviceError(f"{self._name}: no op to derive a default power limit from")
            top = max(powers)
        return self.power_limit_min_share * float(top), float(top)

    def _cap_w(self, state: State) -> float | None:
        return enforced_limit_w(state, self.power_cap_w)

    def power_limit_w(self) -> float:
        self._check("power_limit_w")
        cap = self._cap_w(self._state())
        return self.power_limit_range_w()[1] if cap is None else cap

    @recorded_set_call
    def set_power_limit_w(self, power_limit_w: float) -> float:
        """Set the power limit; returns the value applied.

        Raises:
            DevicePermissionError: without privilege (NO_PERMISSION).
            DeviceError: outside :meth:`power_limit_range_w` (INVALID_ARGUMENT).
        """
        self._check("set_power_limit_w")
        self._refuse_unprivileged("setting the power limit")
        low, high = self.power_limit_range_w()
        if not low <= power_limit_w <= high:
            raise DeviceError(
                f"{self._name}: power limit {power_limit_w} W is outside {low:g}-{high:g} W "
                "(INVALID_ARGUMENT)"
            )
        if self.set_latency_s > 0:
            self._sleep(self.set_latency_s)
        self._set_limit(float(power_limit_w))
        return float(power_limit_w)

    @recorded_set_call
    def reset_power_limit(self) -> None:
        """Back to the default limit (unprivileged: DevicePermissionError)."""
        self._check("reset_power_limit")
        self._refuse_unprivileged("resetting the power limit")
        self._set_limit(None)

    def _set_limit(self, limit_w: float | None) -> None:
        state = self._update(lambda s: s.update(power_limit_w=limit_w))
        self._stream.set_cap(self._cap_w(state))

    def _wait_set_latency(self) -> None:
        """Block the caller for one (lognormal) set call latency."""
        if self.set_latency_s <= 0:
            return
        z = self._latency_rng.gauss(0.0, 1.0)
        self._sleep(self.set_latency_s * math.exp(self._latency_sigma * z))

    def _refuse_unprivileged(self, action: str) -> None:
        if not self.privileged:
            raise DevicePermissionError(
                f"{self._name}: {action} needs root or CAP_SYS_ADMIN (NO_PERMISSION)"
            )

    def supported_memory_clocks_mhz(self) -> tuple[int, ...]:
        """Lockable memory clocks, highest first (empty: one fixed memory clock)."""
        return self._mem_clocks

    def memory_clock_control(self) -> str | None:
        """Why the memory clock cannot be locked, or None when it can."""
        if not self.privileged:
            return "not privileged (NO_PERMISSION)"
        if len(self._mem_clocks) < 2:
            return "one memory clock only"
        return None

    @recorded_set_call
    def set_memory_locked_clock(self, mem_freq_mhz: int) -> int:
        """Lock the memory clock (snapped), after the set latency; re-prices queued ops.

        Raises:
            DevicePermissionError: unprivileged.
            DeviceNotSupportedError: no lockable memory clocks.
        """
        self._check("set_memory_locked_clock")
        why = self.memory_clock_control()
        if why is not None:
            error = DevicePermissionError if not self.privileged else DeviceNotSupportedError
            raise error(f"{self._name}: cannot lock memory clocks: {why}")
        snapped = nearest_clock_mhz(tuple(reversed(self._mem_clocks)), mem_freq_mhz)
        self._apply_memory_lock(snapped)
        return snapped

    @recorded_set_call
    def reset_memory_locked_clock(self) -> None:
        """Back to the default memory clock."""
        self._check("reset_memory_locked_clock")
        self._refuse_unprivileged("resetting memory clocks")
        self._apply_memory_lock(None)

    def locked_memory_clock_mhz(self) -> int | None:
        """The memory lock in the shared state (any process's)."""
        locked = self._state().get("mem_locked_mhz")
        return None if locked is None else int(locked)

    def current_memory_clock_mhz(self) -> int:
        """The memory lock in the shared state, else the default.

        Raises:
            DeviceNotSupportedError: one fixed memory clock (not modelled).
        """
        self._check("current_memory_clock_mhz")
        if not self._mem_clocks:
            raise DeviceNotSupportedError(f"{self._name}: one fixed memory clock, not modelled")
        return self.locked_memory_clock_mhz() or self._mem_clocks[0]

    def _apply_memory_lock(self, mem_mhz: int | None) -> None:
        self._wait_set_latency()
        self._update(lambda s: s.update(mem_locked_mhz=mem_mhz))
        self._mem_locked = mem_mhz
        self._stream.reprice()

    def exact_energy_j(self) -> float:
        """The true energy integral now (the published counter lags it)."""
        return energy_at(self._state(), self._clock())

    @property
    def slowdown(self) -> float:
        """Time multiplier of every op (a throttled GPU), shared by every process."""
        return float(self._state()["slowdown"])

    @slowdown.setter
    def slowdown(self, factor: float) -> None:
        self.set_slowdown(factor)

    def set_slowdown(self, factor: float) -> None:
        """Set the slowdown for every process using this GPU.

        Raises:
            ConfigError: ``factor`` is not positive.
        """
        if not factor > 0:
            raise ConfigError(f"slowdown must be > 0, got {factor}")
        self._update(lambda s: s.update(slowdown=float(factor)))
