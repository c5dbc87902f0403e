"""Shared fixtures: compose the real Hydra configs and shrink them for fast runs."""

from __future__ import annotations

import os

import pytest
from toy_runs import TINY_TRAIN

from transformer_mt.config import compose_job

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


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
