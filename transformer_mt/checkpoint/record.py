"""What a checkpoint says about itself, as one typed record: the model's configuration, its
vocabulary (sizes, and the sha256 of its SentencePiece files), the prepared data it was trained
on, the update and the training progress; and the one comparison that decides whether a
checkpoint fits a run (resume, fine-tune, averaging, eval, export all ask it)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from transformer_mt.config import ModelConfig, config_dict
from transformer_mt.data.tokenizer import PAD_ID, Tokenizers
from transformer_mt.errors import CheckpointError
from transformer_mt.model import Transformer

SHAPE_KEYS = (
    "d_model",
    "n_heads",
    "d_ff",
    "n_encoder_layers",
    "n_decoder_layers",
    "norm_first",
    "max_positions",
)
"""Model settings that change parameter shapes or what the parameters mean: a checkpoint fits a
model only where these agree (a new ModelConfig field of that kind joins this list)."""


@dataclass(frozen=True)
class Mismatch:
    """The first way in which two records differ: `aspect` ('model', 'vocabulary' or 'data'),
    the setting's name, and its value in each (ours first)."""

    aspect: str
    setting: str
    ours: Any
    theirs: Any


@dataclass(frozen=True, kw_only=True)
class CheckpointRecord:
    """A checkpoint's description (everything but tensors and optimizer state)."""

    model: ModelConfig
    """The model's configuration."""
    vocab_size: int | None
    """Target pieces (all pieces with a shared vocabulary); None: not known yet (a run whose
    data is not prepared)."""
    src_vocab_size: int | None = None
    """Source pieces with separate vocabularies; None: one shared vocabulary."""
    data_folder: str | None = None
    """The name of the prepared folder the weights were trained on."""
    step: int = 0
    """The update the checkpoint was written at."""
    progress: dict = field(default_factory=dict)
    """The trainer's progress (train/run_state.Progress as plain values; empty for averages)."""
    tokenizer_sha256: tuple[str, ...] | None = None
    """Tokenizers.sha256 of the SentencePiece model(s) the vocabulary is (spm.model, or
    spm.src.model and spm.tgt.model: each piece with its score and kind), where two tokenizers
    of one size differ. None: not known (a run whose data is not prepared, or a checkpoint
    written before it was recorded)."""

    @classmethod
    def of_run(
        cls, model: ModelConfig, tokenizers: Tokenizers | None, data_folder: str | None = None
    ) -> CheckpointRecord:
        """The record a run's model would have (tokenizers None: the vocabulary is not known)."""
        if tokenizers is None:
            return cls(model=model, vocab_size=None, data_folder=data_folder)
        source = None if tokenizers.shared else tokenizers.src.vocab_size
        return cls(
            model=model,
            vocab_size=tokenizers.tgt.vocab_size,
            src_vocab_size=source,
            data_folder=data_folder,
            tokenizer_sha256=tokenizers.sha256,
        )

    @classmethod
    def read(cls, state: dict, path: Path) -> CheckpointRecord:
        """The record of a loaded checkpoint; CheckpointError naming `path` if it is not valid."""
        try:
            merged = OmegaConf.merge(OmegaConf.structured(ModelConfig), state["model_config"])
            model = OmegaConf.to_object(merged)
        except Exception as error:
            raise CheckpointError(f"{path}: model configuration is not valid ({error})") from error
        return cls(
            model=model,
            vocab_size=int(state["vocab_size"]),
            src_vocab_size=state.get("src_vocab_size"),
            data_folder=state.get("data_folder"),
            step=int(state["step"]),
            progress=dict(state.get("progress") or {}),
            tokenizer_sha256=tuple(hashes) if (hashes := state.get("tokenizer_sha256")) else None,
        )

    def as_state(self) -> dict:
        """The record's entries of a checkpoint's dict (plain values, for weights_only loads)."""
        return {
            "model_config": config_dict(self.model),
            "vocab_size": self.vocab_size,
            "src_vocab_size": self.src_vocab_size,
            "data_folder": self.data_folder,
            "step": self.step,
            "progress": dict(self.progress),
            "tokenizer_sha256": None
            if self.tokenizer_sha256 is None
            else list(self.tokenizer_sha256),
        }

    def with_progress(self, step: int, progress: dict) -> CheckpointRecord:
        return dataclasses.replace(self, step=step, progress=dict(progress))

    def build_model(self) -> Transformer:
        """A freshly initialised Transformer of this record's shape and vocabulary."""
        return Transformer(
            self.model,
            vocab_size=self.vocab_size,
            src_vocab_size=self.src_vocab_size,
            pad_id=PAD_ID,
        )

    def first_mismatch(self, other: CheckpointRecord, aspects: Iterable[str]) -> Mismatch | None:
        """The first setting in which `other` differs from this record, among `aspects`:
        'shape' (SHAPE_KEYS), 'model' (every model setting), 'vocabulary', 'data'."""
        aspects = set(aspects)
        model_keys = [f.name for f in dataclasses.fields(ModelConfig)] if "model" in aspects else []
        if "shape" in aspects:
            model_keys = [*SHAPE_KEYS, *(k for k in model_keys if k not in SHAPE_KEYS)]
        pairs = [
            ("model", key, getattr(self.model, key), getattr(other.model, key))
            for key in model_keys
        ]
        if "vocabulary" in aspects:
            pairs.append(("vocabulary", "vocab_size", self.vocab_size, other.vocab_size))
            pairs.append(
                ("vocabulary", "src_vocab_size", self.src_vocab_size, other.src_vocab_size)
            )
            # A checkpoint written before the hash was recorded (None) still loads: its
            # vocabulary is compared by sizes alone, as it always was.
            if None not in (self.tokenizer_sha256, other.tokenizer_sha256):
                pairs.append(
                    (
                        "vocabulary",
                        "tokenizer_sha256",
                        self.tokenizer_sha256,
                        other.tokenizer_sha256,
                    )
                )
        if "data" in aspects:
            pairs.append(("data", "data_folder", self.data_folder, other.data_folder))
        for aspect, setting, ours, theirs in pairs:
            if ours != theirs:
                return Mismatch(aspect, setting, ours, theirs)
        return None

    def describe_vocabulary(self) -> str:
        shared = "shared" if self.src_vocab_size is None else "separate"
        return f"{shared}, {self.vocab_size} target pieces"


