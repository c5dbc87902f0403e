"""Local files and the Hugging Face `datasets` path, including bad input and the hub's failures."""

import dataclasses
import logging
import os
import subprocess
import sys

import pytest

from transformer_mt.config import DataConfig, SourceKind, compose_job
from transformer_mt.data.sources import load_failure, load_hf_splits, read_pairs, source_version
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


# ---- IWSLT 2017 from the hub's parquet branch, and the hub's failures ----------------------
IWSLT_ROWS = {  # (first language, second language) pairs of each folder on the branch
    "iwslt2017-de-en": {"train": PAIRS[:30], "validation": PAIRS[30:35], "test": PAIRS[35:]},
    "iwslt2017-en-de": {"train": PAIRS[:3], "validation": PAIRS[3:4], "test": PAIRS[4:5]},
    "iwslt2017-ar-en": {"train": PAIRS[5:7], "validation": PAIRS[7:8], "test": PAIRS[8:9]},
}


def parquet_branch(folder, *, card: bool = False, skip: str | None = None):
    """A folder laid out as IWSLT/iwslt2017's refs/convert/parquet branch: a folder per pair
    and split holding 0000.parquet with a `translation` column (no README, no script), with
    `card` a dataset card declaring each pair as a config; `skip`: a file left out."""
    import datasets

    folder.mkdir(parents=True)
    (folder / ".gitattributes").write_text("*.parquet filter=lfs diff=lfs merge=lfs -text\n")
    for pair, splits in IWSLT_ROWS.items():
        first, second = pair.removeprefix("iwslt2017-").split("-")
        for split, rows in splits.items():
            path = folder / pair / split / "0000.parquet"
            if f"{pair}/{split}/0000.parquet" == skip:
                continue
            path.parent.mkdir(parents=True)
            translation = [{first: a, second: b} for a, b in rows]
            datasets.Dataset.from_dict({"translation": translation}).to_parquet(str(path))
    if card:
        configs = "".join(
            f"- config_name: {pair}\n  data_files:\n"
            + "".join(f"  - split: {s}\n    path: {pair}/{s}/*.parquet\n" for s in splits)
            for pair, splits in IWSLT_ROWS.items()
        )
        (folder / "README.md").write_text(f"---\nconfigs:\n{configs}---\n")
    return folder


@pytest.mark.parametrize("card", [False, True])
def test_the_iwslt_preset_reads_the_hubs_parquet_branch_layout(tmp_path, card):
    preset = compose_job("train", ["data=iwslt17_de_en"]).data
    assert (preset.hf_path, preset.hf_revision) == ("IWSLT/iwslt2017", "refs/convert/parquet")
    assert preset.hf_data_files == {
        split: f"iwslt2017-de-en/{split}/0000.parquet" for split in ("train", "validation", "test")
    }
    # The same settings with the repository replaced by a local copy of its branch: datasets
    # resolves the files against the folder as it does against the repository at the revision.
    branch = parquet_branch(tmp_path / "iwslt2017", card=card)
    cfg = dataclasses.replace(preset, hf_path=str(branch))
    de_en = IWSLT_ROWS["iwslt2017-de-en"]
    assert list(read_pairs(cfg, "train")) == de_en["train"]
    assert list(read_pairs(cfg, "valid")) == de_en["validation"]
    assert list(read_pairs(cfg, "test")) == de_en["test"]
    assert set(source_version(cfg)) == {"train", "validation", "path"}
    load_hf_splits.cache_clear()


def hub_message(cfg: DataConfig) -> str:
    with pytest.raises(DataError) as raised:
        list(read_pairs(cfg, "train"))
    message = str(raised.value)
    assert "\n" not in message
    return message


def test_no_network_is_said_with_how_to_use_local_files():
    # HF_HUB_OFFLINE=1 (tests/conftest.py), and nothing of IWSLT in the cache.
    message = hub_message(compose_job("train", ["data=iwslt17_de_en"]).data)
    assert message.startswith(
        "cannot reach the Hugging Face hub for dataset 'IWSLT/iwslt2017' (revision "
        "refs/convert/parquet), and it is not in the local cache: ConnectionError: "
    )
    assert "OfflineModeIsEnabled" in message
    assert message.endswith(
        "Without network access, use local files: data=files data.dir=<folder with "
        "{split}.{lang} files>, or a copy in the hub's layout: data.hf_path=<folder>"
    )


