"""Text in, text out: tokenizer + model + search, batched by length, input order restored."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from transformer_mt.config import DecodeConfig, ModelConfig, Strategy
from transformer_mt.data.batching import pad_sequences
from transformer_mt.data.prepare import TOKENIZER_FILE
from transformer_mt.data.tokenizer import Tokenizer
from transformer_mt.decode.search import beam_search, greedy_search
from transformer_mt.errors import CheckpointError
from transformer_mt.model import Transformer
from transformer_mt.train.checkpoint import load_checkpoint, resolve_checkpoint
from transformer_mt.train.trainer import resolve_device

log = logging.getLogger(__name__)


def model_from_checkpoint(state: dict, path: Path) -> Transformer:
    try:
        model_cfg = OmegaConf.to_object(
            OmegaConf.merge(OmegaConf.structured(ModelConfig), state["model_config"])
        )
    except Exception as error:
        raise CheckpointError(f"{path}: model configuration is not valid ({error})") from None
    model = Transformer(model_cfg, vocab_size=int(state["vocab_size"]), pad_id=0)
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as error:
        raise CheckpointError(
            f"{path}: weights do not fit the recorded model configuration ({error})"
        ) from None
    return model


class Translator:
    """Translate lists of sentences with a trained model."""

    def __init__(
        self, model: Transformer, tokenizer: Tokenizer, decode: DecodeConfig, device: torch.device
    ):
        self.model = model.to(device).eval()
        self.tokenizer, self.decode, self.device = tokenizer, decode, device
        self.max_source_tokens = model.positions.shape[0] - 1  # room for EOS

    @classmethod
    def from_run(
        cls,
        run_dir: str | Path,
        checkpoint: str = "last.pt",
        *,
        decode: DecodeConfig | None = None,
        device: str = "auto",
    ) -> Translator:
        """Everything comes from the run folder: tokenizer, model configuration and weights."""
        run_dir = Path(run_dir)
        path = resolve_checkpoint(run_dir, checkpoint)
        state = load_checkpoint(path)
        tokenizer = Tokenizer(run_dir / TOKENIZER_FILE)
        return cls(
            model_from_checkpoint(state, path),
            tokenizer,
            decode or DecodeConfig(),
            resolve_device(device),
        )

    def translate(self, sentences: list[str]) -> list[str]:
        """One translation per input sentence, in input order; an empty line gives an empty line."""
        ids = self.tokenizer.encode([s.strip() for s in sentences])
        outputs: list[list[int]] = [[] for _ in sentences]
        for batch in self.batches(ids):
            for index, hypothesis in zip(batch, self.search([ids[i] for i in batch]), strict=True):
                outputs[index] = hypothesis
        return self.tokenizer.decode(outputs)

    def batches(self, ids: list[list[int]]) -> list[list[int]]:
        """Indices of non-empty inputs, sorted by length, grouped under decode.batch_tokens."""
        order = sorted((i for i, s in enumerate(ids) if s), key=lambda i: len(ids[i]))
        batches, current, longest = [], [], 0
        for index in order:
            longest_if_added = max(longest, min(len(ids[index]), self.max_source_tokens) + 1)
            if current and longest_if_added * (len(current) + 1) > self.decode.batch_tokens:
                batches.append(current)
                current, longest_if_added = [], min(len(ids[index]), self.max_source_tokens) + 1
            current.append(index)
            longest = longest_if_added
        if current:
            batches.append(current)
        return batches

    def search(self, sources: list[list[int]]) -> list[list[int]]:
        too_long = [s for s in sources if len(s) > self.max_source_tokens]
        if too_long:
            log.warning(
                "%d input(s) longer than %d pieces truncated", len(too_long), self.max_source_tokens
            )
        src = pad_sequences(
            [np.asarray(s[: self.max_source_tokens], dtype=np.int64) for s in sources],
            self.tokenizer.pad_id,
            suffix=self.tokenizer.eos_id,
        ).to(self.device)
        cfg, tok = self.decode, self.tokenizer
        if cfg.strategy == Strategy.greedy:
            hyps = greedy_search(
                self.model,
                src,
                bos_id=tok.bos_id,
                eos_id=tok.eos_id,
                max_len_a=cfg.max_len_a,
                max_len_b=cfg.max_len_b,
            )
            return [h.tokens for h in hyps]
        nbest = beam_search(
            self.model,
            src,
            beam_size=cfg.beam_size,
            bos_id=tok.bos_id,
            eos_id=tok.eos_id,
            alpha=cfg.length_penalty,
            max_len_a=cfg.max_len_a,
            max_len_b=cfg.max_len_b,
        )
        return [hyps[0].tokens for hyps in nbest]
