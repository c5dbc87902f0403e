"""Checkpoint averaging, as the paper does for its results (the last 5 checkpoints of a base run,
the last 20 of a big one): the element-wise mean of each parameter over several checkpoints of
one run, returned as a checkpoint that eval and translate load like any other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from transformer_mt.errors import CheckpointError
from transformer_mt.train.checkpoint import FORMAT, load_checkpoint, step_checkpoints

# What must agree between checkpoints for their mean to be a model of the same shape and data.
MATCHING_KEYS = ("model_config", "vocab_size", "src_vocab_size", "data_folder")


def newest_step_checkpoints(folder: Path, n: int) -> list[Path]:
    """The `n` step_N.pt files in `folder` with the largest N (by number, not by name), oldest
    first."""
    if n < 1:
        raise CheckpointError(f"cannot average {n} checkpoints: need at least one")
    numbered = step_checkpoints(Path(folder))
    if len(numbered) < n:
        raise CheckpointError(
            f"{folder}: {n} step checkpoints requested, but there are only {len(numbered)} "
            "(step_N.pt files; trainer.keep_checkpoints sets how many a run keeps)"
        )
    return numbered[-n:]


def average_checkpoints(paths: list[Path]) -> dict[str, Any]:
    """The mean of the models in `paths` (accumulated in float64, cast back to each tensor's
    dtype), with the first checkpoint's configuration and the newest step; no optimizer,
    schedule or RNG state, since the result is for decoding, not for resuming training."""
    if not paths:
        raise CheckpointError("no checkpoints to average")
    first_path = Path(paths[0])
    first = load_checkpoint(first_path)
    sums = {
        name: tensor.to(torch.float64) if tensor.is_floating_point() else tensor
        for name, tensor in first["model"].items()
    }
    newest_step = int(first["step"])
    for path in map(Path, paths[1:]):
        state = load_checkpoint(path)
        check_compatible(first, first_path, state, path)
        for name, tensor in state["model"].items():
            if tensor.is_floating_point():
                sums[name] += tensor.to(torch.float64)
        newest_step = max(newest_step, int(state["step"]))
        del state  # one checkpoint in memory at a time, besides the first and the sums
    model = {
        name: (total / len(paths)).to(first["model"][name].dtype)
        if total.is_floating_point()
        else total
        for name, total in sums.items()
    }
    return {
        "format": FORMAT,
        "model": model,
        **{key: first.get(key) for key in MATCHING_KEYS},
        "step": newest_step,
        "averaged_from": [Path(path).name for path in paths],
    }


def check_compatible(reference: dict, reference_path: Path, state: dict, path: Path) -> None:
    """CheckpointError naming both files and the first key in which `state` differs."""

    def differ(key: str, ours: Any, theirs: Any) -> CheckpointError:
        return CheckpointError(
            f"{reference_path} and {path} cannot be averaged: {key} differs ({ours} vs {theirs})"
        )

    for key in MATCHING_KEYS:
        ours, theirs = reference.get(key), state.get(key)
        if isinstance(ours, dict) and isinstance(theirs, dict):
            for name in sorted(ours.keys() | theirs.keys()):
                if ours.get(name) != theirs.get(name):
                    raise differ(f"{key}.{name}", ours.get(name), theirs.get(name))
        if ours != theirs:
            raise differ(key, ours, theirs)
    ours, theirs = reference["model"], state["model"]
    for name in sorted(ours.keys() | theirs.keys()):
        if name not in ours or name not in theirs:
            presence = ["present" if name in model else "absent" for model in (ours, theirs)]
            raise differ(f"model.{name}", *presence)
        a, b = ours[name], theirs[name]
        if a.shape != b.shape or a.dtype != b.dtype:
            raise differ(f"model.{name}", f"{a.dtype}{list(a.shape)}", f"{b.dtype}{list(b.shape)}")
        if not a.is_floating_point() and not torch.equal(a, b):
            raise differ(f"model.{name}", "one value", "another (a non-float tensor must agree)")
