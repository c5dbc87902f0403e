"""Validation during training: label-smoothed loss and perplexity on the whole (binarized) valid
split; BLEU comes from the command, which knows how to translate (commands/train.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from transformer_mt.data.batching import collate, token_batches
from transformer_mt.data.store import ParallelTokens
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer_mt.execution import ExecutionPolicy
from transformer_mt.train.loss import TrainingLoss


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
