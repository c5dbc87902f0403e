"""The prepared-data cache: reused if nothing changed, rebuilt if anything did, never half-built."""

import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from transformer_mt.config import DataConfig, SourceKind
from transformer_mt.data import prepare as prepare_module
from transformer_mt.data import store as store_module
from transformer_mt.data.prepare import prepare, prepared_folder
from transformer_mt.data.toy import toy_pairs
from transformer_mt.errors import DataError
from transformer_mt.run_dir import RunDir


def write_corpus(folder, pairs, split="train"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{split}.en").write_text("".join(en + "\n" for en, _ in pairs), encoding="utf-8")
    (folder / f"{split}.de").write_text("".join(de + "\n" for _, de in pairs), encoding="utf-8")


@pytest.fixture
def corpus(tmp_path):
    pairs = toy_pairs(400, seed=5)
    write_corpus(tmp_path / "corpus", pairs[:360])
    write_corpus(tmp_path / "corpus", pairs[360:], "valid")
    return tmp_path / "corpus"


def config(tmp_path, corpus, **overrides) -> DataConfig:
    settings = dict(
        name="c",
        source=SourceKind.files,
        dir=str(corpus),
        src_lang="en",
        tgt_lang="de",
        vocab_size=400,
        prepared_dir=str(tmp_path / "prepared"),
    )
    return DataConfig(**{**settings, **overrides})


def test_reused_when_nothing_changed(tmp_path, corpus):
    first = RunDir(tmp_path / "run1").prepare(config(tmp_path, corpus))
    stamp = (first.folder / "stats.json").stat().st_mtime_ns
    second = RunDir(tmp_path / "run2").prepare(config(tmp_path, corpus, num_workers=3))
    assert second.folder == first.folder
    assert (second.folder / "stats.json").stat().st_mtime_ns == stamp
    assert (tmp_path / "run2" / "spm.model").read_bytes() == (
        first.folder / "spm.model"
    ).read_bytes()


@pytest.mark.parametrize(
    "change", ["vocab_size", "max_length_ratio", "dedupe", "unicode_form", "file"]
)
def test_rebuilt_when_an_input_or_setting_changed(tmp_path, corpus, change):
    first = RunDir(tmp_path / "run").prepare(config(tmp_path, corpus)).folder
    overrides = {
        "vocab_size": {"vocab_size": 390},
        "max_length_ratio": {"max_length_ratio": 2.0},
        "dedupe": {"dedupe": True},
        "unicode_form": {"unicode_form": "NFKC"},
    }.get(change, {})
    if change == "file":
        with open(corpus / "train.en", "a", encoding="utf-8") as handle:
            handle.write("One more line.\n")
        with open(corpus / "train.de", "a", encoding="utf-8") as handle:
            handle.write("Eine Zeile mehr.\n")
    second = RunDir(tmp_path / "run2").prepare(config(tmp_path, corpus, **overrides)).folder
    assert second != first and (second / "stats.json").is_file()
    with pytest.raises(
        DataError, match="use a new run_dir"
    ):  # a run keeps the data it started with
        RunDir(tmp_path / "run").prepare(config(tmp_path, corpus, **overrides))


def test_interrupted_build_leaves_no_usable_cache(tmp_path, corpus, monkeypatch):
    cfg = config(tmp_path, corpus)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(prepare_module, "binarize", interrupted)
    with pytest.raises(KeyboardInterrupt):
        RunDir(tmp_path / "run").prepare(cfg)
    assert list((tmp_path / "prepared").iterdir()) == []  # no folder, no lock file
    monkeypatch.undo()
    # A build killed outright (SIGKILL: no cleanup ran) leaves only a temporary folder and its
    # lock file behind, which are never taken for a finished one.
    stale = abandoned_build(tmp_path / "prepared", f"c-{prepare_module.fingerprint(cfg)}")
    data = RunDir(tmp_path / "run").prepare(cfg)
    assert data.folder.name == f"c-{prepare_module.fingerprint(cfg)}" and len(data.train) == 360
    assert not stale.exists()  # its lock is free, so its folder was removed


def abandoned_build(parent: Path, name: str, suffix: str = "-host-999-abc") -> Path:
    """What a build killed by SIGKILL leaves: its temporary folder and its (free) lock file."""
    stale = parent / f".{name}.tmp{suffix}"
    stale.mkdir(parents=True)
    (stale / "train.src.bin").write_bytes(b"half")
    Path(f"{stale}.lock").touch()
    return stale


def test_abandoned_builds_of_any_corpus_are_swept_but_running_ones_kept(tmp_path, corpus):
    parent = tmp_path / "prepared"
    dead = abandoned_build(parent, "other-0123456789abcdef")
    older = parent / ".other-0123456789abcdef.tmp-4242"  # an older version's: no lock file
    older.mkdir()
    running = abandoned_build(parent, "other-fedcba9876543210", "-elsewhere-7-xyz")
    with open(f"{running}.lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as its builder, alive on some host, holds it
        prepare(config(tmp_path, corpus))
        assert running.is_dir() and Path(f"{running}.lock").is_file()
    assert not dead.exists() and not Path(f"{dead}.lock").exists() and not older.exists()


def test_a_build_folder_names_host_and_pid_and_is_locked_while_it_builds(
    tmp_path, corpus, monkeypatch
):
    seen = []
    build_into = prepare_module.build_into

    def watched(cfg, folder):
        seen.append((folder.name, prepare_module.build_running(folder)))
        return build_into(cfg, folder)

    monkeypatch.setattr(prepare_module, "build_into", watched)
    data = prepare(config(tmp_path, corpus))
    [(name, locked)] = seen
    assert name.startswith(f".{data.folder.name}.tmp-{socket.gethostname()}-{os.getpid()}-")
    assert locked
    assert [path.name for path in data.folder.parent.iterdir()] == [data.folder.name]


def test_every_file_reaches_the_disk_before_the_folder_is_published(tmp_path, corpus, monkeypatch):
    """Each file, stats.json (written last, with each other file's size and sha256) and the
    temporary folder are fsynced before the rename; the parent folder after it."""
    cfg = config(tmp_path, corpus)
    final, synced = prepared_folder(cfg), []

    def fsync_path(path):
        synced.append((Path(path), final.exists()))  # (what, whether published already)

    monkeypatch.setattr(store_module, "fsync_path", fsync_path)
    monkeypatch.setattr(prepare_module, "fsync_path", fsync_path)
    folder = prepare(cfg).folder
    stats = json.loads((folder / "stats.json").read_text())
    names = sorted(path.name for path in folder.iterdir())
    assert sorted(stats["files"]) == [name for name in names if name != "stats.json"]
    for name, entry in stats["files"].items():
        assert entry == {
            "bytes": (folder / name).stat().st_size,
            "sha256": store_module.file_sha256(folder / name),
        }
    *files, (temporary, published_before), (parent, published) = synced
    assert sorted(path.name for path, _ in files) == names  # stats.json the last of them
    assert files[-1][0].name == "stats.json" and temporary.name.startswith(f".{folder.name}.tmp-")
    assert not published_before and not any(published for _, published in files)
    assert parent == folder.parent and published


def test_a_killed_encoding_worker_ends_preparation_with_an_error(tmp_path, corpus):
    """One of two encoding workers SIGKILLs itself mid-corpus (as the OOM killer would): a
    DataError that says what to do, and nothing left behind, where multiprocessing.Pool waited
    forever. It runs in its own process, so that a hang fails this test instead of the run."""
    helper = Path(__file__).with_name("dying_worker.py")
    finished = subprocess.run(
        [sys.executable, str(helper), str(corpus), str(tmp_path / "prepared")],
        capture_output=True,
        text=True,
        timeout=300,  # a hang guard only: it takes seconds
    )
    assert finished.returncode == 0, finished.stderr
    outcome = json.loads(finished.stdout.splitlines()[-1])
    assert "an encoding worker process died" in outcome["error"]
    assert "Set data.num_workers below 2" in outcome["error"]
    assert outcome["left"] == []  # neither the build folder nor its lock file


def test_a_copied_corpus_names_the_same_prepared_folder_and_a_changed_byte_another(
    tmp_path, corpus
):
    """The corpus is identified by its files' names, sizes and sha256: a copy on another node
    (another folder, new times) must name the folder rank 0 prepares."""
    copy = tmp_path / "elsewhere" / "copy"
    copy.mkdir(parents=True)
    for path in corpus.iterdir():
        shutil.copyfile(path, copy / path.name)  # the content only: new times
        os.utime(copy / path.name, ns=(1, 1))
    original = prepared_folder(config(tmp_path, corpus))
    assert prepared_folder(config(tmp_path, copy)) == original
    text = (copy / "train.de").read_bytes()
    (copy / "train.de").write_bytes(text[:100] + bytes([text[100] ^ 1]) + text[101:])
    assert prepared_folder(config(tmp_path, copy)) != original


def test_stats_count_every_dropped_pair(tmp_path):
    pairs = [
        ("A dog.", "Ein Hund."),
        ("", "Leer."),
        ("A dog.", "Ein Hund."),
        ("Cat.", "x " * 60),
        ("Ok.", "Gut."),
    ]
    marks = "a" + "\u0301\u0316" * 10_000  # too long before normalising (NFC is quadratic)
    folder = tmp_path / "corpus"
    write_corpus(folder, pairs * 30 + toy_pairs(100, seed=4) + [(marks, "Zeichen.")])
    write_corpus(folder, pairs[:1], "valid")
    data = RunDir(tmp_path / "run").prepare(
        config(tmp_path, folder, dedupe=True, max_length_ratio=5.0)
    )
    stats = json.loads((data.folder / "stats.json").read_text())["splits"]["train"]
    # 150 lines: 30 empty; of the 120 others only 3 are distinct; "x x x ..." is 60 pieces to 2;
    # 20,001 characters are more than 20 x data.max_tokens_per_sentence (250)
    assert stats["dropped"] == {"empty": 30, "duplicate": 117, "length_ratio": 1, "too_long": 1}
    assert stats["kept"] == len(data.train) == 2 + 100


def test_uint16_store_for_small_vocabularies(tmp_path, corpus):
    data = RunDir(tmp_path / "run").prepare(config(tmp_path, corpus))
    assert data.train.src.tokens.dtype == np.uint16


def test_corpus_empty_after_cleaning_says_which_filters(tmp_path):
    folder = tmp_path / "corpus"
    write_corpus(folder, [(" ".join([en] * 6), "Ja.") for en, _ in toy_pairs(100, seed=6)])
    write_corpus(folder, [("a", "b")], "valid")
    with pytest.raises(
        DataError, match="train split .* empty after cleaning: .*pairs dropped as length_ratio"
    ):
        RunDir(tmp_path / "run").prepare(config(tmp_path, folder))


def test_invalid_utf8_can_be_replaced_and_counted(tmp_path):
    folder = tmp_path / "corpus"
    write_corpus(folder, toy_pairs(200, seed=2))
    write_corpus(folder, toy_pairs(5, seed=3), "valid")
    raw = (folder / "train.en").read_bytes().split(b"\n")
    raw[3] = raw[3] + b" \xff"
    (folder / "train.en").write_bytes(b"\n".join(raw))
    with pytest.raises(DataError, match=r"train\.en:4: not valid UTF-8"):
        RunDir(tmp_path / "run").prepare(config(tmp_path, folder))
    data = RunDir(tmp_path / "run2").prepare(config(tmp_path, folder, invalid_utf8="replace"))
    stats = json.loads((data.folder / "stats.json").read_text())["splits"]["train"]
    assert stats["dropped"]["invalid_utf8_replaced"] == 1
    assert len(data.train) == 200


def test_worker_processes_give_the_same_store_as_one_process(tmp_path, corpus, monkeypatch):
    monkeypatch.setattr(prepare_module, "CHUNK_LINES", 50)  # several chunks, and not "small"
    one = prepare(config(tmp_path, corpus, prepared_dir=str(tmp_path / "p1"), num_workers=1))
    two = prepare(config(tmp_path, corpus, prepared_dir=str(tmp_path / "p2"), num_workers=2))
    for side in ("src", "tgt"):
        for field in ("tokens", "offsets"):
            assert np.array_equal(
                getattr(getattr(one.train, side), field), getattr(getattr(two.train, side), field)
            )
    assert os.path.basename(one.folder) == os.path.basename(two.folder)


def test_truncated_store_is_refused_with_its_name(tmp_path, corpus):
    folder = RunDir(tmp_path / "run").prepare(config(tmp_path, corpus)).folder
    data = (folder / "train.src.bin").read_bytes()
    (folder / "train.src.bin").write_bytes(data[:-10])
    with pytest.raises(DataError, match=r"train\.src\.bin: \d+ bytes, but \d+ were written"):
        RunDir(tmp_path / "run").prepare(config(tmp_path, corpus))


def test_valid_text_is_the_split_as_read(tmp_path, corpus):
    """Validation BLEU's sources and references: the valid split as read, not the cleaned,
    NFC-normalised, length-filtered pairs of the binarized split."""
    decomposed = "Cafe\u0301 \u2026  und Tee."  # NFD é, an ellipsis, two spaces
    long_source = " ".join(["the dog sees the cat"] * 20) + "."
    with open(corpus / "valid.en", "a", encoding="utf-8") as handle:
        handle.write(f"{decomposed}\n{long_source}\n")
    with open(corpus / "valid.de", "a", encoding="utf-8") as handle:
        handle.write(f"{decomposed}\nDer Hund.\n")
    data = RunDir(tmp_path / "run").prepare(config(tmp_path, corpus))
    sources, references = data.valid_text(10_000)
    assert sources == (corpus / "valid.en").read_text(encoding="utf-8").splitlines()
    assert references == (corpus / "valid.de").read_text(encoding="utf-8").splitlines()
    assert len(data.valid) == len(references) - 1  # the binarized split dropped the long pair
    assert data.valid_text(3) == (sources[:3], references[:3])
