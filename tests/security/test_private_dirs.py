"""Root's perseus against a local user's traps in the lock and simulated-state directories.

The attacker creates the directories root would use (before root does, as after a reboot) or
plants links, FIFOs and forged lock files in a shared sticky directory, all pointing at a
victim file only root can write. Every victim stays intact; every refusal is one line naming
the directory or file (its owner and mode) and the fix; the CLI exits 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perseus.device.fake_nvml import FakeDevice, FakeNvml
from perseus.device.nvml import NvmlGPU
from perseus.device.ownership import GpuOwnership, owner_lock_path
from perseus.device.private_dir import runtime_dir
from perseus.device.simulated import SimulatedGPU, sim_uuid
from perseus.errors import ConfigError

from .conftest import Attacker, memory_cap

REPO = Path(__file__).resolve().parents[2]
UUID = "GPU-11111111-2222-3333-4444-555555555555"
VICTIM_TEXT = "root:secret\n"


@pytest.fixture
def victim(tmp_path: Path) -> Iterator[Path]:
    """A file only root can write (in a directory only root can enter)."""
    private = tmp_path / "root-only"
    private.mkdir(mode=0o700)
    path = private / "victim.txt"
    path.write_text(VICTIM_TEXT)
    path.chmod(0o644)
    yield path
    assert path.read_text() == VICTIM_TEXT, "the victim file was changed"
    assert path.stat().st_uid == 0


def _world_readable_dir(tmp_path: Path) -> None:
    # The attacker must reach the victim's directory to aim a link at it (not to write it).
    tmp_path.chmod(0o755)


def _cli(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "perseus.cli", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        preexec_fn=memory_cap(768 * 1024 * 1024),
        timeout=120,
    )


def _one_line(message: str, *mentions: str) -> None:
    assert "Traceback" not in message, message
    lines = message.strip().splitlines()
    assert len(lines) == 1, message
    for m in mentions:
        assert m in lines[0], f"{m!r} not in {lines[0]!r}"


def _refused(result: subprocess.CompletedProcess[str], *mentions: str) -> None:
    assert result.returncode == 2, f"exit {result.returncode}: {result.stderr!r}"
    _one_line(result.stderr, *mentions)


def test_root_default_directories_are_under_run() -> None:
    if os.geteuid() != 0:
        pytest.skip("root's defaults: run as root (CI does)")
    if not os.path.isdir("/run"):
        pytest.skip("no /run on this system")
    assert runtime_dir() == Path("/run/perseus")


def test_attacker_owned_lock_directory_is_refused(
    attacker: Attacker, public_tmp: Path, victim: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    locks = public_tmp / "perseus-locks"
    attacker.sh(f"mkdir -m 777 {locks} && ln -s {victim} {locks}/{UUID}.owner")
    monkeypatch.setenv("PERSEUS_LOCK_DIR", str(locks))
    gpu = NvmlGPU(UUID, nvml_module=FakeNvml(devices=[FakeDevice(UUID)]), privileged=True)
    gpu.open()
    try:
        with pytest.raises(ConfigError) as e:
            gpu.owner_lock_path()
    finally:
        gpu.close()
    _one_line(str(e.value), str(locks), "belongs to another user", attacker.name, "0777")
    _one_line(str(e.value), "PERSEUS_LOCK_DIR", "mkdir -m 700")
    # The lock itself, opened by path, is refused the same way.
    with pytest.raises(ConfigError, match="belongs to another user"):
        GpuOwnership(UUID, owner_lock_path(locks, UUID)).acquire(wait_s=0.0)


def test_attacker_owned_state_directory_is_refused_by_the_cli(
    attacker: Attacker, public_tmp: Path, victim: Path, tmp_path: Path
) -> None:
    _world_readable_dir(tmp_path)
    sim = public_tmp / "sim"
    uuid = sim_uuid(0)
    attacker.sh(
        f"mkdir -m 755 {sim} && ln -s {victim} {sim}/{uuid}.state "
        f"&& ln -s {victim} {sim}/{uuid}.owner"
    )
    for argv, env in (
        (["device", "--sim-dir", str(sim), "info"], {}),
        (["device", "info"], {"PERSEUS_SIM_DIR": str(sim)}),
        (["device", "--sim-dir", str(sim), "reset", "--sim", "0"], {}),
    ):
        result = _cli(argv, env)
        _refused(result, str(sim), "belongs to another user", attacker.name, "0755")
    with pytest.raises(ConfigError, match="belongs to another user"):
        SimulatedGPU.from_preset("a40", state_dir=sim, set_latency_s=0.0).set_locked_clock(900)


def test_a_directory_under_an_attacker_owned_parent_is_refused(
    attacker: Attacker, public_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parent = public_tmp / "attacker"
    attacker.sh(f"mkdir -m 755 {parent}")
    mine = parent / "locks"
    mine.mkdir(mode=0o700)  # root's own directory, but the attacker may rename it away
    monkeypatch.setenv("PERSEUS_LOCK_DIR", str(mine))
    with pytest.raises(ConfigError) as e:
        GpuOwnership(UUID, owner_lock_path(mine, UUID)).acquire(wait_s=0.0)
    _one_line(str(e.value), str(parent), "its parent", "belongs to another user")


def test_a_linked_directory_is_refused(
    attacker: Attacker, public_tmp: Path, tmp_path: Path
) -> None:
    _world_readable_dir(tmp_path)
    target = tmp_path / "root-dir"
    target.mkdir(mode=0o700)
    link = public_tmp / "sim-link"
    attacker.sh(f"ln -s {target} {link}")
    result = _cli(["device", "--sim-dir", str(link), "info"], {})
    _refused(result, str(link), "is a symbolic link")
    assert list(target.iterdir()) == []


@pytest.mark.parametrize("kind", ["link", "fifo", "attacker file", "forged lock"])
def test_traps_planted_in_a_shared_sticky_directory(
    attacker: Attacker,
    public_tmp: Path,
    victim: Path,
    tmp_path: Path,
    kind: str,
) -> None:
    """``public_tmp`` is root's and sticky (like ``/tmp``): accepted as a directory, but no
    file the attacker planted in it is followed, opened for writing, or trusted."""
    _world_readable_dir(tmp_path)
    lock = public_tmp / f"{UUID}.owner"
    forged = json.dumps({"backend": "nvml", "uuid": "GPU-other", "power_limit_mw": 100_000})
    plant = {
        "link": f"ln -s {victim} {lock}",
        "fifo": f"mkfifo {lock}",
        "attacker file": f"echo 1 > {lock}",
        "forged lock": f"printf '1\\n%s\\n' '{forged}' > {lock}",
    }[kind]
    attacker.sh(plant)
    why = {
        "link": "is a symbolic link",
        "fifo": "is not a regular file",
        "attacker file": "belongs to",
        "forged lock": "belongs to",
    }[kind]
    fake = FakeNvml(devices=[FakeDevice(UUID), FakeDevice("GPU-other", locked=(1200, 1200))])
    resets: list[str] = []
    owner = GpuOwnership(UUID, lock, reset=lambda: resets.append("reset"))
    with pytest.raises(ConfigError) as e:
        owner.acquire(wait_s=0.0)
    _one_line(str(e.value), str(lock), why, "rm ")
    assert resets == [] and fake.control_calls() == []
    assert not owner.held


def test_planted_state_file_links_are_not_followed(
    attacker: Attacker, public_tmp: Path, victim: Path, tmp_path: Path
) -> None:
    _world_readable_dir(tmp_path)
    uuid = sim_uuid(3)
    attacker.sh(
        f"ln -s {victim} {public_tmp}/{uuid}.state && ln -s {victim} {public_tmp}/{uuid}.info.json"
    )
    gpu = SimulatedGPU.from_preset("a40", index=3, state_dir=public_tmp, set_latency_s=0.0)
    with pytest.raises(ConfigError) as e:
        gpu.set_locked_clock(900)
    _one_line(str(e.value), f"{uuid}.state", "is a symbolic link")
    # The CLI lists nothing it would have to follow a link for, and resets nothing.
    result = _cli(["device", "--sim-dir", str(public_tmp), "reset", "--sim", "3"], {})
    _refused(result, "no simulated GPU 3")


def test_forged_lock_contents_reset_only_the_simulated_gpu_in_hand(tmp_path: Path) -> None:
    """A lock file with a dead pid and a spec naming another GPU, or a state directory with
    ``../``: the new owner resets its own GPU; the other GPU keeps its lock and limit and no
    directory appears outside the state directory."""
    from perseus.runtime.safety.guard import GpuClaim

    sim = tmp_path / "sim"
    mine = SimulatedGPU.from_preset("a40", index=0, state_dir=sim, set_latency_s=0.0)
    other = SimulatedGPU.from_preset("a40", index=1, state_dir=sim, set_latency_s=0.0)
    for gpu in (mine, other):
        gpu.set_locked_clock(900)
        gpu.set_power_limit_w(150.0)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for spec in (
        {"backend": "sim", "state_dir": str(sim), "uuid": other.uuid},
        {"backend": "sim", "state_dir": str(sim / ".." / ".." / "escaped"), "uuid": "../x"},
        {"backend": "nvml", "uuid": "GPU-other"},
    ):
        mine.set_locked_clock(900)
        mine.owner_lock_path().write_text(f"{dead.pid}\n{json.dumps(spec)}\n")
        claim = GpuClaim(mine, watchdog=False, handle_signals=False, on_exit=lambda: None)
        claim.acquire()
        try:
            assert claim.ownership.reset_stale_pid == dead.pid
            assert mine.locked_clock_mhz() is None
            assert mine.power_limit_w() == mine.power_limit_range_w()[1]
        finally:
            claim.release()
        assert other.locked_clock_mhz() is not None and other.power_limit_w() == 150.0
    assert not (tmp_path.parent / "escaped").exists()


def _as_user(attacker: Attacker, work: Any) -> str:
    """``work()``'s return value, computed in a forked child that has become the attacker
    (the attacker cannot run this interpreter: it lives in root's home, so whatever the
    child imports lazily is imported here first)."""
    import encodings.ascii  # noqa: F401

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(attacker.gid)
            os.setuid(attacker.uid)
            out = str(work())
        except BaseException as e:
            out, code = f"{type(e).__name__}: {e}", 1
        os.write(w, out.encode())
        os._exit(code)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    text = b"".join(chunks).decode()
    assert os.waitstatus_to_exitcode(status) == 0, text
    return text


@pytest.mark.parametrize("root_ran", [True, False])
def test_device_info_as_a_user_says_when_roots_owners_are_hidden(
    attacker: Attacker, public_tmp: Path, root_ran: bool
) -> None:
    """Root's agents record ownership in a directory of mode 0700; a user's ``device info``
    looks in the user's own directory and would say ``owner: none`` of a GPU root's agent
    owns. It says that root's locks are not readable instead, and where each lock lives."""
    import contextlib
    import io

    from perseus.cli.device import _show
    from perseus.device.discovery import nvml_devices

    run = public_tmp / "run"
    run.mkdir(mode=0o755)
    root_locks = run / "perseus" / "locks"
    if root_ran:
        root_locks.mkdir(mode=0o700, parents=True)
        (run / "perseus").chmod(0o700)
        root_owner = os.getpid()  # root's agent, alive, owns the GPU
        (root_locks / f"{UUID}.owner").write_text(f"{root_owner}\n")
    user_locks = public_tmp / "user-locks"
    attacker.sh(f"mkdir -m 700 {user_locks}")

    def info() -> str:
        nvml = FakeNvml(devices=[FakeDevice(UUID)])
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            for device in nvml_devices(nvml, lock_dir=user_locks, root_lock_dir=root_locks):
                _show(device)
        return out.getvalue()

    text = _as_user(attacker, info)
    owner = next(line for line in text.splitlines() if "owner:" in line)
    if root_ran:
        assert f"locks in {root_locks} are not readable by this user: run as root" in owner
        assert "owner: none" not in owner
    else:
        assert owner.endswith("owner: none") or "owner: none;" in owner, owner
    assert f"lock file: {user_locks / (UUID + '.owner')}" in text


