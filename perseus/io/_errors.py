"""Turn pydantic validation errors into perseus's one-line messages."""

from __future__ import annotations

from pydantic import ValidationError

__all__ = ["describe_validation_error"]


def describe_validation_error(source: str, error: ValidationError) -> str:
    """``"<source>: field <loc>: <msg>"`` for the first error, plus a count of the others."""
    errors = error.errors()
    first = errors[0]
    loc = ".".join(str(p) for p in first["loc"]) or "<root>"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{source}: field {loc}: {first['msg']}{more}"
