"""``perseus straggler --store``: an address no resolver could take is one line, exit 2,
before any connection attempt (it was tried, then exit 1)."""

from __future__ import annotations

import pytest

from perseus.cli.main import main


@pytest.mark.parametrize("address", ["h\x00st:29500", "h\x1bst:29500", "127.0.0.1:٢٩٥٠٠"])
def test_an_address_with_a_control_character_or_unicode_port_is_refused(
    capsys: pytest.CaptureFixture[str], address: str
) -> None:
    argv = ["straggler", "set", "--store", address, "--pipeline", "0", "--time-s", "1"]
    assert main([*argv, "--wait-s", "0.1"]) == 2
    err = capsys.readouterr().err
    assert "not HOST:PORT" in err and err.count("\n") == 1, err
