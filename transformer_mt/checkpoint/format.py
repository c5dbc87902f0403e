"""The checkpoint format that every command reads: one dict of plain values and tensors, written
atomically and durably, read with torch.load(weights_only=True), refused in one line when it is
missing, truncated or not ours."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch

from transformer_mt.errors import CheckpointError
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
    """Our checkpoint at `path`, or CheckpointError saying what is wrong with it."""
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint not found")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        if "Weights only load failed" in str(error):  # objects other than tensors and plain data
            raise CheckpointError(
                f"{path}: not a transformer_mt checkpoint (it holds Python objects, which are "
                "never unpickled here)"
            ) from error
        raise CheckpointError(f"{path}: truncated or corrupt") from error
    except Exception as error:  # torch raises many types for truncated or garbled files
        raise CheckpointError(f"{path}: truncated or corrupt") from error
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a transformer_mt checkpoint (no '{FORMAT}' format tag)")
    missing = [key for key in REQUIRED_KEYS if key not in state]
    if missing:
        raise CheckpointError(f"{path}: checkpoint lacks {missing}")
    return state