def tokenizer_refusal(path: Path, tokenizers: Tokenizers, theirs: tuple[str, ...]) -> str:
    """Why the checkpoint at `path` does not go with `tokenizers`, whose files' sha256 differ
    from the ones it recorded (`theirs`): the same sizes, other pieces."""
    files = " and ".join(str(file) for file in tokenizers.files)
    return (
        f"{path} was trained with another SentencePiece model than {files} (its pieces' sha256 "
        f"{', '.join(h[:12] for h in theirs)}, not those of that file): its ids would mean "
        "other pieces; translate it with its own run folder's tokenizer"
    )


def model_from_checkpoint(state: dict, path: Path, tokenizers: Tokenizers) -> Transformer:
    """The checkpoint's model, checked against the run folder's tokenizers."""
    record = CheckpointRecord.read(state, path)
    beside = CheckpointRecord.of_run(record.model, tokenizers)
    mismatch = record.first_mismatch(beside, ["vocabulary"])
    if mismatch is not None and mismatch.setting == "tokenizer_sha256":
        raise CheckpointError(tokenizer_refusal(path, tokenizers, mismatch.ours))
    if mismatch is not None:
        raise CheckpointError(
            f"{path}: the checkpoint's vocabulary ({record.describe_vocabulary()}) does not "
            f"match the tokenizer files in its run folder ({beside.describe_vocabulary()})"
        )
    model = record.build_model()
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as error:
        raise CheckpointError(
            f"{path}: weights do not fit the recorded model configuration ({error})"
        ) from error
    return model
