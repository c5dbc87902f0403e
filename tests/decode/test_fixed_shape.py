"""The fixed-shape beam search (every row to the batch's end, a preallocated KV cache, the
stopping rule decided on the device) against today's shrinking one, on the CPU: the same tokens,
each sentence stopped at the same step, the same shapes at every step, few reads of the device.
The execution policy chooses it on CUDA only (tests/gpu/test_decode_cuda.py runs it there)."""

import pytest
import torch

from transformer_mt.config import BatchShape, DecodeConfig
from transformer_mt.decode.search import (
    Hypothesis,
    beam_search,
    fixed_shape_beam_search,
    length_penalty,
    sentence_done,
    sentences_done,
)
from transformer_mt.execution import ExecutionPolicy
from transformer_mt.model import DecoderCache, FixedDecoderCache

PAD, UNK, BOS, EOS = 0, 1, 2, 3


def varied_sources(count: int, vocab: int, seed: int, longest: int = 12) -> torch.Tensor:
    """`count` sources of 1 to `longest` tokens plus EOS, right-padded."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, longest + 1, (count,), generator=generator).tolist()
    src = torch.full((count, longest + 1), PAD)
    for row, length in enumerate(lengths):
        src[row, :length] = torch.randint(4, vocab, (length,), generator=generator)
        src[row, length] = EOS
    return src


def count_decoder_steps(model) -> list[int]:
    """Record the rows of every model.decode call from now on (one call: one step)."""
    rows, decode = [], model.decode

    def recording(tgt_in, encoded, cache=None):
        rows.append(tgt_in.shape[0])
        return decode(tgt_in, encoded, cache)

    model.decode = recording
    return rows


def same_nbest(ours: list[list[Hypothesis]], theirs: list[list[Hypothesis]]) -> None:
    """The same n-best lists: tokens equal; scores equal up to float32 rounding (the two searches
    compute in batches of other shapes, whose products may sum in other orders)."""
    assert [[h.tokens for h in hyps] for hyps in ours] == [
        [h.tokens for h in hyps] for hyps in theirs
    ]
    for mine, other in zip(ours, theirs, strict=True):
        assert [h.score for h in mine] == pytest.approx([h.score for h in other], abs=1e-4)


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5])
@pytest.mark.parametrize("stop_early", [False, True])
def test_the_fixed_shape_search_finds_what_the_shrinking_search_finds(
    random_model, seed, stop_early
):
    model = random_model(vocab=24, seed=seed, sharpen=2.0, eos_bonus=3.0)
    src = varied_sources(20, 24, seed)
    search = {
        "beam_size": 1 + seed % 4,
        "bos_id": BOS,
        "eos_id": EOS,
        "unk_id": UNK,
        "alpha": 0.6,
        "max_len_b": 6,
        "min_len": seed % 2,
        "stop_early": stop_early,
    }
    shrinking = beam_search(model, src, **search)
    fixed = fixed_shape_beam_search(model, src, check_every=1 + seed % 3, **search)
    same_nbest(fixed, shrinking)
    assert len({len(hyps[0].tokens) for hyps in shrinking}) > 2  # ended at different steps


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("stop_early", [False, True])
def test_the_rule_on_the_device_stops_every_sentence_where_the_host_rule_does(
    random_model, seed, stop_early
):
    """Each sentence of a test set alone in its batch: with a read of the device every step,
    the fixed-shape search runs exactly the steps the shrinking search runs (which stops at its
    stopping rule's step); every 4 steps, at most 3 more, to the same hypotheses."""
    model = random_model(vocab=24, seed=seed, sharpen=2.0, eos_bonus=6.0)  # ends: some early
    steps = count_decoder_steps(model)
    search = {"beam_size": 4, "bos_id": BOS, "eos_id": EOS, "alpha": 0.6, "max_len_b": 8}
    search["stop_early"] = stop_early
    ran = []
    for row in varied_sources(16, 24, seed):
        src = row[: int((row != PAD).sum())].unsqueeze(0)  # (1, length + 1)
        counts = []
        for search_of, options in (
            (beam_search, {}),
            (fixed_shape_beam_search, {"check_every": 1}),
            (fixed_shape_beam_search, {"check_every": 4}),
        ):
            steps.clear()
            found = search_of(model, src, **search, **options)
            counts.append(len(steps))
            if search_of is beam_search:
                expected = found
            else:
                same_nbest(found, expected)
        host, every_step, every_fourth = counts
        assert every_step == host
        assert host <= every_fourth <= host + 3
        ran.append((host, int((row != PAD).sum()) - 1 + 8))  # (steps, the length limit)
    assert len({steps for steps, _ in ran}) > 2
    assert any(steps < limit for steps, limit in ran)  # the rule stopped these, not the limit


def test_sentences_done_decides_as_sentence_done_on_every_kind_of_sentence():
    """The device's rule on a batch of sentences, against the host's on each: too few finished,
    a live hypothesis that could still win, one that could not, exact ties, and stop_early."""
    k, alpha, limit = 3, 0.6, 12
    generator = torch.Generator().manual_seed(0)
    cases = []
    for case in range(200):
        count = case % (k + 1)  # 0 to k finished hypotheses
        scores = sorted((-5 * torch.rand(count, generator=generator)).tolist(), reverse=True)
        # best_live is a float32 log-probability (the search's scores), the finished ones float64
        best_live = -6 * torch.rand(1, generator=generator).item()
        if case % 7 == 0 and scores:  # the worst finished exactly at the live bound
            best_live = scores[-1] * length_penalty(limit, alpha)
        best_live = torch.tensor(best_live, dtype=torch.float32).item()
        if case % 7 == 0 and scores:
            scores[-1] = best_live / length_penalty(limit, alpha)
        cases.append((scores, best_live))
    for stop_early in (False, True):
        for step in (0, 5, 11):
            expected = [
                sentence_done(
                    [Hypothesis([], s) for s in scores], best, step + 2, limit, alpha, k, stop_early
                )
                for scores, best in cases
            ]
            finished = torch.tensor(
                [scores + [-torch.inf] * (k - len(scores)) for scores, _ in cases],
                dtype=torch.float64,
            )
            best_live = torch.tensor([best for _, best in cases], dtype=torch.float32)
            largest = torch.full((len(cases),), length_penalty(limit, alpha), dtype=torch.float64)
            largest = largest.clamp(min=length_penalty(step + 2, alpha))
            done = sentences_done(finished, best_live, largest, stop_early).tolist()
            assert done == expected
    assert 0 < sum(expected) < len(cases)


def test_the_fixed_shape_cache_decodes_as_the_growing_cache(random_model):
    """Step by step with reorders (a beam search's survivors), the fixed cache's logits are the
    growing cache's up to float rounding, with the same argmax; its keys keep one shape."""
    model = random_model(vocab=24, seed=3)
    src = varied_sources(4, 24, seed=3)
    generator = torch.Generator().manual_seed(4)
    with torch.no_grad():
        encoded = model.encode(src)
        growing, fixed = DecoderCache(), FixedDecoderCache(max_length=9)
        tokens = torch.full((4, 1), BOS)
        for _step in range(9):
            expected = model.decode(tokens, encoded, growing)
            found = model.decode(tokens, encoded, fixed)
            torch.testing.assert_close(found, expected, rtol=1e-5, atol=1e-5)
            assert torch.equal(found.argmax(-1), expected.argmax(-1))
            rows = torch.randint(0, 4, (4,), generator=generator)  # survivors' origins
            growing.reorder(rows)
            fixed.reorder(rows)
            tokens = torch.randint(4, 24, (4, 1), generator=generator)
    assert {tuple(k.shape) for k in fixed.self_k} == {(4, 2, 9, 8)}  # (N, H, max_length, Dh)


def test_every_step_of_the_fixed_shape_search_has_the_same_shapes(random_model):
    """The cache's buffers keep one shape; attention reads the positions written so far as views
    of them (no mask, no new allocation)."""
    model = random_model(vocab=24, seed=1, sharpen=2.0, eos_bonus=3.0)
    shapes, extend = [], FixedDecoderCache.extend

    def recording(cache, layer, k, v):
        keys, values = extend(cache, layer, k, v)
        buffers = cache.self_k[layer], cache.self_v[layer]
        assert keys.shape[2] == values.shape[2] == cache.filled[layer]  # the written prefix
        assert [keys.data_ptr(), values.data_ptr()] == [b.data_ptr() for b in buffers]
        shapes.append((tuple(k.shape), *(tuple(b.shape) for b in buffers)))
        return keys, values

    src = varied_sources(6, 24, seed=1)
    FixedDecoderCache.extend = recording
    try:
        fixed_shape_beam_search(model, src, beam_size=3, bos_id=BOS, eos_id=EOS, max_len_b=6)
    finally:
        FixedDecoderCache.extend = extend
    assert len(shapes) > 2 * 3 and len(set(shapes)) == 1


def test_the_fixed_shape_search_reads_the_device_every_check_every_steps(random_model, monkeypatch):
    from test_search import count_host_reads

    model = random_model(vocab=24, seed=1, sharpen=2.0, eos_bonus=3.0)
    src = varied_sources(8, 24, seed=1)
    steps = count_decoder_steps(model)
    reads = count_host_reads(monkeypatch)
    fixed_shape_beam_search(
        model, src, beam_size=3, bos_id=BOS, eos_id=EOS, max_len_b=6, check_every=4
    )
    monkeypatch.undo()
    # the limits at the start, one read every 4 steps, the hypotheses at the end (2 tensors)
    assert reads.count("tolist") == len(reads) <= 1 + len(steps) // 4 + 2
    assert len(steps) > 4


def test_the_policy_keeps_a_fixed_shape_on_cuda_and_shrinks_elsewhere():
    def fixed(device: str, shape: BatchShape = BatchShape.auto) -> bool:
        decode = DecodeConfig(batch_shape=shape)
        return ExecutionPolicy.for_decoding(decode, torch.device(device)).fixed_shape_decoding

    assert fixed("cuda") and not fixed("cpu") and not fixed("mps")
    assert fixed("cpu", BatchShape.fixed) and not fixed("cuda", BatchShape.shrinking)


@pytest.fixture(scope="module")
def learned_run(tmp_path_factory):
    from toy_runs import learned_toy_run

    return learned_toy_run(tmp_path_factory.mktemp("learned"), steps=400)


@pytest.mark.slow
def test_on_the_cpu_the_translator_runs_todays_search_and_fixed_finds_its_tokens(learned_run):
    """1,000 Multi30k-like sentences (toy sentences of 3 to 15 words) with a trained toy model
    (400 updates: it ends its outputs at varied lengths): on the CPU the Translator's beam
    search is today's shrinking one, bit for bit (tokens and scores), and the fixed-shape search,
    as CUDA runs it (decode.batch_shape=fixed), finds the same tokens."""
    from transformer_mt.data.toy import toy_pairs
    from transformer_mt.decode.loading import load_translator

    translator = load_translator(learned_run, decode=DecodeConfig(), device="cpu")
    pairs = toy_pairs(1000, seed=11, min_words=3, max_words=15)
    ids = translator.encode([source for source, _ in pairs])
    default = translator.nbest_ids(ids)
    shrinking = translator.nbest_ids(ids, DecodeConfig(batch_shape=BatchShape.shrinking))
    fixed = translator.nbest_ids(ids, DecodeConfig(batch_shape=BatchShape.fixed))
    assert default == shrinking  # Hypothesis equality: the same tokens and float scores
    same_nbest(fixed, shrinking)
    assert len({len(hyps[0].tokens) for hyps in default}) > 5
