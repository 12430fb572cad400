"""Shared fixtures. Tests can never reach a real GPU by accident."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data" / "perseus-sosp24"
BUNDLED = REPO / "perseus" / "data" / "profiles"


@pytest.fixture(autouse=True)
def _no_real_nvml(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """Make ``pynvml.nvmlInit`` raise unless the test is marked ``gpu``."""
    if request.node.get_closest_marker("gpu") is not None:
        yield
        return

    def _refuse(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("test tried to initialise real NVML; mark it @pytest.mark.gpu")

    try:
        import pynvml
    except ImportError:
        yield
        return
    monkeypatch.setattr(pynvml, "nvmlInit", _refuse)
    if hasattr(pynvml, "nvmlInitWithFlags"):
        monkeypatch.setattr(pynvml, "nvmlInitWithFlags", _refuse)
    yield


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``gpu`` tests on machines without an NVIDIA driver."""
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU and driver")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _has_gpu() -> bool:
    return Path("/proc/driver/nvidia/version").exists()
