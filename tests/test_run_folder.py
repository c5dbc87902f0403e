"""A run folder is one run: one writer at a time, refused commands change nothing, resuming with
other settings, the history of every start, sweeps, fine-tuning from a trained model."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from transformer_mt.commands.evaluate import evaluate
from transformer_mt.commands.train import train
from transformer_mt.config import compose_job
from transformer_mt.errors import CheckpointError, ConfigError, DataError
from transformer_mt.run_dir import RunDir
from transformer_mt.run_lock import RunFolderInUse
from transformer_mt.train.schedule import inverse_sqrt_lr

BIN = Path(sys.executable).parent
QUICK = ["trainer.valid_every=0", "trainer.valid_bleu_sentences=0", "trainer.log_every=1"]


def load(path: Path) -> dict:
    return torch.load(path, weights_only=True)


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_the_lock_names_its_holder_and_is_free_again_after_release(tmp_path):
    run = RunDir(tmp_path / "run")
    run.path.mkdir()  # a folder of the user's (one the lock created goes with it: below)
    held_by_us = rf"in use by PID {os.getpid()} on .* \(since "
    with run.lock(), pytest.raises(RunFolderInUse, match=held_by_us), run.lock():
        pass
    with run.lock():  # released
        pass
    assert (run.path / "run.lock").read_text() == ""


def test_a_command_refused_in_a_new_folder_leaves_no_folder_behind(tiny_train_job, tmp_path):
    """The lock is taken before the checks (two starts must not both pass them); a refusal then
    leaves nothing, not a folder holding run.lock. A folder that gained files keeps its lock."""
    job = tiny_train_job(f"trainer.resume_from={tmp_path / 'missing.pt'}")
    with pytest.raises(CheckpointError, match="checkpoint not found"):
        train(job)
    assert not Path(job.run_dir).exists()
    run = RunDir(tmp_path / "kept")
    with run.lock():
        (run.path / "config.yaml").write_text("data: {}\n")
    assert sorted(path.name for path in run.path.iterdir()) == ["config.yaml", "run.lock"]


def wait_for(condition, what: str, limit_seconds: float = 300.0) -> None:
    """Poll `condition` (a bound on failure only: the test's outcome does not depend on it)."""
    deadline = time.monotonic() + limit_seconds
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.2)


def start_training(overrides: list[str], run_dir: Path, log: Path) -> subprocess.Popen:
    command = [str(BIN / "tmt-train"), *overrides, f"run_dir={run_dir}"]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=open(log, "w"))  # noqa: SIM115


def training_has_begun(run_dir: Path):
    log = run_dir / "train.log"
    return lambda: log.is_file() and "update 1 epoch" in log.read_text()


@pytest.mark.slow
def test_a_second_command_on_a_folder_in_use_is_refused_and_a_killed_holder_blocks_nothing(
    tiny_overrides, tmp_path
):
    overrides = [
        *tiny_overrides,
        *QUICK,
        f"data.prepared_dir={tmp_path / 'prepared'}",
        "trainer.max_steps=1000000",
        "trainer.checkpoint_every=5",
    ]
    run_dir = tmp_path / "run"
    first = start_training(overrides, run_dir, tmp_path / "first.log")
    try:
        wait_for(training_has_begun(run_dir), "the first command's first update")
        second = subprocess.run(
            [str(BIN / "tmt-train"), *overrides, f"run_dir={run_dir}"],
            capture_output=True,
            text=True,
        )
        assert second.returncode == 2
        assert f"is in use by PID {first.pid} on " in second.stderr
        assert "Traceback" not in second.stderr
        # A reader works meanwhile, and says which checkpoint it read.
        wait_for((run_dir / "checkpoints" / "last.pt").is_file, "the first checkpoint")
        reader = subprocess.run(
            [str(BIN / "tmt-translate"), f"run_dir={run_dir}", "decode=greedy"],
            input="the dog sees the cat.\n",
            capture_output=True,
            text=True,
        )
        assert reader.returncode == 0, reader.stderr
        assert len(reader.stdout.splitlines()) == 1
        assert re.search(r"translating with .*checkpoints/last.pt \(update \d+\)", reader.stderr)
        assert first.poll() is None  # unharmed, still training
        first.send_signal(signal.SIGTERM)  # pre-emption: it saves and exits cleanly
        assert first.wait(timeout=300) == 0
    finally:
        first.kill()
    stopped = load(run_dir / "checkpoints" / "last.pt")["step"]
    end = RunDir(run_dir).history()[-1]
    assert (end["event"], end["how"], end["step"]) == ("end", "stop signal", stopped)

    killed = start_training(overrides, run_dir, tmp_path / "killed.log")
    try:
        wait_for(lambda: len(RunDir(run_dir).history()) == 3, "the restarted command's start")
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=60)
    finally:
        killed.kill()
    # The lock died with its holder: the next start continues the run.
    newest = load(run_dir / "checkpoints" / "last.pt")["step"]
    after = train(
        compose_job("train", [*overrides, f"run_dir={run_dir}", f"trainer.max_steps={newest + 1}"])
    )
    assert load(after)["step"] == newest + 1


