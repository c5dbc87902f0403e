"""Resuming a run: exactness, what continues after a layout change, and bad checkpoints."""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import pytest
import torch
from toy_runs import trainer_for

from transformer_mt.checkpoint import Progress
from transformer_mt.checkpoint import format as checkpoint_module  # the module that saves
from transformer_mt.commands.train import train
from transformer_mt.config import Precision
from transformer_mt.errors import CheckpointError, ConfigError
from transformer_mt.train.distributed import Ranks
from transformer_mt.train.loss import TrainingLoss
from transformer_mt.train.schedule import inverse_sqrt_lr
from transformer_mt.train.stopping import StopRules

QUICK = ["trainer.valid_every=0", "trainer.valid_bleu_sentences=0", "trainer.log_every=1"]


def load(path):
    return torch.load(path, weights_only=True)


def assert_same_tensors(a, b, what: str) -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), what
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), what
        for key in a:
            assert_same_tensors(a[key], b[key], f"{what}.{key}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), what
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_tensors(x, y, f"{what}[{index}]")
    else:
        assert a == b, what


@pytest.mark.parametrize("lengths", ["similar", "equal"])
def test_three_steps_stop_resume_three_steps_equals_six_steps(tiny_train_job, tmp_path, lengths):
    """Batches of similar source lengths (the CPU's) and of one source length each (CUDA's)."""
    steps = [f"trainer.max_steps={n}" for n in (6, 3)]
    sources = f"trainer.source_lengths={lengths}"
    straight = load(train(tiny_train_job(steps[0], sources, f"run_dir={tmp_path / 'a'}")))
    train(tiny_train_job(steps[1], sources, f"run_dir={tmp_path / 'b'}"))
    resumed = load(train(tiny_train_job(steps[0], sources, f"run_dir={tmp_path / 'b'}")))
    assert len(resumed["progress"]["layout"]) == (3 if lengths == "equal" else 2)
    assert straight["step"] == resumed["step"] == 6
    assert_same_tensors(straight["model"], resumed["model"], "model")
    assert_same_tensors(straight["optimizer"], resumed["optimizer"], "optimizer")
    assert straight["scheduler"] == resumed["scheduler"]
    assert_same_tensors(straight["rng_cpu"], resumed["rng_cpu"], "rng")


def test_update_count_and_learning_rate_continue_after_resume(tiny_train_job):
    train(tiny_train_job("trainer.max_steps=3", *QUICK))
    state = load(train(tiny_train_job("trainer.max_steps=5", *QUICK)))
    assert state["step"] == 5 and state["scheduler"]["last_epoch"] == 5
    # The rate the next update would use: update 6's, not a restarted warm-up's update 3.
    expected = inverse_sqrt_lr(6, d_model=64, warmup_steps=30, scale=2.0)
    assert state["optimizer"]["param_groups"][0]["lr"] == pytest.approx(expected, rel=1e-12)


def test_another_micro_batch_budget_keeps_the_global_batch_and_the_schedule(tiny_train_job, caplog):
    first = load(train(tiny_train_job("trainer.max_steps=4", *QUICK)))
    world_size, first_micro = first["progress"]["layout"]  # one batch of at most 1,500 tokens
    assert world_size == 1 and 800 < first_micro <= 1500
    fraction = first["progress"]["batch_in_epoch"] / first["progress"]["batches_in_epoch"]
    with caplog.at_level(logging.WARNING):
        second = load(
            train(tiny_train_job("trainer.max_steps=6", "trainer.batch_tokens=800", *QUICK))
        )
    assert "resuming with another layout" in caplog.text
    progress = second["progress"]
    world_size, micro = progress["layout"]
    assert world_size == 1 and micro <= 800
    assert second["step"] == 6 and second["scheduler"]["last_epoch"] == 6
    # Two micro-batches per update now: the same fraction of the epoch, plus 2 updates x 2.
    resumed_at = round(fraction * progress["batches_in_epoch"])
    assert progress["batch_in_epoch"] == resumed_at + 2 * 2


def test_resuming_with_another_model_shape_names_the_key_and_both_values(tiny_train_job):
    train(tiny_train_job("trainer.max_steps=2", *QUICK))
    with pytest.raises(CheckpointError, match=r"model.d_model is 32 in this configuration but 64"):
        train(tiny_train_job("trainer.max_steps=4", "model.d_model=32", *QUICK))


def test_corrupt_newest_checkpoint_falls_back_to_the_previous_one_and_is_kept(
    tiny_train_job, caplog
):
    job = tiny_train_job("trainer.max_steps=4", "trainer.checkpoint_every=2", *QUICK)
    last = train(job)
    folder = last.parent
    assert load(last)["step"] == 4
    data = (folder / "step_4.pt").read_bytes()
    damaged = data[: len(data) // 2]
    (folder / "step_4.pt").write_bytes(damaged)  # last.pt is the same file
    with caplog.at_level(logging.INFO):
        state = load(
            train(tiny_train_job("trainer.max_steps=6", "trainer.checkpoint_every=2", *QUICK))
        )
    assert "step_4.pt: truncated or corrupt" in caplog.text
    assert "resumed from" in caplog.text and "step_2.pt at update 2" in caplog.text
    assert "kept the damaged step_4.pt aside as step_4.damaged.pt" in caplog.text
    assert state["step"] == 6
    # The run wrote its own step_4.pt again; the damaged file is kept, byte for byte.
    assert (folder / "step_4.damaged.pt").read_bytes() == damaged
    assert load(folder / "step_4.pt")["step"] == 4


def file_bytes(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    ("failure", "said"),
    [
        (OSError(errno.EIO, "Input/output error"), "Input/output error, EIO"),
        (MemoryError(), "out of memory"),
    ],
)
def test_a_newest_checkpoint_that_cannot_be_read_now_stops_the_run_changing_nothing(
    tiny_train_job, tmp_path, monkeypatch, failure, said
):
    job = tiny_train_job("trainer.max_steps=4", "trainer.checkpoint_every=2", *QUICK)
    newest = train(job).parent / "step_4.pt"
    before = file_bytes(tmp_path)  # the run folder and the prepared data
    real_load = torch.load

    def failing_on_newest(path, *args, **kwargs):
        if Path(path) == newest:
            raise failure
        return real_load(path, *args, **kwargs)

    monkeypatch.setattr(checkpoint_module.torch, "load", failing_on_newest)
    with pytest.raises(CheckpointError) as stopped:
        train(tiny_train_job("trainer.max_steps=6", "trainer.checkpoint_every=2", *QUICK))
    assert str(stopped.value) == (
        f"{newest}: could not be read ({said}); the file is left as it is: rerun once it can "
        "be read"
    )
    assert file_bytes(tmp_path) == before


def test_a_file_that_is_not_our_checkpoint_is_refused_clearly(tiny_train_job, tmp_path):
    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    torch.save({"weights": torch.zeros(2)}, folder / "last.pt")
    with pytest.raises(CheckpointError, match="no readable checkpoint.*not a transformer_mt"):
        train(tiny_train_job("trainer.max_steps=2", *QUICK))


def test_failed_checkpoint_write_keeps_the_previous_one(tiny_train_job, monkeypatch):
    last = train(tiny_train_job("trainer.max_steps=2", *QUICK))
    real_save = torch.save

    def disk_fills_up(obj, handle, *args, **kwargs):  # save_checkpoint passes an open file
        real_save(obj, handle, *args, **kwargs)
        handle.truncate(1000)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint_module.torch, "save", disk_fills_up)
    with pytest.raises(CheckpointError, match=r"step_4.pt \(.*No space left.*previous checkpoint"):
        train(tiny_train_job("trainer.max_steps=4", *QUICK))
    monkeypatch.setattr(checkpoint_module.torch, "save", real_save)
    assert load(last)["step"] == 2
    assert not list(last.parent.glob(".*.tmp"))


def test_non_finite_updates_are_skipped_then_stop_the_run(tiny_train_job, monkeypatch, caplog):
    real_loss = TrainingLoss.forward
    calls = {"n": 0}

    def loss_that_overflows_from_the_third_update(*args, **kwargs):
        calls["n"] += 1
        sums = real_loss(*args, **kwargs)
        if calls["n"] >= 3:
            sums = sums._replace(loss=sums.loss * float("inf"))
        return sums

    monkeypatch.setattr(TrainingLoss, "forward", loss_that_overflows_from_the_third_update)
    job = tiny_train_job(
        "trainer.max_steps=50",
        "trainer.checkpoint_every=2",
        "trainer.max_nonfinite_updates=3",
        *QUICK,
    )
    with caplog.at_level(logging.INFO):
        last = train(job)
    state = load(last)
    assert "3 updates in a row had a non-finite gradient" in caplog.text
    assert state["step"] == 5 and state["progress"]["skipped_updates"] == 3
    # The skipped updates changed neither the parameters nor Adam's moments.
    after_two = load(last.parent / "step_2.pt")
    assert_same_tensors(after_two["model"], state["model"], "model")
    assert_same_tensors(after_two["optimizer"]["state"], state["optimizer"]["state"], "optimizer")


def test_resume_never_refuses_to_start_over_checkpoints(tiny_train_job):
    train(tiny_train_job("trainer.max_steps=1", *QUICK))
    with pytest.raises(ConfigError, match="trainer.resume=never"):
        train(tiny_train_job("trainer.max_steps=2", "trainer.resume=never", *QUICK))


def test_patience_stops_when_validation_bleu_does_not_improve(tiny_train_job, caplog):
    job = tiny_train_job(
        "trainer.max_steps=50",
        "optim.lr_scale=1e-9",  # nothing is learnt: BLEU stays where it was
        "trainer.valid_every=2",
        "trainer.valid_bleu_sentences=10",
        "trainer.patience=2",
        "trainer.log_every=1",
    )
    with caplog.at_level(logging.INFO):
        last = train(job)
    assert "no better validation score in 2 validations" in caplog.text
    assert "BLEU" in caplog.text
    assert load(last)["step"] == 6
    assert load(last.parent / "best.pt")["step"] == 2


def test_max_epochs_ends_the_data_with_the_epoch_and_names_the_reason(tiny_train_job):
    """The last update of the last epoch holds the micro-batches left (none taken from the
    next epoch); the run stops there, saved at the start of the next epoch."""
    job = tiny_train_job(
        "data.toy_sizes=[300,40,40]",
        "trainer.batch_tokens=600",  # 3 micro-batches an update
        "trainer.max_steps=0",
        "trainer.max_epochs=1",
        *QUICK,
    )
    state = load(train(job))
    trainer = trainer_for(job)
    trainer.metrics.close()
    accumulation, progress = trainer.plan.accumulation, state["progress"]
    assert progress["batches_in_epoch"] % accumulation  # so the last update is a short one
    assert state["step"] == -(-progress["batches_in_epoch"] // accumulation)
    assert (progress["epoch"], progress["batch_in_epoch"]) == (1, 0)
    assert trainer.run.history()[-1]["reason"] == "reached trainer.max_epochs=1"


def test_time_based_checkpoints(tiny_train_job):
    job = tiny_train_job(
        "trainer.max_steps=3",
        "trainer.checkpoint_every=1000",
        "trainer.checkpoint_every_minutes=0.00001",  # due after every update
        *QUICK,
    )
    folder = train(job).parent
    assert sorted(p.name for p in folder.glob("step_*.pt")) == [
        "step_1.pt",
        "step_2.pt",
        "step_3.pt",
    ]


def test_fp16_trains_with_a_gradient_scaler_whose_state_is_saved(tiny_train_job):
    state = load(train(tiny_train_job("trainer.max_steps=3", "trainer.precision=fp16", *QUICK)))
    assert state["step"] == 3
    assert state["scaler"]["scale"] > 0 and state["scaler"]["_growth_tracker"] == 3


def set_scale(scaler: torch.amp.GradScaler, scale: float) -> None:
    scaler.load_state_dict({**scaler.state_dict(), "scale": scale})


def test_fp16_skips_while_the_scale_calibrates_and_stops_only_when_it_collapses(tiny_train_job):
    # fp16 on a CPU is slow: the rule is checked on a Trainer's scaler directly.
    job = tiny_train_job("trainer.precision=fp16", "trainer.max_nonfinite_updates=10")
    trainer = trainer_for(job)
    trainer.metrics.close()
    rules = trainer.stop_rules  # reading the trainer's scaler
    assert trainer.scaler.is_enabled()
    set_scale(trainer.scaler, 16.0)  # where 12 overflows in a row take 65536
    rules.check_gradients(in_a_row=12)
    assert rules.reason(trainer.progress) is None
    set_scale(trainer.scaler, 6.1e-5)
    rules.check_gradients(in_a_row=30)
    assert "the fp16 loss scale fell to 6.1e-05" in rules.reason(trainer.progress)
    fp32 = tiny_train_job("trainer.max_nonfinite_updates=10").trainer
    rules = StopRules(fp32, Ranks(), torch.amp.GradScaler("cpu", enabled=False))
    rules.check_gradients(in_a_row=9)
    assert rules.reason(Progress()) is None
    rules.check_gradients(in_a_row=10)
    assert "10 updates in a row" in rules.reason(Progress())


def test_a_run_records_what_it_trained_in_and_a_resume_keeps_it(tiny_train_job):
    """A run trained in bf16 (trainer.precision=bf16, or auto on a GPU) says so in its
    checkpoints, in trainer.precision's own words. Where auto gives fp32 (the run moved to a CPU)
    the resume is refused, naming the setting that goes on in bf16; with it, it does."""
    first = load(train(tiny_train_job("trainer.precision=bf16", "trainer.max_steps=2", *QUICK)))
    assert first["precision"] == Precision.bf16.value
    with pytest.raises(ConfigError, match="trainer.precision=bf16 to go on in what it trained in"):
        train(tiny_train_job("trainer.precision=auto", "trainer.max_steps=3", *QUICK))
    resumed = load(train(tiny_train_job("trainer.precision=bf16", "trainer.max_steps=3", *QUICK)))
    assert (resumed["step"], resumed["precision"]) == (3, Precision.bf16.value)
