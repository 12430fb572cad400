"""The simulated GPU's record of the set and reset calls it received (opt-in:
``SimulatedGPU(record_set_calls=n)`` keeps the last ``n``, each a :class:`SetCall`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Concatenate, ParamSpec, TypeVar

if TYPE_CHECKING:
    from perseus.device.sim_shared import SimSharedState

__all__ = ["SetCall", "recorded_set_call"]


@dataclass(frozen=True)
class SetCall:
    """One set or reset call a simulated GPU received (times on the GPU's clock, seconds).

    Attributes:
        method: The GPU method called (``"set_locked_clock"``, ...).
        requested: Its argument (MHz or W; None for a reset).
        applied: The clock or limit applied (None for a reset or a refusal).
        issued_s: When the call was made.
        applied_s: When its change took effect (None: refused).
        returned_s: When it returned or raised.
        error: The error it raised (None: it succeeded).
    """

    method: str
    requested: float | None
    applied: float | None
    issued_s: float
    applied_s: float | None
    returned_s: float
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the call succeeded."""
        return self.error is None


_G = TypeVar("_G", bound="SimSharedState")
_P = ParamSpec("_P")
_R = TypeVar("_R")


def _number(value: object) -> float | None:
    return value if isinstance(value, int | float) else None  # MHz, W; None for a reset


def recorded_set_call(
    method: Callable[Concatenate[_G, _P], _R], name: str | None = None
) -> Callable[Concatenate[_G, _P], _R]:
    """Wrap a set/reset method: its change, then ``set_return_lag_s``, then its record (named
    ``name``, default the method's)."""
    name = method.__name__ if name is None else name

    @functools.wraps(method)
    def call(self: _G, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        if self._set_calls is None and self.set_return_lag_s <= 0:
            return method(self, *args, **kwargs)  # neither recording nor lagging
        issued_s = self._clock()
        requested = _number(args[0]) if args else None
        try:
            result = method(self, *args, **kwargs)
        except Exception as e:
            if self._set_calls is not None:
                self._set_calls.append(
                    SetCall(name, requested, None, issued_s, None, self._clock(), str(e))
                )
            raise
        applied_s = self._clock()
        if self.set_return_lag_s > 0:
            self._sleep(self.set_return_lag_s)
        if self._set_calls is not None:
            record = SetCall(name, requested, _number(result), issued_s, applied_s, self._clock())
            self._set_calls.append(record)
        return result

    return call
