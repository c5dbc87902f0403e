"""The checkpoint folder after faults and unusual settings: last.pt left behind by a kill, a
branch started with trainer.resume_from, keep_checkpoints=0, a stop signal during the final
validation."""

from __future__ import annotations

import logging
import os
import signal

import pytest
import torch

from transformer_mt.checkpoint import step_checkpoints
from transformer_mt.commands.train import train
from transformer_mt.run_dir import RunDir
from transformer_mt.train.trainer import Trainer
from transformer_mt.train.validation import Validator

QUICK = [
    "trainer.valid_every=0",
    "trainer.valid_bleu_sentences=0",
    "trainer.checkpoint_every=2",
    "trainer.checkpoint_every_minutes=0",
]


def step_of(path) -> int:
    return torch.load(path, weights_only=True)["step"]


def step_files(folder) -> list[str]:
    return [path.name for path in step_checkpoints(folder)]


def test_a_rerun_points_a_stale_last_pt_at_the_checkpoint_it_resumes(tiny_train_job):
    """A kill between the final step_N.pt and the link of last.pt leaves last.pt at an older
    update; eval, translate, export and serve read last.pt. The rerun resumes step_N.pt and
    must point last.pt at it, though it has no update left to do."""
    job = tiny_train_job(*QUICK, "trainer.max_steps=4")
    folder = RunDir(job.run_dir).checkpoints
    train(job)
    os.unlink(folder.last)
    os.link(folder.step_file(2), folder.last)  # what the kill leaves
    assert step_of(train(job)) == 4
    assert os.path.samefile(folder.last, folder.step_file(4))


def test_a_branch_from_resume_from_is_what_the_next_plain_rerun_continues(tiny_train_job, caplog):
    """trainer.resume_from=step_2.pt abandons updates 3-6: their step files (and best.pt,
    which pointed at one) are set aside, so the next plain rerun continues the branch (not the
    old step_6.pt) and averaging never mixes the two."""
    job = tiny_train_job(*QUICK, "trainer.max_steps=6")
    folder = RunDir(job.run_dir).checkpoints
    train(job)
    branch = f"trainer.resume_from={folder.step_file(2)}"
    assert step_of(train(tiny_train_job(*QUICK, "trainer.max_steps=3", branch))) == 3
    assert step_files(folder.path) == ["step_2.pt", "step_3.pt"]
    assert sorted(p.name for p in folder.path.glob("*.abandoned.pt")) == [
        "best.abandoned.pt",  # it was step_6.pt, the abandoned branch's final validation
        "step_4.abandoned.pt",
        "step_6.abandoned.pt",
    ]
    assert os.path.samefile(folder.best, folder.step_file(3))  # the branch's own best
    with caplog.at_level(logging.INFO):
        train(tiny_train_job(*QUICK, "trainer.max_steps=5"))
    assert f"resumed from {folder.step_file(3)} at update 3" in caplog.text
    assert step_of(folder.last) == 5
    assert [p.name for p in folder.newest_steps(3)] == ["step_3.pt", "step_4.pt", "step_5.pt"]


def test_keep_checkpoints_0_keeps_last_pt_alone_and_resumes_from_it(tiny_train_job, caplog):
    job = tiny_train_job(*QUICK, "trainer.max_steps=4", "trainer.keep_checkpoints=0")
    folder = RunDir(job.run_dir).checkpoints
    with caplog.at_level(logging.INFO):
        assert step_of(train(job)) == 4
    assert "wrote last.pt" in caplog.text
    assert step_files(folder.path) == [] and folder.last.is_file()
    more = tiny_train_job(*QUICK, "trainer.max_steps=6", "trainer.keep_checkpoints=0")
    assert step_of(train(more)) == 6


