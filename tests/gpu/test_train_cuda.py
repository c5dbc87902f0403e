"""Training on a GPU, the CUDA counterparts of tests/train: fused Adam skips a non-finite update on
the device without waiting for the host; DistributedDataParallel over NCCL changes nothing; a run
resumed from a checkpoint continues bitwise (CUDA RNG included); fp16 trains with the scaler."""

from __future__ import annotations

import datetime
import logging
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from toy_runs import MATH_ATTENTION, trainer_for

from transformer_mt.commands.train import train
from transformer_mt.config import TrainJob
from transformer_mt.data.batching import Batch, collate, token_batches
from transformer_mt.data.prepare import PreparedData, prepare
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer_mt.execution import ExecutionPolicy
from transformer_mt.train.distributed import Ranks
from transformer_mt.train.loss import TrainingLoss
from transformer_mt.train.trainer import Trainer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
from test_resume import QUICK, assert_same_tensors, load  # noqa: E402  (the CPU tests' helpers)

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda", 0)
# Eager: the tests below compare runs bitwise and time-box the GPU check; compiling (auto's
# choice on CUDA) is tested on its own at the end.
ON_CUDA = ["trainer.device=cuda", "trainer.compile=false", *QUICK]
# Runs compared bitwise: the math attention kernel, through the execution policy (conftest.py).
BITWISE = [*ON_CUDA, MATH_ATTENTION]


def first_batches(job: TrainJob, data: PreparedData, count: int) -> list[Batch]:
    """The first `count` batches of epoch 0, collated on the host in pinned memory."""
    train_split = data.train
    indices = token_batches(
        train_split.src.lengths,
        train_split.tgt.lengths,
        job.trainer.batch_tokens,
        seed=job.trainer.seed,
        epoch=0,
    )[:count]
    return [
        collate(train_split, b, pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID).pin_memory()
        for b in indices
    ]


def cloned_state(trainer: Trainer) -> dict:
    """The model's and the optimizer's tensors, copied."""
    return {
        "model": {k: v.clone() for k, v in trainer.model.state_dict().items()},
        "optimizer": {
            index: {k: v.clone() for k, v in state.items()}
            for index, state in trainer.optimizer.state_dict()["state"].items()
        },
    }


def test_fused_adam_skips_an_inf_gradient_on_the_device_without_a_host_sync(
    tiny_train_job, monkeypatch
):
    job = tiny_train_job(*ON_CUDA)
    data = prepare(job.data)
    torch.manual_seed(job.trainer.seed)
    trainer = trainer_for(job, data, CUDA)
    batches = first_batches(job, data, 3)
    trainer.train_step([batches[0]])  # Adam's state exists from here on
    before = cloned_state(trainer)
    real_loss = TrainingLoss.forward

    def overflowing_loss(*args, **kwargs):
        sums = real_loss(*args, **kwargs)
        return sums._replace(loss=sums.loss * float("inf"))

    monkeypatch.setattr(TrainingLoss, "forward", overflowing_loss)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any host sync in the update raises
    try:
        trainer.train_step([batches[1]])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    after = cloned_state(trainer)
    assert_same_tensors(before["model"], after["model"], "model after the skipped update")
    # Moments and Adam's step count (the fused kernel's bias correction) are unchanged too.
    assert_same_tensors(before["optimizer"], after["optimizer"], "optimizer state")
    assert trainer.nonfinite.read() == (1, 1)
    assert trainer.progress.step == 2  # the schedule still counts it

    monkeypatch.undo()
    torch.cuda.set_sync_debug_mode("error")
    try:
        trainer.train_step([batches[2]])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    changed = cloned_state(trainer)["model"]
    assert any(not torch.equal(changed[k], after["model"][k]) for k in changed)
    assert trainer.nonfinite.read()[0] == 0  # nothing skipped since the last read


def test_checkpoint_and_resume_on_cuda_continue_bitwise(tiny_train_job, tmp_path, deterministic):
    # A loader worker collates; the main process pins the batches and copies them asynchronously.
    cuda = [*BITWISE, "trainer.loader_workers=1"]

    def run(updates: int, folder: str) -> dict:
        job = tiny_train_job(*cuda, f"trainer.max_steps={updates}", f"run_dir={tmp_path / folder}")
        return load(train(job))

    straight, again = run(6, "a"), run(6, "c")
    # Without deterministic kernels, resuming could not be told apart from run-to-run noise.
    assert_same_tensors(
        straight["model"], again["model"], f"two straight runs (nondeterministic: {deterministic})"
    )
    run(3, "b")
    resumed = run(6, "b")
    assert straight["step"] == resumed["step"] == 6
    assert len(resumed["rng_cuda"]) == 1  # the GPU's generator (dropout) is saved
    assert_same_tensors(straight["model"], resumed["model"], "model")
    assert_same_tensors(straight["optimizer"], resumed["optimizer"], "optimizer")
    assert straight["scheduler"] == resumed["scheduler"]
    assert_same_tensors(straight["rng_cpu"], resumed["rng_cpu"], "CPU RNG")
    assert_same_tensors(straight["rng_cuda"], resumed["rng_cuda"], "CUDA RNG")


