"""Straggler-aware plan switching: the policy (pure), its run-time driver, and the job-level
what-if sweep (pure, :mod:`~perseus.runtime.straggler.sweep`)."""

__all__: list[str] = []
