"""Faults in and around the run folder: unreadable records give one line naming the file; a write
cut short tears no record; a folder that cannot be locked or written is named; best.pt and the
best score stay true through kills and NaNs."""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from console_commands import run_commands_together
from toy_runs import trainer_for

from transformer_mt.commands.train import train
from transformer_mt.errors import TransformerMTError
from transformer_mt.run_dir import RunDir
from transformer_mt.run_lock import RunLock
from transformer_mt.train.validation import ValidationScores

BIN = Path(sys.executable).parent


@pytest.mark.slow
def test_an_unreadable_config_yaml_is_one_line_naming_it(tmp_path, one_update_template):
    configs = []
    for number, text in enumerate(["data: [x\n", "", "just a string\n"]):
        run_dir = shutil.copytree(one_update_template, tmp_path / str(number) / "run")
        (run_dir / "config.yaml").write_text(text)
        configs.append(run_dir / "config.yaml")
    results = run_commands_together(
        [["tmt-translate", f"run_dir={config.parent}"] for config in configs]
    )
    for config, result in zip(configs, results, strict=True):
        stderr = result.stderr.decode()
        assert result.returncode == 2, stderr
        assert "Traceback" not in stderr
        assert f"{config} is unreadable" in stderr


APPEND_UNDER_A_FILE_SIZE_LIMIT = """
import resource, signal, sys
from transformer_mt.run_dir import RunDir
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
run = RunDir(sys.argv[1])
size = (run.path / run.HISTORY).stat().st_size
resource.setrlimit(resource.RLIMIT_FSIZE, (size + 100, size + 100))
try:
    run.append_history({"event": "end", "reason": "x" * 1000})  # only 100 bytes fit
except OSError as error:
    print(error.errno)
"""


def test_a_history_record_cut_short_is_undone(tmp_path):
    # A real short write: the kernel writes what the file-size limit allows and no more, as a
    # full disk does.
    run = RunDir(tmp_path)
    run.append_history({"event": "start", "step": 0})
    before = (tmp_path / run.HISTORY).read_bytes()
    done = subprocess.run(
        [sys.executable, "-c", APPEND_UNDER_A_FILE_SIZE_LIMIT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # The kernel wrote what fitted and returned a short count, which append_history reports as
    # ENOSPC (a second write would have got EFBIG).
    assert done.stdout.strip() == str(errno.ENOSPC), done.stderr
    assert (tmp_path / run.HISTORY).read_bytes() == before  # no torn line
    run.append_history({"event": "start", "step": 2})
    assert [record["step"] for record in run.history()] == [0, 2]


def test_a_run_dir_that_cannot_be_written_or_locked_is_named(tmp_path, monkeypatch):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")
    with pytest.raises(TransformerMTError, match=f"run_dir={not_a_folder}: cannot write"):
        RunLock(not_a_folder / "run.lock").__enter__()

    def no_locks(handle, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)  # NFS without its lock service answers this
    with pytest.raises(TransformerMTError, match="its file system cannot lock files"):
        RunLock(tmp_path / "run" / "run.lock").__enter__()


QUICK_VALID = ["trainer.valid_every=2", "trainer.valid_bleu_sentences=0", "trainer.log_every=1"]


@pytest.mark.slow
def test_a_resume_points_best_pt_at_the_recorded_best(tiny_train_job, tmp_path):
    last = train(tiny_train_job("trainer.max_steps=6", "trainer.checkpoint_every=2", *QUICK_VALID))
    folder = last.parent
    best_step = torch.load(last, weights_only=True)["progress"]["best_step"]
    assert best_step is not None
    other = next(p for p in folder.glob("step_*.pt") if p.name != f"step_{best_step}.pt")
    os.replace(other, folder / ".moved")
    os.link(folder / ".moved", folder / "best.pt.new")
    os.replace(folder / "best.pt.new", folder / "best.pt")  # as a kill before the link leaves it
    os.replace(folder / ".moved", other)
    train(tiny_train_job("trainer.max_steps=6", "trainer.checkpoint_every=2", *QUICK_VALID))
    assert os.path.samefile(folder / "best.pt", folder / f"step_{best_step}.pt")


def test_a_nan_validation_never_becomes_the_best_score(tiny_train_job, monkeypatch):
    job = tiny_train_job("trainer.valid_bleu_sentences=0")
    validator = trainer_for(job).validator
    losses = iter([float("nan"), 3.0, float("nan"), 4.0, 2.5])
    monkeypatch.setattr(validator, "scores", lambda: ValidationScores(loss=next(losses), nll=0.0))
    judged = [validator.run(step).improved for step in range(1, 6)]
    assert judged == [False, True, False, False, True]
    assert (validator.progress.best_score, validator.progress.best_step) == (-2.5, 5)


@pytest.mark.slow
def test_a_start_removes_only_the_partial_writes_of_training(tiny_train_job, tmp_path):
    # tmt-eval and tmt-average may be writing into the folder while training starts.
    train(tiny_train_job("trainer.max_steps=1", *QUICK_VALID))
    run, checkpoints = tmp_path / "run", tmp_path / "run" / "checkpoints"
    stale = [checkpoints / ".step_9.pt.0123abcd.tmp", run / ".config.yaml.0123abcd.tmp"]
    others = [checkpoints / ".averaged.pt.0123abcd.tmp", run / ".scores.test.json.0123abcd.tmp"]
    for path in [*stale, *others]:
        path.write_bytes(b"partial")
    train(tiny_train_job("trainer.max_steps=2", *QUICK_VALID))
    assert [path.exists() for path in stale] == [False, False]
    assert [path.exists() for path in others] == [True, True]
