"""Which database: ``sqlite:///path`` (relative; ``sqlite:////abs`` absolute; a bare path is
SQLite too) or ``postgresql://user@host/db``, whose password comes from libpq's environment
(``PGPASSWORD``, ``~/.pgpass``), never the URL (it shows up in ``ps`` and logs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import parse_qs, urlsplit

from perseus.errors import ConfigError
from perseus.validate import show_value

if TYPE_CHECKING:
    from perseus.recurring.store import SQLStore

__all__ = ["DatabaseTarget", "open_store", "parse_url"]


@dataclass(frozen=True, slots=True)
class DatabaseTarget:
    """A parsed database URL: the engine, and its file (SQLite) or libpq conninfo."""

    engine: Literal["sqlite", "postgresql"]
    path: str
    conninfo: str


def parse_url(url: str) -> DatabaseTarget:
    """The engine and target of ``url``.

    Raises:
        ConfigError: an unknown scheme, an empty path, a malformed PostgreSQL URL, or a
            password in the URL.
    """
    if "://" not in url:
        if not url:
            raise ConfigError("`db` is empty; pass sqlite:///FILE or postgresql://USER@HOST/DB")
        return DatabaseTarget("sqlite", url, "")
    prefix, _, rest = url.partition("://")
    if prefix.lower() == "sqlite":
        if not rest.startswith("/") or len(rest) < 2:
            raise ConfigError(
                f"`db` {url!r}: write sqlite:///relative/file or sqlite:////absolute/file"
            )
        return DatabaseTarget("sqlite", rest[1:], "")
    if prefix.lower() in ("postgresql", "postgres"):
        try:
            split = urlsplit(url)
            password = split.password
            if split.port == 0:  # a port that is not a number in 1-65535
                raise ValueError("port 0")
            if any(c < " " or c == "\x7f" for c in url):
                raise ValueError("a control character")
        except ValueError as e:  # an IPv6 bracket not closed, a bad port, a control character
            raise ConfigError(
                f"`db`: not a PostgreSQL URL ({e}); pass postgresql://USER@HOST[:PORT]/DB"
            ) from None
        if password is not None or "password" in parse_qs(split.query):  # libpq takes both
            raise ConfigError(
                "`db`: the URL carries a password; drop it from the URL and give it in "
                "PGPASSWORD or ~/.pgpass (a URL shows up in ps, shell history and logs)"
            )
        return DatabaseTarget("postgresql", "", url)
    # No user or password (the last '@' ends them, whatever they hold), no query or fragment
    # (``?password=...``).
    where = rest.rpartition("@")[2].partition("?")[0].partition("#")[0]
    shown = show_value(f"{prefix}://{where}")
    raise ConfigError(
        f"`db` {shown} is not a database this store speaks; pass "
        "sqlite:///FILE or postgresql://USER@HOST[:PORT]/DB"
    )


def open_store(url: str, **options: Any) -> SQLStore:
    """The recurring-job store a URL names (``options`` go to its constructor).

    Raises:
        ConfigError: as :func:`parse_url`.
    """
    target = parse_url(url)
    if target.engine == "sqlite":
        from perseus.recurring.store import SQLiteStore

        return SQLiteStore(target.path, **options)
    from perseus.recurring.postgres import PostgresStore

    return PostgresStore(target.conninfo, **options)
