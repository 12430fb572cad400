"""One adapter per training engine: the schedule it runs, and each compute action in an op.

Adapters import their engine lazily; importing this package imports no engine.
"""

__all__: list[str] = []
