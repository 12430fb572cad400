"""``perseus device`` on a simulated GPU whose state or description was edited by hand: the
GPU reads as torn (absent until a process uses it again), never an internal error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perseus.cli.main import main
from perseus.device.simulated import SimulatedGPU

EDITS = [
    ("state", "energy_j", "x"),
    ("state", "energy_j", 1e308),
    ("state", "counter_gain", None),
    ("state", "locked_mhz", float("nan")),
    ("state", "segments", [[0, 1]]),
    ("state", "t_last", None),
    ("info", "clocks_mhz", 0),
    ("info", "idle_clock_mhz", "x"),
    ("info", "name", None),
]


@pytest.fixture
def no_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    pynvml = pytest.importorskip("pynvml")

    def missing() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", missing)


def _edit(path: Path, key: str, value: object, *, state: bool) -> None:
    raw = path.read_bytes()
    head, body = raw.split(b"\n", 1) if state else (b"", raw)
    doc = json.loads(body[: int(head[21:31])] if state else body)
    doc[key] = value
    data = json.dumps(doc).encode()
    path.write_bytes(head[:21] + b"%010d\n" % len(data) + data if state else data)


@pytest.mark.parametrize("command", [["info"], ["reset", "--sim", "0"], ["slowdown", "0", "2"]])
@pytest.mark.parametrize(("file", "key", "value"), EDITS)
def test_a_file_edited_by_hand_is_not_an_internal_error(
    no_driver: None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command: list[str],
    file: str,
    key: str,
    value: object,
) -> None:
    gpu = SimulatedGPU.from_preset("a100", index=0, state_dir=tmp_path, set_latency_s=0.0)
    gpu.set_locked_clock(1095)
    suffix = ".state" if file == "state" else ".info.json"
    _edit(tmp_path / f"{gpu.uuid}{suffix}", key, value, state=file == "state")
    del gpu
    code = main(["device", "--sim-dir", str(tmp_path), *command])
    err = capsys.readouterr().err
    assert code == (0 if command == ["info"] else 2), err
    assert err.count("\n") == code // 2 and "internal error" not in err, err
