"""Scores of given translations (decode/scoring.py): the score of a search's own output is the
score the search gave it, for one model and for an ensemble; pairs keep their order and their
scores whatever they are batched with."""

import math
import random

import numpy as np
import pytest
import torch

from transformer_mt.config import CpuLinear, DecodeConfig
from transformer_mt.data.batching import pad_sequences
from transformer_mt.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
)
from transformer_mt.data.toy import toy_pairs
from transformer_mt.decode import search
from transformer_mt.decode.scoring import score_pairs
from transformer_mt.decode.search import Ensemble, beam_search, greedy_search, length_penalty
from transformer_mt.decode.translator import ModelSearch, Translator
from transformer_mt.execution import ExecutionPolicy

VOCAB = 400
IDS = {"bos_id": BOS_ID, "eos_id": EOS_ID, "unk_id": UNK_ID, "max_len_a": 1.0, "max_len_b": 6}
CPU = torch.device("cpu")
# The members as the searches below run them: torch's products, no prepacked copies.
AS_SEARCHED = ExecutionPolicy.for_decoding(DecodeConfig(cpu_linear=CpuLinear.torch), CPU)


def source_ids(count: int = 12, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(4, VOCAB, size=rng.integers(1, 15)).tolist() for _ in range(count)]


def padded(sources: list[list[int]]) -> torch.Tensor:
    return pad_sequences([np.asarray(s) for s in sources], PAD_ID, suffix=EOS_ID)


@pytest.mark.parametrize("members", [1, 2])
@pytest.mark.parametrize("alpha", [0.6, 0.0, 1.5])
def test_each_nbest_entry_scores_what_beam_search_gave_it(random_model, members, alpha):
    model = Ensemble([random_model(VOCAB, seed, eos_bonus=4.0) for seed in range(members)])
    sources = source_ids()
    nbest = beam_search(model, padded(sources), beam_size=4, alpha=alpha, **IDS)
    pairs = [(sources[row], h) for row, hyps in enumerate(nbest) for h in hyps]
    assert len({len(h.tokens) for _, h in pairs}) > 3  # outputs of many lengths, some at the limit
    found = ModelSearch(model, CPU).target_log_probs(
        [s for s, _ in pairs], [h.tokens for _, h in pairs], AS_SEARCHED
    )
    for (_, hypothesis), log_probs in zip(pairs, found, strict=True):
        assert len(log_probs) == len(hypothesis.tokens) + 1  # EOS last
        normalised = sum(log_probs) / length_penalty(len(log_probs), alpha)
        assert math.isclose(normalised, hypothesis.score, rel_tol=1e-5, abs_tol=1e-4)


def test_scores_computed_a_chunk_of_rows_at_a_time_are_the_whole_batch_s(random_model, monkeypatch):
    model = Ensemble([random_model(VOCAB, 5, eos_bonus=4.0), random_model(VOCAB, 6)])
    sources = source_ids(seed=2)
    targets = source_ids(seed=3)
    whole = ModelSearch(model, CPU).target_log_probs(sources, targets, AS_SEARCHED)
    monkeypatch.setattr(search, "SCORE_CHUNK_LOGITS", 3 * 16 * VOCAB)  # 3 rows of 16 positions
    chunked = ModelSearch(model, CPU).target_log_probs(sources, targets, AS_SEARCHED)
    for one, other in zip(whole, chunked, strict=True):
        assert np.allclose(one, other, rtol=1e-5, atol=1e-5)


def test_a_greedy_output_scores_its_sum_of_log_probabilities(random_model):
    model = Ensemble([random_model(VOCAB, 5, eos_bonus=4.0), random_model(VOCAB, 6)])
    sources = source_ids(seed=1)
    found = greedy_search(model, padded(sources), **IDS)
    scored = ModelSearch(model, CPU).target_log_probs(
        sources, [h.tokens for h in found], AS_SEARCHED
    )
    for hypothesis, log_probs in zip(found, scored, strict=True):
        assert math.isclose(sum(log_probs), hypothesis.score, rel_tol=1e-5, abs_tol=1e-4)


