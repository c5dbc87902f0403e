"""Text in, text out: tokenizer + model + search, batched by length, input order restored."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from transformer_mt.config import (
    DecodeConfig,
    ModelConfig,
    Strategy,
    run_data_config,
    validate_decode,
)
from transformer_mt.data.batching import pad_sequences
from transformer_mt.data.clean import normalise
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizers, load_tokenizers
from transformer_mt.decode.sampling import sample_search
from transformer_mt.decode.search import Hypothesis, beam_search, greedy_search
from transformer_mt.device import resolve_device
from transformer_mt.errors import CheckpointError
from transformer_mt.model import Transformer
from transformer_mt.train.checkpoint import load_checkpoint, resolve_checkpoint

log = logging.getLogger(__name__)


def model_from_checkpoint(state: dict, path: Path, tokenizers: Tokenizers) -> Transformer:
    """The checkpoint's model, checked against the run folder's tokenizers."""
    try:
        model_cfg = OmegaConf.to_object(
            OmegaConf.merge(OmegaConf.structured(ModelConfig), state["model_config"])
        )
    except Exception as error:
        raise CheckpointError(f"{path}: model configuration is not valid ({error})") from None
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
        ) from None
    return model


@dataclass(frozen=True)
class Translation:
    """One entry of an n-best list."""

    text: str
    score: float  # the search's score: beam, length-penalised log-probability; else log-probability


class Translator:
    """Translate lists of sentences with a trained model."""

    def __init__(
        self,
        model: Transformer,
        tokenizers: Tokenizers,
        decode: DecodeConfig,
        device: torch.device,
        *,
        unicode_form: str | None = "NFC",
    ):
        """unicode_form: the normalisation the training data had (data.unicode_form)."""
        validate_decode(decode)
        self.model = model.to(device).eval()
        self.tokenizers, self.decode, self.device = tokenizers, decode, device
        self.unicode_form = unicode_form
        self.max_source_tokens = model.positions.shape[0] - 1  # room for EOS
        # Sampling draws from the translator's own generator: the same calls give the same output.
        self.generator = torch.Generator(device=device).manual_seed(decode.seed)

    @classmethod
    def from_run(
        cls,
        run_dir: str | Path,
        checkpoint: str = "last.pt",
        *,
        decode: DecodeConfig | None = None,
        device: str = "auto",
    ) -> Translator:
        """Everything comes from the run folder: tokenizers, model configuration and weights."""
        run_dir = Path(run_dir)
        path = resolve_checkpoint(run_dir, checkpoint)
        state = load_checkpoint(path)
        tokenizers = load_tokenizers(run_dir)
        model = model_from_checkpoint(state, path, tokenizers)
        unicode_form = run_data_config(run_dir).unicode_form
        return cls(
            model,
            tokenizers,
            decode or DecodeConfig(),
            resolve_device(device),
            unicode_form=unicode_form,
        )

    def translate(self, sentences: list[str]) -> list[str]:
        """One translation per input sentence, in input order; an empty line gives an empty line."""
        return self.tokenizers.tgt.decode(self.translate_ids(self.encode(sentences)))

    def translate_nbest(self, sentences: list[str]) -> list[list[Translation]]:
        """Up to decode.nbest translations per input sentence, best first, in input order; an
        empty line gives one empty translation with score 0."""
        nbest = self.nbest_ids(self.encode(sentences))
        texts = iter(self.tokenizers.tgt.decode([h.tokens for hyps in nbest for h in hyps]))
        return [[Translation(next(texts), h.score) for h in hyps] for hyps in nbest]

    def encode(self, sentences: list[str]) -> list[list[int]]:
        return self.tokenizers.src.encode(
            [normalise(s.strip(), self.unicode_form) for s in sentences]
        )

    def translate_ids(self, ids: list[list[int]]) -> list[list[int]]:
        """Target piece ids for each source's piece ids (no EOS), in input order."""
        return [hyps[0].tokens for hyps in self.nbest_ids(ids)]

    def nbest_ids(self, ids: list[list[int]]) -> list[list[Hypothesis]]:
        """Up to decode.nbest hypotheses per source's piece ids, best first, in input order."""
        outputs = [[Hypothesis([], 0.0)] for _ in ids]
        for batch in self.batches(ids):
            for index, hyps in zip(batch, self.search([ids[i] for i in batch]), strict=True):
                outputs[index] = hyps[: self.decode.nbest]
        return outputs

    def batches(self, ids: list[list[int]]) -> list[list[int]]:
        """Indices of non-empty inputs, sorted by length, grouped under decode.batch_tokens."""
        order = sorted((i for i, s in enumerate(ids) if s), key=lambda i: len(ids[i]))
        batches, current, longest = [], [], 0
        for index in order:
            width = min(len(ids[index]), self.max_source_tokens) + 1
            if current and max(longest, width) * (len(current) + 1) > self.decode.batch_tokens:
                batches.append(current)
                current, longest = [], 0
            current.append(index)
            longest = max(longest, width)
        if current:
            batches.append(current)
        return batches

    def search(self, sources: list[list[int]]) -> list[list[Hypothesis]]:
        """N-best lists (best first) for one batch of sources, truncated to the model's limit."""
        too_long = [s for s in sources if len(s) > self.max_source_tokens]
        if too_long:
            log.warning(
                "%d input(s) longer than %d pieces truncated", len(too_long), self.max_source_tokens
            )
        src = pad_sequences(
            [np.asarray(s[: self.max_source_tokens], dtype=np.int64) for s in sources],
            PAD_ID,
            suffix=EOS_ID,
        ).to(self.device)
        cfg = self.decode
        common = {
            "max_len_a": cfg.max_len_a,
            "max_len_b": cfg.max_len_b,
            "min_len": cfg.min_len,
            "bos_id": BOS_ID,
            "eos_id": EOS_ID,
        }
        if cfg.strategy == Strategy.greedy:
            return [[h] for h in greedy_search(self.model, src, **common)]
        if cfg.strategy == Strategy.sample:
            hyps = sample_search(
                self.model,
                src,
                generator=self.generator,
                temperature=cfg.temperature,
                top_k=cfg.top_k,
                top_p=cfg.top_p,
                **common,
            )
            return [[h] for h in hyps]
        return beam_search(
            self.model, src, beam_size=cfg.beam_size, alpha=cfg.length_penalty, **common
        )
