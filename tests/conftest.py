"""Shared fixtures. Tests can never reach a real GPU by accident.

The solver's numba kernels are compiled (or loaded from numba's disk cache) once, before the
first test, and the time is reported, rather than paid silently by whichever test traces a
frontier first (a cold compile takes 20-90 s on a 2-core machine). Runs that collect only
tests that never solve (``SOLVER_FREE`` folders) skip it.

Lanes: ``pytest -m "not slow"`` for everyday work; ``pytest`` for everything. ``slow`` marks
emulated multi-process runs, real-time smoke tests and subprocess-heavy tests.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data" / "perseus-sosp24"
BUNDLED = REPO / "perseus" / "data" / "profiles"

#: Code for a fresh interpreter starts with this to use numba's JIT kernels, not the ones built
#: at install (perseus.solver.aot): an import of the built module then fails, as where it is not.
JIT_ONLY = "import sys; sys.modules['perseus.solver._kernels'] = None\n"
#: Test folders whose tests never trace a frontier: no kernel warm-up for them alone.
SOLVER_FREE = frozenset({"core", "dag", "device", "profile", "recurring", "schedule", "security"})


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
    """Mark tests/integration (emulated multi-process training runs) ``slow``; skip ``gpu``
    tests on machines without an NVIDIA driver."""
    integration = REPO / "tests" / "integration"
    for item in items:
        if item.path.is_relative_to(integration):
            item.add_marker(pytest.mark.slow)
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU and driver")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _has_gpu() -> bool:
    return Path("/proc/driver/nvidia/version").exists()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Compile (or load) the solver kernels once, up front, and say how long it took."""
    config = session.config
    if config.option.collectonly or not _needs_solver(session.items):
        return
    from perseus.cli._progress import solver_kernels_cached

    reporter = config.pluginmanager.get_plugin("terminalreporter")
    cached = solver_kernels_cached()
    if reporter is not None and not cached:
        reporter.write_line(
            "perseus: compiling the solver kernels (numba; once per checkout, then cached)..."
        )
    started = time.perf_counter()
    _warm_solver_kernels()
    elapsed = time.perf_counter() - started
    if reporter is not None:
        how = "built at install or in numba's disk cache" if cached else "compiled"
        reporter.write_line(f"perseus: solver kernels {how} in {elapsed:.1f} s")


def _needs_solver(items: list[pytest.Item]) -> bool:
    tests = REPO / "tests"
    for item in items:
        try:
            folder = item.path.relative_to(tests).parts[0]
        except ValueError:
            return True
        if folder not in SOLVER_FREE:
            return True
    return False


def _warm_solver_kernels() -> None:
    """Trace a tiny job: every kernel of the default walk compiles (or loads) for the
    argument types all jobs use (two-clock and folded walks reuse them)."""
    from perseus.io import load_profile
    from perseus.io.profile_slice import slice_profile
    from perseus.job import make_job
    from perseus.solver import trace

    profile = slice_profile(load_profile("a100"), 2)
    trace(make_job(profile, "1f1b", 2, 4, blocking_power_w=83.64))


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
