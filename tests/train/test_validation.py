"""Validation BLEU scores the valid split as read, as tmt-eval scores the test split."""

from types import SimpleNamespace

import torch

from transformer_mt.commands.train import valid_bleu
from transformer_mt.decode.translator import Translator


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
    monkeypatch.setattr(Translator, "translate", lambda self, sentences: list(sentences))
    bleu = valid_bleu(job, data, torch.device("cpu"))(None)
    assert asked == [2]
    assert bleu == 100.0  # an echo of the raw sources matches the raw references exactly
