"""Turn pydantic validation errors and OS errors into perseus's one-line messages."""

from __future__ import annotations

import errno
import os

from pydantic import ValidationError

from perseus.errors import ConfigError
from perseus.validate import show_value

__all__ = [
    "FULL_DISK_ERRNOS",
    "describe_os_error",
    "describe_validation_error",
    "full_disk_error",
]

# Documents are validated as Python values; speak of their JSON/TOML shapes.
_ARRAY, _OBJECT = "Input should be a valid array", "Input should be an object"
_SHAPES = {"tuple_type": _ARRAY, "list_type": _ARRAY, "model_type": _OBJECT, "dict_type": _OBJECT}


def describe_validation_error(
    source: str, error: ValidationError, noun: str = "field", loc: tuple[str | int, ...] = ()
) -> str:
    """``"<source>: <noun> <loc>: <msg>, got <value>"`` for the first error, plus a count.

    ``loc`` is where the validated value sits in the document (a part validated alone).
    """
    errors = error.errors()
    first = errors[0]
    where = ".".join(str(p) for p in (*loc, *first["loc"])) or "<root>"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    msg = _SHAPES.get(first["type"], first["msg"])
    got = ""
    if first["type"] not in ("missing", "json_invalid") and "input" in first:
        value = first["input"]
        if not isinstance(value, (dict, list, tuple)):
            got = f", got {show_value(value)}"
    return f"{source}: {noun} {where}: {msg}{got}{more}"


#: Errors that say the disk (or this user's share of it) is full, not that a file is bad.
_FULL = {
    errno.ENOSPC: "the disk is full (ENOSPC)",
    errno.EDQUOT: "the disk quota is exceeded (EDQUOT)",
    errno.EFBIG: "the file size limit is reached (EFBIG)",
}
FULL_DISK_ERRNOS = frozenset(_FULL)


def describe_os_error(error: OSError) -> str:
    """What went wrong, naming a full disk as one: ``"the disk is full (ENOSPC)"``, else the
    system's own words (``"Permission denied"``)."""
    return _FULL.get(error.errno or 0) or error.strerror or str(error)


def full_disk_error(error: OSError, path: str | os.PathLike[str]) -> ConfigError | None:
    """``"<path>: cannot write (the disk is full (ENOSPC)); nothing was written; <fix>"`` for
    an output that did not fit, None for another error."""
    if error.errno not in FULL_DISK_ERRNOS:
        return None
    fix = "raise the file size limit (ulimit -f)" if error.errno == errno.EFBIG else "free space"
    return ConfigError(
        f"{os.fspath(path)}: cannot write ({describe_os_error(error)}); nothing was written; "
        f"{fix} or choose another path"
    )
