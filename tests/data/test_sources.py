"""Local files and the Hugging Face `datasets` path, including bad input."""

import pytest

from transformer_mt.config import DataConfig, SourceKind
from transformer_mt.data.sources import read_pairs
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
