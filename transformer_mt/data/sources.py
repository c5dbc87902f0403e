"""Where parallel text comes from: local files, a Hugging Face dataset, or the embedded toy corpus.

Every source yields (source sentence, target sentence) string pairs for one split.
"""

from __future__ import annotations

import functools
import logging
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from transformer_mt.config import DataConfig, InvalidUtf8, SourceKind
from transformer_mt.errors import DataError

log = logging.getLogger(__name__)


def split_name(cfg: DataConfig, split: str) -> str:
    """Map 'train' / 'valid' / 'test' to the source's own split name."""
    names = {"train": cfg.train_split, "valid": cfg.valid_split, "test": cfg.test_split}
    if split not in names:
        raise DataError(f"unknown split '{split}': expected one of {sorted(names)}")
    return names[split]


def read_pairs(
    cfg: DataConfig, split: str, counts: Counter | None = None
) -> Iterator[tuple[str, str]]:
    """(src, tgt) pairs of one split ('train', 'valid' or 'test'), in corpus order, streamed.

    With data.invalid_utf8=replace, lines with undecodable bytes are counted in `counts`.
    """
    name = split_name(cfg, split)
    if cfg.source == SourceKind.files:
        replace = cfg.invalid_utf8 == InvalidUtf8.replace
        return read_parallel_files(*parallel_file_paths(cfg, name), replace=replace, counts=counts)
    if cfg.source == SourceKind.hf:
        return read_hf_dataset(cfg.hf_path, cfg.hf_config, name, cfg.src_lang, cfg.tgt_lang)
    return iter(toy_split(cfg, split))


def source_version(cfg: DataConfig) -> dict:
    """What identifies the corpus's content: file sizes and times, the HF dataset's fingerprint,
    or the toy generator's seed and sizes."""
    if cfg.source == SourceKind.files:
        files = [
            p
            for split in (cfg.train_split, cfg.valid_split)
            for p in parallel_file_paths(cfg, split)
        ]
        for path in files:
            if not path.is_file():
                raise DataError(f"{path}: no such file")
        return {str(p.resolve()): [p.stat().st_size, p.stat().st_mtime_ns] for p in files}
    if cfg.source == SourceKind.hf:
        return {
            split: load_hf_split(cfg.hf_path, cfg.hf_config, split)._fingerprint
            for split in (cfg.train_split, cfg.valid_split)
        } | {"path": cfg.hf_path}
    from transformer_mt.data.toy import TOY_VERSION

    return {"toy": TOY_VERSION}


def parallel_file_paths(cfg: DataConfig, split: str) -> tuple[Path, Path]:
    folder = Path(cfg.dir or ".")
    return folder / f"{split}.{cfg.src_lang}", folder / f"{split}.{cfg.tgt_lang}"


def count_lines(path: Path) -> int:
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    with path.open("rb") as handle:
        return sum(1 for _ in handle)


def read_lines(
    path: Path, *, replace: bool = False, counts: Counter | None = None
) -> Iterator[str]:
    """Lines without their newline. Invalid UTF-8 is an error naming the file and line, or with
    replace=True becomes U+FFFD and is counted under 'invalid_utf8_replaced'."""
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                yield raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as error:
                if not replace:
                    raise DataError(
                        f"{path}:{number}: not valid UTF-8 ({error.reason} at byte {error.start}); "
                        "fix the file or set data.invalid_utf8=replace"
                    ) from None
                if counts is not None:
                    counts["invalid_utf8_replaced"] += 1
                yield raw.decode("utf-8", errors="replace").rstrip("\r\n")


def read_parallel_files(
    src_path: Path, tgt_path: Path, *, replace: bool = False, counts: Counter | None = None
) -> Iterator[tuple[str, str]]:
    """Pairs line by line; files of different lengths are refused before anything is read."""
    src_count, tgt_count = count_lines(src_path), count_lines(tgt_path)
    if src_count != tgt_count:
        raise DataError(
            f"parallel files differ in length: {src_path} has {src_count} lines, "
            f"{tgt_path} has {tgt_count} lines"
        )
    src_lines = read_lines(src_path, replace=replace, counts=counts)
    return zip(src_lines, read_lines(tgt_path, replace=replace, counts=counts), strict=True)


def read_hf_dataset(
    path: str, config: str | None, split: str, src_lang: str, tgt_lang: str
) -> Iterator[tuple[str, str]]:
    """Rows of a dataset in the hub's translation format: a `translation` column of {lang: text}."""
    dataset = load_hf_split(path, config, split)
    if "translation" not in dataset.column_names:
        raise DataError(
            f"dataset '{path}' has no 'translation' column (columns: {dataset.column_names})"
        )
    for row in dataset:
        pair = row["translation"]
        if src_lang not in pair or tgt_lang not in pair:
            raise DataError(
                f"dataset '{path}': languages {src_lang}, {tgt_lang} not in {sorted(pair)}"
            )
        yield pair[src_lang], pair[tgt_lang]


def load_hf_split(path: str, config: str | None, split: str):
    """One split as a memory-mapped Arrow dataset (downloaded once into the HF cache)."""
    import datasets  # imported here: loading it costs a second, and only this source needs it

    try:
        return datasets.load_dataset(path, config, split=split)
    except (ConnectionError, OSError) as error:
        raise DataError(
            f"cannot load dataset '{path}' ({config}, split {split}) from the Hugging Face hub or "
            f"the local cache: {error}. Without network access, use local files instead: "
            "data=files data.dir=<folder with {split}.{lang} files>"
        ) from error


def toy_split(cfg: DataConfig, split: str) -> list[tuple[str, str]]:
    n_train, n_valid, n_test = cfg.toy_sizes
    return cached_toy_splits(cfg.toy_seed, n_train, n_valid, n_test)[split]


@functools.lru_cache(maxsize=2)
def cached_toy_splits(
    seed: int, n_train: int, n_valid: int, n_test: int
) -> dict[str, list[tuple[str, str]]]:
    """The generated corpus, made once per process for all three splits."""
    from transformer_mt.data.toy import toy_splits

    return toy_splits(seed=seed, n_train=n_train, n_valid=n_valid, n_test=n_test)


def corpus_identity(cfg: DataConfig) -> str:
    """A readable description of the corpus, for logs."""
    if cfg.source == SourceKind.files:
        return f"files in {os.path.abspath(cfg.dir or '.')}"
    if cfg.source == SourceKind.hf:
        return f"datasets {cfg.hf_path} ({cfg.hf_config})"
    return f"toy corpus (seed {cfg.toy_seed}, sizes {list(cfg.toy_sizes)})"
