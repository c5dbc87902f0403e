"""The throughput a log line reports (tok/s, TFLOP/s, MFU) is the training's: the time spent
validating and checkpointing in its window is left out."""

from __future__ import annotations

from transformer_mt.commands.train import train
from transformer_mt.train import checkpointer as checkpointer_module
from transformer_mt.train import monitor
from transformer_mt.train import trainer as trainer_module
from transformer_mt.train.checkpointer import Checkpointer
from transformer_mt.train.monitor import WindowStats
from transformer_mt.train.trainer import Trainer


class FakeClock:
    """time.perf_counter and time.monotonic, moved on only by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now


def test_validation_and_checkpoints_do_not_lower_the_throughput_of_their_window(
    tiny_train_job, monkeypatch
):
    clock = FakeClock()
    monkeypatch.setattr(trainer_module, "time", clock)
    monkeypatch.setattr(monitor, "time", clock)
    monkeypatch.setattr(checkpointer_module, "time", clock)
    train_step, validate, save = Trainer.train_step, Trainer.validate, Checkpointer.save

    def one_second_update(self, *args):
        stats = train_step(self, *args)
        clock.now += 1.0
        return stats

    def slow_validation(self):
        judged = validate(self)
        clock.now += 50.0
        return judged

    def slow_save(self, *args, **kwargs):
        path = save(self, *args, **kwargs)
        clock.now += 100.0
        return path

    monkeypatch.setattr(Trainer, "train_step", one_second_update)
    monkeypatch.setattr(Trainer, "validate", slow_validation)
    monkeypatch.setattr(Checkpointer, "save", slow_save)
    windows = []
    window_stats = WindowStats.of

    def recorded(cls, window, seconds, peak_flops, waited=0.0):
        windows.append((len(window), seconds))
        return window_stats(window, seconds, peak_flops, waited)

    monkeypatch.setattr(WindowStats, "of", classmethod(recorded))
    train(
        tiny_train_job(
            "trainer.max_steps=6",
            "trainer.log_every=2",
            "trainer.valid_every=2",
            "trainer.checkpoint_every=2",
            "trainer.checkpoint_every_minutes=0",
            "trainer.valid_bleu_sentences=0",
        )
    )
    # Every window: 2 updates of 1 s; not 2 s + the 150 s of the previous log's validation and
    # checkpoint, which ran after its window had been closed.
    assert windows == [(2, 2.0)] * 3
