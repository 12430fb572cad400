"""A job's power cap in its torch.distributed store (``perseus power set --cap-w W``).

The value under :data:`CAP_KEY` is ``"<cap_w> <scope> <token>"``, the scope ``pipeline`` or
``gpu`` (per GPU: times the pipeline's ranks); the job acknowledges the token under
:data:`ACK_KEY` at the iteration boundary where it reads it, after writing under
:data:`UNHELD_KEY` ``"<token> <lowest_w> <ranks>"`` when the cap is below its lowest-power plan.
"""

from __future__ import annotations

import math
import secrets
from typing import Any, Literal

from perseus.errors import ConfigError
from perseus.runtime.straggler.switching import CLEARED, clear_key, read_ack_at, read_text

__all__ = [
    "ACK_KEY",
    "CAP_KEY",
    "CLEARED",
    "UNHELD_KEY",
    "clear_cap",
    "read_cap",
    "read_cap_ack",
    "read_unheld",
    "set_cap",
]

#: Store key of the job's power cap.
CAP_KEY = "perseus/power/cap"
#: Store key of the job's acknowledgement.
ACK_KEY = "perseus/power/ack"
#: Store key of the last cap the job acknowledged but cannot hold.
UNHELD_KEY = "perseus/power/unheld"

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
    clear_key(store, CAP_KEY)


def read_cap(store: Any) -> tuple[float, Scope, str] | None:
    """The cap, its scope and token, or None (never blocks; a malformed value reads as none)."""
    fields = (read_text(store, CAP_KEY) or "").split()
    try:
        value = float(fields[0])
    except (ValueError, IndexError):
        return None
    scope = fields[1] if len(fields) > 1 else "pipeline"
    if not (math.isfinite(value) and value > 0) or scope not in ("pipeline", "gpu"):
        return None
    return value, ("gpu" if scope == "gpu" else "pipeline"), (fields[2] if len(fields) > 2 else "")


def read_cap_ack(store: Any) -> tuple[str, int | None] | None:
    """The job's last acknowledgement of a cap (:func:`read_ack_at`)."""
    return read_ack_at(store, ACK_KEY)


def read_unheld(store: Any, token: str) -> tuple[float, int] | None:
    """The job's lowest plan power (pipeline watts) and ranks when the cap of ``token`` is
    below it, or None (the cap holds, or the job did not say)."""
    fields = (read_text(store, UNHELD_KEY) or "").split()
    if len(fields) != 3 or fields[0] != token:
        return None
    try:
        return float(fields[1]), int(fields[2])
    except ValueError:
        return None