def test_an_ensemble_scores_the_mean_of_its_members_probabilities(random_model):
    first, second = random_model(VOCAB, 2), random_model(VOCAB, 3)
    source, target = [[5, 6, 7, 8]], [[9, 10, 11]]
    each = [
        np.exp(ModelSearch(m, CPU).target_log_probs(source, target, AS_SEARCHED)[0])
        for m in (first, second)
    ]
    both = ModelSearch(Ensemble([first, second]), CPU).target_log_probs(source, target, AS_SEARCHED)
    assert np.allclose(both[0], np.log((each[0] + each[1]) / 2), atol=1e-5)


def test_pairs_keep_their_order_and_scores_whatever_they_are_batched_with(random_model, tokenizers):
    """Shuffled lengths in small batches against each pair alone; an empty source is not scored
    (None) and an empty target is EOS alone."""
    model = random_model(VOCAB, 4, eos_bonus=4.0)
    decode = DecodeConfig(batch_tokens=40, length_penalty=1.0)
    translator = Translator.for_model(model, tokenizers, decode, CPU)
    pairs = [(src, tgt) for src, tgt in toy_pairs(30, seed=5)]
    random.Random(0).shuffle(pairs)
    pairs += [("", "a line"), ("a line", "")]
    sources, targets = [s for s, _ in pairs], [t for _, t in pairs]
    together = score_pairs(translator, sources, targets)
    alone = [score_pairs(translator, [s], [t])[0] for s, t in pairs]
    assert together[-2] is None and alone[-2] is None
    assert together[-1].pieces == 1  # EOS alone
    for batched, single in zip(together[:-2] + together[-1:], alone[:-2] + alone[-1:], strict=True):
        assert batched.pieces == single.pieces
        assert math.isclose(batched.log_prob, single.log_prob, rel_tol=1e-5, abs_tol=1e-4)
        assert math.isclose(batched.per_piece * batched.pieces, batched.log_prob)
        assert batched.normalised == pytest.approx(batched.log_prob / ((5 + batched.pieces) / 6))
    assert len({s.pieces for s in together if s is not None}) > 3


def test_a_translation_scores_as_its_pieces_with_the_translator_s_kernels(random_model, tokenizers):
    """Through the translator's own kernels (oneDNN's prepacked copies): the search's pieces
    score the search's score; and a text scores as the pieces SentencePiece encodes it to (a
    search may spell a text in other pieces: a random model's outputs mostly are)."""
    model = random_model(VOCAB, 7, eos_bonus=4.0)
    decode = DecodeConfig(beam_size=4, nbest=4, max_len_b=3)
    translator = Translator.for_model(model, tokenizers, decode, CPU)
    sentences = [src for src, _ in toy_pairs(20, seed=6)]
    sources = translator.encode(sentences)
    nbest = translator.nbest_ids(sources)
    pairs = [(s, h) for s, hyps in zip(sources, nbest, strict=True) for h in hyps]
    _, policy = translator.prepared(None)
    found = translator.backend.target_log_probs(
        [s for s, _ in pairs], [h.tokens for _, h in pairs], policy
    )
    for (_, hypothesis), log_probs in zip(pairs, found, strict=True):
        normalised = sum(log_probs) / length_penalty(len(log_probs), decode.length_penalty)
        assert math.isclose(normalised, hypothesis.score, rel_tol=1e-5, abs_tol=1e-4)
    texts = tokenizers.tgt.decode([h.tokens for _, h in pairs])
    text_sources = [sentences[i] for i, hyps in enumerate(nbest) for _ in hyps]
    scored = score_pairs(translator, text_sources, texts)
    spelled = translator.backend.target_log_probs(
        [s for s, _ in pairs], translator.encode_targets(texts), policy
    )
    for pair, log_probs in zip(scored, spelled, strict=True):
        assert math.isclose(pair.log_prob, sum(log_probs), rel_tol=1e-5, abs_tol=1e-4)
