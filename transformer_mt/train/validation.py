"""Validation during training: the Validator decides when to validate, measures the
label-smoothed loss and perplexity on the whole (binarized) valid split, and keeps the best
score and the patience spent (`ValidationProgress`, saved in every checkpoint). BLEU comes from
the command, which knows how to translate (commands/train.py); the trainer hands the scores to
its metrics. A validation can be cut short (a stop signal: train/signals.py), and is then left
out: nothing of it is judged, and every rank learns it."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch

from transformer_mt.checkpoint import ValidationProgress
from transformer_mt.config import TrainerConfig
from transformer_mt.data.batching import collate, token_batches
from transformer_mt.data.store import ParallelTokens
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer_mt.execution import ExecutionPolicy
from transformer_mt.model import Transformer
from transformer_mt.train.distributed import Ranks
from transformer_mt.train.loss import TrainingLoss
from transformer_mt.train.signals import Interrupted


@dataclass(frozen=True)
class ValidationScores:
    loss: float  # label-smoothed, per target token
    nll: float  # per target token
    bleu: float | None = None  # sacreBLEU on the first valid sentences, when it is on

    @property
    def ppl(self) -> float:
        return math.exp(min(self.nll, 50.0))

    def scalars(self) -> dict[str, float]:
        """TensorBoard's valid/ scalars."""
        values = {"loss": self.loss, "nll": self.nll, "ppl": self.ppl, "bleu": self.bleu}
        return {name: value for name, value in values.items() if value is not None}

    def format(self, step: int) -> str:
        bleu = "" if self.bleu is None else f", BLEU {self.bleu:.2f}"
        losses = f"valid loss {self.loss:.3f}, nll {self.nll:.3f}, ppl {self.ppl:.2f}"
        return f"update {step}: {losses}{bleu}"


@torch.no_grad()
def validation_loss(
    loss_of: TrainingLoss, data: ParallelTokens, batch_tokens: int, policy: ExecutionPolicy
) -> ValidationScores:
    """The loss of the model in `loss_of` (in eval mode; eager: a compiled step's layers would
    compile new graphs for a pass without gradients) on the whole of `data`, in batches of
    batch_tokens grouped as `policy` groups the training step's (one source length a batch, or
    similar lengths), run as the training step runs (`policy`)."""
    loss_of.eval()
    loss_sum = nll_sum = tokens = 0.0
    equal = policy.equal_source_lengths
    batches = token_batches(
        data.src.lengths,
        data.tgt.lengths,
        batch_tokens,
        seed=0,
        epoch=0,
        shuffle=False,
        equal_sources=equal,
    )
    for indices in batches:
        batch = collate(
            data, indices, pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID, equal_sources=equal
        )
        batch = batch.to(policy.device)
        with policy.forward():
            sums = loss_of(batch.src, batch.tgt_in, batch.tgt_out, batch.src_padded)
        loss_sum += float(sums.loss)
        nll_sum += float(sums.nll)
        tokens += batch.n_tgt_tokens
    return ValidationScores(loss=loss_sum / tokens, nll=nll_sum / tokens)


@dataclass(frozen=True)
class Verdict:
    """What a validation decided, the same on every rank: whether it ran to its end and was
    judged, or was cut short (`interrupted`); a new best score, the patience used up; and rank
    0's scores (None on the other ranks, and where no validation was judged)."""

    judged: bool = False
    interrupted: bool = False
    improved: bool = False
    exhausted: bool = False
    scores: ValidationScores | None = None


class Validator:
    """When to validate (every trainer.valid_every updates, and at the end), the valid loss
    (and BLEU where the command gives a scorer) on rank 0, and the best score and patience."""

    def __init__(
        self,
        model: Transformer,
        loss_of: TrainingLoss,
        data: ParallelTokens,
        policy: ExecutionPolicy,
        ranks: Ranks,
        settings: TrainerConfig,
        bleu: Callable[[Transformer], float] | None = None,
    ):
        """loss_of: the model's loss as validation runs it (eager: Trainer.validation_loss_module);
        policy: the training step's, eager; bleu: the BLEU of a model's translations of (part
        of) the valid split; None: validate the loss only."""
        self.model, self.loss_of, self.data, self.policy = model, loss_of, data, policy
        self.ranks, self.settings, self.bleu = ranks, settings, bleu
        self.progress = ValidationProgress()

    @property
    def metric(self) -> str:
        """What the best score measures."""
        return "-valid loss" if self.bleu is None else "valid BLEU"

    def due(self, step: int, *, last: bool = False) -> bool:
        """Whether update `step` is validated: every trainer.valid_every updates; the `last`
        update where it has no validation yet (a resumed checkpoint's progress says)."""
        if last:
            return self.progress.validated_step != step
        every = self.settings.valid_every
        return bool(every) and step % every == 0

    def run(
        self,
        step: int,
        interruptible: Callable[[], AbstractContextManager] = contextlib.nullcontext,
    ) -> Verdict:
        """Validate update `step` on rank 0, judge its score, and share the verdict. The scores
        are measured in `interruptible()`, which may cut them short (raising Interrupted: a
        stop signal, StopSignals.interrupting); then nothing is judged."""
        improved = exhausted = interrupted = False
        scores = None
        if self.ranks.is_main:
            try:
                with interruptible():
                    scores = self.scores()
            except Interrupted:
                interrupted = True
            else:
                improved, exhausted = self.judge(scores, step)
        agreed = self.ranks.broadcast([float(improved), float(exhausted), float(interrupted)])
        if agreed[2]:
            return Verdict(interrupted=True)
        self.progress.validated_step = step
        return Verdict(
            judged=True, improved=bool(agreed[0]), exhausted=bool(agreed[1]), scores=scores
        )

    def scores(self) -> ValidationScores:
        """The loss (and BLEU) on the valid split (rank 0)."""
        scores = validation_loss(self.loss_of, self.data, self.settings.batch_tokens, self.policy)
        if self.bleu is not None:
            scores = dataclasses.replace(scores, bleu=self.bleu(self.model))
        return scores

    def judge(self, scores: ValidationScores, step: int) -> tuple[bool, bool]:
        """(a new best score, patience exhausted): BLEU where it is measured, else minus the
        loss. A non-finite score (a NaN loss) never improves, so it never becomes the best."""
        score = scores.bleu if scores.bleu is not None else -scores.loss
        progress = self.progress
        improved = math.isfinite(score) and (
            progress.best_score is None or score > progress.best_score
        )
        if improved:
            progress.best_score, progress.best_step = score, step
            progress.validations_without_improvement = 0
        else:
            progress.validations_without_improvement += 1
        patience = self.settings.patience
        return improved, bool(patience) and progress.validations_without_improvement >= patience
