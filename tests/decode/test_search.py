"""Beam search against exhaustive search and greedy decoding, on tiny random models.

Scores are log-probabilities under the full softmax; PAD and BOS are banned, not renormalised."""

import itertools

import pytest
import torch
import torch.nn.functional as F

from benchmarks.reference_search import reference_beam_search
from transformer_mt.config import DecodeConfig
from transformer_mt.decode.search import (
    beam_search,
    greedy_search,
    length_penalty,
    sentences_done,
)
from transformer_mt.model import EncoderOutput, Transformer

PAD, UNK, BOS, EOS = 0, 1, 2, 3


def sequence_log_prob(model: Transformer, src: torch.Tensor, tokens: list[int]) -> float:
    with torch.no_grad():
        tgt_in = torch.tensor([[BOS, *tokens[:-1]]])
        log_probs = F.log_softmax(model(src, tgt_in).float(), dim=-1)[0]
    return float(sum(log_probs[t, token] for t, token in enumerate(tokens)))


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_beam_search_finds_best_sequence_by_exhaustive_search(random_model, seed):
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
def test_beam_of_one_without_length_penalty_equals_greedy(random_model, seed):
    """With alpha = 0 a finished hypothesis beats every live one (log-probabilities only fall):
    a beam of one stops where greedy does. (With alpha > 0 it may rightly go on: a longer ending
    can score better after normalisation.)"""
    model = random_model(vocab=20, seed=seed, sharpen=2.0, eos_bonus=3.0)
    src = varied_lengths_batch(20, seed)
    greedy = greedy_search(model, src, bos_id=BOS, eos_id=EOS, max_len_a=1.0, max_len_b=5)
    beam = beam_search(
        model, src, beam_size=1, bos_id=BOS, eos_id=EOS, alpha=0.0, max_len_a=1.0, max_len_b=5
    )
    assert [h.tokens for h in greedy] == [hyps[0].tokens for hyps in beam]
    assert len({len(h.tokens) for h in greedy}) > 1  # sentences end at different steps


def test_nbest_lists_are_ordered_and_scored(random_model):
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


def test_output_respects_length_limit(random_model):
    model = random_model(vocab=20, seed=7)
    src = torch.tensor(
        [[5, 6, 7, EOS], [8, 9, EOS, PAD]]
    )  # source lengths 3 and 2 (EOS not counted)
    nbest = beam_search(model, src, beam_size=3, bos_id=BOS, eos_id=EOS, max_len_a=1.0, max_len_b=2)
    for hyps, limit in zip(nbest, [3 + 2, 2 + 2], strict=True):
        assert max(len(h.tokens) + 1 for h in hyps) <= limit  # + 1: EOS counts


def varied_lengths_batch(vocab: int, seed: int) -> torch.Tensor:
    """Six sources of 1 to 8 tokens plus EOS, right-padded: (6, 9)."""
    src = torch.randint(4, vocab, (6, 9), generator=torch.Generator().manual_seed(seed))
    for row, length in enumerate([9, 3, 6, 2, 8, 4]):
        src[row, length - 1] = EOS
        src[row, length:] = PAD
    return src


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_batched_cached_beam_search_equals_the_no_cache_reference(random_model, seed):
    """Ours (a batch of six sentences, KV cache, finished sentences pruned) gives, for each
    sentence, the output of the tutorial search that reruns the decoder over every beam's whole
    prefix, one sentence at a time (benchmarks/reference_search.py)."""
    model = random_model(vocab=20, seed=seed, sharpen=2.0, eos_bonus=3.0)
    src = varied_lengths_batch(20, seed)
    decode = DecodeConfig(beam_size=3, length_penalty=0.6, max_len_a=1.0, max_len_b=4)
    nbest = beam_search(
        model,
        src,
        beam_size=decode.beam_size,
        alpha=decode.length_penalty,
        max_len_a=decode.max_len_a,
        max_len_b=decode.max_len_b,
        bos_id=BOS,
        eos_id=EOS,
        unk_id=UNK,
    )
    lengths = (src != PAD).sum(dim=1) - 1  # EOS not counted
    outputs = [hyps[0].tokens for hyps in nbest]
    references = [
        reference_beam_search(model, row[:length].tolist(), decode)
        for row, length in zip(src, lengths.tolist(), strict=True)
    ]
    assert outputs == references
    assert len({len(tokens) for tokens in outputs}) > 1  # sentences ended at different steps


