"""A job's power cap in its torch.distributed store (``perseus power set --cap-w W``).

The value under :data:`CAP_KEY` is ``"<cap_w> <scope> <token>"``: the cap in watts, ``pipeline``
(the whole pipeline's average power) or ``gpu`` (per GPU: times the pipeline's ranks), and a
token the job acknowledges under :data:`ACK_KEY` (``"<token> <iteration>"``, ``-`` once a cap
was cleared) when it reads it at an iteration boundary, so the command can tell a job that
took the cap from a store nobody reads.
"""

from __future__ import annotations

import math
import secrets
from typing import Any, Literal

from perseus.errors import ConfigError

__all__ = [
    "ACK_KEY",
    "CAP_KEY",
    "CLEARED",
    "clear_cap",
    "read_cap",
    "read_cap_ack",
    "set_cap",
]

#: Store key of the job's power cap.
CAP_KEY = "perseus/power/cap"
#: Store key of the job's acknowledgement.
ACK_KEY = "perseus/power/ack"
#: The acknowledgement of a cleared cap names this instead of a token.
CLEARED = "-"

Scope = Literal["pipeline", "gpu"]


def set_cap(store: Any, cap_w: float, scope: Scope = "pipeline") -> str:
    """Declare a power cap of ``cap_w`` watts (per pipeline, or per GPU); returns its token.

    Raises:
        ConfigError: if ``cap_w`` is not a positive finite number or the scope is unknown.
    """
    if not (math.isfinite(cap_w) and cap_w > 0):
        raise ConfigError(f"`cap_w` must be a positive number of watts, got {cap_w}")
    if scope not in ("pipeline", "gpu"):
        raise ConfigError(f"cap scope must be 'pipeline' or 'gpu', got {scope!r}")
    token = secrets.token_hex(6)
    store.set(CAP_KEY, f"{float(cap_w)!r} {scope} {token}")
    return token


def clear_cap(store: Any) -> None:
    """Remove the cap (no error if there is none)."""
    if store.check([CAP_KEY]):
        store.delete_key(CAP_KEY)


def read_cap(store: Any) -> tuple[float, Scope, str] | None:
    """The cap, its scope and token, or None (never blocks; a malformed value reads as none)."""
    if not store.check([CAP_KEY]):
        return None
    try:
        fields = store.get(CAP_KEY).decode().split()
        value = float(fields[0])
    except (ValueError, UnicodeDecodeError, IndexError):
        return None
    scope = fields[1] if len(fields) > 1 else "pipeline"
    if not (math.isfinite(value) and value > 0) or scope not in ("pipeline", "gpu"):
        return None
    return value, ("gpu" if scope == "gpu" else "pipeline"), (fields[2] if len(fields) > 2 else "")


def read_cap_ack(store: Any) -> tuple[str, int | None] | None:
    """The job's last acknowledgement: the token (:data:`CLEARED` after a clear) and the
    iteration it was read at (None if unknown), or None if no job acknowledged one."""
    if not store.check([ACK_KEY]):
        return None
    try:
        token, _, iteration = store.get(ACK_KEY).decode().partition(" ")
    except UnicodeDecodeError:
        return None
    return token, int(iteration) if iteration.isdecimal() else None
