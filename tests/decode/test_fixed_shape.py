"""Beam search in a batch of fixed shape (every row to the batch's end, a preallocated KV cache,
the device read every check_every steps) against the shrinking batch, on the CPU: the same
tokens, at the same step, the same shapes at every step, few reads of the device. The execution
policy chooses it on CUDA only (tests/gpu/test_decode_cuda.py runs it there)."""

import pytest
import torch
from test_search import count_decoder_rows, count_host_reads

from transformer_mt.config import BatchShape, DecodeConfig
from transformer_mt.decode.search import Hypothesis, beam_search, fixed_shape_beam_search
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
def test_a_fixed_shape_finds_what_a_shrinking_batch_finds_at_the_same_step(
    random_model, seed, stop_early
):
    """One search, two batch shapes: the shrinking batch decodes one row a sentence at the first
    step, then each sentence's beams, fewer as sentences are done; the fixed shape decodes every
    row to the end. The same hypotheses, and the same last step: with a read of the device every
    step exactly the shrinking batch's steps; every c steps, at most c - 1 more."""
    model = random_model(vocab=24, seed=seed, sharpen=2.0, eos_bonus=3.0)
    src = varied_sources(20, 24, seed)
    k, check_every = 1 + seed % 4, 2 + seed % 3
    search = {
        "beam_size": k,
        "bos_id": BOS,
        "eos_id": EOS,
        "unk_id": UNK,
        "alpha": 0.6,
        "max_len_b": 6,
        "min_len": seed % 2,
        "stop_early": stop_early,
    }
    rows = count_decoder_rows(model)
    shrinking = beam_search(model, src, **search)
    shrinking_rows = list(rows)
    assert shrinking_rows[0] == 20 and max(shrinking_rows[1:]) <= 20 * k
    assert shrinking_rows[-1] < 20 * k  # done sentences left
    assert shrinking_rows[1:] == sorted(shrinking_rows[1:], reverse=True)
    assert len({len(hyps[0].tokens) for hyps in shrinking}) > 2  # ended at different steps
    rows.clear()
    same_nbest(fixed_shape_beam_search(model, src, check_every=1, **search), shrinking)
    assert rows == [20 * k] * len(shrinking_rows)
    rows.clear()
    same_nbest(fixed_shape_beam_search(model, src, check_every=check_every, **search), shrinking)
    assert set(rows) == {20 * k}
    assert len(shrinking_rows) <= len(rows) <= len(shrinking_rows) + check_every - 1


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
    model = random_model(vocab=24, seed=1, sharpen=2.0, eos_bonus=3.0)
    src = varied_sources(8, 24, seed=1)
    steps = count_decoder_rows(model)
    reads = count_host_reads(monkeypatch)
    fixed_shape_beam_search(
        model, src, beam_size=3, bos_id=BOS, eos_id=EOS, max_len_b=6, check_every=4
    )
    monkeypatch.undo()
    # the limits at the start, one read every 4 steps, the hypotheses at the end
    assert reads.count("tolist") == len(reads) <= 1 + len(steps) // 4 + 1
    assert len(steps) > 4


def test_the_policy_keeps_a_fixed_shape_on_cuda_and_shrinks_elsewhere():
    def fixed(device: str, shape: BatchShape = BatchShape.auto) -> bool:
        decode = DecodeConfig(batch_shape=shape)
        return ExecutionPolicy.for_decoding(decode, torch.device(device)).fixed_shape_decoding

    assert fixed("cuda") and not fixed("cpu") and not fixed("mps")
    assert fixed("cpu", BatchShape.fixed) and not fixed("cuda", BatchShape.shrinking)


@pytest.mark.slow
def test_on_the_cpu_the_translator_runs_todays_search_and_fixed_finds_its_tokens(learned_run):
    """500 Multi30k-like sentences (toy sentences of 3 to 15 words) with a trained toy model
    (400 updates: it ends its outputs at varied lengths): on the CPU the Translator's beam
    search is today's shrinking one, bit for bit (tokens and scores), and the fixed-shape search,
    as CUDA runs it (decode.batch_shape=fixed), finds the same tokens."""
    from transformer_mt.data.toy import toy_pairs
    from transformer_mt.decode.loading import load_translator

    translator = load_translator(learned_run, decode=DecodeConfig(), device="cpu")
    pairs = toy_pairs(500, seed=11, min_words=3, max_words=15)
    ids = translator.encode([source for source, _ in pairs])
    default = translator.nbest_ids(ids)
    shrinking = translator.nbest_ids(ids, DecodeConfig(batch_shape=BatchShape.shrinking))
    fixed = translator.nbest_ids(ids, DecodeConfig(batch_shape=BatchShape.fixed))
    assert default == shrinking  # Hypothesis equality: the same tokens and float scores
    same_nbest(fixed, shrinking)
    assert len({len(hyps[0].tokens) for hyps in default}) > 5