def count_decoder_rows(model: Transformer) -> list[int]:
    """Record the batch size of every model.decode call from now on."""
    rows, decode = [], model.decode

    def recording_decode(tgt_in, encoded, cache=None):
        rows.append(tgt_in.shape[0])
        return decode(tgt_in, encoded, cache)

    model.decode = recording_decode
    return rows


def test_cross_attention_keys_and_values_are_computed_once_per_sentence(random_model):
    model = random_model(vocab=20, seed=0)
    src = varied_lengths_batch(20, 0)
    batch_sizes = []
    for layer in model.decoder:
        compute = layer.cross_attn.memory_kv

        def recording(memory, compute=compute):
            batch_sizes.append(memory.shape[0])
            return compute(memory)

        layer.cross_attn.memory_kv = recording
    beam_search(model, src, beam_size=4, bos_id=BOS, eos_id=EOS, max_len_b=6)
    assert batch_sizes == [6] * len(model.decoder)  # once per layer, on sentences, not beams


def test_greedy_rows_leave_the_batch_at_eos_without_changing_outputs(random_model):
    model = random_model(vocab=20, seed=2, sharpen=2.0, eos_bonus=3.0)
    src = varied_lengths_batch(20, 2)
    rows = count_decoder_rows(model)
    batched = greedy_search(model, src, bos_id=BOS, eos_id=EOS, max_len_b=10)
    assert rows[-1] < rows[0] == 6
    for row, hypothesis in enumerate(batched):
        length = int((src[row] != PAD).sum())
        (alone,) = greedy_search(model, src[[row], :length], bos_id=BOS, eos_id=EOS, max_len_b=10)
        assert alone.tokens == hypothesis.tokens
        assert alone.score == pytest.approx(hypothesis.score, abs=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
def test_beam_search_with_min_len_finds_best_long_enough_sequence(random_model, seed):
    model = random_model(vocab=6, seed=seed, sharpen=2.0, eos_bonus=6.0)
    src = torch.tensor([[4, 5, EOS]])  # EOS is favoured from the third output token on
    max_len, min_len, alpha = 5, 3, 0.6
    candidates = []
    for length in range(min_len, max_len):
        for body in itertools.product([UNK, 4, 5], repeat=length):
            tokens = [*body, EOS]
            score = sequence_log_prob(model, src, tokens) / length_penalty(len(tokens), alpha)
            candidates.append((score, list(body)))
    (unconstrained,) = beam_search(
        model, src, beam_size=1, bos_id=BOS, eos_id=EOS, max_len_a=0.0, max_len_b=max_len
    )
    assert len(unconstrained[0].tokens) < min_len  # so min_len has something to change
    (hyps,) = beam_search(
        model,
        src,
        beam_size=200,  # more than the 27 + 81 hypotheses: exhaustive
        bos_id=BOS,
        eos_id=EOS,
        alpha=alpha,
        max_len_a=0.0,
        max_len_b=max_len,
        min_len=min_len,
    )
    assert len(hyps) == len(candidates)
    best_score, best_tokens = max(candidates)
    assert hyps[0].tokens == best_tokens
    assert hyps[0].score == pytest.approx(best_score, abs=1e-5)


def test_min_len_holds_for_greedy_and_beam_and_the_length_limit_wins(random_model):
    model = random_model(vocab=20, seed=0, sharpen=1.0, eos_bonus=4.0)
    src = varied_lengths_batch(20, 0)
    limits = {"bos_id": BOS, "eos_id": EOS, "max_len_a": 0.0, "max_len_b": 6}  # 5 tokens + EOS
    greedy = greedy_search(model, src, **limits)
    assert min(len(h.tokens) for h in greedy) < 4  # so min_len has something to change
    greedy = greedy_search(model, src, min_len=4, **limits)
    nbest = beam_search(model, src, beam_size=3, min_len=4, **limits)
    assert min(len(h.tokens) for h in greedy) == 4
    assert min(len(h.tokens) for hyps in nbest for h in hyps) == 4
    greedy = greedy_search(model, src, min_len=9, **limits)
    nbest = beam_search(model, src, beam_size=3, min_len=9, **limits)
    assert {len(h.tokens) for h in greedy} == {len(h.tokens) for hyps in nbest for h in hyps} == {5}


@pytest.mark.parametrize(
    "length,alpha,expected",
    [
        (1, 0.6, 1.0),  # (5 + 1) / 6 = 1: no penalty for a single token, whatever alpha
        (7, 0.0, 1.0),  # alpha 0: plain log-probabilities
        (10, 1.0, 2.5),  # (5 + 10) / 6
        (13, 2.0, 9.0),  # ((5 + 13) / 6) ** 2 = 3 ** 2
        (19, 0.5, 2.0),  # sqrt((5 + 19) / 6) = sqrt(4)
        (10, 0.6, 2.5**0.6),  # the paper's alpha
    ],
)
def test_length_penalty_matches_gnmt_formula_exactly(length, alpha, expected):
    assert length_penalty(length, alpha) == expected


A, B, C = 4, 5, 6
SCRIPT = {  # next-token weights after each prefix; the rest of the vocabulary gets 1e-4 each
    (): {A: 0.6, B: 0.39},
    (A,): {EOS: 0.55, A: 0.45},
    (B,): {EOS: 0.6, A: 0.4},
    (B, A): {EOS: 1.0},
    (A, A): {C: 1.0},
    (A, A, C): {C: 1.0},
    (A, A, C, C): {C: 1.0},
    (A, A, C, C, C): {C: 1.0},
    (A, A, C, C, C, C): {EOS: 1.0},
}


def scripted_log_probs(prefix: tuple[int, ...], vocab: int = 7) -> torch.Tensor:
    """(V,) log-probabilities after `prefix`: SCRIPT's weights, uniform after unlisted prefixes."""
    weights = torch.full((vocab,), 1e-4)
    for token, weight in SCRIPT.get(prefix, {t: 1.0 for t in (EOS, A, B, C)}).items():
        weights[token] = weight
    return F.log_softmax(weights.log(), dim=-1)


class ScriptedModel(torch.nn.Module):
    """The encode / decode interface of Transformer, with next-token probabilities looked up in
    SCRIPT by the prefix generated so far. The prefix travels in the decoder cache (as the keys
    of one layer), so that beam reordering and pruning carry it as they carry real keys."""

    pad_id = PAD

    def __init__(self):
        super().__init__()
        self.register_buffer("positions", torch.zeros(32, 1))

    def encode(self, src, *, padded=True):
        return EncoderOutput(torch.zeros(src.shape[0], src.shape[1], 1), src != PAD, padded)

    def fill_cross_attention(self, encoded, cache):
        if not cache.cross_k:
            cache.cross_k.append(torch.zeros(encoded.memory.shape[0], 1, 1, 1))
            cache.cross_v.append(torch.zeros(encoded.memory.shape[0], 1, 1, 1))

    def decode(self, tgt_in, encoded, cache):
        new = tgt_in.float()[:, None, :, None]  # (N, 1, T, 1)
        new, _ = cache.extend(0, new, new)  # (N, 1, t + T, 1): the cache reorders its rows
        prefixes = [tuple(int(t) for t in row[1:]) for row in new[:, 0, :, 0]]  # BOS dropped
        return torch.stack([scripted_log_probs(p) for p in prefixes])[:, None, :]  # (N, 1, V)


@pytest.mark.parametrize("beam_size", [1, 2])
@pytest.mark.parametrize("nbest", [None, 1])
def test_beam_search_does_not_stop_at_short_endings_a_longer_hypothesis_beats(beam_size, nbest):
    """SCRIPT gives two short endings, [A] and [B A], that finish first (fairseq's rule, done at
    beam_size finished hypotheses, stops there), while [A A C C C C], whose tokens after A A are
    certain, finishes later with the best normalised score of all sequences."""
    src, max_len, alpha = torch.tensor([[A, EOS]]), 8, 0.6
    candidates = []
    for length in range(max_len):
        for body in itertools.product([A, B, C], repeat=length):
            tokens = (*body, EOS)
            log_prob = sum(
                float(scripted_log_probs(tokens[:t])[tokens[t]]) for t in range(len(tokens))
            )
            candidates.append((log_prob / length_penalty(len(tokens), alpha), list(body)))
    best_score, best_tokens = max(candidates)
    assert best_tokens == [A, A, C, C, C, C]
    (hyps,) = beam_search(
        ScriptedModel(),
        src,
        beam_size=beam_size,
        bos_id=BOS,
        eos_id=EOS,
        unk_id=UNK,
        alpha=alpha,
        max_len_a=0.0,
        max_len_b=max_len,
        nbest=nbest,
    )
    assert hyps[0].tokens == best_tokens
    assert hyps[0].score == pytest.approx(best_score, abs=1e-5)
    assert len(hyps) == beam_size or nbest is not None


@pytest.mark.parametrize("beam_size", [1, 2])
def test_stop_early_ends_a_sentence_at_its_first_beam_size_finished_hypotheses(beam_size):
    """fairseq's and CTranslate2's rule, kept as an option: on SCRIPT it stops at the short
    endings that finish first and misses [A A C C C C] (the test above)."""
    (hyps,) = beam_search(
        ScriptedModel(),
        torch.tensor([[A, EOS]]),
        beam_size=beam_size,
        bos_id=BOS,
        eos_id=EOS,
        unk_id=UNK,
        alpha=0.6,
        max_len_a=0.0,
        max_len_b=8,
        stop_early=True,
    )
    assert hyps[0].tokens == [A]
    assert len(hyps) == beam_size


def test_the_stopping_rule_on_every_kind_of_sentence():
    """sentences_done on a batch of sentences with K = 3 finished places (best first; -inf:
    empty), each with the best live log-probability (float32, as the search's scores) and the
    largest length penalty P that hypothesis could still get: too few finished, a live one that
    could still win, one that can at best tie (a tie keeps the finished ones), one that cannot."""
    penalty = length_penalty(12, 0.6)
    tie = torch.tensor(-3.0 * penalty).item()  # float32: -3 * P, rounded
    sentences = [  # (finished, best live, done, done with stop_early)
        ([-1.0, -2.0, -torch.inf], -0.1, False, False),
        ([-1.0, -2.0, -torch.inf], -9.0, False, False),
        ([-1.0, -2.0, -3.0], -2.0, False, True),  # -2 / P > -3: it could still win
        ([-1.0, -2.0, tie / penalty], tie, True, True),
        ([-1.0, -2.0, -3.0], -5.0 * penalty, True, True),
    ]
    finished = torch.tensor([scores for scores, *_ in sentences], dtype=torch.float64)
    best_live = torch.tensor([best for _, best, *_ in sentences], dtype=torch.float32)
    largest = torch.full((len(sentences),), penalty, dtype=torch.float64)
    for stop_early, column in ((False, 2), (True, 3)):
        done = sentences_done(finished, best_live, largest, stop_early)
        assert done.tolist() == [row[column] for row in sentences]


def test_the_stopping_rule_for_a_caller_that_keeps_the_best_nbest():
    """With nbest < K a sentence is done once its nbest-th best finished hypothesis cannot be
    beaten: without waiting for K finished ones, and not while a live one could still win."""
    penalty = length_penalty(12, 0.6)
    sentences = [  # (finished, best live, done for nbest 1, done for nbest 2)
        ([-1.0, -torch.inf, -torch.inf], -9.0, True, False),
        ([-1.0, -2.0, -torch.inf], -9.0, True, True),
        ([-1.0, -2.0, -torch.inf], -2.0 * penalty - 1.0, True, True),
        ([-1.0, -2.0, -torch.inf], -1.5 * penalty, True, False),  # could beat the second
        ([-1.0, -2.0, -3.0], -0.5 * penalty, False, False),  # could beat the first
    ]
    finished = torch.tensor([scores for scores, *_ in sentences], dtype=torch.float64)
    best_live = torch.tensor([best for _, best, *_ in sentences], dtype=torch.float32)
    largest = torch.full((len(sentences),), penalty, dtype=torch.float64)
    for nbest, column in ((1, 2), (2, 3)):
        done = sentences_done(finished, best_live, largest, False, nbest)
        assert done.tolist() == [row[column] for row in sentences], nbest
    assert not sentences_done(finished, best_live, largest, False, 3)[:4].any()


@pytest.mark.parametrize("fixed_shape", [False, True])
def test_a_search_for_the_best_nbest_finds_the_full_search_s_first_nbest(random_model, fixed_shape):
    """The same first nbest hypotheses at the same scores as the search that keeps all K, with
    no more decoder rows in all (each step's rows summed), and, in a shrinking batch, fewer on
    these batches: its sentences leave sooner."""
    model = random_model(vocab=30, seed=5, sharpen=1.0, eos_bonus=2.0)  # falls fast enough
    rows = []
    decode = model.decode
    model.decode = lambda tgt_in, *args: rows.append(len(tgt_in)) or decode(tgt_in, *args)
    settings = {"beam_size": 4, "bos_id": BOS, "eos_id": EOS, "max_len_b": 12}
    work = {}
    for seed in range(4):
        src = varied_lengths_batch(30, seed)
        for nbest in (None, 1, 2):
            rows.clear()
            found = beam_search(model, src, nbest=nbest, fixed_shape=fixed_shape, **settings)
            work[seed, nbest] = sum(rows)
            if nbest is None:
                everything = found
                continue
            for kept, full in zip(found, everything, strict=True):
                assert [h.tokens for h in kept[:nbest]] == [h.tokens for h in full[:nbest]]
                for ours, theirs in zip(kept[:nbest], full[:nbest], strict=True):
                    assert ours.score == pytest.approx(theirs.score, abs=1e-6)
            assert work[seed, nbest] <= work[seed, None]
    if not fixed_shape:
        assert sum(work[seed, 1] for seed in range(4)) < sum(work[seed, None] for seed in range(4))


def test_the_unknown_piece_is_never_generated(random_model):
    model = random_model(vocab=20, seed=0)
    with torch.no_grad():
        model.embed.weight[UNK] = model.embed.weight[4:].sum(dim=0)  # UNK's logit stands out
    src = varied_lengths_batch(20, 0)
    common = {"bos_id": BOS, "eos_id": EOS, "max_len_b": 6}
    assert any(UNK in h.tokens for h in greedy_search(model, src, **common))  # it would be
    outputs = [h.tokens for h in greedy_search(model, src, unk_id=UNK, **common)]
    outputs += [
        h.tokens
        for hyps in beam_search(model, src, beam_size=3, unk_id=UNK, **common)
        for h in hyps
    ]
    assert outputs and all(UNK not in tokens for tokens in outputs)


HOST_READS = ("tolist", "item", "__bool__", "__int__", "__float__", "__index__")
"""The Tensor methods that bring values to the host: on a GPU, each call waits for the device."""


def count_host_reads(monkeypatch) -> list[str]:
    """Record every host read of a tensor from now on (the name of the method called)."""
    reads = []

    def counting(name: str):
        read = getattr(torch.Tensor, name)

        def counted(self, *args, **kwargs):
            reads.append(name)
            return read(self, *args, **kwargs)

        return counted

    for name in HOST_READS:
        monkeypatch.setattr(torch.Tensor, name, counting(name))
    return reads


@pytest.mark.parametrize("strategy", ["beam", "greedy"])
def test_a_search_reads_the_device_once_per_step(random_model, monkeypatch, strategy):
    """What a step decides on the host (greedy: the rows that end and their tokens; beam search:
    the sentences done) comes in one copy per step, not one per value (which on a GPU is one wait
    for the device each)."""
    model = random_model(vocab=20, seed=1, sharpen=2.0, eos_bonus=3.0)
    src = varied_lengths_batch(20, 1)
    steps = count_decoder_rows(model)
    reads = count_host_reads(monkeypatch)
    if strategy == "beam":
        nbest = beam_search(model, src, beam_size=3, bos_id=BOS, eos_id=EOS, max_len_b=10)
    else:
        nbest = [[h] for h in greedy_search(model, src, bos_id=BOS, eos_id=EOS, max_len_b=10)]
    monkeypatch.undo()
    assert len(steps) > 3 and sum(len(hyps) for hyps in nbest) >= len(src)
    # + 2: the length limits at the start, beam search's hypotheses at its end
    assert reads.count("tolist") == len(reads) <= len(steps) + 2
