"""solver."""
__all__: list[str] = []
