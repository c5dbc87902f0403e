"""Text in, text out: tokenizer + a search backend, batched by length, input order restored.

The Translator prepares text the same way whatever runs the search: normalisation, tokenizer,
truncation to the model's length limit, batches under decode.batch_tokens. The backend turns
one batch of source piece ids into n-best lists: `ModelSearch` runs our model with
decode/search.py and decode/sampling.py; `ctranslate2_backend.CTranslate2Search` runs a model
written by tmt-export.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from transformer_mt.checkpoint import load_checkpoint, model_from_checkpoint
from transformer_mt.config import DecodeConfig, Strategy, validate_decode
from transformer_mt.data.batching import pad_sequences
from transformer_mt.data.clean import normalise, single_line
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizers
from transformer_mt.decode.sampling import sample_search
from transformer_mt.decode.search import Hypothesis, beam_search, greedy_search
from transformer_mt.device import resolve_device
from transformer_mt.errors import ConfigError
from transformer_mt.model import Transformer
from transformer_mt.run_dir import RunDir

log = logging.getLogger(__name__)


class SearchBackend(Protocol):
    """What runs the search for a Translator."""

    name: str
    strategies: tuple[Strategy, ...]  # the decode strategies it offers
    max_source_tokens: int  # longest source it takes, in pieces (EOS not counted)

    def search(self, sources: list[list[int]], decode: DecodeConfig) -> list[list[Hypothesis]]:
        """N-best lists (best first, EOS dropped) for one batch of sources that fit."""
        ...


class ModelSearch:
    """Our model with our searches: beam, greedy, and sampling from its own generator (the same
    calls give the same output; the global RNG is not touched)."""

    name = "transformer_mt"
    strategies = (Strategy.beam, Strategy.greedy, Strategy.sample)

    def __init__(self, model: Transformer, device: torch.device, *, sampling_seed: int = 1):
        self.model, self.device = model.to(device).eval(), device
        self.max_source_tokens = model.positions.shape[0] - 1  # room for EOS
        self.decoder_layers = len(model.decoder)
        self.generator = torch.Generator(device=device).manual_seed(sampling_seed)

    def reseed(self, seed: int) -> None:
        """Sample from `seed` afresh. The server does this before each sampling request, so
        that the request's own seed decides its output, whatever was sampled before it."""
        self.generator.manual_seed(seed)

    def search(self, sources: list[list[int]], decode: DecodeConfig) -> list[list[Hypothesis]]:
        src = pad_sequences(
            [np.asarray(s, dtype=np.int64) for s in sources], PAD_ID, suffix=EOS_ID
        ).to(self.device)
        common = {
            "max_len_a": decode.max_len_a,
            "max_len_b": decode.max_len_b,
            "min_len": decode.min_len,
            "bos_id": BOS_ID,
            "eos_id": EOS_ID,
            "unk_id": UNK_ID,  # with byte fallback every character has pieces: never ' ⁇ '
        }
        if decode.strategy == Strategy.greedy:
            return [[h] for h in greedy_search(self.model, src, **common)]
        if decode.strategy == Strategy.sample:
            hyps = sample_search(
                self.model,
                src,
                generator=self.generator,
                temperature=decode.temperature,
                top_k=decode.top_k,
                top_p=decode.top_p,
                **common,
            )
            return [[h] for h in hyps]
        return beam_search(
            self.model,
            src,
            beam_size=decode.beam_size,
            alpha=decode.length_penalty,
            stop_early=decode.stop_early,
            **common,
        )

    def cross_attention(
        self, sources: list[list[int]], targets: list[list[int]], layer: int
    ) -> list[list[list[float]]]:
        """Per pair: decoder layer `layer`'s cross-attention, averaged over heads, of the model
        reading `target` for `source` (both without EOS): (len(target) + 1) rows of
        (len(source) + 1) weights, EOS last on both sides."""
        layers = self.decoder_layers
        if not -layers <= layer < layers:
            raise ConfigError(f"attention layer {layer}: the decoder has {layers} layers")
        src = pad_sequences([np.asarray(s, dtype=np.int64) for s in sources], PAD_ID, suffix=EOS_ID)
        tgt_in = pad_sequences([np.asarray([BOS_ID, *t], dtype=np.int64) for t in targets], PAD_ID)
        weights = self.model.cross_attention(src.to(self.device), tgt_in.to(self.device), layer)
        return [
            weights[i, : len(t) + 1, : len(s) + 1].float().cpu().tolist()
            for i, (s, t) in enumerate(zip(sources, targets, strict=True))
        ]


@dataclass(frozen=True)
class AttentionMap:
    """Where the model looked while writing one translation: row i is target piece i (the last
    row: end of sentence), column j source piece j (the last: end of sentence); each row sums
    to 1. Cross-attention of one decoder layer, averaged over its heads."""

    source_pieces: list[str]
    target_pieces: list[str]
    weights: list[list[float]]  # len(target_pieces) x len(source_pieces)
    layer: int  # from 0


@dataclass(frozen=True)
class Translation:
    """One entry of an n-best list."""

    text: str
    score: float  # the search's score: beam, length-penalised log-probability; else log-probability


