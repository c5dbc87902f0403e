"""Validation BLEU scores the valid split as read, as tmt-eval scores the test split."""

from types import SimpleNamespace

import pytest
import torch

from transformer_mt import execution
from transformer_mt.commands.train import train, valid_bleu
from transformer_mt.decode.translator import Translator
from transformer_mt.execution import ExecutionPolicy
from transformer_mt.run_dir import RunDir


def test_validation_bleu_translates_raw_sources_and_scores_raw_references(
    tiny_train_job, monkeypatch
):
    job = tiny_train_job("trainer.valid_bleu_sentences=2")
    raw = ["Cafe\u0301 \u2026 und Tee.", "Ein  Hund.", "Nicht gelesen."]  # NFD é, two spaces
    asked = []
    data = SimpleNamespace(
        valid_text=lambda count: asked.append(count) or (raw[:count], raw[:count]),
        tokenizers=None,
    )
    monkeypatch.setattr(
        Translator, "for_model", lambda *args, **kwargs: Translator.__new__(Translator)
    )
    monkeypatch.setattr(
        Translator, "translate", lambda self, sentences, decode=None: list(sentences)
    )
    policy = ExecutionPolicy.for_training(job.trainer, torch.device("cpu"))
    bleu = valid_bleu(job, data, policy)(None)
    assert asked == [2]
    assert bleu == 100.0  # an echo of the raw sources matches the raw references exactly


@pytest.mark.parametrize(
    ("trainer", "decode", "searched"),
    [("fp32", "decode.precision=bf16", "fp32"), ("bf16", "decode.quantize=int8", "bf16")],
)
def test_validation_searches_in_what_the_training_step_computes_in(
    tiny_train_job, monkeypatch, trainer, decode, searched
):
    """Issue 66: validation BLEU searched with the decode group's settings (decode.precision=auto
    was bf16 on a CPU with native bf16 while training computed in fp32), so best.pt depended on
    the machine. Now it searches as the training step computes, on the weights as trained
    (whatever decode.precision and decode.quantize say), and the end record names it."""
    monkeypatch.setattr(execution, "cpu_multiplies_bf16", lambda: True)  # as on such a CPU
    job = tiny_train_job(
        f"trainer.precision={trainer}",
        decode,
        "trainer.max_steps=2",
        "trainer.valid_every=0",
        "trainer.valid_bleu_sentences=2",
    )
    used, for_model = [], Translator.for_model

    def recorded(model, tokenizers, settings, device, **options):
        used.append(settings)
        return for_model(model, tokenizers, settings, device, **options)

    monkeypatch.setattr(Translator, "for_model", recorded)
    train(job)
    assert [(d.precision.value, d.quantize.value) for d in used] == [(searched, "none")]
    end = RunDir(job.run_dir).history()[-1]
    assert end["best"]["metric"] == "valid BLEU" and end["best"]["precision"] == searched
