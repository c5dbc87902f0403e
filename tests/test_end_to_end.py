"""train -> checkpoint -> translate -> BLEU on a tiny toy corpus, via the CLI's functions."""

import json
import time

import pytest
import torch

from transformer_mt.config import compose_job
from transformer_mt.decode.translator import Translator
from transformer_mt.errors import CheckpointError
from transformer_mt.evaluate import evaluate
from transformer_mt.train.trainer import train


@pytest.mark.slow
def test_train_checkpoint_translate_bleu_under_a_minute(tiny_train_job, tmp_path):
    started = time.perf_counter()
    job = tiny_train_job()
    checkpoint = train(job)
    assert checkpoint.is_file()
    run_dir = checkpoint.parents[1]
    for name in ("config.yaml", "spm.model", "data/stats.json"):
        assert (run_dir / name).is_file(), name
    assert any((run_dir / "tensorboard").iterdir())

    scores = evaluate(compose_job("eval", [f"run_dir={run_dir}", "decode.beam_size=2"]))
    assert scores["sentences"] == 40
    assert 0.0 <= scores["bleu"] <= 100.0 and scores["bleu_signature"].startswith("nrefs:1")
    assert json.loads((run_dir / "scores.test.json").read_text())["bleu"] == scores["bleu"]
    assert len((run_dir / "hypotheses.test.txt").read_text().splitlines()) == 40

    translator = Translator.from_run(run_dir)
    outputs = translator.translate(["the dog sees the cat.", "", "the man."])
    assert len(outputs) == 3 and outputs[1] == ""
    assert time.perf_counter() - started < 60


@pytest.mark.slow
def test_rerun_resumes_instead_of_starting_over(tiny_train_job):
    job = tiny_train_job("trainer.max_steps=20", "trainer.checkpoint_every=10")
    checkpoint = train(job)
    first = torch.load(checkpoint, weights_only=True)
    assert first["step"] == 20
    checkpoint = train(tiny_train_job("trainer.max_steps=30", "trainer.checkpoint_every=10"))
    second = torch.load(checkpoint, weights_only=True)
    assert second["step"] == 30
    assert second["scheduler"]["last_epoch"] == 30


def test_missing_checkpoint_is_named(tmp_path):
    with pytest.raises(CheckpointError, match="nope.pt: checkpoint not found"):
        Translator.from_run(tmp_path, "nope.pt")
