"""device."""
__all__: list[str] = []
