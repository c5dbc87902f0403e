"""Local files and the Hugging Face `datasets` path, including bad input."""

import dataclasses
import logging

import pytest

from transformer_mt.config import DataConfig, SourceKind, compose_job
from transformer_mt.data.sources import load_hf_splits, read_pairs
from transformer_mt.errors import DataError


def write(path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def files_config(folder, **overrides) -> DataConfig:
    return DataConfig(
        source=SourceKind.files, dir=str(folder), src_lang="de", tgt_lang="en", **overrides
    )


def test_reads_local_parallel_files(tmp_path):
    write(tmp_path / "train.de", ["Ein Hund.", "Zwei Katzen."])
    write(tmp_path / "train.en", ["A dog.", "Two cats."])
    assert list(read_pairs(files_config(tmp_path), "train")) == [
        ("Ein Hund.", "A dog."),
        ("Zwei Katzen.", "Two cats."),
    ]


def test_mismatched_line_counts_name_both_files_and_counts(tmp_path):
    write(tmp_path / "train.de", ["a", "b", "c"])
    write(tmp_path / "train.en", ["a", "b"])
    with pytest.raises(DataError) as error:
        list(read_pairs(files_config(tmp_path), "train"))
    message = str(error.value)
    assert str(tmp_path / "train.de") in message and "3 lines" in message
    assert str(tmp_path / "train.en") in message and "2 lines" in message


def test_missing_file_is_named(tmp_path):
    with pytest.raises(DataError, match="train.de: no such file"):
        list(read_pairs(files_config(tmp_path), "train"))


def test_invalid_utf8_names_file_and_line(tmp_path):
    (tmp_path / "train.de").write_bytes(b"gut\nkaputt \xff\n")
    write(tmp_path / "train.en", ["good", "broken"])
    with pytest.raises(DataError, match=r"train\.de:2: not valid UTF-8"):
        list(read_pairs(files_config(tmp_path), "train"))


def hub_layout_dataset(folder) -> None:
    """A local folder laid out like the hub's wmt/wmt14 repository: parquet files per config."""
    import datasets

    rows = {
        "train": [("Hallo Welt.", "Hello world."), ("Guten Morgen.", "Good morning.")],
        "validation": [("Danke.", "Thanks.")],
        "test": [("Ja.", "Yes.")],
    }
    for split, pairs in rows.items():
        table = datasets.Dataset.from_dict(
            {"translation": [{"de": de, "en": en} for de, en in pairs]}
        )
        (folder / "de-en").mkdir(parents=True, exist_ok=True)
        table.to_parquet(str(folder / "de-en" / f"{split}-00000-of-00001.parquet"))
    (folder / "README.md").write_text(
        "---\nconfigs:\n- config_name: de-en\n  data_files:\n"
        "  - split: train\n    path: de-en/train-*\n"
        "  - split: validation\n    path: de-en/validation-*\n"
        "  - split: test\n    path: de-en/test-*\n---\n"
    )


@pytest.mark.parametrize("src,tgt", [("de", "en"), ("en", "de")])
def test_hf_dataset_in_hub_format_both_directions(tmp_path, src, tgt):
    hub_layout_dataset(tmp_path)
    cfg = DataConfig(
        source=SourceKind.hf,
        hf_path=str(tmp_path),
        hf_config="de-en",
        src_lang=src,
        tgt_lang=tgt,
        valid_split="validation",
    )
    pairs = list(read_pairs(cfg, "train"))
    expected = [("Hallo Welt.", "Hello world."), ("Guten Morgen.", "Good morning.")]
    assert pairs == (expected if src == "de" else [(b, a) for a, b in expected])
    assert list(read_pairs(cfg, "valid")) == (
        [("Danke.", "Thanks.")] if src == "de" else [("Thanks.", "Danke.")]
    )


def test_unreachable_dataset_says_how_to_use_local_files():
    cfg = DataConfig(
        source=SourceKind.hf, hf_path="no-such-user/no-such-dataset", hf_config="de-en"
    )
    with pytest.raises(DataError, match="data=files"):
        list(read_pairs(cfg, "train"))


# ---- Hugging Face datasets in the layouts users meet ----------------------------------------
PAIRS = [(f"Satz {i}.", f"Sentence {i}.") for i in range(40)]  # (de, en)


def flat_parquet_folder(folder, splits: dict[str, list[tuple[str, str]]]) -> None:
    """A local folder like bentrevett/multi30k: one parquet file per split, columns en and de."""
    import datasets

    folder.mkdir(parents=True, exist_ok=True)
    for split, pairs in splits.items():
        columns = {"en": [en for _, en in pairs], "de": [de for de, _ in pairs]}
        datasets.Dataset.from_dict(columns).to_parquet(str(folder / f"{split}.parquet"))


def local_hf(folder, **settings) -> DataConfig:
    """The hf source on a local folder, German to English, with `settings` on top."""
    base = {"hf_config": None, "src_lang": "de", "tgt_lang": "en", "valid_split": "validation"}
    return DataConfig(source=SourceKind.hf, hf_path=str(folder), **{**base, **settings})


def test_flat_language_columns_with_the_multi30k_presets_names_and_splits(tmp_path):
    flat_parquet_folder(
        tmp_path / "m30k", {"train": PAIRS[:30], "validation": PAIRS[30:35], "test": PAIRS[35:]}
    )
    for preset, flip in (("multi30k_de_en", False), ("multi30k_en_de", True)):
        cfg = compose_job("train", [f"data={preset}", f"data.hf_path={tmp_path / 'm30k'}"]).data
        expected = {"train": PAIRS[:30], "valid": PAIRS[30:35], "test": PAIRS[35:]}
        for split, pairs in expected.items():
            assert list(read_pairs(cfg, split)) == [(b, a) if flip else (a, b) for a, b in pairs]


def test_a_dataset_without_a_valid_split_gets_one_carved_from_train(tmp_path, caplog):
    flat_parquet_folder(tmp_path / "d", {"train": PAIRS[:35], "test": PAIRS[35:]})
    cfg = local_hf(tmp_path / "d", carve_valid=6, seed=3)
    with caplog.at_level(logging.INFO, logger="transformer_mt.data.sources"):
        valid = list(read_pairs(cfg, "valid"))
    train = list(read_pairs(cfg, "train"))
    assert len(valid) == 6 and len(train) == 29
    assert set(valid).isdisjoint(train) and sorted(valid + train) == sorted(PAIRS[:35])
    assert "6 of 35 train pairs carved out as the valid split (seed 3)" in caplog.text
    assert list(read_pairs(dataclasses.replace(cfg, seed=3), "valid")) == valid  # seeded
    assert list(read_pairs(dataclasses.replace(cfg, seed=4), "valid")) != valid
    assert list(read_pairs(cfg, "test")) == PAIRS[35:]


def test_a_save_to_disk_folder_and_named_columns(tmp_path):
    import datasets

    rows = {"src_text": [de for de, _ in PAIRS], "tgt_text": [en for _, en in PAIRS]}
    table = datasets.Dataset.from_dict(rows)
    datasets.DatasetDict({"train": table, "dev": table.select(range(5))}).save_to_disk(
        str(tmp_path / "saved")
    )
    cfg = local_hf(
        tmp_path / "saved", valid_split="dev", hf_src_column="src_text", hf_tgt_column="tgt_text"
    )
    assert list(read_pairs(cfg, "train")) == PAIRS
    assert list(read_pairs(cfg, "valid")) == PAIRS[:5]


def test_an_unknown_column_is_named_with_the_columns_that_exist(tmp_path):
    flat_parquet_folder(tmp_path / "d", {"train": PAIRS, "validation": PAIRS[:3]})
    cfg = local_hf(tmp_path / "d", hf_src_column="german")
    with pytest.raises(DataError, match=r"no column 'german' \(its columns: en, de\)"):
        list(read_pairs(cfg, "train"))
    cfg = dataclasses.replace(cfg, hf_src_column=None, src_lang="fr")
    with pytest.raises(DataError, match=r"neither a 'translation' column nor columns named 'fr'"):
        list(read_pairs(cfg, "train"))


def test_parquet_files_per_split_as_the_iwslt_preset_reads_them(tmp_path):
    flat_parquet_folder(tmp_path / "f", {"tr": PAIRS[:30], "va": PAIRS[30:35], "te": PAIRS[35:]})
    files = {"train": "tr", "validation": "va", "test": "te"}
    overrides = [
        f"data.hf_data_files.{split}={tmp_path / 'f' / name}.parquet"
        for split, name in files.items()
    ]
    cfg = compose_job("train", ["data=iwslt17_de_en", *overrides]).data
    assert cfg.hf_path == "parquet"
    assert list(read_pairs(cfg, "valid")) == PAIRS[30:35]
    assert list(read_pairs(cfg, "test")) == PAIRS[35:]


# ---- a damaged local dataset or HF cache: a DataError naming the folder and the fix ----------
def test_a_truncated_save_to_disk_folder_is_named(tmp_path):
    import datasets

    rows = {"de": [de for de, _ in PAIRS], "en": [en for _, en in PAIRS]}
    table = datasets.Dataset.from_dict(rows)
    datasets.DatasetDict({"train": table, "validation": table.select(range(5))}).save_to_disk(
        str(tmp_path / "saved")
    )
    [arrow] = (tmp_path / "saved" / "train").glob("*.arrow")
    with open(arrow, "r+b") as handle:
        handle.truncate(100)
    with pytest.raises(DataError) as raised:
        list(read_pairs(local_hf(tmp_path / "saved"), "train"))
    message = str(raised.value)
    assert message.startswith(f"{tmp_path / 'saved'}: a dataset folder written by save_to_disk")
    assert "ArrowInvalid" in message and "write it again with save_to_disk" in message
    assert "\n" not in message


def test_a_corrupt_copy_in_the_hf_cache_names_the_cache_folder(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    load_hf_splits.cache_clear()
    hub_layout_dataset(tmp_path / "hub")
    cfg = DataConfig(
        source=SourceKind.hf,
        hf_path=str(tmp_path / "hub"),
        hf_config="de-en",
        valid_split="validation",
    )
    assert len(list(read_pairs(cfg, "train"))) == 2  # read once: now in the cache
    cached = sorted((tmp_path / "cache").rglob("*.arrow"))
    assert cached
    for arrow in cached:
        with open(arrow, "r+b") as handle:
            handle.truncate(50)
    load_hf_splits.cache_clear()  # as a new process would
    with pytest.raises(DataError) as raised:
        list(read_pairs(cfg, "train"))
    message = str(raised.value)
    assert f"Its copy in the Hugging Face cache ({cached[0].parent})" in message
    assert "delete that cache folder and rerun" in message and "\n" not in message
    load_hf_splits.cache_clear()
