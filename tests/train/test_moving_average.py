"""The moving average of the weights (trainer.ema_decay): its update rule, its place in the
checkpoint, a bitwise resume, validation and decoding with it by default (weights=raw: the
weights as trained), and what tmt-average averages."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from transformer_mt.checkpoint import load_checkpoint
from transformer_mt.commands.average import average
from transformer_mt.commands.train import train
from transformer_mt.config import Weights, compose_job
from transformer_mt.decode.loading import load_translator
from transformer_mt.errors import CheckpointError, ConfigError
from transformer_mt.train.moving_average import WeightAverage

QUICK = ["trainer.valid_every=0", "trainer.valid_bleu_sentences=0", "trainer.log_every=1"]


def test_the_average_follows_the_weights_with_a_warmed_up_decay():
    layer = nn.Linear(3, 2)
    average = WeightAverage(layer, decay=0.99)
    history = []
    for value in (1.0, 2.0, 4.0, 8.0):
        with torch.no_grad():
            layer.weight.fill_(value)
        average.update(layer)
        history.append(value)
    expected = history[0]  # the first update copies
    for n, value in enumerate(history[1:], start=1):
        decay = min(0.99, (1 + n) / (10 + n))
        expected = decay * expected + (1 - decay) * value
    assert average.updates == 4
    assert torch.allclose(average.model.weight, torch.full((2, 3), expected), atol=1e-6)
    assert torch.equal(average.model.bias, layer.bias)  # untouched values move nowhere


class TwoRanks:
    """Ranks.gather of two ranks, the second holding `other` (None: the same as the first)."""

    def __init__(self, other: torch.Tensor | None):
        self.other = other

    def gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        return [tensor, tensor.clone() if self.other is None else self.other]


def test_the_state_holds_each_rank_s_digest_and_refuses_averages_that_differ():
    layer = nn.Linear(3, 2)
    average = WeightAverage(layer, decay=0.9)
    average.update(layer)
    state = average.state(TwoRanks(None))
    assert len(state.rank_digests) == 2 and torch.equal(*state.rank_digests)
    with pytest.raises(CheckpointError, match=r"rank\(s\) \[1\] differs from rank 0's"):
        average.state(TwoRanks(torch.zeros(2, dtype=torch.float64)))


def test_every_checkpoint_holds_the_average_and_a_resume_continues_it_bitwise(
    tiny_train_job, tmp_path
):
    settings = ["trainer.ema_decay=0.9", *QUICK]
    straight = load_checkpoint(
        train(tiny_train_job("trainer.max_steps=6", f"run_dir={tmp_path / 'a'}", *settings))
    )
    train(tiny_train_job("trainer.max_steps=3", f"run_dir={tmp_path / 'b'}", *settings))
    resumed = load_checkpoint(
        train(tiny_train_job("trainer.max_steps=6", f"run_dir={tmp_path / 'b'}", *settings))
    )
    assert straight["ema_updates"] == resumed["ema_updates"] == 6
    for name, tensor in straight["ema_model"].items():
        assert torch.equal(tensor, resumed["ema_model"][name]), name
    moved = [
        n for n, t in straight["ema_model"].items() if not torch.equal(t, straight["model"][n])
    ]
    assert moved  # an average, not a copy of the last weights


def test_a_resume_with_another_decay_is_refused_by_its_key_unless_forced(tiny_train_job, tmp_path):
    run = f"run_dir={tmp_path / 'run'}"
    train(tiny_train_job("trainer.max_steps=2", "trainer.ema_decay=0.9", run, *QUICK))
    again = ["trainer.max_steps=3", "trainer.ema_decay=0.5", run, *QUICK]
    with pytest.raises(ConfigError, match="trainer.ema_decay"):
        train(tiny_train_job(*again))
    resumed = load_checkpoint(train(tiny_train_job(*again, "trainer.resume=force")))
    assert resumed["ema_updates"] == 3  # the average goes on, with the new decay


def test_decoding_uses_the_average_unless_told_raw_and_validation_scores_it(
    tiny_train_job, tmp_path
):
    run = tmp_path / "run"
    path = train(
        tiny_train_job(
            "trainer.max_steps=4",
            "trainer.ema_decay=0.5",
            f"run_dir={run}",
            "trainer.valid_every=2",
            "trainer.valid_bleu_sentences=0",
        )
    )
    state = load_checkpoint(path)
    for weights, key in ((Weights.auto, "ema_model"), (Weights.raw, "model")):
        translator = load_translator(run, device="cpu", weights=weights)
        model = translator.backend.model
        for name, tensor in model.state_dict().items():
            assert torch.equal(tensor, state[key][name]), (weights, name)
    raw = compose_job("translate", [f"run_dir={run}", "weights=raw", "device=cpu"])
    assert raw.weights == Weights.raw
    plain = train(tiny_train_job("trainer.max_steps=1", f"run_dir={tmp_path / 'plain'}", *QUICK))
    with pytest.raises(CheckpointError, match="'weights': ema, but the checkpoint has no moving"):
        load_translator(plain.parents[1], device="cpu", weights=Weights.ema)


def test_tmt_average_averages_the_moving_averages_and_says_so(tiny_train_job, tmp_path):
    run = tmp_path / "run"
    train(
        tiny_train_job(
            "trainer.max_steps=4",
            "trainer.checkpoint_every=1",
            "trainer.checkpoint_min_seconds=0",
            "trainer.ema_decay=0.5",
            f"run_dir={run}",
            *QUICK,
        )
    )
    for weights, key, said in (
        ("auto", "ema_model", "moving average"),
        ("raw", "model", "as trained"),
    ):
        average(compose_job("average", [f"run_dir={run}", "last=2", f"weights={weights}"]))
        averaged = load_checkpoint(run / "checkpoints" / "averaged.pt")
        newest = [load_checkpoint(run / "checkpoints" / f"step_{n}.pt") for n in (3, 4)]
        assert averaged["averaged_weights"] == said
        for name, tensor in averaged["model"].items():
            if tensor.is_floating_point():
                mean = (newest[0][key][name].double() + newest[1][key][name].double()) / 2
                assert torch.allclose(tensor.double(), mean, atol=1e-6), name


def test_a_decay_outside_zero_to_one_is_refused_by_key(tiny_train_job):
    with pytest.raises(ConfigError, match="'trainer.ema_decay': must be in \\[0, 1\\)"):
        train(tiny_train_job("trainer.ema_decay=1.0"))