def test_a_refused_connection_is_no_network_too(tmp_path):
    # A real failed connection, not offline mode: the hub's address is a closed local port, and
    # the parquet builder reads an hf:// URL (httpx raises its own ConnectError, which is no
    # OSError, around the socket's ConnectionRefusedError).
    script = (
        "from transformer_mt.config import DataConfig, SourceKind\n"
        "from transformer_mt.data.sources import read_pairs\n"
        "from transformer_mt.errors import DataError\n"
        "url = 'hf://datasets/IWSLT/iwslt2017@refs%2Fconvert%2Fparquet/iwslt2017-de-en/'\n"
        "files = {s: url + s + '/0000.parquet' for s in ('train', 'validation')}\n"
        "cfg = DataConfig(source=SourceKind.hf, hf_path='parquet', hf_config=None,\n"
        "    hf_data_files=files, src_lang='de', tgt_lang='en', valid_split='validation')\n"
        "try:\n"
        "    list(read_pairs(cfg, 'train'))\n"
        "except DataError as error:\n"
        "    print(error)\n"
    )
    environment = {
        **os.environ,
        "HF_HUB_OFFLINE": "0",
        "HF_DATASETS_OFFLINE": "0",
        "HF_ENDPOINT": "http://127.0.0.1:9",  # the discard port: nothing listens there
        "HF_HOME": str(tmp_path / "hf"),
    }
    result = subprocess.run(
        [sys.executable, "-c", script], env=environment, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    message = result.stdout.strip()
    assert message.startswith("cannot reach the Hugging Face hub for dataset 'parquet'"), message
    assert "ConnectError" in message and "data=files" in message


def test_a_file_the_revision_lacks_is_named(tmp_path):
    branch = parquet_branch(tmp_path / "iwslt2017", skip="iwslt2017-de-en/test/0000.parquet")
    preset = compose_job("train", ["data=iwslt17_de_en"]).data
    message = hub_message(dataclasses.replace(preset, hf_path=str(branch)))
    missing = branch / "iwslt2017-de-en" / "test" / "0000.parquet"
    assert message == (
        f"dataset '{branch}' (revision refs/convert/parquet) not found: Unable to find "
        f"'{missing}' (see data.hf_path, data.hf_revision, data.hf_data_files)"
    )


def test_a_folder_that_does_not_exist_is_named(tmp_path):
    message = hub_message(local_hf(tmp_path / "nowhere"))
    assert message == (
        f"dataset '{tmp_path / 'nowhere'}' not found: Couldn't find any data file at "
        f"{tmp_path / 'nowhere'} (see data.hf_path, data.hf_revision, data.hf_data_files)"
    )


def test_a_script_only_dataset_says_what_to_do(tmp_path):
    # The layout of IWSLT/iwslt2017's main branch: a loading script (and zip files), which
    # datasets >= 4 refuses with "RuntimeError: Dataset scripts are no longer supported".
    import datasets

    folder = tmp_path / "iwslt2017"
    folder.mkdir()
    (folder / "iwslt2017.py").write_text("import datasets  # a loading script\n")
    message = hub_message(local_hf(folder))
    assert message == (
        f"dataset '{folder}' is a loading script (iwslt2017.py), which datasets "
        f"{datasets.__version__} cannot run (datasets 4.0 and later run no scripts): convert it "
        "to parquet or JSON files (one per split) in a folder and load that"
    )
    # The same refusal of a dataset on the hub (which cannot be reached from here): the
    # exception datasets raises there, classified by the same function.
    hub = RuntimeError("Dataset scripts are no longer supported, but found iwslt2017.py")
    message = str(load_failure("IWSLT/iwslt2017", None, None, hub))
    assert message.startswith(
        "dataset 'IWSLT/iwslt2017' is a loading script (iwslt2017.py), which datasets "
    )
    assert "data.hf_revision=refs/convert/parquet with data.hf_data_files" in message


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
