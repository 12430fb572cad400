"""The PerseusError tree: bad input raises a :class:`ConfigError` (the CLI's exit code 2);
vendor errors are wrapped once, in the device layer, with ``raise ... from e``."""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "DeviceBusyError",
    "DeviceError",
    "DeviceLostError",
    "DeviceNotSupportedError",
    "DevicePermissionError",
    "InfeasibleError",
    "PerseusError",
    "PlanError",
    "ProfileError",
    "ScheduleError",
]


class PerseusError(Exception):
    """Base class of every error perseus raises deliberately.

    Attributes:
        message: What went wrong, in one line.
        detail: Lines shown under it (a schedule's grid with the failing step marked).
    """

    def __init__(self, message: str = "", detail: str = "") -> None:
        super().__init__(message)
        self.message, self.detail = message, detail

    def __str__(self) -> str:
        return f"{self.message}\n{self.detail}" if self.detail else self.message


class ConfigError(PerseusError, ValueError):
    """Bad user input: the message names the file, the field or line, and the fix."""


class ScheduleError(ConfigError):
    """A pipeline schedule is malformed (missing, duplicated or deadlocking actions)."""


class ProfileError(ConfigError):
    """A time/energy profile is malformed or incomplete."""


class PlanError(ConfigError):
    """A plan or frontier file does not match its schema or its job."""


class InfeasibleError(PerseusError):
    """No plan satisfies the request (e.g. a deadline below the fastest possible time)."""


class DeviceError(PerseusError):
    """A GPU operation failed."""


class DevicePermissionError(DeviceError):
    """The process may read the GPU but not change its clocks."""


class DeviceNotSupportedError(DeviceError):
    """The GPU or driver does not support the operation (pre-Volta, MIG, ...)."""


class DeviceLostError(DeviceError):
    """The GPU fell off the bus or stopped answering."""


class DeviceBusyError(DeviceError):
    """Another live process owns the GPU's clocks."""
