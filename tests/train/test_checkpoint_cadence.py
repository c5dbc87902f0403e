"""How often checkpoints are written, on the device a run lands on: a cadence in updates tuned on
the CPU (the Multi30k recipe's 50 updates, about a minute on 2 cores) is a second on a GPU, so
periodic checkpoints keep trainer.checkpoint_min_seconds apart on any device; the GPU recipe
(multi30k_gpu) checkpoints by time alone. Clocks here are fakes: no assertion depends on how
fast this machine runs."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from transformer_mt.commands.train import train
from transformer_mt.config import compose_job
from transformer_mt.data.batching import plan_batches
from transformer_mt.errors import ConfigError
from transformer_mt.execution import ExecutionPolicy
from transformer_mt.run_dir import RunDir
from transformer_mt.train import checkpointer as checkpointer_module
from transformer_mt.train.checkpointer import Checkpointer
from transformer_mt.train.distributed import Ranks


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(checkpointer_module.time, "monotonic", fake)
    return fake


def checkpointer_of(config: str, tmp_path, *overrides: str) -> Checkpointer:
    """A Checkpointer of a preset's trainer settings (what its cadence reads; nothing saved)."""
    job = compose_job(config, [f"run_dir={tmp_path / 'run'}", *overrides])
    return Checkpointer(RunDir(job.run_dir), None, None, Ranks(), torch.device("cpu"), job.trainer)


def test_the_cpu_recipes_cadence_on_a_gpu_keeps_the_minimum_interval(tmp_path, clock):
    """multi30k (checkpoint_every=50) at GPU speed (64 updates/s, 1/64 s exact in floating
    point; the first GPU run: 55): a new run has no previous checkpoint, so update 50's is
    written; update 100 comes 0.8 s after it and is skipped; the first multiple of 50 at least
    trainer.checkpoint_min_seconds later is written."""
    checkpointer = checkpointer_of("multi30k", tmp_path)
    settings = checkpointer.settings
    assert settings.checkpoint_every == 50 and settings.checkpoint_min_seconds == 30
    due = []
    for step in range(1, 120 * 64 + 1):  # 2 minutes
        clock.now += 1 / 64
        if checkpointer.periodic_due(step):
            due.append(step)
            checkpointer.saved_step, checkpointer.last_save_time = step, clock.now  # as save()
    # 30 s are 1,920 updates: after 50, the next multiple of 50 is 2,000, then 3,950, ...
    assert due == [50, 2000, 3950, 5900]


def test_the_cpu_recipes_cadence_on_the_cpu_is_unchanged(tmp_path, clock):
    """On 2 CPU cores (about one update a second) 50 updates take longer than the minimum
    interval: every multiple of 50 is written, as before the rule."""
    checkpointer = checkpointer_of("multi30k", tmp_path)
    due = []
    for step in range(1, 301):
        clock.now += 1.0
        if checkpointer.periodic_due(step):
            due.append(step)
            checkpointer.saved_step, checkpointer.last_save_time = step, clock.now
    assert due == [50, 100, 150, 200, 250, 300]


def test_no_minimum_interval_writes_every_periodic_checkpoint(tmp_path, clock):
    checkpointer = checkpointer_of("multi30k", tmp_path, "trainer.checkpoint_min_seconds=0")
    due = [step for step in range(1, 201) if checkpointer.periodic_due(step)]
    assert due == [50, 100, 150, 200]


def test_the_minimum_interval_cannot_be_negative(tmp_path):
    job = compose_job("multi30k", [f"run_dir={tmp_path}", "trainer.checkpoint_min_seconds=-1"])
    with pytest.raises(ConfigError, match="trainer.checkpoint_min_seconds"):
        job.validate()


def test_the_gpu_recipe_plans_for_cuda_and_checkpoints_by_time(tmp_path, clock):
    """multi30k_gpu on a CUDA device (the policy object: torch.device('cuda') needs no GPU):
    bf16, our attention order, lengths rounded to few shapes, one micro-batch of the recipe's
    padded tokens per update; checkpoints by time alone, enough of them kept for make average
    N=auto, and none for an update count however fast the updates come."""
    job = compose_job("multi30k_gpu", [f"run_dir={tmp_path / 'run'}"])
    job.validate()
    trainer = job.trainer
    policy = ExecutionPolicy.for_training(trainer, torch.device("cuda"))
    assert policy.dtype == torch.bfloat16 and policy.round_lengths
    assert policy.attention is not None and policy.attention[0].value == "flash"
    lengths = np.random.default_rng(1).integers(8, 30, 29_000)  # Multi30k-like sentence lengths
    plan = plan_batches(
        lengths,
        lengths,
        global_target_tokens=trainer.global_batch_tokens,
        max_batch_tokens=trainer.batch_tokens,
        world_size=1,
        padded=trainer.global_batch_padded,
    )
    assert (plan.accumulation, plan.micro_batch_tokens) == (1, trainer.batch_tokens)
    cpu_recipe = compose_job("multi30k", [f"run_dir={tmp_path}"]).trainer
    assert trainer.batch_tokens > cpu_recipe.batch_tokens
    assert trainer.checkpoint_every == 0 and 0 < trainer.checkpoint_every_minutes <= 0.5
    assert trainer.keep_checkpoints >= 5 and trainer.max_time_minutes <= 5

    checkpointer = checkpointer_of("multi30k_gpu", tmp_path)
    saved = []
    for step in range(1, 60 * 64 + 1):  # a minute at 64 updates/s
        clock.now += 1 / 64
        if checkpointer.periodic_due(step) or checkpointer.time_due():
            saved.append(step)
            checkpointer.saved_step, checkpointer.last_save_time = step, clock.now
    interval = 60 * trainer.checkpoint_every_minutes
    assert len(saved) == int(60 / interval)


def test_a_run_writes_no_periodic_checkpoint_within_the_minimum_interval(tiny_train_job, caplog):
    """Through the real loop: checkpoint_every=2 with a minimum interval no toy run reaches.
    The interval counts from the previous checkpoint, which a new run does not have: its first
    periodic checkpoint is written, the next ones within the interval are not, and the message
    names the checkpoint they keep apart from; the end's is always written (without the interval
    every second update's is written: tests/test_end_to_end.py and others)."""
    spaced = tiny_train_job(
        "trainer.max_steps=6", "trainer.checkpoint_every=2", "trainer.valid_every=0",
        "trainer.valid_bleu_sentences=0", "trainer.checkpoint_every_minutes=0",
        "trainer.checkpoint_min_seconds=100000",
    )  # fmt: skip
    folder = RunDir(spaced.run_dir).checkpoints
    with caplog.at_level(logging.INFO):
        train(spaced)
    names = sorted(path.name for path in folder.path.glob("step_*.pt"))
    assert names == ["step_2.pt", "step_6.pt"]
    assert "no checkpoint at update 4, " in caplog.text
    assert "s after the previous one (update 2):" in caplog.text
