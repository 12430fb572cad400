"""The GPU record of a profile file (:class:`~perseus.identity.GpuIdentity`): a JSON
profile's ``gpu`` field, or ``<name>.gpu.json`` beside a CSV profile (whose Zeus format stays
unchanged). A file without one still reads; it is logged as unchecked.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import ValidationError

from perseus.errors import ConfigError, ProfileError
from perseus.identity import GpuIdentity
from perseus.io._errors import describe_validation_error
from perseus.io.atomic import atomic_write_text, check_output_path
from perseus.io.frontier_files import read_json_document
from perseus.log import get_logger
from perseus.validate import show_value

logger = get_logger(__name__)

__all__ = [
    "gpu_record_path",
    "gpu_record_target",
    "note_missing_gpu_record",
    "read_gpu_record",
    "write_gpu_record",
]

_MAX_BYTES = 1 << 20
#: Longest file name (bytes) on Linux file systems.
_NAME_MAX = 255


def gpu_record_path(profile_path: str | os.PathLike[str]) -> Path:
    """Where a CSV profile's GPU record lives: ``<stem>.gpu.json`` beside it."""
    p = Path(profile_path)
    return p.with_name(f"{p.stem}.gpu.json")


def read_gpu_record(profile_path: str | os.PathLike[str]) -> GpuIdentity | None:
    """The GPU record beside the CSV profile at ``profile_path``; None, logged as unchecked,
    when there is none.

    Raises:
        ProfileError: a record that is not valid, naming its file and field.
    """
    where, raw = gpu_record_path(profile_path), None
    try:
        present = where.is_file()
    except OSError:  # a name too long for the file system: no record can have it
        present = False
    if present:
        raw = read_json_document(
            where, "the GPU record written with the profile", ProfileError, _MAX_BYTES
        )
    if raw is None:
        return note_missing_gpu_record(profile_path, None)
    try:
        return GpuIdentity.model_validate(raw)
    except ValidationError as e:
        raise ProfileError(describe_validation_error(str(where), e)) from None


def note_missing_gpu_record(
    profile_path: str | os.PathLike[str], gpu: GpuIdentity | None
) -> GpuIdentity | None:
    """``gpu``, the record of the profile at ``profile_path`` already read (a JSON profile's
    ``gpu`` field, validated with its rows); logged as unchecked when None."""
    if gpu is None:
        p = Path(profile_path)
        where = p if p.suffix.lower() == ".json" else gpu_record_path(p)
        logger.info(
            "%s: no GPU record (%s): the GPU it was measured on is unchecked", p, where.name
        )
    return gpu


def gpu_record_target(profile_path: str | os.PathLike[str]) -> Path | None:
    """Where the record of a CSV profile written to ``profile_path`` goes, checked before
    anything is written: None when the profile goes to a stream (a device, FIFO or
    descriptor), which has nothing beside it.

    Raises:
        ConfigError: a record name longer than a file name may be, or a record path that
            perseus must not write (a directory, a FIFO, a link out of its directory).
    """
    if check_output_path(profile_path).kind != "file":
        return None
    where = gpu_record_path(profile_path)
    why = f"{len(os.fsencode(where.name))} bytes, more than the {_NAME_MAX} of a file name"
    if len(os.fsencode(where.name)) <= _NAME_MAX:
        try:
            ok = check_output_path(where).kind == "file"
            why = "" if ok else f"{where} is not a regular file"
        except ConfigError as e:
            why = str(e).partition("; ")[0]
    if why:
        raise ConfigError(
            f"{profile_path}: cannot write its GPU record {show_value(where.name)} beside it "
            f"({why}); remove that or choose another name (nothing was written)"
        )
    return where


def write_gpu_record(gpu: GpuIdentity, profile_path: str | os.PathLike[str]) -> None:
    """Write a CSV profile's GPU record beside it (atomically)."""
    atomic_write_text(
        gpu_record_path(profile_path), gpu.model_dump_json(indent=1, exclude_none=True) + "\n"
    )
