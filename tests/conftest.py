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
    "data.vocab_size=300",
    "model=tiny",
    "optim.warmup_steps=30",
    "optim.lr_scale=2.0",
    "trainer.batch_tokens=1500",
    "trainer.max_steps=200",
    "trainer.valid_every=100",
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
