"""Blocking power from the device: declared (simulated), from the table (known GPUs), or refused."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from perseus import blocking_power_for
from perseus.device.presets import PRESETS, blocking_power_of_name
from perseus.device.simulated import SimulatedGPU
from perseus.errors import ConfigError
from perseus.io import BUNDLED_PROFILES


class _Named:
    def __init__(self, name: str) -> None:
        self.name = name


@pytest.mark.parametrize(
    ("name", "power_w", "estimated"),
    [
        ("NVIDIA A100-SXM4-80GB", 83.64, False),
        ("NVIDIA A100-SXM4-40GB", 83.64, False),
        ("NVIDIA A40", 70.38, False),
        ("NVIDIA H100 80GB HBM3", 120.0, True),
    ],
)
def test_known_gpus_by_name(name: str, power_w: float, estimated: bool) -> None:
    figure = blocking_power_of_name(name)
    assert figure is not None
    assert (figure.power_w, figure.estimated) == (power_w, estimated)
    assert ("estimate" in figure.source) == estimated


@pytest.mark.parametrize(
    "name", ["NVIDIA A100 80GB PCIe", "NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA RTX A4000"]
)
def test_other_boards_are_not_guessed(name: str) -> None:
    assert blocking_power_of_name(name) is None
    with pytest.raises(ConfigError, match=r"perseus doctor.*`blocking_power_w`"):
        blocking_power_for(_Named(name))  # type: ignore[arg-type]


def test_the_table_agrees_with_the_presets_and_the_bundled_profiles() -> None:
    for key in ("a100", "a40", "h100"):
        preset = PRESETS[key]
        figure = blocking_power_of_name(preset.name)
        assert figure is not None and figure.power_w == preset.power.blocking_w
        assert figure.estimated == preset.estimated
    for bundled in BUNDLED_PROFILES:
        figure = blocking_power_of_name(PRESETS[bundled.alias].name)
        assert figure is not None and figure.power_w == bundled.blocking_power_w


def test_source_is_logged_and_estimates_warn(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="perseus.device.presets"):
        assert blocking_power_for(_Named("NVIDIA A40")) == 70.38  # type: ignore[arg-type]
        assert blocking_power_for(_Named("NVIDIA H100 80GB HBM3")) == 120.0  # type: ignore[arg-type]
    levels = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert levels[0][0] == logging.INFO and "Perseus SOSP'24" in levels[0][1]
    assert levels[1][0] == logging.WARNING and "estimate" in levels[1][1]


def test_a_simulated_gpu_declares_its_own(tmp_path: Path) -> None:
    gpu = SimulatedGPU.from_preset("a40", state_dir=tmp_path, blocking_power_w=66.0)
    assert blocking_power_for(gpu) == 66.0