@pytest.mark.slow
def test_a_refused_command_leaves_every_file_of_the_run_folder_byte_identical(tiny_train_job):
    last = train(tiny_train_job("trainer.max_steps=2", *QUICK))
    run_dir = last.parents[1]
    before = folder_bytes(run_dir)
    refusals = {
        "optim.lr_scale=3.0": (ConfigError, r"optim.lr_scale: 2.0 → 3.0"),
        "data.toy_seed=5": (DataError, r"data.toy_seed: 1 → 5"),
        "model.d_ff=256": (CheckpointError, r"model.d_ff is 256 in this configuration but 128"),
        "trainer.resume=never": (ConfigError, r"trainer.resume=never"),
    }
    for override, (error, message) in refusals.items():
        with pytest.raises(error, match=message):
            train(tiny_train_job("trainer.max_steps=4", override, *QUICK))
        assert folder_bytes(run_dir) == before, override


@pytest.mark.slow
def test_a_steering_change_continues_and_logs_the_difference(tiny_train_job, caplog):
    train(tiny_train_job("trainer.max_steps=2", *QUICK))
    with caplog.at_level(logging.INFO):
        last = train(tiny_train_job("trainer.max_steps=3", "trainer.keep_checkpoints=2", *QUICK))
    assert "changed since the previous start: trainer.max_steps: 2 → 3" in caplog.text
    assert "changed since the previous start: trainer.keep_checkpoints: 5 → 2" in caplog.text
    assert load(last)["step"] == 3


@pytest.mark.slow
def test_a_training_change_is_refused_with_both_values_and_continues_with_force(tiny_train_job):
    last = train(tiny_train_job("trainer.max_steps=2", *QUICK))
    with pytest.raises(ConfigError) as refused:
        train(tiny_train_job("trainer.max_steps=4", "optim.lr_scale=3.0", *QUICK))
    message = str(refused.value)
    assert "optim.lr_scale: 2.0 → 3.0" in message
    assert "a new run_dir" in message and "trainer.resume=force" in message
    state = load(
        train(
            tiny_train_job(
                "trainer.max_steps=4", "optim.lr_scale=3.0", "trainer.resume=force", *QUICK
            )
        )
    )
    assert state["step"] == 4
    # The new rate applies from the resumed update on: update 5's rate at scale 3.
    expected = inverse_sqrt_lr(5, d_model=64, warmup_steps=30, scale=3.0)
    assert state["optimizer"]["param_groups"][0]["lr"] == pytest.approx(expected, rel=1e-12)
    starts = [r for r in RunDir(last.parents[1]).history() if r["event"] == "start"]
    assert starts[-1]["forced"] == ["optim.lr_scale"]
    assert starts[-1]["changed"]["optim.lr_scale"] == [2.0, 3.0]


