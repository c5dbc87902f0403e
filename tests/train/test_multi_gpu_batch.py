"""Many GPUs: the warning for micro-batches too small to keep a GPU busy, and trainer=scaled,
which grows the global batch and the learning rate with the number of ranks."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from transformer_mt.config import compose_job, config_dict
from transformer_mt.data.batching import BatchPlan
from transformer_mt.train.distributed import small_micro_batch_warning

CUDA, CPU = torch.device("cuda", 0), torch.device("cpu")


def plan(world_size: int, micro_batch_tokens: int) -> BatchPlan:
    return BatchPlan(world_size, 1, micro_batch_tokens, 0.8 * world_size * micro_batch_tokens)


def test_ranks_with_micro_batches_too_small_for_a_gpu_are_told_what_to_change():
    # The paper's 25,000 target tokens over 8 GPUs: one micro-batch of 3,523 padded tokens each.
    message = small_micro_batch_warning(plan(8, 3523), CUDA)
    assert "each of the 8 ranks gets micro-batches of 3,523 padded tokens, below 8,000" in message
    assert "launch-bound" in message
    for key in ("trainer=scaled", "trainer.global_batch_tokens", "trainer.batch_tokens"):
        assert key in message
    assert small_micro_batch_warning(plan(8, 8000), CUDA) is None  # large enough
    assert small_micro_batch_warning(plan(1, 3523), CUDA) is None  # one GPU: nothing to scale
    assert small_micro_batch_warning(plan(8, 3523), CPU) is None  # a CPU is not launch-bound


@pytest.fixture
def ranks(monkeypatch):
    """Set WORLD_SIZE as torchrun does (None: unset, a plain tmt-train)."""

    def launched(count: int | None) -> None:
        if count is None:
            monkeypatch.delenv("WORLD_SIZE", raising=False)
        else:
            monkeypatch.setenv("WORLD_SIZE", str(count))

    return launched


def scaled(*overrides: str):
    return compose_job("train", ["trainer=scaled", "run_dir=/tmp/x", *overrides])


def test_the_scaled_preset_is_the_paper_run_on_one_rank(ranks):
    ranks(None)
    assert config_dict(scaled()) == config_dict(compose_job("train", ["run_dir=/tmp/x"]))


@pytest.mark.parametrize(("count", "lr_scale"), [(16, 2.0), (8, 8**0.25), (2, 2**0.25)])
def test_the_scaled_preset_grows_the_batch_and_the_learning_rate_with_the_ranks(
    ranks, count, lr_scale
):
    ranks(None)
    paper = compose_job("train", ["run_dir=/tmp/x"])
    ranks(count)
    job = scaled()
    # Ott et al. (2018): 16x the batch (400,000 tokens) with 2x the learning rate.
    assert job.trainer.global_batch_tokens == 25_000 * count
    assert job.optim.lr_scale == pytest.approx(lr_scale, rel=1e-12)
    assert dataclasses.replace(job.trainer, global_batch_tokens=25_000) == paper.trainer
    assert dataclasses.replace(job.optim, lr_scale=1.0) == paper.optim
    assert scaled("optim.lr_scale=3").optim.lr_scale == 3.0  # the command line still wins