class Died(Exception):
    """What the test's own handlers raise: the signal reached a handler before the checkpoint
    was written, as it would kill a real process."""


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_during_the_final_validation_still_writes_the_last_checkpoint(
    tiny_train_job, monkeypatch, stop_signal
):
    """training.md#pre-emption: SIGTERM or a first Ctrl-C writes a checkpoint and exits
    cleanly, also after "stopped: reached trainer.max_steps", as the final validation begins
    (with no checkpoint for updates 1-3 yet: each would be lost). The validation is left out,
    and the launcher's handler has the signal only once the checkpoint is written."""

    def died(signum, frame):
        raise Died(signal.Signals(signum).name)

    checkpoint_written_when_passed_on = []

    def launchers_handler(signum, frame):
        """The handler a launcher installed before training (as submitit's): the signal may
        reach it once the checkpoint is written (signals.pass_on), never while validating."""
        written = RunDir(job.run_dir).checkpoints.step_file(3).exists()
        checkpoint_written_when_passed_on.append(written)
        if not written:
            raise Died(signal.Signals(signum).name)

    monkeypatch.setattr(signal, "default_int_handler", died)  # a second Ctrl-C's handler
    previous = signal.signal(stop_signal, launchers_handler)
    validate = Trainer.validate

    def validate_with_a_signal(trainer: Trainer):
        os.kill(os.getpid(), stop_signal)  # delivered before the next line runs
        return validate(trainer)

    monkeypatch.setattr(Trainer, "validate", validate_with_a_signal)
    job = tiny_train_job(
        "trainer.valid_every=0", "trainer.valid_bleu_sentences=2", "trainer.max_steps=3",
        "trainer.checkpoint_every=0", "trainer.checkpoint_every_minutes=0",
    )  # fmt: skip
    try:
        assert step_of(train(job)) == 3
    finally:
        signal.signal(stop_signal, previous)
    assert RunDir(job.run_dir).history()[-1]["how"] == "stop signal"
    # Ctrl-C is never passed on; SIGTERM is, once, after the checkpoint.
    assert checkpoint_written_when_passed_on == ([True] if stop_signal == signal.SIGTERM else [])


def test_a_stop_signal_during_the_final_validation_ends_it_and_the_checkpoint_comes_first(
    tiny_train_job, monkeypatch
):
    """Review t6, D2: a SIGTERM during the final validation used to wait for the validation's
    end before the checkpoint of the last update was written, and a pre-emption's grace period
    shorter than the validation lost every update since the previous checkpoint. Now the signal
    ends the validation where it is: nothing after the signal runs in it, the checkpoint is
    written, and the run is recorded as stopped by the signal during the final validation. The
    same command again validates that update (with nothing left to train) and records it."""
    job = tiny_train_job(
        "trainer.valid_every=0", "trainer.valid_bleu_sentences=2", "trainer.max_steps=3",
        "trainer.checkpoint_every=0", "trainer.checkpoint_every_minutes=0",
    )  # fmt: skip
    measure, after_the_signal = Validator.scores, []

    def scores_with_a_signal(validator: Validator):
        os.kill(os.getpid(), signal.SIGTERM)  # the grace period starts mid-validation
        after_the_signal.append(RunDir(job.run_dir).checkpoints.step_file(3).exists())
        return measure(validator)

    monkeypatch.setattr(Validator, "scores", scores_with_a_signal)
    assert step_of(train(job)) == 3
    assert after_the_signal == []  # the validation went no further than the signal
    end = RunDir(job.run_dir).history()[-1]
    assert end["how"] == "stop signal"
    assert end["reason"].startswith("reached trainer.max_steps=3, then a stop signal (SIGTERM)")
    assert "during the final validation, which was left out" in end["reason"]
    assert end["best"]["step"] is None  # nothing was validated

    monkeypatch.setattr(Validator, "scores", measure)
    assert step_of(train(job)) == 3
    start, end = RunDir(job.run_dir).history()[-2:]
    assert (start["kind"], start["step"], end["how"], end["step"]) == ("resume", 3, "finished", 3)
    assert end["best"]["step"] == 3
    saved = torch.load(RunDir(job.run_dir).checkpoints.last, weights_only=True)["progress"]
    assert (saved["validated_step"], saved["best_step"]) == (3, 3)
