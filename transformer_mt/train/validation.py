"""Validation during training: label-smoothed loss and perplexity on the whole (binarized) valid
split; BLEU on its first sentences as read, translated with greedy or beam search and scored by
sacreBLEU against the raw references, as tmt-eval scores the test split."""

from __future__ import annotations

import dataclasses
import math

import torch

from transformer_mt.config import TrainJob
from transformer_mt.data.batching import collate, token_batches
from transformer_mt.data.prepare import PreparedData
from transformer_mt.data.store import ParallelTokens
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer_mt.decode.translator import Translator
from transformer_mt.device import autocast_for
from transformer_mt.evaluate import sacrebleu_scores
from transformer_mt.model import Transformer
from transformer_mt.train.loss import label_smoothed_loss


@torch.no_grad()
def validation_loss(
    model: Transformer, data: ParallelTokens, cfg: TrainJob, device: torch.device
) -> dict[str, float]:
    model.eval()
    loss_sum = nll_sum = tokens = 0.0
    batches = token_batches(
        data.src.lengths,
        data.tgt.lengths,
        cfg.trainer.batch_tokens,
        seed=0,
        epoch=0,
        shuffle=False,
    )
    for indices in batches:
        batch = collate(data, indices, pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID).to(device)
        with autocast_for(device, cfg.trainer.precision):
            logits = model(batch.src, batch.tgt_in)
        sums = label_smoothed_loss(
            logits, batch.tgt_out, epsilon=cfg.optim.label_smoothing, pad_id=PAD_ID
        )
        loss_sum += float(sums.loss)
        nll_sum += float(sums.nll)
        tokens += batch.n_tgt_tokens
    return {
        "loss": loss_sum / tokens,
        "nll": nll_sum / tokens,
        "ppl": math.exp(min(nll_sum / tokens, 50.0)),
    }


@torch.no_grad()
def validation_bleu(
    model: Transformer, data: PreparedData, cfg: TrainJob, device: torch.device
) -> float:
    """sacreBLEU of the first trainer.valid_bleu_sentences translations of the valid split."""
    sources, references = data.valid_text(cfg.trainer.valid_bleu_sentences)
    decode = dataclasses.replace(cfg.decode, strategy=cfg.trainer.valid_bleu_strategy)
    translator = Translator(
        model, data.tokenizers, decode, device, unicode_form=cfg.data.unicode_form
    )
    with autocast_for(device, cfg.trainer.precision):
        hypotheses = translator.translate(sources)
    return sacrebleu_scores(hypotheses, references)["bleu"]
