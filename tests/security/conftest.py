"""Fixtures for the attacker's side of the security tests.

These tests run as root (CI does) and play an unprivileged local user against perseus: the
``attacker`` fixture creates that user once per session (or skips with the reason when this is
not root or the system has no ``useradd``). ``public_tmp`` is a fresh stand-in for ``/tmp``
(world-writable, sticky) so that nothing here touches the real shared directories.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import resource
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ATTACKER_NAME = "perseus-attacker"


@dataclass(frozen=True)
class Attacker:
    """An unprivileged local user; ``run`` executes a command as that user."""

    name: str
    uid: int
    gid: int

    def run(
        self, argv: Sequence[str], *, check: bool = True, **kwargs: Any
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` as the attacker (no supplementary groups), text output captured."""
        return subprocess.run(
            list(argv),
            user=self.uid,
            group=self.gid,
            extra_groups=[],
            capture_output=True,
            text=True,
            check=check,
            timeout=60,
            **kwargs,
        )

    def sh(self, script: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """Run a shell script as the attacker (``set -e``)."""
        return self.run(["/bin/sh", "-ec", script], **kwargs)


@pytest.fixture(scope="session")
def attacker() -> Iterator[Attacker]:
    """The unprivileged user, created for this session when missing (removed afterwards)."""
    if os.geteuid() != 0:
        pytest.skip("security tests play an attacker against root: run them as root (CI does)")
    useradd, userdel = shutil.which("useradd"), shutil.which("userdel")
    if useradd is None:
        pytest.skip("no useradd on this system: cannot create the unprivileged attacker user")
    created = False
    try:
        entry = pwd.getpwnam(ATTACKER_NAME)
    except KeyError:
        result = subprocess.run(
            [useradd, "--system", "--no-create-home", "--shell", "/bin/sh", ATTACKER_NAME],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            pytest.skip(f"useradd {ATTACKER_NAME} failed: {result.stderr.strip()}")
        entry = pwd.getpwnam(ATTACKER_NAME)
        created = True
    yield Attacker(ATTACKER_NAME, entry.pw_uid, entry.pw_gid)
    if created and userdel is not None:
        subprocess.run([userdel, ATTACKER_NAME], capture_output=True)


@pytest.fixture
def public_tmp() -> Iterator[Path]:
    """A fresh world-writable sticky directory, like ``/tmp`` (removed afterwards)."""
    path = Path(tempfile.mkdtemp(prefix="perseus-public-tmp-", dir="/tmp"))
    path.chmod(0o1777)
    yield path
    with contextlib.suppress(OSError):
        shutil.rmtree(path)


def memory_cap(limit_bytes: int) -> Callable[[], None]:
    """A ``preexec_fn`` capping the child's address space (an endless read dies, not the host)."""

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    return apply