def test_fp16_trains_with_the_gradient_scaler_on_cuda(tiny_train_job):
    state = load(train(tiny_train_job(*ON_CUDA, "trainer.precision=fp16", "trainer.max_steps=8")))
    skipped = state["progress"]["skipped_updates"]
    print(f"fp16: loss scale {state['scaler']['scale']:g} after 8 updates, {skipped} skipped")
    assert state["step"] == 8 and skipped < 8  # the scaler may skip the first while it calibrates
    assert state["scaler"]["scale"] > 0
    assert all(torch.isfinite(tensor).all() for tensor in state["model"].values())
    # Resuming loads the scaler's state onto the GPU run.
    resumed = load(train(tiny_train_job(*ON_CUDA, "trainer.precision=fp16", "trainer.max_steps=9")))
    assert resumed["step"] == 9 and resumed["scaler"]["scale"] > 0


class OneRankWorld(Ranks):
    """A world of one rank that still trains through DistributedDataParallel (the trainer leaves
    DDP out when one process trains alone): NCCL all-reduces the one GPU's gradients."""

    @property
    def distributed(self) -> bool:
        return True


def trained_state(job: TrainJob, data: PreparedData, ranks: Ranks, updates) -> dict:
    torch.manual_seed(job.trainer.seed)  # the same initial parameters and dropout masks
    trainer = trainer_for(job, data, CUDA, ranks)
    assert isinstance(trainer.train_model, DistributedDataParallel) == ranks.distributed
    for batches in updates:
        trainer.train_step(batches)
    return cloned_state(trainer)


def test_a_one_rank_nccl_ddp_run_equals_the_plain_run(tiny_train_job, tmp_path, deterministic):
    if not dist.is_nccl_available():
        pytest.skip("this torch has no NCCL")
    job = tiny_train_job(*BITWISE)
    data = prepare(job.data)
    batches = first_batches(job, data, 6)
    # Two micro-batches per update: the first accumulates under DDP's no_sync.
    updates = [batches[0:2], batches[2:4], batches[4:6]]
    plain = trained_state(job, data, Ranks(), updates)
    dist.init_process_group(  # last in this file: a hung NCCL start ends the run in 60 s
        "nccl",
        init_method=f"file://{tmp_path / 'rendezvous'}",
        rank=0,
        world_size=1,
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        control = dist.new_group(backend="gloo")  # as start_ranks makes it
        ddp = trained_state(job, data, OneRankWorld(0, 1, 0, control), updates)
        assert dist.get_backend() == "nccl"
    finally:
        dist.destroy_process_group()
    # DDP sums one rank's gradients and divides by a world size of 1: exact, so bitwise.
    assert_same_tensors(plain["model"], ddp["model"], f"model (nondeterministic: {deterministic})")
    assert_same_tensors(plain["optimizer"], ddp["optimizer"], "optimizer")


def test_compiled_layers_train_on_cuda_and_auto_stays_eager(tiny_train_job, caplog):
    # trainer.compile=true on CUDA: each repeated layer compiled and the loss's chunks (3
    # graphs: an encoder layer, a decoder layer, a chunk's softmax_terms), lengths rounded to
    # few shapes, and the run trains to a finite state; auto stays eager until make gpu-check
    # measures the compiled step faster (execution.py).
    compiled = ["trainer.device=cuda", "trainer.compile=true", *QUICK, "trainer.log_every=1"]
    job = tiny_train_job(*compiled)
    with caplog.at_level(logging.INFO):
        state = load(train(job))
    assert "torch.compile by update 1: 3 graph(s) compiled" in caplog.text
    assert "the first update took" in caplog.text
    assert all(torch.isfinite(tensor).all() for tensor in state["model"].values())
    policy = ExecutionPolicy.for_training(tiny_train_job(*QUICK).trainer, CUDA)
    assert not policy.compile and policy.round_lengths
