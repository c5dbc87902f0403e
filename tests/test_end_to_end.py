"""train -> checkpoint -> translate -> BLEU on a tiny toy corpus, via the CLI's functions."""

import json
import unicodedata
from pathlib import Path

import pytest
import torch

from transformer_mt.commands.evaluate import evaluate
from transformer_mt.commands.train import train
from transformer_mt.config import compose_job
from transformer_mt.data.store import ParallelTokens
from transformer_mt.data.tokenizer import Tokenizer
from transformer_mt.data.toy import toy_pairs
from transformer_mt.decode.loading import load_translator
from transformer_mt.errors import CheckpointError, ConfigError


@pytest.mark.slow
def test_train_checkpoint_translate_bleu(tiny_train_job, tmp_path):
    # Its duration is printed by `make test` (pytest --durations); no timing assertion here.
    job = tiny_train_job(
        "trainer.max_steps=100", "trainer.valid_every=50", "trainer.checkpoint_every=50"
    )
    checkpoint = train(job)
    assert checkpoint.is_file()
    run_dir = checkpoint.parents[1]
    for name in ("config.yaml", "spm.model", "prepared.json"):
        assert (run_dir / name).is_file(), name
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    logged = set(events.Tags()["scalars"])
    for tag in ("tokens_per_s", "tflops_per_s", "padding", "skipped_updates", "lr", "grad_norm"):
        assert f"train/{tag}" in logged, tag
    assert {"valid/loss", "valid/ppl", "valid/bleu"} <= logged
    assert (run_dir / "checkpoints" / "best.pt").is_file()

    scores = evaluate(compose_job("eval", [f"run_dir={run_dir}", "decode.beam_size=2"]))
    assert scores.sentences == 40
    bleu = scores.sacrebleu
    assert 0.0 <= bleu.bleu <= 100.0 and bleu.bleu_signature.startswith("nrefs:1")
    assert json.loads((run_dir / "scores.test.json").read_text())["bleu"] == bleu.bleu
    assert len((run_dir / "hypotheses.test.txt").read_text().splitlines()) == 40

    translator = load_translator(run_dir)
    outputs = translator.translate(["the dog sees the cat.", "", "the man."])
    assert len(outputs) == 3 and outputs[1] == ""


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
        load_translator(tmp_path, "nope.pt")


def hub_format_corpus(folder, pairs_by_split) -> None:
    """A local folder laid out like the hub's wmt/wmt14 repository (parquet per config)."""
    import datasets

    (folder / "de-en").mkdir(parents=True)
    for split, pairs in pairs_by_split.items():
        rows = {"translation": [{"en": en, "de": de} for en, de in pairs]}
        datasets.Dataset.from_dict(rows).to_parquet(
            str(folder / "de-en" / f"{split}-00000-of-00001.parquet")
        )
    files = "".join(f"  - split: {split}\n    path: de-en/{split}-*\n" for split in pairs_by_split)
    (folder / "README.md").write_text(
        f"---\nconfigs:\n- config_name: de-en\n  data_files:\n{files}---\n"
    )


@pytest.mark.slow
@pytest.mark.parametrize("src_lang,tgt_lang", [("en", "de"), ("de", "en")])
def test_wmt14_preset_through_datasets_end_to_end(tiny_train_job, tmp_path, src_lang, tgt_lang):
    pairs = toy_pairs(700, seed=9)
    hub_format_corpus(
        tmp_path / "hub", {"train": pairs[:600], "validation": pairs[600:650], "test": pairs[650:]}
    )
    job = tiny_train_job(
        "data=wmt14_en_de",
        f"data.hf_path={tmp_path / 'hub'}",
        f"data.src_lang={src_lang}",
        f"data.tgt_lang={tgt_lang}",
        "data.vocab_size=400",
        "trainer.max_steps=5",
    )
    run_dir = train(job).parents[1]
    prepared = ParallelTokens.load(
        Path(json.loads((run_dir / "prepared.json").read_text())["folder"]), "train"
    )
    tokenizer = Tokenizer(run_dir / "spm.model")
    first_source = tokenizer.decode([prepared.src[0].tolist()])[0]
    sources = {en if src_lang == "en" else de for en, de in pairs[:600]}
    assert first_source in sources
    scores = evaluate(compose_job("eval", [f"run_dir={run_dir}", "decode=greedy"]))
    assert scores.sentences == 50


@pytest.mark.slow
def test_separate_vocabularies_train_and_translate(tiny_train_job):
    job = tiny_train_job("data.shared_vocab=false", "data.vocab_size=400", "trainer.max_steps=5")
    run_dir = train(job).parents[1]
    assert (run_dir / "spm.src.model").is_file() and (run_dir / "spm.tgt.model").is_file()
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert state["src_vocab_size"] == 400 and "src_embed.weight" in state["model"]
    translator = load_translator(run_dir)
    assert translator.backend.model.src_embed is not None
    assert len(translator.translate(["the dog sees the cat.", ""])) == 2


@pytest.mark.slow
def test_translator_normalises_input_like_the_training_data(tiny_train_job):
    run_dir = train(tiny_train_job("trainer.max_steps=2")).parents[1]
    translator = load_translator(
        run_dir, decode=compose_job("eval", ["run_dir=x", "decode=greedy"]).decode
    )
    sentence = "Die Bäume über dem Fluß."
    nfd = unicodedata.normalize("NFD", sentence)
    assert nfd != sentence
    assert translator.translate([nfd]) == translator.translate([sentence])


def test_impossible_beam_size_is_named(tiny_train_job):
    run_dir = train(tiny_train_job("trainer.max_steps=1")).parents[1]
    decode = compose_job("eval", ["run_dir=x", "decode.beam_size=0"]).decode
    with pytest.raises(ConfigError, match="decode.beam_size"):
        load_translator(run_dir, decode=decode)
