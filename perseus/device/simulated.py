"""A simulated GPU whose state lives outside the process, like a real driver's.

Lock, energy counter, slowdown and owner live in a state directory (:mod:`.sim_state`), so
several processes see one GPU. It behaves like a GPU, not like a plan: an asynchronous stream,
set calls with lognormal latency, seeded noise, a power cap that overrides the lock and an
energy counter published every 100 ms (``docs/hardware.md#sim-model``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from perseus.device.base import DeviceEvent, nearest_clock_mhz
from perseus.device.nvml_calls import CLOCK_EVENT_BITS
from perseus.device.presets import GPUPreset, get_preset
from perseus.device.sim_calls import SetCall, recorded_set_call
from perseus.device.sim_costs import SimNoise, preset_costs, profile_costs, split_backward
from perseus.device.sim_shared import SimSharedState, sim_uuid
from perseus.device.sim_state import published_mj, segment_at
from perseus.device.sim_stream import OpTrace, SimEvent
from perseus.errors import ConfigError, DeviceError, ProfileError
from perseus.profile.model import Profile
from perseus.schedule.actions import Kind

__all__ = ["OpTrace", "SetCall", "SimEvent", "SimNoise", "SimulatedGPU", "sim_uuid"]

_REASON_IDLE = CLOCK_EVENT_BITS["gpu_idle"]
_REASON_POWER_CAP = CLOCK_EVENT_BITS["sw_power_cap"]


class SimulatedGPU(SimSharedState):
    """A GPU model implementing :class:`~perseus.device.base.GPU` plus an emulation API.

    The constructor does no I/O; the state file is created on first use.

    Args:
        name: Reported device name.
        clocks_mhz: Supported SM clocks (any order).
        op_cost_fn: Uncapped ``(time_s, energy_j)`` of an op at a supported clock.
        blocking_power_w: Power while not running an op (waiting on P2P/collectives).
        index: Device index; the UUID is derived from it.
        state_dir: Where the state lives (default ``$PERSEUS_SIM_DIR`` or a per-user dir).
        publish_interval_s: Energy counter update period; 0 publishes exactly.
        set_latency_s: Median (lognormal) time a clock set or reset blocks; 0 for none.
        set_latency_p99_s: Its 99th percentile (default 2.4 x the median: 12 ms for 5 ms).
        noise: Per-op time/power noise and blocking-power error (None: exact).
        power_cap_w: The board's power cap and default power limit (None: uncapped);
            :meth:`set_power_limit_w` enforces a lower limit until reset.
        idle_clock_mhz: Clock reported while idle and unlocked (default: lowest clock).
        privileged: False makes set/reset raise ``DevicePermissionError`` (NO_PERMISSION).
        clamp_out_of_range: Snap out-of-range requests to the nearest end, else raise.
        source: Free text saying what the model was built from.
        clock: The device's timeline shared by all processes (default ``WALL_CLOCK``;
            tests pass a ``VirtualClock``).
        seed: Seed of the set-latency draws (the noise has its own seed).
        trace_ops: Keep every completed op's clock pieces (:attr:`op_trace`).
        memory_clocks_mhz: Lockable memory clocks, highest (the default) first; empty: HBM.
        mem_cost_fn: The op cost at a locked memory clock (needed with memory clocks).
        record_set_calls: Keep the last this many set and reset calls in :attr:`set_calls`.
        set_return_lag_s: How long a set or reset call blocks after its change took effect.
    """

    @classmethod
    def from_profile(
        cls, profile: Profile, *, blocking_power_w: float, name: str | None = None, **kwargs: Any
    ) -> SimulatedGPU:
        """A GPU on which an op costs exactly ``profile``'s time and energy (at the nearest
        profiled clock); other keywords go to the constructor."""
        clocks, cost, mem_clocks, mem_cost = profile_costs(profile)
        return cls(
            # The file's stem, without what scale_profile/take_stages appended ("... (time x0.1)").
            name=name or f"Simulated GPU ({Path(profile.source.split(' (', 1)[0]).stem})",
            clocks_mhz=clocks,
            op_cost_fn=cost,
            blocking_power_w=blocking_power_w,
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
        power_cap_w: float | str | None = "preset",
        activity: float | None = None,
        op_time_s: Mapping[Kind, float] | None = None,
        blocking_power_w: float | None = None,
        **kwargs: Any,
    ) -> SimulatedGPU:
        """A GPU from a fitted preset (``a100``, ``a100-500w``, ``a40``, ``h100``).

        Every stage costs ``op_time_s[kind]`` (default: the preset's) at the highest clock,
        scaled by the preset's time model, at its power model's power for ``activity``
        (default: the preset's). ``power_cap_w="preset"`` keeps the preset's cap; None removes
        it. Other keywords go to the constructor.
        """
        preset = key if isinstance(key, GPUPreset) else get_preset(key)
        cost, mem_cost = preset_costs(preset, activity=activity, op_time_s=op_time_s)
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
            power_cap_w=cap,
            idle_clock_mhz=preset.idle_clock_mhz,
            source=f"preset {preset.key}" + (" (estimated)" if preset.estimated else ""),
            memory_clocks_mhz=() if preset.memory is None else preset.memory.clocks_mhz,
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
        """A new GPU of the same model at another index and/or state directory (default:
        this one's).

        Args:
            backward_split: When the model prices no ``W`` op, charge ``B`` this share of a
                full backward and ``W`` the rest (as ``Profile.split_backward`` plans it).
        """
        config = dict(self._config)
        if index is not None:
            config["index"] = index
        if state_dir is not None:
            config["state_dir"] = state_dir
        if backward_split is not None and not self.prices(Kind.W):
            config["op_cost_fn"] = split_backward(self._cost_fn, backward_split)
        return type(self)(**config)

    def prices(self, kind: Kind) -> bool:
        """Whether the model has costs for ``kind`` ops."""
        try:
            self._cost_fn(0, kind, self._clocks[0])
        except (ProfileError, KeyError):
            return False
        return True

    def supported_clocks_mhz(self) -> tuple[int, ...]:
        return self._clocks

    def snap_clock_mhz(self, freq_mhz: int) -> int:
        """The supported clock nearest ``freq_mhz`` (ties go to the higher clock).

        Raises:
            DeviceError: out of range and ``clamp_out_of_range`` is False.
        """
        asc = self._ascending
        if not asc[0] <= freq_mhz <= asc[-1] and not self.clamp_out_of_range:
            raise DeviceError(
                f"{self._name}: {freq_mhz} MHz is outside the supported range "
                f"{asc[0]}-{asc[-1]} MHz (INVALID_ARGUMENT)"
            )
        return nearest_clock_mhz(asc, freq_mhz)

    @recorded_set_call
    def set_locked_clock(self, freq_mhz: int) -> int:
        self._check("set_locked_clock")
        self._refuse_unprivileged("setting locked clocks")
        snapped = self.snap_clock_mhz(freq_mhz)
        self._wait_set_latency()
        self._stream.set_lock(snapped)
        return snapped

    def reset_locked_clock(self) -> None:
        self._reset_sm_lock()
        if self._mem_locked is not None:
            self.reset_memory_locked_clock()  # a call of its own, recorded after this one

    def _reset_sm_lock_now(self) -> None:
        self._check("reset_locked_clock")
        self._refuse_unprivileged("resetting locked clocks")
        self._wait_set_latency()
        self._stream.set_lock(None)

    # Recorded on its own: the SM clock's reset takes effect before the memory clock's starts.
    _reset_sm_lock = recorded_set_call(_reset_sm_lock_now, "reset_locked_clock")

    def locked_clock_mhz(self) -> int | None:
        self._check("locked_clock_mhz")
        locked = self._state()["locked_mhz"]
        return None if locked is None else int(locked)

    def current_clock_mhz(self) -> int:
        self._check("current_clock_mhz")
        return self._clock_now()[0]

    def clock_event_reasons(self) -> int:
        """NVML's bit mask of why the clock is low now: SW power cap (0x4) while an op runs
        below its target clock, idle (0x1) while none runs."""
        self._check("clock_event_reasons")
        return self._clock_now()[1]

    def _clock_now(self) -> tuple[int, int]:
        """The clock now and the event reasons behind it."""
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
        another process is writing; the running maximum covers a replanned stream.
        """
        self._check("energy_mj")
        with self._stream._lock:  # no backdated launch between the read and its record
            now = self._clock()
            self._stream.observe(now)
            value = published_mj(self._state(), now)
        self._last_mj = max(self._last_mj, value)
        return self._last_mj

    def power_w(self) -> float:
        self._check("power_w")
        state = self._state()
        seg = segment_at(state, self._clock())
        return float(seg[2] if seg is not None else state["idle_power_w"])

    def effective_clock_mhz(self, stage_index: int, kind: Kind) -> int:
        """The clock an op would run at now: the lock (or max when unlocked), power-capped."""
        return self._op_now(stage_index, kind, self._state())[0]

    def _op_now(
        self, stage_index: int, kind: Kind, state: dict[str, Any]
    ) -> tuple[int, float, float]:
        locked = state["locked_mhz"]
        f = self._clocks[0] if locked is None else locked
        return self._pricer.price(stage_index, kind, f, self._cap_w(state), self._mem_locked)

    def op_cost(self, stage_index: int, kind: Kind) -> tuple[float, float]:
        """``(time_s, energy_j)`` of one op at the current effective clock, with slowdown
        (which multiplies time and, at unchanged power, energy)."""
        state = self._state()
        _, t, e = self._op_now(stage_index, kind, state)
        s = float(state["slowdown"])
        return t * s, e * s

    def launch(self, stage_index: int, kind: Kind, until: float = 1.0) -> None:
        """Queue one op of ``(stage_index, kind)``; returns at once (like a kernel launch).
        ``until`` < 1 runs only that share of its work, up to where the next launch of the
        same op, with no event recorded between, carries on."""
        self._check("launch")
        self._stream.launch(stage_index, kind, until)

    def wait_until(self, time_s: float) -> None:
        """Make the stream wait until ``time_s`` (a receive whose data arrives then)."""
        self._stream.wait_until(time_s)

    def backdate(self, ready_s: float) -> None:
        """Let the next op start when the stream was free and its inputs were ready at
        ``ready_s`` (a GPU host runs ahead); only past idle time after the last event."""
        self._stream.backdate(ready_s)

    def wait_event(self, event: DeviceEvent) -> None:
        """Make the stream wait for another simulated GPU's event (an NCCL receive)."""
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

    @property
    def set_calls(self) -> list[SetCall]:
        """The last ``record_set_calls`` set and reset calls, oldest first."""
        return list(self._set_calls or ())

    def timeline_now_s(self) -> float:
        """Now, on this GPU's timeline (event times are on it)."""
        return self._clock()

    def clock_applied_s(self) -> float | None:
        """When the last clock set or reset took effect on the timeline (None: none yet),
        a little before the call returned; the controller learns its lead from it."""
        return self._stream.lock_applied_s

    def synchronize(self) -> None:
        """Wait until every queued op has run (like ``cuda.synchronize``)."""
        self._stream.record_event().synchronize()

    def __repr__(self) -> str:
        return f"SimulatedGPU(name={self._name!r}, index={self.index}, uuid={self._uuid!r})"
