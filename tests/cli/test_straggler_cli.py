"""``perseus straggler set|clear`` against a real TCP store in this process."""

from __future__ import annotations

from datetime import timedelta

import pytest

from perseus.cli.main import main
from perseus.runtime.straggler.switching import read_hint

dist = pytest.importorskip("torch.distributed")


def test_set_and_clear_reach_the_job_store(capsys):
    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False
    )
    address = f"127.0.0.1:{store.port}"
    assert main(["straggler", "set", "--store", address, "--pipeline", "1", "--time-s", "2.5"]) == 0
    assert read_hint(store, 1) == 2.5
    assert main(["straggler", "clear", "--store", address, "--pipeline", "1"]) == 0
    assert read_hint(store, 1) is None
    assert "perseus/straggler/1" in capsys.readouterr().out


def test_bad_address_and_value_exit_2(capsys):
    assert main(["straggler", "set", "--store", "nohost", "--pipeline", "0", "--time-s", "1"]) == 2
    assert "HOST:PORT" in capsys.readouterr().err
