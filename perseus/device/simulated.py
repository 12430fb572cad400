"""A simulated GPU whose state lives outside the process, like a real driver's.

The simulator follows ``docs/hardware.md#sim-model``. Its locked clock, energy counter, slowdown
and owner live in a state directory (see :mod:`perseus.device.sim_state`), so several
processes see the same GPU and a killed process's lock stays until someone resets it.

Two ways to build one:

* :meth:`SimulatedGPU.from_profile`: the clock list is the profile's clocks and an op at clock
  ``f`` costs exactly the profile's time and energy (power = energy / time, so a power cap
  clamps to the highest profiled clock whose power fits).
* :meth:`SimulatedGPU.from_preset`: A100-SXM4, A40, H100 (estimated) from fitted physics
  (:mod:`perseus.device.power_model`).

It behaves like a GPU, not like a plan (see :mod:`perseus.device.sim_stream`):

* **Asynchronous stream.** :meth:`~SimulatedGPU.launch` queues an op and returns at once; the
  device runs queued ops in order on its own timeline, so the host runs ahead as with CUDA.
  :meth:`~SimulatedGPU.record_event` marks a point of the stream (a ``DeviceEvent`` with
  ``query``/``synchronize``/``device_time_s``), :meth:`~SimulatedGPU.wait_until` makes the
  stream wait (a receive whose data is ready at a given time).
* **Clocks on the device's timeline.** ``set_locked_clock`` blocks its caller for a latency
  drawn from a lognormal (median ``set_latency_s``, p99 ``set_latency_p99_s``:
  docs/hardware.md#sim-defaults,
  5 ms / 12 ms) and the new clock applies when it returns, in the middle of whatever op the
  device is running then: an op that spans a clock change is priced piece by piece.
* **Noise the planner does not know.** With ``noise`` (a :class:`SimNoise`; the emulation
  entry points turn it on) every op's time and power get a seeded lognormal factor and the
  blocking power is off the nominal value by a seeded error.
* **Power cap.** Under ``power_cap_w`` (or a set power limit) an op runs at the highest
  supported clock at or below the lock whose power fits the cap, as an H100 under its SW power
  cap does: a lock is a request. :meth:`~SimulatedGPU.current_clock_mhz` and
  :meth:`~SimulatedGPU.clock_event_reasons` read back what runs (the SW power cap reason set),
  like NVML (:class:`~perseus.device.base.ClockReadbackGPU`).
* **Sensors.** Energy is the integral of the true power (op power while busy, blocking power
  otherwise); the counter is published every ``publish_interval_s`` (100 ms).
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import threading
import time
import uuid as _uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from perseus.device.base import DeviceEvent, nearest_clock_mhz
from perseus.device.clock import Clock, RealClock, WallClock
from perseus.device.nvml import CLOCK_EVENT_REASONS
from perseus.device.ownership import owner_lock_path
from perseus.device.power_model import capped_clock_mhz
from perseus.device.presets import GPUPreset, get_preset
from perseus.device.sim_costs import (
    MemCostFn,
    OpCostFn,
    preset_costs,
    profile_costs,
    split_backward,
)
from perseus.device.sim_state import (
    SimStateFile,
    State,
    advance,
    clock_kind,
    default_state_dir,
    energy_at,
    published_mj,
    segment_at,
    write_info,
)
from perseus.device.sim_stream import OpTrace, SimEvent, SimNoise, SimStream, StreamDevice
from perseus.errors import (
    ConfigError,
    DeviceError,
    DeviceNotSupportedError,
    DevicePermissionError,
    PerseusError,
    ProfileError,
)
from perseus.profile.model import Profile
from perseus.schedule.actions import Kind

__all__ = ["OpTrace", "SimEvent", "SimNoise", "SimulatedGPU", "sim_uuid"]

_REASON_BITS = {name: bit for bit, name in CLOCK_EVENT_REASONS}
_REASON_IDLE = _REASON_BITS["gpu_idle"]
_REASON_POWER_CAP = _REASON_BITS["sw_power_cap"]


class _FnClock:
    """A :class:`~perseus.device.clock.Clock` from a time function and a sleep function."""

    __slots__ = ("now", "real_time", "sleep")

    def __init__(self, now: Callable[[], float], sleep: Callable[[float], None]) -> None:
        self.now = now
        self.sleep = sleep
        self.real_time = sleep is time.sleep


def _clock_kind(clock: Clock) -> str:
    """How another process can read ``clock`` (see :func:`~perseus.device.sim_state.clock_kind`)."""
    if isinstance(clock, _FnClock):
        return clock_kind(clock.now)
    if isinstance(clock, WallClock):
        return "wall"
    if isinstance(clock, RealClock):
        return "monotonic"
    return "virtual"


class _StreamPort:
    """The :class:`~perseus.device.sim_stream.StreamDevice` view of a :class:`SimulatedGPU`:
    the only members of the device its stream may use (bound once: the stream prices an op
    on every commit)."""

    __slots__ = (
        "cap_w",
        "clock",
        "counter_gain",
        "idle_power_w",
        "index",
        "noise",
        "power_cap_w",
        "price",
        "publish_interval_s",
        "read_state",
        "top_clock_mhz",
        "update_state",
    )

    def __init__(self, gpu: SimulatedGPU, clock: Clock) -> None:
        self.index = gpu.index
        self.noise = gpu.noise
        self.clock = clock
        self.top_clock_mhz = gpu.supported_clocks_mhz()[0]
        self.idle_power_w = gpu.true_blocking_power_w
        self.publish_interval_s = gpu.publish_interval_s
        self.counter_gain = gpu.counter_gain
        self.power_cap_w = gpu.power_cap_w
        self.price: Callable[[int, Kind, int, float | None], tuple[int, float, float]] = gpu._op_at
        self.read_state: Callable[[], State] = gpu._state
        self.cap_w: Callable[[State], float | None] = gpu._cap_w
        self.update_state: Callable[[Callable[[State], None], float | None], State] = gpu._update


def sim_uuid(index: int) -> str:
    """The UUID of simulated GPU ``index``: stable, so every process finds the same GPU."""
    return f"GPU-{_uuid.uuid5(_uuid.NAMESPACE_URL, f'perseus-sim/{index}')}"


class SimulatedGPU:
    """A GPU model implementing :class:`~perseus.device.base.GPU` plus an emulation API.

    The constructor does no I/O; the state file is created on first use.

    Args:
        name: Reported device name.
        clocks_mhz: Supported SM clocks (any order; stored highest first).
        op_cost_fn: Uncapped ``(time_s, energy_j)`` of an op at a supported clock.
        blocking_power_w: Power while not running an op (waiting on P2P/collectives).
        index: Device index; the UUID is derived from it.
        state_dir: Where the state lives (default ``$PERSEUS_SIM_DIR`` or a per-user temp dir).
        publish_interval_s: Energy counter update period; 0 publishes exactly (tests).
        set_latency_s: Median time ``set_locked_clock``/``reset_locked_clock`` block the
            caller (lognormal; the new clock applies when the call returns); 0 for none.
        set_latency_p99_s: 99th percentile of that latency (default 2.4 x the median, the
            measured 12 ms for 5 ms).
        noise: Per-op time/power noise and blocking-power error (None: exact).
        power_cap_w: Enforced power limit, None for none.
        idle_clock_mhz: Clock reported while idle and unlocked (default: lowest clock).
        privileged: False makes set/reset raise :class:`DevicePermissionError` (NO_PERMISSION).
        clamp_out_of_range: Out-of-range requests snap to the nearest end (True) or raise
            (NVML's INVALID_ARGUMENT, False).
        source: Free text saying what the model was built from.
        clock: The device's timeline (event times are on it), shared by all processes: a
            :class:`~perseus.device.clock.Clock` (tests pass a
            :class:`~perseus.device.clock.VirtualClock`, and the agent the same one), or a
            time function such as ``time.time`` (the default) or ``time.perf_counter``.
        sleep: How to wait out the set latency and event waits, when ``clock`` is a time
            function (a :class:`~perseus.device.clock.Clock` brings its own sleep).
        seed: Seed of the set-latency draws (the noise has its own seed).
        trace_ops: Keep every completed op's clock pieces (:attr:`op_trace`; benchmarks).
        memory_clocks_mhz: Lockable memory clocks, highest (the default) first; empty for one
            fixed memory clock (HBM).
        mem_cost_fn: The op cost at an SM clock and a locked memory clock (needed with
            ``memory_clocks_mhz``). The power cap is applied on default-memory power.
    """

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
        clock: Clock | Callable[[], float] = time.time,
        sleep: Callable[[float], None] | None = None,
        seed: int = 0,
        trace_ops: bool = False,
        memory_clocks_mhz: tuple[int, ...] = (),
        mem_cost_fn: MemCostFn | None = None,
    ) -> None:
        # Everything this GPU was built from, so that placed() can build its twin.
        self._config: dict[str, Any] = {k: v for k, v in locals().items() if k != "self"}
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
        self._name = name
        self._clocks = tuple(sorted(set(clocks_mhz), reverse=True))
        self._ascending = tuple(reversed(self._clocks))
        self._cost_fn = op_cost_fn
        self.blocking_power_w = float(blocking_power_w)
        self.index = index
        self._state_dir = Path(state_dir) if state_dir is not None else None
        self.publish_interval_s = float(publish_interval_s)
        self.set_latency_s = float(set_latency_s)
        self.set_latency_p99_s = float(p99)
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
        timeline: Clock = (
            clock if isinstance(clock, Clock) else _FnClock(clock, sleep or time.sleep)
        )
        self.clock = timeline
        self._clock = timeline.now
        self._sleep = timeline.sleep
        self._uuid = sim_uuid(index)
        self._file: SimStateFile | None = None
        self._injected: dict[str, list[DeviceError]] = {}
        self._cost_cache: dict[tuple[int, Kind, int, float | None], tuple[int, float, float]] = {}
        self._last_mj = 0
        self._attach_lock = threading.Lock()
        port: StreamDevice = _StreamPort(self, timeline)
        self._stream = SimStream(port)
        self._mem_clocks = tuple(sorted(set(memory_clocks_mhz), reverse=True))
        if len(self._mem_clocks) > 1 and mem_cost_fn is None:
            raise ConfigError(f"simulated GPU {name!r}: memory clocks need a mem_cost_fn")
        self._mem_cost_fn = mem_cost_fn
        self._mem_locked: int | None = None  # this process's memory lock (also in the state)
        if trace_ops:
            self._stream.trace = []

    # -----------------------------------------------------------------------------------------
    # Constructors

    @classmethod
    def from_profile(
        cls,
        profile: Profile,
        *,
        blocking_power_w: float,
        index: int = 0,
        state_dir: str | Path | None = None,
        publish_interval_s: float = 0.1,
        set_latency_s: float = 0.005,
        power_cap_w: float | None = None,
        name: str | None = None,
        **kwargs: Any,
    ) -> SimulatedGPU:
        """A GPU on which an op at clock ``f`` costs exactly ``profile``'s time and energy.

        The clock list is the union of the profile's clocks. An op asked to run at a clock it
        was not profiled at uses its nearest profiled clock.
        """
        clocks, cost, mem_clocks, mem_cost = profile_costs(profile)
        return cls(
            # The file's stem, without what scale_profile/take_stages appended ("... (time x0.1)").
            name=name or f"Simulated GPU ({Path(profile.source.split(' (', 1)[0]).stem})",
            clocks_mhz=clocks,
            op_cost_fn=cost,
            blocking_power_w=blocking_power_w,
            index=index,
            state_dir=state_dir,
            publish_interval_s=publish_interval_s,
            set_latency_s=set_latency_s,
            power_cap_w=power_cap_w,
            source=f"profile {profile.source}",
            memory_clocks_mhz=mem_clocks,
            mem_cost_fn=mem_cost,
            **kwargs,
        )

    @classmethod
    def from_preset(
        cls,
        key: str | GPUPreset,
        *,
        index: int = 0,
        state_dir: str | Path | None = None,
        publish_interval_s: float = 0.1,
        set_latency_s: float = 0.005,
        power_cap_w: float | str | None = "preset",
        activity: float | None = None,
        op_time_s: Mapping[Kind, float] | None = None,
        blocking_power_w: float | None = None,
        **kwargs: Any,
    ) -> SimulatedGPU:
        """A GPU from a fitted preset (``a100``, ``a100-500w``, ``a40``, ``h100``).

        Every stage costs the same: ``op_time_s[kind]`` at the highest clock (uncapped),
        scaled by the preset's time model; power from its power model at ``activity``.
        ``power_cap_w="preset"`` keeps the preset's cap; None removes it.
        """
        preset = key if isinstance(key, GPUPreset) else get_preset(key)
        cost, mem_cost = preset_costs(preset, activity=activity, op_time_s=op_time_s)
        memory = preset.memory
        cap = preset.power_cap_w if power_cap_w == "preset" else power_cap_w
        if isinstance(cap, str):
            raise ConfigError(f"power_cap_w must be a number, None or 'preset', got {cap!r}")
        return cls(
            name=f"Simulated {preset.name}",
            clocks_mhz=preset.clocks_mhz,
            op_cost_fn=cost,
            blocking_power_w=(
                preset.power.blocking_w if blocking_power_w is None else blocking_power_w
            ),
            index=index,
            state_dir=state_dir,
            publish_interval_s=publish_interval_s,
            set_latency_s=set_latency_s,
            power_cap_w=cap,
            idle_clock_mhz=preset.idle_clock_mhz,
            source=f"preset {preset.key}" + (" (estimated)" if preset.estimated else ""),
            memory_clocks_mhz=() if memory is None else memory.clocks_mhz,
            mem_cost_fn=mem_cost,
            **kwargs,
        )

    def placed(
        self,
        *,
        index: int | None = None,
        state_dir: str | Path | None = None,
        backward_split: float | None = None,
    ) -> SimulatedGPU:
        """A new GPU of the same model at another index and/or state directory (emulation
        gives each rank its own device and each job its own directory).

        Args:
            index: Device index (default: this one's).
            state_dir: State directory (default: this one's).
            backward_split: When the model prices no ``W`` op (a profile without ``weight``
                rows), charge ``B`` this share of a full backward and ``W`` the rest, as
                :meth:`~perseus.profile.model.Profile.split_backward` plans it.
        """
        config = dict(self._config)
        if index is not None:
            config["index"] = index
        if state_dir is not None:
            config["state_dir"] = state_dir
        if backward_split is not None and not self.prices(Kind.W):
            config["op_cost_fn"] = split_backward(self._cost_fn, backward_split)
        return type(self)(**config)

    @property
    def explicit_state_dir(self) -> bool:
        """Whether the state directory was chosen (argument or ``$PERSEUS_SIM_DIR``): GPUs
        meant to be shared, rather than the per-user default."""
        return self._state_dir is not None or bool(os.environ.get("PERSEUS_SIM_DIR"))

    def prices(self, kind: Kind) -> bool:
        """Whether the model has costs for ``kind`` ops (no I/O)."""
        try:
            self._cost_fn(0, kind, self._clocks[0])
        except (ProfileError, KeyError):
            return False
        return True

    # -----------------------------------------------------------------------------------------
    # Identity and state plumbing

    @property
    def uuid(self) -> str:
        return self._uuid

    @property
    def name(self) -> str:
        return self._name

    @property
    def state_dir(self) -> Path:
        """The directory holding this GPU's state (resolved on first use)."""
        if self._state_dir is None:
            self._state_dir = default_state_dir()
        return self._state_dir

    def owner_lock_path(self) -> Path:
        """Ownership lock file, in the state directory next to the state."""
        return owner_lock_path(self.state_dir, self._uuid)

    def watchdog_spec(self) -> dict[str, str]:
        """What the watchdog needs to reset this GPU from another process."""
        return {"backend": "sim", "state_dir": str(self.state_dir), "uuid": self._uuid}

    def _info(self) -> State:
        """Static description, kept apart from the small, frequently rewritten state."""
        return {
            "uuid": self._uuid,
            "index": self.index,
            "name": self._name,
            "source": self.source,
            "clocks_mhz": list(self._clocks),
            "idle_clock_mhz": self._idle_clock,
        }

    def _initial_state(self, now: float) -> State:
        return {
            "uuid": self._uuid,
            "index": self.index,
            "idle_power_w": self.true_blocking_power_w,
            "publish_interval_s": self.publish_interval_s,
            "counter_gain": self.counter_gain,
            "power_cap_w": self.power_cap_w,
            "locked_mhz": None,
            "power_limit_w": None,  # None: the default limit (power_cap_w)
            # The board's default limit, apart from the limit in force: what every reset
            # restores and what ``perseus device info`` compares against.
            "default_power_limit_w": self._default_power_limit_w(),
            "slowdown": 1.0,
            "energy_j": 0.0,
            "t_last": now,
            "clock": _clock_kind(self.clock),
            "segments": [],
            "pub_tick": 0.0,
            "pub_mj": 0,
        }

    @property
    def true_blocking_power_w(self) -> float:
        """The blocking power this device really draws (nominal +- the noise's error)."""
        if self.noise is None:
            return self.blocking_power_w
        return self.blocking_power_w * (1.0 + self.noise.blocking_offset(self.index))

    @property
    def counter_gain(self) -> float:
        """The share of the true energy the counter reports (``noise.counter_gain``; 1
        without noise). :meth:`exact_energy_j` is the truth."""
        return 1.0 if self.noise is None else self.noise.counter_gain

    def _attach(self, state: State | None, now: float) -> State:
        """Create the state, or adopt an existing one with this process's model parameters
        (the lock, counter, slowdown and owner are kept: they belong to the "hardware")."""
        if state is None:
            return self._initial_state(now)
        advance(state, now)
        state.update(
            idle_power_w=self.true_blocking_power_w,
            publish_interval_s=self.publish_interval_s,
            counter_gain=self.counter_gain,
            power_cap_w=self.power_cap_w,
        )
        default = self._default_power_limit_w()
        if default is not None:  # a handle without an op model keeps the recorded one
            state["default_power_limit_w"] = default
        return state

    def _store(self) -> SimStateFile:
        f = self._file
        if f is None:
            with self._attach_lock:  # the clock worker and the training thread may race here
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
        if state is None:  # someone deleted the state dir: start afresh, like a driver reload
            self._file = None
            state = self._store().read()
        assert state is not None  # created just above
        return state

    def _update(self, change: Callable[[State], None], at_s: float | None = None) -> State:
        """Apply ``change`` to the shared state, advanced to now, or to ``at_s`` (the stream's
        time of the change: on a real clock "now" has moved on by the time the file is
        locked, and integrating that sliver at the old plan's power loses energy)."""

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

    # -----------------------------------------------------------------------------------------
    # Error injection

    def inject_error(self, method: str, error: DeviceError, times: int = 1) -> None:
        """Make the next ``times`` calls of ``method`` raise ``error`` (GPU_IS_LOST, TIMEOUT...)."""
        self._injected.setdefault(method, []).extend([error] * times)

    def _check(self, method: str) -> None:
        queue = self._injected.get(method)
        if queue:
            raise queue.pop(0)

    # -----------------------------------------------------------------------------------------
    # GPU protocol

    def supported_clocks_mhz(self) -> tuple[int, ...]:
        return self._clocks

    def snap_clock_mhz(self, freq_mhz: int) -> int:
        """The supported clock nearest ``freq_mhz`` (ties go to the higher clock).

        Raises:
            DeviceError: if out of range and ``clamp_out_of_range`` is False.
        """
        asc = self._ascending
        if not asc[0] <= freq_mhz <= asc[-1] and not self.clamp_out_of_range:
            raise DeviceError(
                f"{self._name}: {freq_mhz} MHz is outside the supported range "
                f"{asc[0]}-{asc[-1]} MHz (INVALID_ARGUMENT)"
            )
        return nearest_clock_mhz(asc, freq_mhz)

    def _draw_latency_s(self) -> float:
        if self.set_latency_s <= 0:
            return 0.0
        z = self._latency_rng.gauss(0.0, 1.0)
        return self.set_latency_s * math.exp(self._latency_sigma * z)

    def set_locked_clock(self, freq_mhz: int) -> int:
        self._check("set_locked_clock")
        if not self.privileged:
            raise DevicePermissionError(
                f"{self._name}: setting locked clocks needs root or CAP_SYS_ADMIN (NO_PERMISSION)"
            )
        snapped = self.snap_clock_mhz(freq_mhz)
        latency = self._draw_latency_s()
        if latency > 0:
            self._sleep(latency)
        self._stream.set_lock(snapped)
        return snapped

    def reset_locked_clock(self) -> None:
        self._check("reset_locked_clock")
        if not self.privileged:
            raise DevicePermissionError(
                f"{self._name}: resetting locked clocks needs root or CAP_SYS_ADMIN (NO_PERMISSION)"
            )
        latency = self._draw_latency_s()
        if latency > 0:
            self._sleep(latency)
        self._stream.set_lock(None)
        if self._mem_locked is not None:
            self.reset_memory_locked_clock()

    # Memory clocks (GDDR presets and pair profiles; see perseus.device.power_model)

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

    def set_memory_locked_clock(self, mem_freq_mhz: int) -> int:
        """Lock the memory clock (snapped), after the set latency; queued ops are re-priced.

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

    def reset_memory_locked_clock(self) -> None:
        """Back to the default memory clock."""
        self._check("reset_memory_locked_clock")
        if not self.privileged:
            raise DevicePermissionError(f"{self._name}: resetting memory clocks: NO_PERMISSION")
        self._apply_memory_lock(None)

    def locked_memory_clock_mhz(self) -> int | None:
        """The memory lock in the shared state (any process's, until a reset)."""
        locked = self._state().get("mem_locked_mhz")
        return None if locked is None else int(locked)

    def _apply_memory_lock(self, mem_mhz: int | None) -> None:
        latency = self._draw_latency_s()
        if latency > 0:
            self._sleep(latency)

        def change(state: State) -> None:
            state["mem_locked_mhz"] = mem_mhz

        self._update(change)
        self._mem_locked = mem_mhz
        self._stream.reprice()

    def locked_clock_mhz(self) -> int | None:
        self._check("locked_clock_mhz")
        locked = self._state()["locked_mhz"]
        return None if locked is None else int(locked)

    def current_clock_mhz(self) -> int:
        self._check("current_clock_mhz")
        return self._clock_now()[0]

    def clock_event_reasons(self) -> int:
        """Why the clock is below the maximum now, as NVML's bit mask: the SW power cap
        (0x4) while an op runs below the lock (or, unlocked, the top clock) because its power
        does not fit the cap; idle (0x1) while no op runs."""
        self._check("clock_event_reasons")
        return self._clock_now()[1]

    def _clock_now(self) -> tuple[int, int]:
        """The clock now and the event reasons behind it (one state read)."""
        state = self._state()
        seg = segment_at(state, self._clock())
        locked = state["locked_mhz"]
        if seg is None:
            return (int(locked) if locked is not None else self._idle_clock), _REASON_IDLE
        target = self._clocks[0] if locked is None else int(locked)
        return int(seg[3]), (_REASON_POWER_CAP if int(seg[3]) < target else 0)

    def energy_mj(self) -> int:
        """The published counter, never decreasing as seen by this object.

        The clock is read before the state so the integral is not extrapolated past a change
        another process is writing; the running maximum covers the remaining window (a stream
        that replanned its segments after this object extrapolated them).
        """
        self._check("energy_mj")
        with self._stream._lock:  # no backdated launch between the read and its record
            now = self._clock()
            self._stream.observe(now)
            value = published_mj(self._state(), now)
        if value < self._last_mj:
            return self._last_mj
        self._last_mj = value
        return value

    def power_w(self) -> float:
        self._check("power_w")
        state = self._state()
        seg = segment_at(state, self._clock())
        return float(seg[2] if seg is not None else state["idle_power_w"])

    # -----------------------------------------------------------------------------------------
    # Emulation API

    def exact_energy_j(self) -> float:
        """The true energy integral now (the published counter lags it by up to 100 ms)."""
        return energy_at(self._state(), self._clock())

    @property
    def slowdown(self) -> float:
        """Time multiplier of every op (a throttled GPU: ops take longer at the same power)."""
        return float(self._state()["slowdown"])

    @slowdown.setter
    def slowdown(self, factor: float) -> None:
        self.set_slowdown(factor)

    def set_slowdown(self, factor: float) -> None:
        """Set the slowdown for every process using this GPU (stored in the state dir).

        Raises:
            ConfigError: if ``factor`` is not positive.
        """
        if not factor > 0:
            raise ConfigError(f"slowdown must be > 0, got {factor}")

        def change(state: State) -> None:
            state["slowdown"] = float(factor)

        self._update(change)

    def effective_clock_mhz(self, stage_index: int, kind: Kind) -> int:
        """The clock an op would run at now: the lock (or max when unlocked), power-capped."""
        state = self._state()
        locked = state["locked_mhz"]
        f = self._clocks[0] if locked is None else locked
        return self._op_at(stage_index, kind, f, self._cap_w(state))[0]

    def _op_at(
        self, stage_index: int, kind: Kind, freq_mhz: int, cap_w: float | None
    ) -> tuple[int, float, float]:
        mem = self._mem_locked
        if mem is not None and self._mem_cost_fn is not None and mem != self._mem_clocks[0]:
            # The memory hook: the clock the cap allows at the default memory clock, priced
            # at the locked memory clock.
            f_eff = self._op_at_default_memory(stage_index, kind, freq_mhz, cap_w)[0]
            t, e = self._mem_cost_fn(stage_index, kind, f_eff, mem)
            return f_eff, t, e
        return self._op_at_default_memory(stage_index, kind, freq_mhz, cap_w)

    def _op_at_default_memory(
        self, stage_index: int, kind: Kind, freq_mhz: int, cap_w: float | None
    ) -> tuple[int, float, float]:
        key = (stage_index, kind, freq_mhz, cap_w)
        hit = self._cost_cache.get(key)
        if hit is None:
            if cap_w is None:
                f_eff = freq_mhz
            else:
                below = [f for f in self._clocks if f <= freq_mhz] or [self._clocks[-1]]
                power = {}
                for f in below:
                    t, e = self._cost_fn(stage_index, kind, f)
                    power[f] = e / t
                f_eff = capped_clock_mhz(below, freq_mhz, power, cap_w)
            t, e = self._cost_fn(stage_index, kind, f_eff)
            hit = (f_eff, t, e)
            self._cost_cache[key] = hit
        return hit

    def op_cost(self, stage_index: int, kind: Kind) -> tuple[float, float]:
        """``(time_s, energy_j)`` of one op at the current effective clock, with slowdown.

        Slowdown multiplies time and, at unchanged power, energy.
        """
        state = self._state()
        locked = state["locked_mhz"]
        f = self._clocks[0] if locked is None else locked
        _, t, e = self._op_at(stage_index, kind, f, self._cap_w(state))
        s = float(state["slowdown"])
        return t * s, e * s

    # -----------------------------------------------------------------------------------------
    # The stream (see perseus.device.sim_stream)

    def launch(self, stage_index: int, kind: Kind) -> None:
        """Queue one op of ``(stage_index, kind)``; returns at once (like a kernel launch)."""
        self._check("launch")
        self._stream.launch(stage_index, kind)

    def wait_until(self, time_s: float) -> None:
        """Make the stream wait until ``time_s`` (this GPU's clock) before what comes next,
        like a receive whose data arrives then."""
        self._stream.wait_until(time_s)

    def backdate(self, ready_s: float) -> None:
        """Emulation: the host reached the next op after the device could have started it
        (on a GPU the host runs ahead); let it start when the stream was free and its inputs
        were ready at ``ready_s``. Reuses only past idle time, never before the last event."""
        self._stream.backdate(ready_s)

    def wait_event(self, event: DeviceEvent) -> None:
        """Make the stream wait for another simulated GPU's event (a receive of data that
        op produced, as NCCL's receive kernel waits on the device)."""
        if not isinstance(event, SimEvent):
            raise ConfigError("a simulated GPU can only wait for another simulated GPU's event")
        self._stream.wait_event(event)

    def record_event(self) -> DeviceEvent:
        """Mark the current end of the stream; the event completes when the device gets there."""
        return self._stream.record_event()

    @property
    def op_trace(self) -> list[OpTrace]:
        """Completed ops with the clocks they ran at (empty unless ``trace_ops=True``)."""
        self._stream.poll()
        return list(self._stream.trace or ())

    def timeline_now_s(self) -> float:
        """Now, on the clock of this GPU's timeline (the clock event times are on)."""
        return self._clock()

    def clock_applied_s(self) -> float | None:
        """When the last clock set or reset took effect, on the timeline's clock (None: none
        yet). The simulator applies a set call's clock while the call still publishes the new
        state, so this is a little before the call returns; the controller learns its lead
        from it. NVML cannot tell (reading the clock back takes milliseconds)."""
        return self._stream.lock_applied_s

    def synchronize(self) -> None:
        """Wait until every queued op has run (like ``cuda.synchronize``; tests, teardown)."""
        self._stream.record_event().synchronize()

    # -----------------------------------------------------------------------------------------
    # Power limit (recurring jobs; owned by perseus.recurring). The limit lives in the shared
    # state like the clock lock: it outlives this process and the watchdog resets it.

    #: Lowest accepted limit as a share of the default one (A100: 100 of 400 W,
    #: docs/hardware.md#sim-defaults).
    power_limit_min_share: float = 0.25

    def power_limit_range_w(self) -> tuple[float, float]:
        """``(min, max)``: the default limit (``power_cap_w``, else the largest op power at the
        top clock) and ``power_limit_min_share`` of it."""
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

    def _default_power_limit_w(self) -> float | None:
        """The default limit (top of :meth:`power_limit_range_w`), None when unknown here."""
        with contextlib.suppress(DeviceError):
            return self.power_limit_range_w()[1]
        return None

    def _cap_w(self, state: State) -> float | None:
        """The enforced cap: the set limit, never above the board's own cap."""
        limit = state.get("power_limit_w")
        if limit is None:
            return self.power_cap_w
        return float(limit) if self.power_cap_w is None else min(float(limit), self.power_cap_w)

    def power_limit_w(self) -> float:
        self._check("power_limit_w")
        cap = self._cap_w(self._state())
        return self.power_limit_range_w()[1] if cap is None else cap

    def set_power_limit_w(self, power_limit_w: float) -> float:
        """Set the limit (NVML's ``SetPowerManagementLimit``); returns the value applied.

        Raises:
            DevicePermissionError: without privilege (NO_PERMISSION).
            DeviceError: outside :meth:`power_limit_range_w` (INVALID_ARGUMENT).
        """
        self._check("set_power_limit_w")
        if not self.privileged:
            raise DevicePermissionError(
                f"{self._name}: setting the power limit needs root or CAP_SYS_ADMIN (NO_PERMISSION)"
            )
        low, high = self.power_limit_range_w()
        if not low <= power_limit_w <= high:
            raise DeviceError(
                f"{self._name}: power limit {power_limit_w} W is outside {low:g}-{high:g} W "
                "(INVALID_ARGUMENT)"
            )
        if self.set_latency_s > 0:
            self._sleep(self.set_latency_s)

        def change(state: State) -> None:
            state["power_limit_w"] = float(power_limit_w)

        self._stream.set_cap(self._cap_w(self._update(change)))
        return float(power_limit_w)

    def reset_power_limit(self) -> None:
        """Back to the default limit.

        Raises:
            DevicePermissionError: without privilege (NO_PERMISSION).
        """
        self._check("reset_power_limit")
        if not self.privileged:
            raise DevicePermissionError(
                f"{self._name}: resetting the power limit needs root or CAP_SYS_ADMIN "
                "(NO_PERMISSION)"
            )

        def change(state: State) -> None:
            state["power_limit_w"] = None

        self._stream.set_cap(self._cap_w(self._update(change)))

    def __repr__(self) -> str:
        return f"SimulatedGPU(name={self._name!r}, index={self.index}, uuid={self._uuid!r})"
