"""Command-line interface (``perseus``); no library module imports this package."""

__all__: list[str] = []
