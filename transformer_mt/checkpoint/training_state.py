"""What a training checkpoint carries for a run to continue exactly, as typed records: the
progress (`Progress`) and the state of the model, optimizer, schedule, gradient scaler and every
rank's random generators (`TrainingState`). With checkpoint/record.py, the only module that
names a checkpoint's keys.

Exact: model, optimizer, learning-rate schedule, gradient scaler, every rank's RNG and the data
position, when the run resumes with the same number of ranks and micro-batch budget. With another
layout the global batch and the schedule still continue; the data position becomes the same
fraction of the epoch in the new layout's batch order (approximate, see README).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from torch import Tensor

from transformer_mt.errors import CheckpointError


@dataclass
class UpdateCounts:
    """What the training loop counts (train/trainer.py owns it)."""

    step: int = 0
    train_seconds: float = 0.0
    skipped_updates: int = 0  # non-finite gradients


@dataclass
class DataPosition:
    """Where the data stream stands (train/batches.py owns it)."""

    epoch: int = 0
    batch_in_epoch: int = 0  # this rank's position in the epoch's batch list
    batches_in_epoch: int = 0  # length of that list
    layout: list[int] = field(default_factory=list)  # [world_size, micro_batch_tokens(, 1)]


@dataclass
class ValidationProgress:
    """The best validation score and the patience spent (train/validation.py owns it)."""

    best_score: float | None = None  # validation BLEU, or -loss when BLEU is off
    best_step: int | None = None  # the update best_score was measured at
    validations_without_improvement: int = 0
    validated_step: int | None = None  # the update last validated (None: none, or not recorded)


@dataclass
class Progress:
    """Where training stands, saved in every training checkpoint: assembled from the parts that
    own each piece (the trainer's counts, the batches' position, the validator's best score),
    saved as one flat record whose keys are the same as before the split."""

    counts: UpdateCounts = field(default_factory=UpdateCounts)
    position: DataPosition = field(default_factory=DataPosition)
    validation: ValidationProgress = field(default_factory=ValidationProgress)

    @property
    def step(self) -> int:
        return self.counts.step

    @classmethod
    def from_state(cls, saved: dict) -> Progress:
        """The progress a checkpoint saved (a field an older version lacked: its default)."""

        def part(kind: type):
            return kind(
                **{name: saved[name] for name in kind.__dataclass_fields__ if name in saved}
            )

        return cls(part(UpdateCounts), part(DataPosition), part(ValidationProgress))

    def as_state(self) -> dict:
        """The flat record a checkpoint holds, in the order it always had."""
        counts, position = vars(self.counts), vars(self.position)
        return {
            "step": counts["step"],
            **position,
            "train_seconds": counts["train_seconds"],
            "skipped_updates": counts["skipped_updates"],
            **vars(self.validation),
        }


@dataclass(frozen=True)
class RngStates:
    """Every rank's random generator states, rank by rank: the CPU's, and the GPU's (CUDA or MPS)
    that dropout draws from (empty lists for a kind the run did not use)."""

    cpu: list[Tensor]
    cuda: list[Tensor] = field(default_factory=list)
    mps: list[Tensor] = field(default_factory=list)

    def of_device(self, kind: str) -> list[Tensor]:
        return {"cuda": self.cuda, "mps": self.mps}.get(kind, [])


@dataclass(frozen=True, kw_only=True)
class TrainingState:
    """The tensors and state dicts a run continues from (the record, checkpoint/record.py, says
    what the model is and where training stands)."""

    model: dict[str, Tensor]
    optimizer: dict
    scheduler: dict
    scaler: dict
    """Empty where the gradient scaler is off (bf16, fp32)."""
    rng: RngStates

    def as_state(self) -> dict:
        """This state's entries of a checkpoint's dict (plain values and tensors)."""
        return {
            "model": self.model,
            "optimizer": self.optimizer,
            "scheduler": self.scheduler,
            "scaler": self.scaler,
            "rng_cpu": self.rng.cpu,
            "rng_cuda": self.rng.cuda,
            "rng_mps": self.rng.mps,
        }

    @classmethod
    def read(cls, state: dict, path: Path) -> TrainingState:
        """The training state of a loaded checkpoint; CheckpointError naming `path` when it has
        none (an average: a model to decode with, which training cannot continue from)."""
        if "optimizer" not in state or "scheduler" not in state:
            raise CheckpointError(
                f"{path}: it holds a model only (no optimizer state: an average?), so training "
                "cannot continue from it; fine-tune from it with trainer.init_from instead"
            )
        return cls(
            model=state["model"],
            optimizer=state["optimizer"],
            scheduler=state["scheduler"],
            scaler=state.get("scaler") or {},
            rng=RngStates(
                cpu=state.get("rng_cpu", []),
                cuda=state.get("rng_cuda", []),
                mps=state.get("rng_mps", []),
            ),
        )


def model_weights(state: dict) -> dict[str, Tensor]:
    """The model's tensors of a loaded checkpoint (every checkpoint has them: format.py)."""
    return state["model"]
