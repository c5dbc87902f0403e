"""Batches of one source length (trainer.source_lengths, decode.source_lengths = equal): no source
position is padding, so attention takes no key mask (on CUDA every call can take flash). The
batches fill the same budgets, the plan keeps the update's size, and the losses and translations
are the masked path's (the same sentences in batches of similar lengths, padded and masked),
up to float rounding (the translations: tests/decode/test_translator.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_batching import parallel_lengths
from test_model import tiny_model

from transformer_mt.config import CpuLinear, DecodeConfig, SourceLengths, TrainerConfig
from transformer_mt.data.batching import (
    Batch,
    batch_shapes,
    collate,
    epoch_batches,
    plan_batches,
    token_batches,
)
from transformer_mt.data.store import ParallelTokens, TokenArray
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer_mt.execution import ExecutionPolicy
from transformer_mt.train.loss import TrainingLoss

CPU = torch.device("cpu")


def test_a_length_that_fills_half_a_batch_gets_batches_of_its_own_every_example_once():
    """Every example once, every budget kept; the sentences of a source length that are not in
    batches of that length alone fill less than half a budget (left over, packed with their
    neighbours: padded, masked); most target tokens are in batches of one length, in about as
    many batches as similar lengths give (here 94 against 90)."""
    src, tgt = parallel_lengths(5000)
    budget = 2000
    batches = token_batches(src, tgt, budget, seed=1, epoch=0, equal_sources=True)
    assert sorted(np.concatenate(batches).tolist()) == list(range(5000))
    left_over: dict[int, list[int]] = {}
    for batch in batches:
        assert len(batch) * (max(src[batch].max(), tgt[batch].max()) + 1) <= budget
        if len(set(src[batch].tolist())) > 1:
            for index in batch.tolist():
                left_over.setdefault(int(src[index]), []).append(index)
    for sentences in left_over.values():
        assert 2 * len(sentences) * (max(src[sentences].max(), tgt[sentences].max()) + 1) < budget
    one_length = sum(int(tgt[b].sum()) + len(b) for b in batches if len(set(src[b])) == 1)
    assert one_length >= 0.85 * (tgt.sum() + len(tgt))  # here 89.8%
    assert len(batches) <= 1.1 * len(token_batches(src, tgt, budget, seed=1, epoch=0))


def test_the_plan_packs_as_the_batches_do_and_keeps_the_update_at_its_size():
    """An update of `accumulation` batches per rank holds the asked target tokens on average,
    counted over the batches the epoch really has (up to world_size - 1 halved ones)."""
    src, tgt = parallel_lengths(5000)
    for world_size in (1, 2):
        plan = plan_batches(
            src, tgt, global_target_tokens=5000, max_batch_tokens=2000, world_size=world_size,
            equal_sources=True,
        )  # fmt: skip
        batches = epoch_batches(
            src, tgt, plan.micro_batch_tokens, seed=1, epoch=0, world_size=world_size,
            equal_sources=True,
        )  # fmt: skip
        assert plan.target_tokens >= 5000 and plan.micro_batch_tokens <= 2000
        per_batch = (int(tgt.sum()) + len(tgt)) / len(batches)
        expected = per_batch * world_size * plan.accumulation
        assert expected == pytest.approx(plan.target_tokens, rel=world_size / len(batches))


def test_a_batch_of_one_source_length_is_collated_without_source_padding():
    """Its source stays exact (rounded, it would be padded) and unmasked; a left-over batch of
    several lengths is padded and rounded as similar ones are."""
    src, tgt = parallel_lengths(400, seed=2)
    data = corpus(src, tgt)
    kinds = set()
    for indices in token_batches(src, tgt, 300, seed=1, epoch=0, equal_sources=True):
        batch = collate(data, indices, pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID,
                        round_lengths=True, equal_sources=True)  # fmt: skip
        one_length = len(set(src[indices].tolist())) == 1
        kinds.add(one_length)
        (shape,) = batch_shapes([indices], src, tgt, round_lengths=True, equal_sources=True)
        assert tuple(shape) == (len(indices), *batch.src.shape[1:], *batch.tgt_in.shape[1:])
        assert batch.src_padded != one_length
        if one_length:
            assert bool((batch.src != PAD_ID).all()) and shape[1] == src[indices][0] + 1
        assert batch.tgt_in.shape[1] >= tgt[indices].max() + 1  # targets: rounded, right-padded
    assert kinds == {True, False}


def corpus(src_lengths: np.ndarray, tgt_lengths: np.ndarray, vocab: int = 50) -> ParallelTokens:
    """Random pieces (ids 4..vocab-1) of the given lengths."""
    rng = np.random.default_rng(7)

    def side(lengths: np.ndarray) -> TokenArray:
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        return TokenArray(rng.integers(4, vocab, int(offsets[-1])).astype(np.int32), offsets)

    return ParallelTokens(side(src_lengths), side(tgt_lengths))


def loss_and_gradients(batches: list[Batch]) -> tuple[list[float], list[torch.Tensor]]:
    """Summed loss, nll and target tokens over `batches`, and every parameter's summed gradient,
    of the same tiny model (dropout off: each sentence's loss is its own, whatever batch)."""
    model = tiny_model().eval()  # dropout off
    eager = ExecutionPolicy.for_training(TrainerConfig(cpu_linear=CpuLinear.torch), CPU)
    loss_of = TrainingLoss.for_policy(model, eager, epsilon=0.1, pad_id=PAD_ID)
    sums = [0.0, 0.0, 0.0]
    for batch in batches:
        found = loss_of(batch.src, batch.tgt_in, batch.tgt_out, batch.src_padded)
        found.loss.backward()
        sums = [s + float(v.detach()) for s, v in zip(sums, found, strict=True)]
    return sums, [p.grad for p in model.parameters()]


def test_training_losses_and_gradients_equal_the_masked_paths():
    """The same 300 sentences in batches of one source length where a length fills half a batch
    (no masks) and of similar lengths (padded, masked): the same summed loss, nll, token count
    and gradients. Float32 sums of a few thousand terms in another order: 1e-5 relative is two
    orders of magnitude above their rounding, and a mask ignored or a sentence lost moves them
    by percents."""
    src, tgt = parallel_lengths(300, seed=3)
    src, tgt = np.minimum(src, 20), np.minimum(tgt, 20)  # the tiny model's 50 positions
    data = corpus(src, tgt)
    runs = {}
    for equal in (True, False):
        batches = [
            collate(data, b, pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID, equal_sources=equal)
            for b in token_batches(src, tgt, 200, seed=1, epoch=0, equal_sources=equal)
        ]
        assert any(not b.src_padded for b in batches) == equal
        runs[equal] = loss_and_gradients(batches)
    (sums, grads), (masked_sums, masked_grads) = runs[True], runs[False]
    assert sums[2] == masked_sums[2]
    assert sums[:2] == pytest.approx(masked_sums[:2], rel=1e-5)
    for found, expected in zip(grads, masked_grads, strict=True):
        assert (found - expected).abs().max() <= 1e-5 * expected.abs().max()


def test_the_policy_gives_batches_of_one_source_length_to_cuda_by_default():
    def equal(device: str, setting: SourceLengths = SourceLengths.auto) -> tuple[bool, bool]:
        training = TrainerConfig(source_lengths=setting)
        decoding = DecodeConfig(source_lengths=setting)
        return (
            ExecutionPolicy.for_training(training, torch.device(device)).equal_source_lengths,
            ExecutionPolicy.for_decoding(decoding, torch.device(device)).equal_source_lengths,
        )

    assert equal("cuda") == (True, True)
    assert equal("cpu") == equal("mps") == (False, False)
    assert equal("cpu", SourceLengths.equal) == (True, True)
    assert equal("cuda", SourceLengths.similar) == (False, False)
