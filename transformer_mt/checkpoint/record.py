"""What a checkpoint says about itself, as one typed record: the model's configuration, its
vocabulary (sizes, and the sha256 of its SentencePiece models' pieces), the prepared data it was
trained on, the update and the training progress; and the
one check that decides whether a checkpoint fits, `check_fits`, asked for a purpose (resume,
fine-tune, average, decode: eval, translate, export, serve), with the one builder of its refusal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from torch import Tensor

from transformer_mt.checkpoint.training_state import Progress, TrainingState, model_weights
from transformer_mt.config import ModelConfig, Weights, config_dict
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
    progress: Progress | None = None
    """Where training stood (None: an average, or a run not yet saved)."""
    tokenizer_sha256: tuple[str, ...] | None = None
    """Tokenizers.sha256 of the SentencePiece model(s) the vocabulary is (spm.model, or
    spm.src.model and spm.tgt.model: each piece with its score and kind), where two tokenizers
    of one size differ. None: not known (a run whose data is not prepared, or a checkpoint
    written before it was recorded)."""
    precision: str | None = None
    """What the run computed in (the execution policy's: fp32, bf16 or fp16), which a resume
    keeps (train/start.py); None: not recorded (an average, or a checkpoint written before)."""

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
            progress=Progress.from_state(state["progress"]) if state.get("progress") else None,
            tokenizer_sha256=tuple(hashes) if (hashes := state.get("tokenizer_sha256")) else None,
            precision=state.get("precision"),
        )

    def as_state(self) -> dict:
        """The record's entries of a checkpoint's dict (plain values, for weights_only loads)."""
        return {
            "model_config": config_dict(self.model),
            "vocab_size": self.vocab_size,
            "src_vocab_size": self.src_vocab_size,
            "data_folder": self.data_folder,
            "step": self.step,
            **({} if self.progress is None else {"progress": self.progress.as_state()}),
            "tokenizer_sha256": None
            if self.tokenizer_sha256 is None
            else list(self.tokenizer_sha256),
            **({} if self.precision is None else {"precision": self.precision}),
        }

    def with_progress(self, progress: Progress) -> CheckpointRecord:
        """This record at `progress` (a copy of it: the trainer goes on moving its own)."""
        return dataclasses.replace(
            self, step=progress.step, progress=Progress.from_state(progress.as_state())
        )

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


@dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint: its file, its record and what it holds (format.load_checkpoint's
    dict, read through the record and training_state.TrainingState)."""

    path: Path
    record: CheckpointRecord
    state: dict

    @classmethod
    def of(cls, state: dict, path: Path) -> Checkpoint:
        return cls(path, CheckpointRecord.read(state, path), state)

    def training_state(self) -> TrainingState:
        """What a run continues from; CheckpointError when the checkpoint has none (an average)."""
        return TrainingState.read(self.state, self.path)

    def weights(self) -> dict[str, Tensor]:
        return model_weights(self.state)


class Purpose(str, Enum):
    """What a checkpoint is checked for (`check_fits`), which says what must agree."""

    resume = "resume"
    fine_tune = "fine-tune"
    average = "average"
    decode = "decode"


ASPECTS = {
    # The vocabulary follows from the data: a prepared folder is named by the hash of everything
    # that made it, its tokenizer included (data/prepare.py).
    Purpose.resume: ("data", "shape"),
    Purpose.fine_tune: ("shape", "vocabulary"),
    Purpose.average: ("model", "vocabulary", "data"),
    Purpose.decode: ("vocabulary",),
}


def check_fits(
    purpose: Purpose,
    ours: CheckpointRecord,
    theirs: CheckpointRecord,
    path: Path,
    *,
    ours_from: str = "this configuration",
    theirs_from: str | None = None,
) -> None:
    """CheckpointError unless the checkpoint at `path`, whose record is `theirs`, fits `ours`
    for `purpose` (ASPECTS says what must agree). ours_from: where our record comes from, as the
    refusal names it (the configuration, the run's tokenizer files, the first checkpoint);
    theirs_from: the tokenizer files the checkpoint came with, where known (its run folder's)."""
    mismatch = ours.first_mismatch(theirs, ASPECTS[purpose])
    if mismatch is not None:
        raise CheckpointError(
            refusal(purpose, mismatch, ours, theirs, path, ours_from, theirs_from)
        )


def refusal(
    purpose: Purpose,
    mismatch: Mismatch,
    ours: CheckpointRecord,
    theirs: CheckpointRecord,
    path: Path,
    ours_from: str,
    theirs_from: str | None = None,
) -> str:
    """The one message of a checkpoint that does not fit: what differs, and what to do."""
    if purpose == Purpose.average:
        prefix = "model_config." if mismatch.aspect == "model" else ""
        setting = f"{prefix}{mismatch.setting}"
        return averaging_refusal(ours_from, path, setting, mismatch.ours, mismatch.theirs)
    if mismatch.aspect == "data":
        return (
            f"{path} was trained on prepared data {mismatch.theirs}, but {ours_from} prepares "
            f"{mismatch.ours} (a data or tokenizer setting, or the corpus, changed): use a new "
            "run_dir, restore the original settings, or fine-tune from this run on the new data "
            "with trainer.init_from"
        )
    if mismatch.aspect == "model":
        name = f"model.{mismatch.setting}"
        return (
            f"{path}: {name} is {mismatch.ours} in {ours_from} but {mismatch.theirs} in the "
            f"checkpoint; use a new run_dir, or restore {name}={mismatch.theirs}"
        )
    if mismatch.setting == "tokenizer_sha256":
        its_own = "" if theirs_from is None else f"{theirs_from}, "
        return (
            f"{path} was trained with {its_own}another SentencePiece model than {ours_from} "
            f"(its pieces' sha256 {', '.join(h[:12] for h in mismatch.theirs)}, not those of "
            "that model): its ids would mean other pieces; use it with its own run folder's "
            "tokenizer"
        )
    if purpose == Purpose.fine_tune:
        return (
            f"{path}: the parent model's embedding has {pieces(theirs)}, but {ours_from} has "
            f"{pieces(ours)}: fine-tuning needs the parent's own SentencePiece model (leave "
            "data.spm_model unset and trainer.init_from supplies it)"
        )
    return (
        f"{path}: the checkpoint's vocabulary ({theirs.describe_vocabulary()}) does not match "
        f"{ours_from} ({ours.describe_vocabulary()})"
    )


def averaging_refusal(first: str, path: Path, key: str, ours: Any, theirs: Any) -> str:
    """Why the checkpoint at `path` cannot be averaged with the first one: `key` (a setting, or a
    tensor checkpoint/average.py compares) differs."""
    return f"{first} and {path} cannot be averaged: {key} differs ({ours} vs {theirs})"


def pieces(record: CheckpointRecord) -> str:
    """'400 target pieces' (and the source's with separate vocabularies)."""
    source = "" if record.src_vocab_size is None else f" and {record.src_vocab_size} source pieces"
    return f"{record.vocab_size} target pieces{source}"


def model_from_checkpoint(
    state: dict,
    path: Path,
    tokenizers: Tokenizers,
    home: Tokenizers | None = None,
    weights: Weights = Weights.auto,
) -> Transformer:
    """The checkpoint's model, checked against the run folder's tokenizers (`decoded_record`),
    with its `weights` (training_state.model_weights)."""
    model = decoded_record(state, path, tokenizers, home).build_model()
    try:
        model.load_state_dict(model_weights(state, weights))
    except RuntimeError as error:
        raise CheckpointError(
            f"{path}: weights do not fit the recorded model configuration ({error})"
        ) from error
    return model


def decoded_record(
    state: dict, path: Path, tokenizers: Tokenizers, home: Tokenizers | None = None
) -> CheckpointRecord:
    """The checkpoint's record, once its vocabulary is known to be the run folder's tokenizers'
    (CheckpointError naming both otherwise). home: the tokenizers of the other run folder the
    checkpoint lies in (an ensemble's member from another run): a refusal names their files,
    and their hash stands in for the one a checkpoint written before it was recorded lacks."""
    record = CheckpointRecord.read(state, path)
    if home is not None and record.tokenizer_sha256 is None:
        record = dataclasses.replace(record, tokenizer_sha256=home.sha256)
    beside = CheckpointRecord.of_run(record.model, tokenizers)
    check_fits(
        Purpose.decode,
        beside,
        record,
        path,
        ours_from=file_names(tokenizers),
        theirs_from=None if home is None else file_names(home),
    )
    return record


def file_names(tokenizers: Tokenizers) -> str:
    """'run/spm.model' (or 'run/spm.src.model and run/spm.tgt.model')."""
    return " and ".join(str(file) for file in tokenizers.files)
