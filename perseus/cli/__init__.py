"""Command-line interface (``perseus``); nothing imports this package."""

__all__: list[str] = []
