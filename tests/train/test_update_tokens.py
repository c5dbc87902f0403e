"""Every rank knows every rank's target tokens of an update without asking them: each computes
the whole epoch's batches (data/batching.epoch_batches) and takes its share. (Two processes
check it against an all-reduce in tests/train/test_distributed.py.)"""

from __future__ import annotations

import numpy as np
import pytest
from toy_runs import trainer_for

from transformer_mt.data.batching import epoch_batches, target_tokens_by_turn, token_batches


@pytest.mark.parametrize("world_size", [1, 2, 3, 8])
def test_the_epochs_batches_give_the_target_tokens_of_every_ranks_batch_at_each_place(
    world_size,
):
    rng = np.random.default_rng(world_size)
    src, tgt = rng.integers(1, 60, 5000), rng.integers(1, 60, 5000)
    every = epoch_batches(src, tgt, 700, seed=3, epoch=2, world_size=world_size)
    shares = [
        token_batches(src, tgt, 700, seed=3, epoch=2, rank=rank, world_size=world_size)
        for rank in range(world_size)
    ]
    by_turn = target_tokens_by_turn(every, tgt, world_size)
    # The ranks' i-th batches together, counted as collate counts them (+ EOS each).
    expected = [sum(int(tgt[b].sum()) + len(b) for b in turn) for turn in zip(*shares, strict=True)]
    assert by_turn.tolist() == expected
    assert sum(len(share) for share in shares) == len(every)


def test_the_stream_gives_each_batch_the_tokens_it_holds_on_one_rank(tiny_train_job):
    job = tiny_train_job("trainer.batch_tokens=600", "trainer.valid_bleu_sentences=0")
    trainer = trainer_for(job)
    trainer.metrics.close()
    stream, seen, first_epoch = trainer.batches.micro_batches(), 0, 0
    position = trainer.batches.position
    for batch, tokens in stream:  # across an epoch's end, into the next
        assert tokens == batch.n_tgt_tokens
        first_epoch = first_epoch or position.batches_in_epoch
        seen += 1
        if position.epoch == 1 and position.batch_in_epoch == 3:
            break
    assert seen == first_epoch + 3
    stream.close()
