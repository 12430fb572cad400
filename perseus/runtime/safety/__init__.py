"""Never leave a GPU at a low clock or power limit: ownership, exit and signal hooks, watchdog."""

from perseus.runtime.safety.guard import ExitGuard, GpuClaim, Watchdog

__all__ = ["ExitGuard", "GpuClaim", "Watchdog"]
