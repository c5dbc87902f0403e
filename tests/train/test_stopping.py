"""StopRules, the one place that says why a run ends: each reason by itself, the order in which
they are named where several hold, and the clock and signals as a lone process agrees them."""

from __future__ import annotations

import signal

import pytest
import torch

from transformer_mt.checkpoint import DataPosition, Progress, UpdateCounts
from transformer_mt.config import TrainerConfig
from transformer_mt.train.distributed import Ranks
from transformer_mt.train.signals import StopSignals
from transformer_mt.train.stopping import StopRules

SETTINGS = TrainerConfig(max_steps=10, max_epochs=3, max_time_minutes=1.0, patience=2)
REASONS = {  # what each rule's state is when it holds, in the order the rules are named
    "stop signal": {"signalled": True},
    "no better validation score in 2 validations": {"exhausted": True},
    "diverged": {"diverged": "diverged"},
    "reached trainer.max_steps=10": {"step": 10},
    "reached trainer.max_epochs=3": {"epoch": 3},
    "reached trainer.max_time_minutes=1.0": {"out_of_time": True},
}


def rules_and_progress(holding: dict) -> tuple[StopRules, Progress]:
    rules = StopRules(SETTINGS, Ranks(), torch.amp.GradScaler("cpu", enabled=False))
    progress = Progress(UpdateCounts(step=holding.get("step", 0)))
    progress.position = DataPosition(epoch=holding.get("epoch", 0))
    for name in ("signalled", "exhausted", "diverged", "out_of_time"):
        if name in holding:
            setattr(rules, name, holding[name])
    return rules, progress


@pytest.mark.parametrize("first", range(len(REASONS)))
def test_the_first_reason_that_holds_is_named(first):
    named = list(REASONS)
    holding = {key: value for reason in named[first:] for key, value in REASONS[reason].items()}
    rules, progress = rules_and_progress(holding)
    assert rules.reason(progress).startswith(named[first])
    assert rules_and_progress({})[0].reason(Progress()) is None


def test_a_lone_process_agrees_on_its_own_clock_and_signal_after_each_update():
    rules, _ = rules_and_progress({})
    rules.start(train_seconds=0.0)
    assert not rules.agree(step=1, train_seconds=59.0, checkpoint_due=False)
    assert rules.reason(Progress()) is None
    assert rules.agree(step=2, train_seconds=60.0, checkpoint_due=True)  # rank 0's clock
    assert rules.reason(Progress()) == "reached trainer.max_time_minutes=1.0"
    rules.signals.received = "SIGTERM"
    rules.agree(step=3, train_seconds=61.0, checkpoint_due=False)
    assert rules.reason(Progress()) == "stop signal (SIGTERM)"
    assert rules.epoch_limit == 3  # where the training batches end


def test_sighup_is_a_stop_signal_unless_nohup_ignores_it():
    """A closing terminal's SIGHUP stops the run with a checkpoint, as SIGTERM does; under
    `nohup`, which ignores it so that the command outlives the terminal, it stays ignored."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        with StopSignals() as caught:
            assert signal.getsignal(signal.SIGHUP) == caught.handle
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nohup
        with StopSignals():
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) != signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)
