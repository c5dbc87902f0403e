"""Shared fixtures: compose the real Hydra configs and shrink them for fast runs."""

from __future__ import annotations

import os

import pytest

from transformer_mt.config import compose_job

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


TINY_TRAIN = [
    "data=toy",
    "data.toy_sizes=[1500,40,40]",
    "data.vocab_size=400",
    "model=tiny",
    "optim.warmup_steps=30",
    "optim.lr_scale=2.0",
    "trainer.batch_tokens=1500",
    "trainer.global_batch_tokens=1200",  # one batch of at most 1,500 tokens (~81% target tokens)
    "trainer.max_steps=200",
    "trainer.valid_every=100",
    "trainer.valid_bleu_sentences=8",
    "trainer.checkpoint_every=100",
    "trainer.log_every=20",
    "trainer.progress_bar=false",
    "trainer.num_threads=2",
    "trainer.loader_workers=0",
]


@pytest.fixture
def tiny_train_job(tmp_path):
    def make(*extra: str):
        overrides = [f"run_dir={tmp_path / 'run'}", f"data.prepared_dir={tmp_path / 'prepared'}"]
        return compose_job("train", [*TINY_TRAIN, *overrides, *extra])

    return make


@pytest.fixture
def tiny_overrides() -> list[str]:
    """TINY_TRAIN as command-line overrides (for runs through the CLI or torchrun)."""
    return list(TINY_TRAIN)
