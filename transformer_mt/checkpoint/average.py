"""Checkpoint averaging, as the paper averages its last 5 (base) or 20 (big) checkpoints: the
mean of each parameter, refused for checkpoints of different models or data."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from transformer_mt.checkpoint.format import FORMAT, load_checkpoint
from transformer_mt.checkpoint.record import (
    CheckpointRecord,
    Purpose,
    averaging_refusal,
    check_fits,
)
from transformer_mt.checkpoint.training_state import has_moving_average, model_weights
from transformer_mt.config import Weights
from transformer_mt.errors import CheckpointError

AVERAGED_FROM = "averaged_from"
"""The key only an average has (the names of the checkpoints averaged): how tmt-average knows a
file it wrote before, which it may replace."""


def average_checkpoints(
    paths: list[Path], *, chosen_on_valid: dict | None = None, weights: Weights = Weights.auto
) -> dict[str, Any]:
    """The mean of the models in `paths` (accumulated in float64, cast back to each tensor's
    dtype), with the first checkpoint's configuration and the newest step; no optimizer,
    schedule or RNG state, since the result is for decoding, not for resuming training.
    weights: of each checkpoint, the weights decoding it would use (auto: the moving average
    where its run kept one, training_state.model_weights), recorded as `averaged_weights`.
    chosen_on_valid: how tmt-average last=auto chose the paths, recorded as `average_auto`."""
    if not paths:
        raise CheckpointError("no checkpoints to average")
    first_path = Path(paths[0])
    first = load_checkpoint(first_path)
    first_record = CheckpointRecord.read(first, first_path)
    sums = {
        name: tensor.to(torch.float64) if tensor.is_floating_point() else tensor
        for name, tensor in model_weights(first, weights).items()
    }
    newest_step = first_record.step
    for path in map(Path, paths[1:]):
        state = load_checkpoint(path)
        check_compatible(first, first_path, state, path, first_record, weights)
        for name, tensor in model_weights(state, weights).items():
            if tensor.is_floating_point():
                sums[name] += tensor.to(torch.float64)
        newest_step = max(newest_step, CheckpointRecord.read(state, path).step)
        del state  # one checkpoint in memory at a time, besides the first and the sums
    model = {
        name: (total / len(paths)).to(model_weights(first, weights)[name].dtype)
        if total.is_floating_point()
        else total
        for name, total in sums.items()
    }
    # An average is for decoding: it has no training progress.
    described = dataclasses.replace(first_record, step=newest_step, progress=None).as_state()
    return {
        "format": FORMAT,
        "model": model,
        **described,
        AVERAGED_FROM: [Path(path).name for path in paths],
        "averaged_weights": "moving average"
        if weights != Weights.raw and has_moving_average(first)
        else "as trained",
        **({} if chosen_on_valid is None else {"average_auto": chosen_on_valid}),
    }


def check_compatible(
    reference: dict,
    reference_path: Path,
    state: dict,
    path: Path,
    record: CheckpointRecord,
    weights: Weights = Weights.auto,
) -> None:
    """CheckpointError naming both files and the first setting or tensor in which `state`
    differs from `reference` (whose record is `record`): their mean would be no model (nor is
    that of a moving average and weights as trained: one has it where the other has none)."""

    def differ(key: str, ours: Any, theirs: Any) -> CheckpointError:
        return CheckpointError(averaging_refusal(str(reference_path), path, key, ours, theirs))

    theirs_record = CheckpointRecord.read(state, path)
    check_fits(Purpose.average, record, theirs_record, path, ours_from=str(reference_path))
    if weights == Weights.auto and has_moving_average(reference) != has_moving_average(state):
        has = ["a moving average" if has_moving_average(s) else "none" for s in (reference, state)]
        raise differ("the moving average of the weights (trainer.ema_decay)", *has)
    ours, theirs = model_weights(reference, weights), model_weights(state, weights)
    for name in sorted(ours.keys() | theirs.keys()):
        if name not in ours or name not in theirs:
            presence = ["present" if name in model else "absent" for model in (ours, theirs)]
            raise differ(f"model.{name}", *presence)
        a, b = ours[name], theirs[name]
        if a.shape != b.shape or a.dtype != b.dtype:
            raise differ(f"model.{name}", f"{a.dtype}{list(a.shape)}", f"{b.dtype}{list(b.shape)}")
        if not a.is_floating_point() and not torch.equal(a, b):
            raise differ(f"model.{name}", "one value", "another (a non-float tensor must agree)")
