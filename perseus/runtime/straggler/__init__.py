"""Straggler-aware plan switching: the policy (pure) and its run-time driver."""

__all__: list[str] = []
