"""The model's scores of given translations: reranking an n-best list, filtering a corpus.

A pair is read as a translation is made: the source normalised, encoded and tagged as the
Translator encodes it (decode.tgt_lang's tag for a model of several target languages), the
target normalised and encoded by the target tokenizer, then EOS. The model reads the target
teacher-forced, with the members, kernels and precision a search of the same settings runs
(ModelSearch.target_log_probs), so the score of a search's own output is the score the search
gave it, up to float rounding. A source line that is empty is not scored (a Translator does not
translate it either).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from transformer_mt.config import DecodeConfig
from transformer_mt.data.batching import pack
from transformer_mt.decode.search import length_penalty
from transformer_mt.decode.translator import TargetScorer, Translator
from transformer_mt.errors import ConfigError


@dataclass(frozen=True)
class PairScore:
    """A target's log-probability given its source, under the model (an ensemble's: of the mean
    of its members' probabilities)."""

    log_prob: float  # the sum over the target's pieces and EOS
    pieces: int  # the target's pieces, EOS included
    normalised: float  # log_prob / ((5 + pieces) / 6) ** alpha: what beam search ranks by

    @property
    def per_piece(self) -> float:
        return self.log_prob / self.pieces


def scorer(translator: Translator) -> TargetScorer:
    """The translator's backend, which must be able to score (ConfigError otherwise)."""
    if not isinstance(translator.backend, TargetScorer):
        raise ConfigError(
            f"scoring needs a transformer_mt checkpoint, not a {translator.backend.name} model"
        )
    return translator.backend


def score_pairs(
    translator: Translator,
    sources: list[str],
    targets: list[str],
    *,
    decode: DecodeConfig | None = None,
) -> list[PairScore | None]:
    """Each pair's score (None where the source is empty), in input order; the length penalty
    is decode.length_penalty's (None: the translator's defaults)."""
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources and {len(targets)} targets")
    return score_encoded(
        translator, translator.encode(sources, decode), translator.encode_targets(targets), decode
    )


def score_encoded(
    translator: Translator,
    source_ids: list[list[int]],
    target_ids: list[list[int]],
    decode: DecodeConfig | None = None,
) -> list[PairScore | None]:
    """`score_pairs` of pairs encoded already (sources by Translator.encode, targets by
    Translator.encode_targets; the server encodes each request when it arrives). Batched under
    decode.batch_tokens by the longer side of each pair, sorted by length."""
    backend = scorer(translator)
    decode, policy = translator.prepared(decode)
    source_ids = translator.truncate(source_ids)
    widths = [max(len(s), len(t)) + 1 for s, t in zip(source_ids, target_ids, strict=True)]
    order = sorted((i for i, s in enumerate(source_ids) if s), key=lambda i: widths[i])
    scores: list[PairScore | None] = [None] * len(source_ids)
    sorted_widths = np.array([widths[i] for i in order], np.int64)
    for batch in pack(np.array(order, np.int64), sorted_widths, decode.batch_tokens):
        rows = batch.tolist()
        found = backend.target_log_probs(
            [source_ids[i] for i in rows], [target_ids[i] for i in rows], policy
        )
        for index, log_probs in zip(rows, found, strict=True):
            total = sum(log_probs)
            scores[index] = PairScore(
                log_prob=total,
                pieces=len(log_probs),
                normalised=total / length_penalty(len(log_probs), decode.length_penalty),
            )
    return scores