class Translator:
    """Translate lists of sentences."""

    def __init__(
        self,
        backend: SearchBackend,
        tokenizers: Tokenizers,
        decode: DecodeConfig,
        *,
        unicode_form: str | None = "NFC",
    ):
        """unicode_form: the normalisation the training data had (data.unicode_form)."""
        validate_decode(decode)
        if decode.strategy not in backend.strategies:
            offered = " or ".join(s.value for s in backend.strategies)
            raise ConfigError(
                f"config key 'decode.strategy': {decode.strategy.value} is not available with a "
                f"{backend.name} model ({offered})"
            )
        self.backend, self.tokenizers, self.decode = backend, tokenizers, decode
        self.unicode_form = unicode_form
        self.max_source_tokens = backend.max_source_tokens
        self.origin: dict | None = None  # from_run: which checkpoint (or export) translates

    @classmethod
    def for_model(
        cls,
        model: Transformer,
        tokenizers: Tokenizers,
        decode: DecodeConfig,
        device: torch.device,
        *,
        unicode_form: str | None = "NFC",
    ) -> Translator:
        """A Translator that searches with `model` on `device`."""
        backend = ModelSearch(model, device, sampling_seed=decode.seed)
        return cls(backend, tokenizers, decode, unicode_form=unicode_form)

    @classmethod
    def from_run(
        cls,
        run_dir: str | Path,
        checkpoint: str = "last.pt",
        *,
        decode: DecodeConfig | None = None,
        device: str = "auto",
    ) -> Translator:
        """Everything comes from the run folder: tokenizers, model configuration and weights.
        A `checkpoint` that names a folder written by tmt-export is run by CTranslate2."""
        run = RunDir(run_dir)
        path = run.checkpoint(checkpoint)
        decode = decode or DecodeConfig()
        if path.is_dir():
            from transformer_mt.decode.ctranslate2_backend import translator_from_export

            translator = translator_from_export(path, decode=decode, device=device)
            translator.origin = {"checkpoint": str(path.resolve()), "format": "ctranslate2"}
            return translator
        state = load_checkpoint(path)
        tokenizers = run.tokenizers()
        log.info("translating with %s (update %d)", path, int(state["step"]))
        translator = cls.for_model(
            model_from_checkpoint(state, path, tokenizers),
            tokenizers,
            decode,
            resolve_device(device),
            unicode_form=run.data_config().unicode_form,
        )
        translator.origin = {"checkpoint": str(path.resolve()), "step": int(state["step"])}
        return translator

    def translate(self, sentences: list[str]) -> list[str]:
        """One translation per input sentence, in input order; an empty line gives an empty line.
        Each translation is one line (a line break the model spelled in byte pieces is a space)."""
        return [
            single_line(t)
            for t in self.tokenizers.tgt.decode(self.translate_ids(self.encode(sentences)))
        ]

    def translate_nbest(self, sentences: list[str]) -> list[list[Translation]]:
        """Up to decode.nbest translations per input sentence, best first, in input order; an
        empty line gives one empty translation with score 0."""
        return self.nbest_texts(self.nbest_ids(self.encode(sentences)))

    def nbest_texts(self, nbest: list[list[Hypothesis]]) -> list[list[Translation]]:
        texts = map(
            single_line, self.tokenizers.tgt.decode([h.tokens for hyps in nbest for h in hyps])
        )
        return [[Translation(next(texts), h.score) for h in hyps] for hyps in nbest]

    def translate_with_attention(
        self, sentences: list[str], layer: int = -1
    ) -> list[tuple[list[Translation], AttentionMap | None]]:
        """translate_nbest's lists, each with the cross-attention of decoder layer `layer` behind
        its best translation (None for an empty line)."""
        attend = getattr(self.backend, "cross_attention", None)
        if attend is None:
            raise ConfigError(
                f"attention needs a transformer_mt checkpoint, not a {self.backend.name} model"
            )
        ids = self.encode(sentences)
        nbest = self.nbest_ids(ids)
        sources = [s[: self.max_source_tokens] for s in ids]  # as the search read them
        targets = [hyps[0].tokens for hyps in nbest]
        maps: list[AttentionMap | None] = [None] * len(sentences)
        for batch in self.batches(sources):
            weights = attend([sources[i] for i in batch], [targets[i] for i in batch], layer)
            for index, matrix in zip(batch, weights, strict=True):
                maps[index] = AttentionMap(
                    source_pieces=[*self.tokenizers.src.pieces(sources[index]), "</s>"],
                    target_pieces=[*self.tokenizers.tgt.pieces(targets[index]), "</s>"],
                    weights=matrix,
                    layer=layer % self.backend.decoder_layers,
                )
        return list(zip(self.nbest_texts(nbest), maps, strict=True))

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

    def truncate(self, sources: list[list[int]]) -> list[list[int]]:
        """Sources cut to the model's limit (room left for EOS), with a warning if any was."""
        too_long = [s for s in sources if len(s) > self.max_source_tokens]
        if too_long:
            log.warning(
                "%d input(s) longer than %d pieces truncated", len(too_long), self.max_source_tokens
            )
        return [s[: self.max_source_tokens] for s in sources]

    def search(self, sources: list[list[int]]) -> list[list[Hypothesis]]:
        """N-best lists (best first) for one batch of sources, truncated to the model's limit."""
        return self.backend.search(self.truncate(sources), self.decode)
