"""Checkpoints: one dict of state dicts, written atomically, read with weights_only=True."""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from transformer_mt.errors import CheckpointError

log = logging.getLogger(__name__)

FORMAT = "transformer_mt/1"
REQUIRED_KEYS = ("format", "model", "model_config", "vocab_size", "step")
STEP_FILE = re.compile(r"step_(\d+)\.pt$")


def save_checkpoint(state: dict[str, Any], path: Path) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    try:
        with temporary.open("wb") as handle:
            torch.save({"format": FORMAT, **state}, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def publish_as(source: Path, target: Path) -> None:
    """Make `target` the same file as `source` atomically (a hard link, or a copy where links
    are not supported), so a checkpoint is serialised once however many names it has."""
    temporary = target.with_name(f".{target.name}.tmp")
    temporary.unlink(missing_ok=True)
    try:
        os.link(source, temporary)
    except OSError:
        shutil.copyfile(source, temporary)
    os.replace(temporary, target)


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Our checkpoint at `path`, or CheckpointError saying what is wrong with it."""
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint not found")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:  # torch raises many types for truncated / foreign files
        raise CheckpointError(
            f"{path}: not a readable checkpoint ({type(error).__name__}: {error})"
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a transformer_mt checkpoint (no '{FORMAT}' format tag)")
    missing = [key for key in REQUIRED_KEYS if key not in state]
    if missing:
        raise CheckpointError(f"{path}: checkpoint lacks {missing}")
    return state


def resolve_checkpoint(run_dir: Path, name: str) -> Path:
    """A checkpoint name inside run_dir/checkpoints, or a path."""
    candidate = Path(name)
    if candidate.is_absolute() or candidate.parent != Path("."):
        return candidate
    return run_dir / "checkpoints" / name


def step_checkpoints(folder: Path) -> list[Path]:
    """The step_N.pt files in `folder`, oldest (smallest N) first."""
    numbered = sorted(
        (int(m.group(1)), p) for p in folder.glob("step_*.pt") if (m := STEP_FILE.search(p.name))
    )
    return [path for _, path in numbered]


def prune_step_checkpoints(folder: Path, keep: int) -> None:
    """Delete all but the newest `keep` step_N.pt files."""
    numbered = step_checkpoints(folder)
    for path in numbered[: max(0, len(numbered) - keep)]:
        path.unlink(missing_ok=True)


def remove_partial_writes(folder: Path) -> list[Path]:
    """Delete the temporary files of writes that a killed process never finished."""
    partial = sorted(folder.glob(".*.tmp"))
    for path in partial:
        path.unlink(missing_ok=True)
    return partial


def load_newest_readable(folder: Path) -> tuple[dict[str, Any], Path] | None:
    """The newest checkpoint in `folder` that loads (step files newest first, then last.pt),
    or None when there is none at all; CheckpointError when there are some but none loads."""
    candidates = [*reversed(step_checkpoints(folder)), folder / "last.pt"]
    candidates = [path for path in candidates if path.is_file()]
    problems = []
    for path in candidates:
        try:
            return load_checkpoint(path), path
        except CheckpointError as error:
            log.warning("%s; trying the previous checkpoint", error)
            problems.append(str(error))
    if problems:
        raise CheckpointError(f"no readable checkpoint in {folder}: " + "; ".join(problems))
    return None
