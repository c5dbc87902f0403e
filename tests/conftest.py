"""Shared fixtures: compose the real Hydra configs and shrink them for fast runs."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from toy_runs import TINY_TRAIN, learned_toy_run, train_one_update

from transformer_mt import execution
from transformer_mt.config import compose_job

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# One intra-op thread in every test process and every command it starts: make test runs two
# test processes (pytest-xdist), and torch processes of two threads each on two cores wait on
# each other's spinning threads (a toy step 10x slower), where one thread each lose little on
# tiny models. A test that asks for threads (trainer.num_threads) still gets them.
os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def cpu_without_native_bf16():
    """decode.precision=auto means fp32 in every test process, on any machine: whether a CPU
    multiplies bf16 natively (execution.cpu_multiplies_bf16) would otherwise change what the
    tests' searches compute. The tests of the detection and of auto's bf16 branch inject their
    own answer."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(execution, "cpu_multiplies_bf16", lambda: False)
        yield


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


@pytest.fixture(scope="session")
def learned_run(tmp_path_factory):
    """One run folder per test session whose tiny model has learned short toy sentences (400
    updates, toy_runs.learned_toy_run), for the tests that only read it: train nothing in it."""
    return learned_toy_run(tmp_path_factory.mktemp("learned"), steps=400)


@pytest.fixture(scope="session")
def one_update_template(tmp_path_factory) -> Path:
    return train_one_update(tmp_path_factory.mktemp("one-update"))


@pytest.fixture
def one_update_run(one_update_template, tmp_path) -> Path:
    """tmp_path/run: a copy, the test's own, of a run folder with a one-update tiny model
    (toy_runs.train_one_update, trained once per test session): enough to translate with."""
    return Path(shutil.copytree(one_update_template, tmp_path / "run"))