@pytest.mark.slow
def test_history_has_a_line_for_every_start_and_end(tiny_train_job, monkeypatch):
    first = tiny_train_job("trainer.max_steps=2", *QUICK)
    run = RunDir(first.run_dir)
    train(first, ["trainer.max_steps=2"])
    train(tiny_train_job("trainer.max_steps=3", *QUICK), ["trainer.max_steps=3"])

    from transformer_mt.train import trainer as trainer_module

    def broken_fit(self):
        raise RuntimeError("the disk went away")

    monkeypatch.setattr(trainer_module.Trainer, "fit", broken_fit)
    with pytest.raises(RuntimeError):
        train(tiny_train_job("trainer.max_steps=5", *QUICK))
    history = run.history()
    assert [(r["event"], r.get("kind"), r.get("how"), r["step"]) for r in history] == [
        ("start", "new", None, 0),
        ("end", None, "finished", 2),
        ("start", "resume", None, 2),
        ("end", None, "finished", 3),
        ("start", "resume", None, 3),
        ("end", None, "error", 3),
    ]
    new, _, resumed, *_ = history
    assert new["overrides"] == ["trainer.max_steps=2"] and new["changed"] == {}
    assert resumed["changed"] == {"trainer.max_steps": [2, 3]}
    assert resumed["from"].endswith("step_2.pt")
    assert history[-1]["reason"] == "RuntimeError: the disk went away"
    for record in (new, resumed):
        assert record["world_size"] == 1 and record["device"] == "cpu"
        assert record["host"] and record["version"] and "time" in record
        assert "git_commit" in record


@pytest.mark.slow
def test_a_sweep_gives_every_job_its_own_run_folder(tiny_overrides, tmp_path):
    command = [
        str(BIN / "tmt-train"),
        "-m",
        *tiny_overrides,
        *QUICK,
        f"data.prepared_dir={tmp_path / 'prepared'}",
        "trainer.max_steps=2",
        "optim.lr_scale=1,2",
    ]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    sweep = tmp_path / "runs" / "toy_tiny-sweep"
    folders = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [p.name for p in folders] == ["0", "1"]
    for folder, scale in zip(folders, ("1", "2"), strict=True):
        (start, end) = RunDir(folder).history()
        assert f"optim.lr_scale={scale}" in start["overrides"]
        assert end["how"] == "finished" and load(folder / "checkpoints" / "last.pt")["step"] == 2


@pytest.mark.slow
def test_a_corrupt_or_foreign_checkpoint_is_one_line_naming_the_file(tiny_train_job, tmp_path):
    run_dir = train(tiny_train_job("trainer.max_steps=1", *QUICK)).parents[1]
    corrupt, foreign = tmp_path / "corrupt.pt", tmp_path / "foreign.pt"
    corrupt.write_bytes((run_dir / "checkpoints" / "last.pt").read_bytes()[:5000])
    torch.save({"net": torch.nn.Linear(2, 2)}, foreign)  # a whole module: Python objects
    expected = {
        corrupt: f"{corrupt}: truncated or corrupt",
        foreign: f"{foreign}: not a transformer_mt checkpoint",
    }
    for path, message in expected.items():
        done = subprocess.run(
            [str(BIN / "tmt-eval"), f"run_dir={run_dir}", f"checkpoint={path}"],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 2
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], done.stderr
        assert "PyTorch" not in done.stderr


@pytest.mark.slow
def test_eval_records_which_checkpoint_and_which_data_it_scored(tiny_train_job):
    run_dir = train(tiny_train_job("trainer.max_steps=2", *QUICK)).parents[1]
    evaluate(compose_job("eval", [f"run_dir={run_dir}", "decode=greedy"]))
    scores = json.loads((run_dir / "scores.test.json").read_text())
    assert scores["checkpoint"] == {
        "checkpoint": str((run_dir / "checkpoints" / "last.pt").resolve()),
        "step": 2,
    }
    assert scores["data"] == "toy corpus (seed 1, sizes [1500, 40, 40])"
    assert scores["split"] == "test" and scores["sentences"] == 40