def test_an_attacker_link_above_the_lock_directory_is_refused(
    attacker: Attacker, public_tmp: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``$PERSEUS_LOCK_DIR=/tmp/evil/locks`` with ``/tmp/evil`` the attacker's link to a
    directory of root's: the resolved path passes every check, but the attacker can repoint
    the link at a directory of theirs between the check and the open of each lock file."""
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    attacker.sh(f"ln -s {mine} {public_tmp}/evil")
    monkeypatch.setenv("PERSEUS_LOCK_DIR", str(public_tmp / "evil" / "locks"))
    from perseus.device.private_dir import lock_dir

    with pytest.raises(ConfigError) as e:
        lock_dir()
    _one_line(str(e.value), f"{public_tmp}/evil", "symbolic link owned by", attacker.name)
    assert not (mine / "locks").exists()
    # The same link made by root in a sticky directory (nobody else can repoint it) is fine.
    (public_tmp / "ours").symlink_to(mine)
    monkeypatch.setenv("PERSEUS_LOCK_DIR", str(public_tmp / "ours" / "locks"))
    assert lock_dir() == mine / "locks"


def test_device_reset_as_a_user_refuses_a_gpu_roots_agent_may_own(
    attacker: Attacker, public_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user with CAP_SYS_ADMIN (or a careless operator's sudo-less shell) cannot see root's
    locks, so cannot know that root's agent owns the GPU: ``device reset`` refuses with one
    line instead of pulling the clocks from under a running job."""
    import contextlib
    import io

    from perseus.cli.main import main
    from perseus.device import discovery

    run = public_tmp / "run"
    run.mkdir(mode=0o755)
    root_locks = run / "perseus" / "locks"
    root_locks.mkdir(mode=0o700, parents=True)
    (run / "perseus").chmod(0o700)
    user_locks = public_tmp / "user-locks"
    attacker.sh(f"mkdir -m 700 {user_locks}")
    monkeypatch.setattr(discovery, "ROOT_LOCK_DIR", root_locks)
    monkeypatch.setenv("PERSEUS_LOCK_DIR", str(user_locks))

    def reset() -> str:
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = main(["device", "reset", "--uuid", UUID])
        return f"{rc}\n{err.getvalue()}"

    rc, _, message = _as_user(attacker, reset).partition("\n")
    assert rc == "2", message
    _one_line(message, UUID, f"locks in {root_locks} are not readable", "run as root")


def test_a_users_private_group_may_write_their_directory(
    attacker: Attacker, public_tmp: Path
) -> None:
    """With umask 002 a user's directories are group-writable by their own private group
    (same name, nobody else in it): accepted for them; the same mode with a group that others
    share is refused."""
    import grp

    try:
        group = grp.getgrgid(attacker.gid)
    except KeyError:
        pytest.skip("the attacker user has no group entry")
    if group.gr_name != attacker.name or group.gr_mem:
        pytest.skip("useradd made no user private group here")
    from perseus.device.private_dir import verify_private_dir

    own = public_tmp / "own-group"
    attacker.sh(f"mkdir -m 770 {own}")

    def check() -> str:
        return str(verify_private_dir(own, create=False))

    assert _as_user(attacker, check) == str(own)
    os.chown(own, attacker.uid, 0)  # root's group: shared with whoever is in it

    def refused() -> str:
        try:
            verify_private_dir(own, create=False)
        except ConfigError as e:
            return str(e)
        return "accepted"

    assert "writable by group or others" in _as_user(attacker, refused)


def test_a_users_device_commands_say_roots_simulated_gpus_are_unreadable(
    attacker: Attacker, public_tmp: Path
) -> None:
    """Pointed at root's simulated GPUs (mode 0700), a user's ``device info`` said "none
    yet" and ``device reset`` "no simulated GPU 0": both now say the directory is not
    readable by this user and how to proceed."""
    import contextlib
    import io

    from perseus.cli.main import main

    run = public_tmp / "run"
    run.mkdir(mode=0o755)
    sim = run / "sim"
    sim.mkdir(mode=0o700)
    SimulatedGPU.from_preset("a40", state_dir=sim, set_latency_s=0.0).set_locked_clock(900)
    user_locks = public_tmp / "user-locks"
    attacker.sh(f"mkdir -m 700 {user_locks}")

    def commands() -> str:
        os.environ["PERSEUS_LOCK_DIR"] = str(user_locks)
        results = []
        for argv in (["info"], ["reset", "--sim", "0"]):
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                rc = main(["device", "--sim-dir", str(sim), *argv])
            results.append(json.dumps([rc, out.getvalue(), err.getvalue()]))
        return "\n".join(results)

    info, reset = (json.loads(line) for line in _as_user(attacker, commands).splitlines())
    assert info[0] == 0, info
    assert f"simulated GPU directory {sim} is not readable by this user" in info[1]
    assert "none yet" not in info[1]
    assert reset[0] == 2, reset
    _one_line(reset[2], str(sim), "not readable by this user", "run as its owner")
