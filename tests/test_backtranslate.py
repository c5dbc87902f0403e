"""tmt-backtranslate: a synthetic corpus in chunks, continued after a kill or a full disk."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from transformer_mt.commands import backtranslate as module
from transformer_mt.commands.backtranslate import backtranslate
from transformer_mt.config import compose_job
from transformer_mt.data.corpora import prepare_corpora
from transformer_mt.errors import ConfigError

# A one-update model spells long nonsense: short outputs keep the searches fast.
SHORT = ["decode.max_len_a=0", "decode.max_len_b=6", "device=cpu"]


def mono(folder: Path, name: str = "mono.en", lines: int = 23) -> Path:
    path = folder / name
    path.write_text("".join(f"the dog sees {i} cats .\n" for i in range(lines)), encoding="utf-8")
    return path


def job(run: Path, source: Path, output: Path, *extra: str):
    overrides = [f"run_dir={run}", f"input={source}", f"output={output}", "chunk_lines=5"]
    return compose_job("backtranslate", [*overrides, *SHORT, *extra])


def test_the_corpus_pairs_each_input_line_with_its_translation_and_says_what_made_it(
    one_update_run, tmp_path
):
    source = mono(tmp_path)
    folder = backtranslate(job(one_update_run, source, tmp_path / "bt"))
    inputs = (folder / "train.en").read_text(encoding="utf-8").splitlines()
    outputs = (folder / "train.de").read_text(encoding="utf-8").splitlines()
    assert inputs == source.read_text(encoding="utf-8").splitlines() and len(outputs) == 23
    record = json.loads((folder / "backtranslation.json").read_text())
    assert record["complete"] and record["lines"] == 23 and record["chunk_lines"] == 5
    assert record["checkpoint"]["step"] == 1 and record["decode"]["strategy"] == "beam"
    assert record["languages"] == {"source": "de", "target": "en"}
    assert sorted(p.name for p in folder.iterdir()) == [
        "backtranslation.json",
        "train.de",
        "train.en",
    ]
    # The folder is a training corpus (of the other direction: de -> en).
    data = compose_job(
        "train",
        [
            "data=toy",
            "data.src_lang=de",
            "data.tgt_lang=en",
            "data.toy_sizes=[300,20,20]",
            "data.vocab_size=400",
            f"data.prepared_dir={tmp_path / 'prepared'}",
            f'+data.corpora.bt={{source:files,dir:"{folder}",tag:"<BT>"}}',
        ],
    ).data
    assert len(prepare_corpora(data).extra[0].train) == 23


@pytest.mark.parametrize("strategy", [[], ["decode=sample", "decode.seed=5"]])
def test_a_command_stopped_by_a_full_disk_continues_to_the_same_corpus(
    one_update_run, tmp_path, monkeypatch, strategy
):
    """The same corpus as an uninterrupted command's, with beam search and with sampling (each
    chunk draws from its own seed). The full disk stops the third chunk's write: the two before
    it stay, and nothing is left half-written."""
    source = mono(tmp_path)
    whole = backtranslate(job(one_update_run, source, tmp_path / "whole", *strategy))
    real, writes = module.replacing, []

    def full_disk_at_third_chunk(path):
        if path.suffix == ".txt":
            writes.append(path)
            if len(writes) == 3:
                raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path)

    monkeypatch.setattr(module, "replacing", full_disk_at_third_chunk)
    cut = tmp_path / "cut"
    with pytest.raises(OSError):
        backtranslate(job(one_update_run, source, cut, *strategy))
    assert sorted(p.name for p in (cut / ".chunks").iterdir()) == ["000000.txt", "000001.txt"]
    monkeypatch.setattr(module, "replacing", real)
    backtranslate(job(one_update_run, source, cut, *strategy))
    for name in ("train.de", "train.en"):
        assert (cut / name).read_bytes() == (whole / name).read_bytes()
    assert not (cut / ".chunks").exists()


def test_a_complete_corpus_is_not_made_again_and_another_setting_is_refused(
    one_update_run, tmp_path
):
    source = mono(tmp_path)
    folder = backtranslate(job(one_update_run, source, tmp_path / "bt"))
    made = (folder / "train.de").stat().st_mtime_ns
    backtranslate(job(one_update_run, source, tmp_path / "bt"))
    assert (folder / "train.de").stat().st_mtime_ns == made
    with pytest.raises(ConfigError, match="made with other settings .*decode_settings"):
        backtranslate(job(one_update_run, source, tmp_path / "bt", "decode.beam_size=2"))


@pytest.mark.parametrize(
    ("name", "extra", "key"),
    [
        ("mono.de", [], "input"),  # the run translates en -> de: its input is English
        ("mono.txt", [], "input"),
        ("mono.txt", ["input_lang=fr"], "input_lang"),
        ("mono.en", ["chunk_lines=0"], "chunk_lines"),
    ],
)
def test_an_input_the_run_cannot_back_translate_is_refused_writing_nothing(
    one_update_run, tmp_path, name, extra, key
):
    source = mono(tmp_path, name)
    with pytest.raises(ConfigError) as refused:
        backtranslate(job(one_update_run, source, tmp_path / "bt", *extra))
    assert f"config key '{key}'" in str(refused.value) and "\n" not in str(refused.value)
    assert not (tmp_path / "bt").exists()


def test_a_folder_of_other_files_is_no_output(one_update_run, tmp_path):
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine\n")
    with pytest.raises(ConfigError, match="holds other files"):
        backtranslate(job(one_update_run, mono(tmp_path), busy))
    assert [p.name for p in busy.iterdir()] == ["notes.txt"]


def test_empty_translations_are_counted_and_the_command_says_so(
    one_update_run, tmp_path, caplog, monkeypatch
):
    # An undertrained model writes empty lines: here, for every input that holds a 1.
    translate = module.Translator.translate

    def some_empty(self, sentences, *args, **kwargs):
        texts = translate(self, sentences, *args, **kwargs)
        return ["" if "1" in s else text for s, text in zip(sentences, texts, strict=True)]

    monkeypatch.setattr(module.Translator, "translate", some_empty)
    output = tmp_path / "bt"
    backtranslate(job(one_update_run, mono(tmp_path), output))
    empty = sum(1 for line in (output / "train.de").read_text("utf-8").splitlines() if not line)
    record = json.loads((output / "backtranslation.json").read_text())
    assert empty == 12 and record["empty_translations"] == 12
    assert "12 of 23 translations are empty (training drops those pairs)" in caplog.text
