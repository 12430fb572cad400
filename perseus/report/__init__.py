"""report."""
__all__: list[str] = []
