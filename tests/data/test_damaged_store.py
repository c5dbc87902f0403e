"""A prepared folder damaged after it was built (a crash, a power cut, bit rot, a hand edit):
opening it is a one-line DataError naming the file and the fix, never a numpy or SentencePiece
traceback, and never an out-of-range id that crashes the model hours later."""

import json
import shutil

import numpy as np
import pytest

from transformer_mt.config import DataConfig
from transformer_mt.data.prepare import open_prepared, prepare
from transformer_mt.data.store import TokenArray
from transformer_mt.errors import DataError


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A toy prepared folder, built once (about a second) and copied by each test."""
    prepared = tmp_path_factory.mktemp("pristine")
    cfg = DataConfig(toy_sizes=[300, 20, 20], vocab_size=400, prepared_dir=str(prepared))
    return prepare(cfg).folder


@pytest.fixture
def folder(pristine, tmp_path):
    copy = tmp_path / pristine.name
    shutil.copytree(pristine, copy)
    return copy


def empty_offsets(folder):
    (folder / "train.src.offsets.npy").write_bytes(b"")  # np.load: EOFError


def no_offsets(folder):
    np.save(
        folder / "train.src.offsets.npy", np.zeros(0, dtype=np.int64)
    )  # offsets[-1]: IndexError


def garbled_dtype(folder):
    index = json.loads((folder / "train.tgt.json").read_text())
    (folder / "train.tgt.json").write_text(json.dumps({**index, "dtype": "uint1x"}))  # TypeError


def decreasing_offsets(folder):
    offsets = np.load(folder / "train.src.offsets.npy")
    offsets[5] = offsets[6] + 1  # the same size and last offset: only the order is wrong
    np.save(folder / "train.src.offsets.npy", offsets)


def id_beyond_vocabulary(folder):
    tokens = np.memmap(folder / "valid.src.bin", dtype=np.uint16, mode="r+")
    tokens[3] = 65000  # a flipped bit in an id: the embedding would fail on it mid-training
    tokens.flush()


def truncated_tokenizer(folder):
    model = (folder / "spm.model").read_bytes()
    (folder / "spm.model").write_bytes(model[:100])


def every_file_empty(folder):
    """What a power cut shortly after an unsynced build left: the names, but no data."""
    for path in folder.iterdir():
        if path.name != "stats.json":
            path.write_bytes(b"")


DAMAGE = {  # damage: the file the error must name
    empty_offsets: "train.src.offsets.npy",
    no_offsets: "train.src.offsets.npy",
    garbled_dtype: "train.tgt.json",
    decreasing_offsets: "train.src.offsets.npy",
    id_beyond_vocabulary: "valid.src.bin",
    truncated_tokenizer: "spm.model",
    every_file_empty: "spm.model",  # the first file opened
}


def forget_the_record(folder):
    """Make the folder look prepared before stats.json recorded sizes and hashes: then the
    store's own checks (structure, ids) must catch the damage."""
    stats = json.loads((folder / "stats.json").read_text())
    del stats["files"]
    (folder / "stats.json").write_text(json.dumps(stats))


@pytest.mark.parametrize("recorded", [True, False], ids=["checked by record", "older folder"])
@pytest.mark.parametrize("damage", DAMAGE, ids=lambda damage: damage.__name__)
def test_a_damaged_folder_is_one_line_naming_the_file_and_the_fix(folder, damage, recorded):
    if not recorded:
        forget_the_record(folder)
    damage(folder)
    with pytest.raises(DataError) as raised:
        open_prepared(folder)
    message = str(raised.value)
    assert message.startswith(f"{folder / DAMAGE[damage]}: ") and "\n" not in message
    assert f"delete the folder {folder}" in message or "prepared folder is rebuilt" in message


def test_a_changed_byte_of_any_file_is_caught_by_its_sha256(folder):
    text = (folder / "valid.text.tgt").read_bytes()
    (folder / "valid.text.tgt").write_bytes(text[:-2] + bytes([text[-2] ^ 1]) + text[-1:])
    with pytest.raises(DataError, match=r"valid\.text\.tgt: its content changed .*sha256"):
        open_prepared(folder)


@pytest.mark.parametrize("stats", ["", "{", '{"files": {"spm.model": 3}}', "[]"])
def test_an_unreadable_stats_file_is_named(folder, stats):
    (folder / "stats.json").write_text(stats)
    with pytest.raises(DataError, match=r"stats\.json: .*delete the folder"):
        open_prepared(folder)


def test_the_store_alone_refuses_damage_with_the_files_name(folder):
    """TokenArray.load, under open_prepared's record check: each failure numpy or json can
    raise becomes a DataError naming the file."""
    empty_offsets(folder)
    with pytest.raises(DataError, match=r"train\.src\.offsets\.npy: not a readable offsets"):
        TokenArray.load(folder / "train.src")
    garbled_dtype(folder)
    with pytest.raises(DataError, match=r"train\.tgt\.json: not a readable token index"):
        TokenArray.load(folder / "train.tgt")
    id_beyond_vocabulary(folder)
    assert len(TokenArray.load(folder / "valid.src")) == 20  # no vocabulary given: not checked
    with pytest.raises(DataError, match=r"valid\.src\.bin: token id 65000 is not below .* 400"):
        TokenArray.load(folder / "valid.src", vocab_size=400)
