"""Batches across simulated data-parallel ranks, resuming mid-epoch, loader workers."""

import numpy as np
import pytest
import torch

from transformer_mt.data.batching import BatchDataset, token_batches
from transformer_mt.data.store import ParallelTokens, StoredSplit, TokenArray


def lengths(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(1, 80, n), rng.integers(1, 80, n)


@pytest.mark.parametrize("world_size", [1, 2, 4])
@pytest.mark.parametrize("n", [997, 3000])
def test_each_example_once_per_epoch_across_ranks(world_size, n):
    src, tgt = lengths(n)
    per_rank = [
        token_batches(src, tgt, 700, seed=3, epoch=1, rank=r, world_size=world_size)
        for r in range(world_size)
    ]
    assert (
        len({len(batches) for batches in per_rank}) == 1
    )  # the same number of batches on every rank
    seen = np.concatenate([b for batches in per_rank for b in batches])
    assert sorted(seen.tolist()) == list(range(n))
    for batches in per_rank:
        for batch in batches:
            assert len(batch) * (max(src[batch].max(), tgt[batch].max()) + 1) <= 700


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_epochs_differ_and_seed_reproduces(world_size):
    src, tgt = lengths(2000)

    def order(seed, epoch):
        return [
            b.tolist()
            for b in token_batches(
                src, tgt, 500, seed=seed, epoch=epoch, rank=0, world_size=world_size
            )
        ]

    assert order(1, 0) == order(1, 0)
    assert order(1, 0) != order(1, 1)
    assert order(1, 0) != order(2, 0)


def tiny_store(tmp_path, n=200):
    rng = np.random.default_rng(0)
    src = [rng.integers(4, 100, rng.integers(1, 20)).tolist() for _ in range(n)]
    tgt = [rng.integers(4, 100, rng.integers(1, 20)).tolist() for _ in range(n)]
    data = ParallelTokens(
        TokenArray.from_lists(src, np.uint16), TokenArray.from_lists(tgt, np.uint16)
    )
    data.save(tmp_path, "train")
    return ParallelTokens.load(tmp_path, "train")


@pytest.mark.parametrize("workers", [0, 2])
def test_resuming_at_batch_k_yields_exactly_the_remaining_batches(tmp_path, workers):
    data = tiny_store(tmp_path)
    batches = token_batches(data.src.lengths, data.tgt.lengths, 120, seed=1, epoch=0)
    dataset = BatchDataset(
        [StoredSplit.of(tmp_path, "train")], batches, pad_id=0, bos_id=2, eos_id=3
    )

    def run(start):
        loader = torch.utils.data.DataLoader(
            dataset, batch_size=None, sampler=range(start, len(batches)), num_workers=workers
        )
        return [batch.tgt_out.tolist() for batch in loader]

    full, k = run(0), 5
    assert run(k) == full[k:]
    assert len(full) == len(batches)
