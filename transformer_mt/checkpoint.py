"""The checkpoint format that every command reads: one dict of plain values and tensors, written
atomically, read with torch.load(weights_only=True); the step files of a run, averaging, and the
model a checkpoint holds."""

from __future__ import annotations

import logging
import pickle
import re
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from transformer_mt.config import ModelConfig
from transformer_mt.data.tokenizer import PAD_ID, Tokenizers
from transformer_mt.errors import CheckpointError
from transformer_mt.files import replacing
from transformer_mt.model import Transformer

log = logging.getLogger(__name__)

FORMAT = "transformer_mt/1"
REQUIRED_KEYS = ("format", "model", "model_config", "vocab_size", "step")
STEP_FILE = re.compile(r"step_(\d+)\.pt")


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


TRAINING_NAMES = ("last.pt", "best.pt")
"""Besides step_N.pt, the names the trainer gives its checkpoints."""


def is_training_checkpoint(name: str) -> bool:
    """Whether `name` is one the trainer gives its checkpoints (which only the trainer writes)."""
    return name in TRAINING_NAMES or STEP_FILE.fullmatch(name) is not None


def step_checkpoints(folder: Path) -> list[Path]:
    """The step_N.pt files in `folder`, oldest (smallest N) first."""
    numbered = sorted(
        (int(m.group(1)), p) for p in folder.glob("step_*.pt") if (m := STEP_FILE.fullmatch(p.name))
    )
    return [path for _, path in numbered]


def prune_step_checkpoints(folder: Path, keep: int) -> None:
    """Delete all but the newest `keep` step_N.pt files."""
    numbered = step_checkpoints(folder)
    for path in numbered[: max(0, len(numbered) - keep)]:
        path.unlink(missing_ok=True)


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


def config_dict(cfg) -> dict:
    """A dataclass config as plain Python values (safe for torch.load(weights_only=True))."""
    return OmegaConf.to_container(OmegaConf.structured(cfg), enum_to_str=True)


def model_from_checkpoint(state: dict, path: Path, tokenizers: Tokenizers) -> Transformer:
    """The checkpoint's model, checked against the run folder's tokenizers."""
    try:
        model_cfg = OmegaConf.to_object(
            OmegaConf.merge(OmegaConf.structured(ModelConfig), state["model_config"])
        )
    except Exception as error:
        raise CheckpointError(f"{path}: model configuration is not valid ({error})") from error
    src_vocab_size = state.get("src_vocab_size")
    recorded = (
        f"{'shared' if src_vocab_size is None else 'separate'}, {state['vocab_size']} target pieces"
    )
    mode = "shared" if tokenizers.shared else "separate"
    beside = f"{mode}, {tokenizers.tgt.vocab_size} target pieces"
    if recorded != beside:
        raise CheckpointError(
            f"{path}: the checkpoint's vocabulary ({recorded}) does not match the "
            f"tokenizer files in its run folder ({beside})"
        )
    model = Transformer(
        model_cfg, vocab_size=int(state["vocab_size"]), src_vocab_size=src_vocab_size, pad_id=PAD_ID
    )
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as error:
        raise CheckpointError(
            f"{path}: weights do not fit the recorded model configuration ({error})"
        ) from error
    return model


# ---- averaging: the paper's last 5 (base) / last 20 (big) checkpoints ----------------------
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
