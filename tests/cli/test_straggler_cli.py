"""``perseus straggler set|clear`` against a real TCP store in this process: delivery, the
running job's acknowledgement, and bounded waits."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from perseus.cli.main import main
from perseus.runtime.straggler.switching import (
    StragglerRuntime,
    ack_key,
    read_ack,
    read_hint,
)
from tests.runtime.plans import tiny_plan

dist = pytest.importorskip("torch.distributed")


def _store() -> Any:
    return dist.TCPStore(
        "127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False
    )


class _Job:
    """A running job's global rank 0: reads hints at every iteration boundary (every 20 ms)."""

    def __init__(self, store: Any) -> None:
        self.runtime = StragglerRuntime(tiny_plan(), pipeline_index=0, num_pipelines=2, store=store)
        self.iteration = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.iteration += 1
            self.runtime.exchange(1.0, self.iteration)
            time.sleep(0.02)

    def __enter__(self) -> _Job:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def test_set_without_a_running_job_says_nobody_read_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    store = _store()
    address = f"127.0.0.1:{store.port}"
    argv = ["straggler", "set", "--store", address, "--pipeline", "1", "--time-s", "2.5"]
    assert main([*argv, "--wait-s", "0.3"]) == 1
    out = capsys.readouterr().out
    assert "delivered: perseus/straggler/1 = 2.5 s; no running job has read it yet" in out
    assert read_hint(store, 1) == 2.5  # delivered all the same: a job starting later reads it
    assert main([*argv, "--wait-s", "0"]) == 0
    assert "not waiting" in capsys.readouterr().out
    assert main(["straggler", "clear", "--store", address, "--pipeline", "1"]) == 0
    assert read_hint(store, 1) is None
    assert "no running job had a hint" in capsys.readouterr().out


def test_a_running_job_acknowledges_set_and_clear(capsys: pytest.CaptureFixture[str]) -> None:
    store = _store()
    address = f"127.0.0.1:{store.port}"
    with _Job(store) as job:
        argv = ["straggler", "set", "--store", address, "--pipeline", "1", "--time-s", "2.5"]
        assert main(argv) == 0
        out = capsys.readouterr().out
        assert "acknowledged by the job at iteration" in out
        acked_at = int(out.rsplit("iteration ", 1)[1].split()[0])
        assert 1 <= acked_at <= job.iteration
        deadline = time.monotonic() + 5
        while job.runtime.exchange(1.0, None)[1] != 2.5 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert job.runtime.exchange(1.0, None)[1] == 2.5  # the job runs with the hint
        assert main(["straggler", "clear", "--store", address, "--pipeline", "1"]) == 0
        assert "cleared; acknowledged by the job at iteration" in capsys.readouterr().out
    ack = read_ack(store, 1)
    assert ack is not None and ack[0] == "-"
    assert store.check([ack_key(1)])


def test_a_second_set_of_the_same_value_waits_for_its_own_acknowledgement(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An old acknowledgement of an equal value does not count: each set has its token."""
    store = _store()
    address = f"127.0.0.1:{store.port}"
    argv = ["straggler", "set", "--store", address, "--pipeline", "0", "--time-s", "3"]
    with _Job(store):
        assert main(argv) == 0
    capsys.readouterr()
    assert main([*argv, "--wait-s", "0.3"]) == 1  # the job has stopped: nobody read this one
    assert "no running job has read it yet" in capsys.readouterr().out


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A server that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue
            except OSError:
                return

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield int(server.getsockname()[1])
    stop.set()
    thread.join(5)
    for c in held:
        c.close()
    server.close()


def test_a_server_that_never_answers_is_given_up_on_within_the_timeout(
    silent_server: int, capsys: pytest.CaptureFixture[str]
) -> None:
    address = f"127.0.0.1:{silent_server}"
    started = time.monotonic()
    rc = main(
        [
            "straggler",
            "set",
            "--store",
            address,
            "--pipeline",
            "0",
            "--time-s",
            "1",
            "--timeout-s",
            "1",
        ]
    )
    elapsed = time.monotonic() - started
    assert rc == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "no answer within 1 s" in err[0]
    # Bounded by the timeout (generous slack for a loaded machine); the unpatched client waited
    # for ever.
    assert elapsed < 15


def test_bad_address_and_value_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["straggler", "set", "--store", "nohost", "--pipeline", "0", "--time-s", "1"]) == 2
    assert "HOST:PORT" in capsys.readouterr().err
    assert (
        main(
            [
                "straggler",
                "set",
                "--store",
                "127.0.0.1:1",
                "--pipeline",
                "0",
                "--time-s",
                "1",
                "--wait-s",
                "inf",
            ]
        )
        == 2
    )
    assert "--wait-s" in capsys.readouterr().err


@pytest.mark.parametrize("host", ["a" * 300, "a..b", "."])
def test_a_host_name_the_resolver_refuses_is_exit_2(
    host: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 300-character or empty label made getaddrinfo raise UnicodeError: an internal error."""
    argv = ["power", "set", "--store", f"{host}:1", "--cap-w", "100", "--timeout-s", "0.5"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "is not a host name or address" in err and err.count("\n") == 1
