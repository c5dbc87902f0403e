"""The checkpoint format that every command reads: one dict of plain values and tensors, written
atomically and durably, read with torch.load(weights_only=True), refused in one line when it is
missing, truncated or not ours (DamagedCheckpoint), or when it could not be read now (a plain
CheckpointError: a resume must not pass over a file that may be whole)."""

from __future__ import annotations

import errno
import pickle
from pathlib import Path
from typing import Any

import torch

from transformer_mt.errors import CheckpointError, DamagedCheckpoint
from transformer_mt.files import replacing

FORMAT = "transformer_mt/1"
REQUIRED_KEYS = ("format", "model", "model_config", "vocab_size", "step")


def save_checkpoint(state: dict[str, Any], path: Path) -> None:
    """Write `state` with the format tag, atomically and durably (files.replacing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path, durable=True) as temporary, temporary.open("wb") as handle:
        # Through a file object, so that a full disk is an OSError (ENOSPC) of Python's write:
        # torch's C++ writer turns it into a RuntimeError ("unexpected pos"), but keeps Python's
        # error as its context; written to a path, the errno would be lost altogether.
        try:
            torch.save({"format": FORMAT, **state}, handle)
        except RuntimeError as error:
            if isinstance(error.__context__, OSError):
                raise error.__context__ from error
            raise


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Our checkpoint at `path`; DamagedCheckpoint when the file is not one (truncated, corrupt,
    foreign), CheckpointError when it is missing or could not be read now (an OSError such as
    EIO or EACCES, or memory: the file itself may be whole), each naming the path."""
    try:
        if not path.is_file():
            raise CheckpointError(f"{path}: checkpoint not found")
        state = torch.load(path, map_location=map_location, weights_only=True)
    except CheckpointError:
        raise
    except Exception as error:
        if (failure := read_failure(error)) is not None:
            raise CheckpointError(
                f"{path}: could not be read ({describe_read_failure(failure)}); the file is "
                "left as it is: rerun once it can be read"
            ) from error
        raise DamagedCheckpoint(f"{path}: {damage(error)}") from error
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise DamagedCheckpoint(
            f"{path}: not a transformer_mt checkpoint (no '{FORMAT}' format tag)"
        )
    missing = [key for key in REQUIRED_KEYS if key not in state]
    if missing:
        raise DamagedCheckpoint(f"{path}: checkpoint lacks {missing}")
    return state


def read_failure(error: BaseException) -> OSError | MemoryError | None:
    """The OSError or MemoryError that `error` is, or that torch's reader wrapped (its context):
    a fault of reading, not of the file's content. Not EINVAL: torch's zip reader seeks before
    the start of a file cut short (a truncated checkpoint), which Python refuses with it."""
    for candidate in (error, error.__cause__, error.__context__):
        if isinstance(candidate, MemoryError) or (
            isinstance(candidate, OSError) and candidate.errno != errno.EINVAL
        ):
            return candidate
    return None


def describe_read_failure(failure: OSError | MemoryError) -> str:
    """'Input/output error, EIO' for an OSError; 'out of memory' for a MemoryError."""
    if isinstance(failure, MemoryError):
        return "out of memory"
    code = errno.errorcode.get(failure.errno) if failure.errno is not None else None
    return ", ".join(part for part in (failure.strerror or str(failure), code) if part)


def damage(error: Exception) -> str:
    """What is wrong with a file torch could read but not load (torch raises many types for
    truncated or garbled files)."""
    if isinstance(error, pickle.UnpicklingError) and "Weights only load failed" in str(error):
        # objects other than tensors and plain data
        return (
            "not a transformer_mt checkpoint (it holds Python objects, which are never unpickled "
            "here)"
        )
    return "truncated or corrupt"
