"""torch.compile's cache is code: never read from the run folder (a pickle planted there ran on
resume), kept where only the user can write, one folder per setting torch's keys leave out (the
attention kernels), and a cache that cannot be used is one line, not a traceback."""

from __future__ import annotations

import errno
import logging
import os
import stat
import tempfile
from pathlib import Path

import pytest
import torch
from torch._inductor.exc import InductorError
from toy_runs import trainer_for

from transformer_mt.config import compose_job
from transformer_mt.errors import TransformerMTError
from transformer_mt.execution import ExecutionPolicy
from transformer_mt.train import compile_cache
from transformer_mt.train.compile_cache import (
    CACHE_SETTING,
    cache_root,
    named_compile_failure,
    use_compile_cache,
)

CPU = torch.device("cpu")


@pytest.fixture
def user_cache(tmp_path, monkeypatch) -> Path:
    """The user's cache folder, a new one; no cache chosen in the environment; private folders
    for one process made in the test's own folder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv(CACHE_SETTING, "")  # so that the test's end restores it, set or not
    monkeypatch.delenv(CACHE_SETTING)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    return cache_root()


def policy_of(*overrides: str) -> ExecutionPolicy:
    trainer = compose_job("train", ["run_dir=unused", *overrides]).trainer
    return ExecutionPolicy.for_training(trainer, CPU)


def test_the_cache_is_private_and_its_folder_follows_the_attention_kernels(user_cache, caplog):
    """torch 2.13's cache keys hold no SDPA state: another trainer.sdpa_backends (or precision)
    gets a folder of its own, the same settings the same folder."""
    run = user_cache.parent / "run"
    with caplog.at_level(logging.WARNING):
        auto = use_compile_cache(policy_of(), run / "compile-cache")
        assert use_compile_cache(policy_of(), run / "compile-cache") == auto
        math = use_compile_cache(policy_of("trainer.sdpa_backends=[math]"), run / "compile-cache")
        bf16 = use_compile_cache(policy_of("trainer.precision=bf16"), run / "compile-cache")
    assert len({auto, math, bf16}) == 3
    assert {auto.parent, math.parent, bf16.parent} == {user_cache}
    assert os.environ[CACHE_SETTING] == str(bf16)
    assert stat.S_IMODE(user_cache.stat().st_mode) == 0o700  # nobody else can reach inside
    assert caplog.records == []


def test_a_cache_folder_others_can_write_is_not_used(user_cache, caplog):
    user_cache.mkdir(parents=True)
    user_cache.chmod(0o777)
    with caplog.at_level(logging.WARNING):
        used = use_compile_cache(policy_of(), user_cache / "unused")
    assert user_cache not in used.parents and used.is_dir()
    assert stat.S_IMODE(used.stat().st_mode) == 0o700
    (warning,) = caplog.records
    assert "others may write to it" in warning.getMessage()
    assert str(user_cache) in warning.getMessage()


def test_a_cache_folder_of_another_user_is_not_used(user_cache, monkeypatch, caplog):
    user_cache.mkdir(parents=True)
    monkeypatch.setattr(compile_cache.os, "getuid", lambda: os.stat(user_cache).st_uid + 1)
    with caplog.at_level(logging.WARNING):
        used = use_compile_cache(policy_of(), user_cache / "unused")
    assert user_cache not in used.parents
    assert "is not a folder of yours" in caplog.text


def test_a_cache_that_cannot_be_written_is_one_line_and_a_private_folder(
    user_cache, monkeypatch, caplog
):
    """A read-only (or full) disk: torch failed at its first lock file with a 154-line
    traceback; now the run compiles into a folder of its own and says so."""

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(compile_cache.tempfile, "TemporaryFile", read_only)
    with caplog.at_level(logging.WARNING):
        used = use_compile_cache(policy_of(), user_cache / "unused")
    assert user_cache not in used.parents
    (warning,) = caplog.records
    assert "cannot be written (Read-only file system)" in warning.getMessage()


def test_a_run_folder_s_old_cache_is_named_and_not_read(user_cache, caplog):
    old = user_cache.parent / "run" / "compile-cache"
    old.mkdir(parents=True)
    with caplog.at_level(logging.WARNING):
        used = use_compile_cache(policy_of(), old)
    assert old not in [used, *used.parents]
    assert f"{old} is not read: a compile cache is code" in caplog.text


def test_a_failure_of_torch_compile_is_one_line_naming_its_cache(tiny_train_job, monkeypatch):
    """A full disk while Inductor writes (its OSError wrapped: it slipped past the CLI's
    full-disk line), a damaged cache: one line, what to do, the checkpoints intact."""
    cache = Path("/some/cache")
    full = named_compile_failure(InductorError(OSError(errno.ENOSPC, "No space left"), None), cache)
    assert "torch.compile failed (its cache: /some/cache): OSError:" in str(full)
    assert "free space and rerun, or train without it (trainer.compile=false)" in str(full)
    damaged = InductorError(RuntimeError("C++ compile error\n" + "line\n" * 200), None)
    said = str(named_compile_failure(damaged, cache))
    assert "RuntimeError: C++ compile error; delete /some/cache to compile afresh" in said
    assert "\n" not in said
    assert named_compile_failure(ValueError("not torch.compile's"), cache) is None

    trainer = trainer_for(tiny_train_job("trainer.max_steps=1"))

    def compiling_fails():
        raise InductorError(OSError(errno.ENOSPC, "No space left on device"), None)

    monkeypatch.setattr(trainer, "run_updates", compiling_fails)
    with pytest.raises(TransformerMTError, match="torch.compile failed: OSError"):
        trainer.fit()
