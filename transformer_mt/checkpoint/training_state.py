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

from transformer_mt.config import Weights
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


EMA_WEIGHTS, EMA_UPDATES, EMA_DIGESTS = "ema_model", "ema_updates", "ema_rank_digests"
"""The keys of the moving average of the weights (trainer.ema_decay) in a checkpoint."""


@dataclass(frozen=True)
class MovingAverage:
    """The exponential moving average of a run's weights: the model-shaped tensors and how many
    updates it has averaged (its decay's warm-up reads it); rank_digests: each rank's digest of
    its own average when saved (train/moving_average.digest), equal on every rank."""

    weights: dict[str, Tensor]
    updates: int
    rank_digests: list[Tensor] = field(default_factory=list)


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
    ema: MovingAverage | None = None
    """The moving average of the weights, where the run keeps one (trainer.ema_decay)."""

    def as_state(self) -> dict:
        """This state's entries of a checkpoint's dict (plain values and tensors)."""
        state = {
            "model": self.model,
            "optimizer": self.optimizer,
            "scheduler": self.scheduler,
            "scaler": self.scaler,
            "rng_cpu": self.rng.cpu,
            "rng_cuda": self.rng.cuda,
            "rng_mps": self.rng.mps,
        }
        if self.ema is not None:
            state |= {
                EMA_WEIGHTS: self.ema.weights,
                EMA_UPDATES: self.ema.updates,
                EMA_DIGESTS: self.ema.rank_digests,
            }
        return state

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
            ema=MovingAverage(state[EMA_WEIGHTS], state[EMA_UPDATES], state.get(EMA_DIGESTS, []))
            if EMA_WEIGHTS in state
            else None,
        )


def model_weights(state: dict, weights: Weights = Weights.auto) -> dict[str, Tensor]:
    """The model's tensors of a loaded checkpoint (every checkpoint has them: format.py): the
    moving average where it has one (trainer.ema_decay) for auto, else the weights as trained;
    CheckpointError for `ema` where it has none."""
    if weights == Weights.raw or (weights == Weights.auto and EMA_WEIGHTS not in state):
        return state["model"]
    if EMA_WEIGHTS not in state:
        raise CheckpointError(
            "config key 'weights': ema, but the checkpoint has no moving average of its weights "
            "(its run had trainer.ema_decay=0): give auto or raw"
        )
    return state[EMA_WEIGHTS]


def has_moving_average(state: dict) -> bool:
    return EMA_WEIGHTS in state
