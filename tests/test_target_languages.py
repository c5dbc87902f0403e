"""A model trained into several target languages: each translation names its language
(decode.tgt_lang), whose tag goes first before the source, in the library, tmt-eval (one score
per language pair), tmt-serve and validation; a one-direction model asks for nothing new."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pytest

from transformer_mt.commands.evaluate import evaluate_pairs
from transformer_mt.commands.train import train
from transformer_mt.config import compose_job
from transformer_mt.decode.loading import load_translator
from transformer_mt.errors import ConfigError

LINES = [f"the house number {i} is small" for i in range(40)]
GERMAN = [f"das Haus Nummer {i} ist klein" for i in range(40)]


def write_pair(folder: Path, split: str, count: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{split}.en").write_text("".join(f"{line}\n" for line in LINES[:count]), "utf-8")
    (folder / f"{split}.de").write_text("".join(f"{line}\n" for line in GERMAN[:count]), "utf-8")


@pytest.fixture(scope="module")
def both_ways(tmp_path_factory):
    """A tiny model of English→German and German→English from the same files (one update, and
    validation BLEU on both pairs at the end), and its training log."""
    folder = tmp_path_factory.mktemp("both-ways")
    data = folder / "data"
    for split, count in (("train", 40), ("valid", 6), ("test", 5)):
        write_pair(data, split, count)
    job = compose_job(
        "train",
        [
            "data=files",
            f"data.dir={data}",
            "data.src_lang=en",
            "data.tgt_lang=de",
            "data.vocab_size=300",
            "+data.corpora.back={src_lang:de,tgt_lang:en}",
            "model=tiny",
            "trainer.max_steps=1",
            "trainer.batch_tokens=1000",
            "trainer.valid_bleu_sentences=3",
            "decode.max_len_a=0",
            "decode.max_len_b=4",
            "trainer.progress_bar=false",
            "trainer.loader_workers=0",
            f"run_dir={folder / 'run'}",
            f"data.prepared_dir={folder / 'prepared'}",
        ],
    )
    package = logging.getLogger("transformer_mt")
    level = package.level
    package.setLevel(logging.INFO)  # train.log gets the info lines, as under the CLI
    try:
        run = train(job).parents[1]
    finally:
        package.setLevel(level)
    return run, (run / "train.log").read_text(encoding="utf-8")


SHORT = ["decode.max_len_a=0", "decode.max_len_b=4", "device=cpu"]


def test_a_translation_names_its_language_and_its_tag_goes_first(both_ways):
    run, _ = both_ways
    translator = load_translator(run, device="cpu")
    assert translator.target_languages == ["de", "en"]
    processor = translator.tokenizers.src.processor
    for language in ("de", "en"):
        decode = dataclasses.replace(translator.decode, tgt_lang=language)
        ids = translator.encode(["the house", ""], decode)
        assert ids[0][0] == processor.piece_to_id(f"<2{language}>") and ids[1] == []
        assert len(translator.translate(["the house"], decode=decode)) == 1
    for language, said in ((None, "no language was named"), ("fr", "not into fr")):
        decode = dataclasses.replace(translator.decode, tgt_lang=language)
        with pytest.raises(ConfigError) as refused:
            translator.translate(["the house"], decode=decode)
        assert "config key 'decode.tgt_lang'" in str(refused.value) and said in str(refused.value)


def test_eval_scores_each_language_pair(both_ways):
    run, _ = both_ways
    job = compose_job("eval", [f"run_dir={run}", "decode=greedy", *SHORT])
    reports = evaluate_pairs(job)
    assert [report.language_pair for report in reports] == ["en-de", "de-en"]
    for report in reports:
        pair = report.language_pair
        scores = json.loads((run / f"scores.test.{pair}.json").read_text())
        assert scores["language_pair"] == pair and scores["sentences"] == 5
        assert scores["decode"]["tgt_lang"] == pair.split("-")[1]
        assert len((run / f"hypotheses.test.{pair}.txt").read_text().splitlines()) == 5
    assert not (run / "scores.test.json").exists()


def test_validation_scores_each_language_pair(both_ways):
    _, log = both_ways
    assert "valid BLEU by pair: en-de" in log and "de-en" in log


def test_the_server_takes_the_language_of_each_request(both_ways):
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    from fastapi.testclient import TestClient

    from transformer_mt.config import ServeJob
    from transformer_mt.serve.app import create_app

    run, _ = both_ways
    translator = load_translator(run, device="cpu")
    limits = ServeJob(run_dir=str(run), decode=translator.decode)
    with TestClient(create_app(translator, limits)) as client:
        assert client.get("/health").json()["target_languages"] == ["de", "en"]
        answered = client.post("/translate", json={"text": "the house", "tgt_lang": "de"})
        assert answered.status_code == 200, answered.text
        assert answered.json()["decode"]["tgt_lang"] == "de"
        for body in ({"text": "the house"}, {"text": "the house", "tgt_lang": "fr"}):
            refused = client.post("/translate", json=body)
            assert refused.status_code == 422 and "decode.tgt_lang" in refused.json()["detail"]


def test_a_one_direction_model_asks_for_nothing_new(one_update_run):
    translator = load_translator(one_update_run, device="cpu")
    assert translator.target_languages == ["de"]
    for language in (None, "de"):
        decode = dataclasses.replace(translator.decode, tgt_lang=language, max_len_b=3)
        assert len(translator.translate(["a dog"], decode=decode)) == 1
    with pytest.raises(ConfigError, match="translates into de only, not fr"):
        translator.translate(
            ["a dog"], decode=dataclasses.replace(translator.decode, tgt_lang="fr")
        )
