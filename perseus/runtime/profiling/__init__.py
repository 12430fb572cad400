"""Online profiling: the clock sweep, energy counter windows and their attribution to ops."""

__all__: list[str] = []
