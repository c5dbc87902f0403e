"""Training on several corpora: a resume is bitwise, and the history says what each gave."""

from __future__ import annotations

import json

import pytest
import torch
from test_resume import assert_same_tensors

from transformer_mt.commands.train import train
from transformer_mt.errors import ConfigError

# The main toy corpus and a second one, upsampled 1.5x and tagged: an epoch of about 500 pairs,
# 23 updates of 1,200 target tokens, so that 26 updates cross into the second epoch (another
# random half of the second corpus's extra share).
TWO_CORPORA = [
    "data.toy_sizes=[200,40,40]",
    '+data.corpora.bt={toy_seed:2,toy_sizes:[200,1,1],weight:1.5,tag:"<BT>"}',
    "trainer.valid_every=0",
    "trainer.valid_bleu_sentences=0",
]


def load(path):
    return torch.load(path, weights_only=True)


@pytest.mark.parametrize(
    ("sampling", "updates"),
    [
        pytest.param([], (26, 11), id="best segmentations"),
        # Each epoch reads each pair in one of 3 sampled segmentations (drawn again each epoch),
        # longer than the best: 25 updates an epoch, so 30 cross into the second.
        pytest.param(
            ["data.src_subword_alpha=0.1", "data.tgt_subword_alpha=0.1", "data.subword_samples=3"],
            (30, 13),
            id="sampled segmentations",
        ),
    ],
)
def test_a_resume_with_two_corpora_is_bitwise_the_uninterrupted_run(
    tiny_train_job, tmp_path, sampling, updates
):
    steps = [f"trainer.max_steps={n}" for n in updates]
    corpora = [*TWO_CORPORA, *sampling]
    straight = load(train(tiny_train_job(*corpora, steps[0], f"run_dir={tmp_path / 'a'}")))
    train(tiny_train_job(*corpora, steps[1], f"run_dir={tmp_path / 'b'}"))
    resumed = load(train(tiny_train_job(*corpora, steps[0], f"run_dir={tmp_path / 'b'}")))
    assert straight["progress"]["epoch"] == resumed["progress"]["epoch"] == 1
    assert_same_tensors(straight["model"], resumed["model"], "model")
    assert_same_tensors(straight["optimizer"], resumed["optimizer"], "optimizer")
    history = [
        json.loads(line) for line in (tmp_path / "a" / "history.jsonl").read_text().splitlines()
    ]
    epochs = [record for record in history if record["event"] == "epoch"]
    assert [record["epoch"] for record in epochs] == [0, 1]
    for record in epochs:
        counts = record["corpora"]
        assert list(counts) == ["toy", "bt"]
        assert counts["toy"]["pairs"] == 200 and counts["bt"]["pairs"] == 300
        assert counts["bt"]["src_tokens"] > 300  # every source holds the tag


def test_a_changed_weight_is_refused_on_resume_unless_forced(tiny_train_job):
    train(tiny_train_job(*TWO_CORPORA, "trainer.max_steps=1"))
    heavier = '+data.corpora.bt={toy_seed:2,toy_sizes:[200,1,1],weight:3,tag:"<BT>"}'
    changed = [*TWO_CORPORA[:1], heavier, *TWO_CORPORA[2:], "trainer.max_steps=2"]
    try:
        train(tiny_train_job(*changed))
    except ConfigError as refused:
        assert "data.corpora.bt.weight: 1.5 → 3" in str(refused)
    else:
        raise AssertionError("a resume with another weight was not refused")
    assert load(train(tiny_train_job(*changed, "trainer.resume=force")))["step"] == 2
