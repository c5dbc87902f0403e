"""Beam search against exhaustive search and greedy decoding, on tiny random models.

Scores are log-probabilities under the full softmax; PAD and BOS are banned, not renormalised."""

import itertools

import pytest
import torch
import torch.nn.functional as F

from transformer_mt.config import ModelConfig
from transformer_mt.decode.search import beam_search, greedy_search, length_penalty
from transformer_mt.model import Transformer

PAD, UNK, BOS, EOS = 0, 1, 2, 3


def random_model(vocab: int, seed: int) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(
        name="t",
        d_model=16,
        n_heads=2,
        d_ff=32,
        n_encoder_layers=1,
        n_decoder_layers=2,
        dropout=0.0,
        max_positions=64,
    )
    model = Transformer(cfg, vocab_size=vocab, pad_id=PAD).eval()
    with torch.no_grad():  # sharpen the output distribution so the search has real choices to make
        model.embed.weight.mul_(4.0)
    return model


def sequence_log_prob(model: Transformer, src: torch.Tensor, tokens: list[int]) -> float:
    with torch.no_grad():
        tgt_in = torch.tensor([[BOS, *tokens[:-1]]])
        log_probs = F.log_softmax(model(src, tgt_in).float(), dim=-1)[0]
    return float(sum(log_probs[t, token] for t, token in enumerate(tokens)))


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_beam_search_finds_best_sequence_by_exhaustive_search(seed):
    model = random_model(vocab=6, seed=seed)
    src = torch.tensor([[4, 5, 4, EOS]])
    max_len, alpha = 4, 0.6  # outputs of at most 4 tokens, EOS included
    candidates = []
    for length in range(max_len):
        for body in itertools.product([UNK, 4, 5], repeat=length):
            tokens = [*body, EOS]
            score = sequence_log_prob(model, src, tokens) / length_penalty(len(tokens), alpha)
            candidates.append((score, list(body)))
    best_score, best_tokens = max(candidates)
    # 40 hypotheses in all: a beam of 64 keeps every prefix, so beam search is exhaustive here.
    (hyps,) = beam_search(
        model,
        src,
        beam_size=64,
        bos_id=BOS,
        eos_id=EOS,
        alpha=alpha,
        max_len_a=0.0,
        max_len_b=max_len,
    )
    assert hyps[0].tokens == best_tokens
    assert hyps[0].score == pytest.approx(best_score, abs=1e-5)
    assert len(hyps) == len(candidates)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_of_one_equals_greedy(seed):
    model = random_model(vocab=20, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(4, 20, (5, 6), generator=generator)
    src[2, 4:] = PAD
    greedy = greedy_search(model, src, bos_id=BOS, eos_id=EOS, max_len_a=1.0, max_len_b=5)
    beam = beam_search(
        model, src, beam_size=1, bos_id=BOS, eos_id=EOS, alpha=0.6, max_len_a=1.0, max_len_b=5
    )
    assert [h.tokens for h in greedy] == [hyps[0].tokens for hyps in beam]


def test_nbest_lists_are_ordered_and_scored():
    model = random_model(vocab=20, seed=5)
    src = torch.randint(4, 20, (3, 5), generator=torch.Generator().manual_seed(5))
    nbest = beam_search(model, src, beam_size=4, bos_id=BOS, eos_id=EOS, alpha=0.6, max_len_b=8)
    for row, hyps in enumerate(nbest):
        assert len(hyps) >= 1
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        for h in hyps:
            expected = sequence_log_prob(model, src[[row]], [*h.tokens, EOS])
            assert h.score == pytest.approx(
                expected / length_penalty(len(h.tokens) + 1, 0.6), abs=1e-4
            )


def test_output_respects_length_limit():
    model = random_model(vocab=20, seed=7)
    src = torch.tensor(
        [[5, 6, 7, EOS], [8, 9, EOS, PAD]]
    )  # source lengths 3 and 2 (EOS not counted)
    nbest = beam_search(model, src, beam_size=3, bos_id=BOS, eos_id=EOS, max_len_a=1.0, max_len_b=2)
    for hyps, limit in zip(nbest, [3 + 2, 2 + 2], strict=True):
        assert max(len(h.tokens) + 1 for h in hyps) <= limit  # + 1: EOS counts


def test_length_penalty_is_gnmt_formula():
    assert length_penalty(1, 0.6) == pytest.approx(1.0)
    assert length_penalty(10, 0.6) == pytest.approx((15 / 6) ** 0.6)
    assert length_penalty(7, 0.0) == 1.0
