"""Root's perseus against a local user's traps in the files it reads back: the recurring
store's SQLite file and its ``-wal``/``-shm``/``-journal`` siblings (which SQLite opens itself,
following links), and the online-profile cache (read back to plan the next run's clocks).

The attacker creates the directory root will use (before root does) or plants links in it;
every victim stays intact, every refusal is one ``ConfigError`` line naming the path and fix.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from perseus.device.simulated import SimulatedGPU
from perseus.errors import ConfigError
from perseus.io import load_profile
from perseus.io.profile_files import write_profile_csv
from perseus.recurring.store import SQLiteStore
from perseus.runtime.emulation import scale_profile, take_stages
from perseus.runtime.planning import OnlineProfile
from perseus.runtime.session import RankSession, SessionOptions
from perseus.schedule import build_schedule

from .conftest import Attacker

VICTIM = b"root:secret\n" * 4096  # 48 KiB: SQLite would write a WAL header and frames over it
CONFIG = {"batch_sizes": [32, 64], "default_batch_size": 32, "eta": 0.5, "beta": 2.0}


@pytest.fixture
def victim(tmp_path: Path) -> Iterator[Path]:
    private = tmp_path / "root-only"
    private.mkdir(mode=0o700)
    path = private / "victim.db"
    path.write_bytes(VICTIM)
    yield path
    assert path.read_bytes() == VICTIM, "the victim file was changed"


def _one_line(error: BaseException, *mentions: str) -> None:
    lines = str(error).strip().splitlines()
    assert len(lines) == 1, str(error)
    for m in mentions:
        assert m in lines[0], f"{m!r} not in {lines[0]!r}"


def _use(store: SQLiteStore) -> None:
    store.register_job("j", {**CONFIG, "max_power_w": 300.0})


@pytest.mark.parametrize("sibling", ["-wal", "-shm", "-journal"])
def test_a_store_in_an_attacker_directory_is_refused(
    attacker: Attacker, public_tmp: Path, victim: Path, tmp_path: Path, sibling: str
) -> None:
    tmp_path.chmod(0o755)  # the attacker must reach the victim to aim a link at it
    folder = public_tmp / "perseus-store"
    attacker.sh(f"mkdir -m 777 {folder} && ln -s {victim} {folder}/jobs.db{sibling}")
    with pytest.raises(ConfigError) as e:
        _use(SQLiteStore(folder / "jobs.db"))
    _one_line(e.value, str(folder), "belongs to another user", attacker.name)
    assert not (folder / "jobs.db").exists()


@pytest.mark.parametrize("sibling", ["-wal", "-shm"])
def test_a_link_left_beside_a_store_in_a_directory_of_ours_is_refused(
    tmp_path: Path, victim: Path, sibling: str
) -> None:
    folder = tmp_path / "store"
    folder.mkdir(mode=0o700)
    db = folder / "jobs.db"
    first = SQLiteStore(db)  # a real store, used before and closed
    _use(first)
    first.close()
    for suffix in ("-wal", "-shm"):
        (folder / f"jobs.db{suffix}").unlink(missing_ok=True)
    (folder / f"jobs.db{sibling}").symlink_to(victim)
    with pytest.raises(ConfigError) as e:
        _use(SQLiteStore(db))
    _one_line(e.value, f"jobs.db{sibling}", "symbolic link", "rm ")


def test_a_store_file_of_another_user_is_refused(attacker: Attacker, tmp_path: Path) -> None:
    """A forged history (the attacker's own database, hard-linked or moved in) never steers
    root's job: only our own regular file with one name is opened."""
    folder = tmp_path / "store"
    folder.mkdir(mode=0o700)
    db = folder / "jobs.db"
    _use(SQLiteStore(db))
    os.chown(db, attacker.uid, attacker.gid)
    with pytest.raises(ConfigError) as e:
        _use(SQLiteStore(db))
    _one_line(e.value, str(db), attacker.name)


def test_a_group_or_world_writable_store_directory_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    folder.mkdir()
    folder.chmod(0o777)
    with pytest.raises(ConfigError) as e:
        _use(SQLiteStore(folder / "jobs.db"))
    _one_line(e.value, str(folder), "writable by group or others", "mkdir -m 700")


def test_a_forged_profile_cache_in_an_attacker_directory_is_never_read(
    attacker: Attacker, public_tmp: Path, tmp_path: Path
) -> None:
    """The cache decides the next run's clocks: a profile planted in a directory the
    attacker controls (here made slow at every clock) must not be planned from."""
    profile = scale_profile(take_stages(load_profile("a100"), 1), 0.02)
    folder = public_tmp / "perseus-cache"
    attacker.sh(f"mkdir -m 777 {folder}")
    cache = folder / "profile.csv"
    write_profile_csv(profile, cache)
    os.chown(cache, attacker.uid, attacker.gid)
    gpu = SimulatedGPU.from_profile(
        profile, blocking_power_w=83.64, state_dir=tmp_path / "sim", set_latency_s=0.0
    )
    session = RankSession(
        build_schedule("1f1b", 1, 4),
        0,
        gpu=gpu,
        plan=OnlineProfile(cache=cache),
        options=SessionOptions(blocking_power_w=83.64, watchdog=False, handle_signals=False),
    )
    with pytest.raises(ConfigError) as e:
        session.start()
    session.close()
    _one_line(e.value, str(folder), "belongs to another user", "profile cache")


def test_metrics_file_behind_an_attacker_link_is_refused(
    attacker: Attacker, public_tmp: Path, tmp_path: Path
) -> None:
    """``jsonl=/tmp/shared/metrics.jsonl`` with ``/tmp/shared`` the attacker's link to a
    directory of root's: root would truncate its own file of that name (``O_NOFOLLOW`` only
    guards the last component)."""
    pytest.importorskip("prometheus_client")
    from perseus.runtime.metrics import MetricsSink
    from tests.runtime.test_metrics import _emulated_session

    private = tmp_path / "root-only"
    private.mkdir(mode=0o700)
    victim = private / "metrics.jsonl"
    victim.write_text("root's records\n")
    attacker.sh(f"ln -s {private} {public_tmp}/shared")
    session = _emulated_session(tmp_path)
    with pytest.raises(ConfigError) as e:
        MetricsSink(session, jsonl=public_tmp / "shared" / "metrics.jsonl").attach()
    _one_line(e.value, "shared", "owned by another user")
    assert victim.read_text() == "root's records\n"


def test_the_emulation_timeline_lives_in_a_fresh_private_directory(tmp_path: Path) -> None:
    """The emulated pipeline's shared timeline is mapped read-write (created with ``w+``, which
    truncates): a user-named path in a shared directory could be a planted link that makes root
    truncate its target. No caller names it: it is made in a fresh directory of mode 0700."""
    from perseus.job import make_job

    profile = scale_profile(take_stages(load_profile("a100"), 1), 0.02)
    gpu = SimulatedGPU.from_profile(
        profile, blocking_power_w=83.64, state_dir=tmp_path / "sim", set_latency_s=0.0
    )
    job = make_job(profile, "1f1b", 1, 4, blocking_power_w=83.64)
    plan = job.frontier([job.point(job.allmax())])
    options = SessionOptions(blocking_power_w=83.64, watchdog=False, handle_signals=False)
    kwargs = {"gpu": gpu, "plan": plan, "options": options}
    with pytest.raises(TypeError, match="timeline"):
        RankSession(build_schedule("1f1b", 1, 4), 0, timeline=tmp_path / "t", **kwargs)  # type: ignore[call-arg]
    session = RankSession(build_schedule("1f1b", 1, 4), 0, **kwargs).start()
    try:
        emulator = session._run
        assert emulator is not None
        path = Path(emulator._timeline._ends.filename)
        folder = path.parent.lstat()
        assert stat.S_ISDIR(folder.st_mode) and stat.S_IMODE(folder.st_mode) == 0o700
        assert folder.st_uid == os.getuid() and not path.is_symlink()
    finally:
        session.close()


@pytest.mark.parametrize("name", ["jobs.db", "jobs.db-wal"])
def test_a_store_in_a_shared_sticky_directory_is_refused(
    attacker: Attacker,
    public_tmp: Path,
    victim: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
) -> None:
    """``/tmp/jobs.db``: root's sticky ``/tmp`` passed the directory check, and SQLite then
    creates the database and its ``-wal`` by name, following links: the attacker's link,
    planted between perseus's check and SQLite's open (played here right after the check),
    was opened as root's store or its log (a forged database of the attacker's, planted the
    same way, would steer root's power limits). A store needs a directory nobody else writes."""
    tmp_path.chmod(0o755)  # the attacker must reach the victim to aim a link at it
    import perseus.recurring.store as store_module

    real_check = store_module.check_private_file

    def check_then_lose_the_race(*args: object, **kwargs: object) -> bool:
        exists = real_check(*args, **kwargs)  # type: ignore[arg-type]
        attacker.sh(f"ln -sf {victim} {public_tmp}/{name}")
        return exists

    monkeypatch.setattr(store_module, "check_private_file", check_then_lose_the_race)
    with pytest.raises(ConfigError) as e:
        _use(SQLiteStore(public_tmp / "jobs.db"))
    _one_line(e.value, str(public_tmp), "writable by others", "mkdir -m 700")
