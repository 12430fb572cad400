"""Fleet fixtures: frontiers traced once per test run, and a real PostgreSQL server."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from perseus.io import load_profile
from perseus.io.frontier_files import write_frontier
from perseus.job import make_job
from perseus.plan import Frontier
from perseus.runtime.emulation import take_stages
from perseus.solver import trace
from perseus.solver.power import with_power

#: (profile, stages, microbatches): the bundled profiles cut to a few stage counts.
SHAPES = [
    (name, stages, microbatches)
    for name in ("a100", "a40")
    for stages, microbatches in ((2, 4), (2, 8), (3, 6), (4, 4))
]


@pytest.fixture(scope="session")
def fleet_frontiers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Frontier]]:
    """Each shape's frontier (with power figures), written once to a session folder."""
    folder = tmp_path_factory.mktemp("frontiers")
    out = {}
    for name, stages, microbatches in SHAPES:
        job = make_job(
            take_stages(load_profile(name), stages),
            "1f1b",
            stages,
            microbatches,
            blocking_power_w=83.64,
        )
        frontier = with_power(job, trace(job, min_gap_fraction=0.005).frontier)
        path = folder / f"{name}-{stages}x{microbatches}.json"
        write_frontier(frontier, path)
        out[path.stem] = (path, frontier)
    return out


# ---------------------------------------------------------------------------------------------
# A real PostgreSQL server for the whole test run (initdb + pg_ctl on a temporary directory).


def _server_binaries() -> Path | None:
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0,
    )
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """``postgresql://perseus@127.0.0.1:PORT`` of a server started for this test run (trust
    authentication on 127.0.0.1 only; as root, the server runs as the ``postgres`` user)."""
    pytest.importorskip("psycopg", reason="psycopg is not installed (pip install '.[postgres]')")
    bin_dir = _server_binaries()
    if bin_dir is None:
        pytest.skip("no PostgreSQL server binaries (apt-get install postgresql)")
    run_as: list[str] = []
    owner = None
    if os.geteuid() == 0:  # initdb and postgres refuse to run as root
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no postgres user to run the server as")
        run_as = ["runuser", "-u", "postgres", "--"]
    folder = Path(tempfile.mkdtemp(prefix="perseus-pg-"))
    data = folder / "data"
    if owner is not None:
        os.chown(folder, owner.pw_uid, owner.pw_gid)
    port = _free_port()
    try:
        subprocess.run(
            [*run_as, str(bin_dir / "initdb"), "-D", str(data), "--auth=trust",
             "--username=perseus", "-E", "UTF8", "--no-sync"],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        subprocess.run(
            [*run_as, str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(folder / "log"), "-w",
             "-t", "60", "-o",
             f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off "
             "-c max_connections=200 -c synchronous_commit=off",
             "start"],
            check=True, capture_output=True, timeout=90,
        )  # fmt: skip
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        log = (folder / "log").read_text() if (folder / "log").exists() else ""
        shutil.rmtree(folder, ignore_errors=True)
        detail = getattr(e, "stderr", b"") or b""
        pytest.fail(
            f"PostgreSQL did not start: {detail.decode(errors='replace')[-500:]} {log[-500:]}"
        )
    try:
        yield f"postgresql://perseus@127.0.0.1:{port}"
    finally:
        subprocess.run(
            [*run_as, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
            capture_output=True, timeout=60,
        )  # fmt: skip
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres_server: str) -> str:
    """A fresh, empty database on the session's server."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(f"{postgres_server}/postgres", autocommit=True) as con:
        con.execute(f"CREATE DATABASE {name}")
    return f"{postgres_server}/{name}"


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The same test on both engines: a SQLite file, then a PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'jobs.sqlite'}"
    return str(request.getfixturevalue("postgres_url"))
