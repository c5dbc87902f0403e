"""Where parallel text comes from: local files, a Hugging Face dataset, or the embedded toy corpus.

Every source yields (source sentence, target sentence) string pairs for one split.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import socket
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from transformer_mt.config import DataConfig, InvalidUtf8, SourceKind
from transformer_mt.errors import DataError
from transformer_mt.files import file_sha256

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
        return read_hf_dataset(cfg, split)
    return iter(toy_split(cfg, split))


def source_version(cfg: DataConfig, splits: tuple[str, ...] = ("train", "valid")) -> dict:
    """What identifies the content of the corpus's `splits`: each file's name, size and sha256
    (not its folder or time, so a copy on another node or mount names the same prepared
    folder), the HF dataset's fingerprint, or the toy generator's seed and sizes."""
    names = [split_name(cfg, split) for split in splits]
    if cfg.source == SourceKind.files:
        files = [p for name in names for p in parallel_file_paths(cfg, name)]
        for path in files:
            if not path.is_file():
                raise DataError(f"{path}: no such file")
        return {path.name: content_identity(path) for path in files}
    if cfg.source == SourceKind.hf:
        found = load_hf_splits(cfg.hf_path, cfg.hf_config, cfg.hf_revision, data_files_key(cfg))
        used = [name for name in names if name in found]
        return {name: found[name]._fingerprint for name in used} | {"path": cfg.hf_path}
    from transformer_mt.data.toy import TOY_VERSION

    return {"toy": TOY_VERSION}


def content_identity(path: Path) -> list:
    """[size, sha256] of a file. The whole file is hashed (0.08 s per 100 MB here), once per
    process while its size, time and inode stay the same: a start asks several times."""
    status = path.stat()
    key = (str(path.resolve()), status.st_size, status.st_mtime_ns, status.st_ino)
    return [status.st_size, cached_sha256(*key)]


@functools.lru_cache(maxsize=16)
def cached_sha256(path: str, size: int, mtime_ns: int, inode: int) -> str:
    """file_sha256, keyed by what changes when the file is rewritten."""
    return file_sha256(Path(path))


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


def check_parallel_files(src_path: Path, tgt_path: Path) -> None:
    """DataError unless both files exist and have as many lines."""
    src_count, tgt_count = count_lines(src_path), count_lines(tgt_path)
    if src_count != tgt_count:
        raise DataError(
            f"parallel files differ in length: {src_path} has {src_count} lines, "
            f"{tgt_path} has {tgt_count} lines"
        )


def check_training_files(cfg: DataConfig) -> None:
    """For local files: DataError unless the training split's two files exist and have as many
    lines (what reading them would find, found before anything is prepared)."""
    if cfg.source == SourceKind.files:
        check_parallel_files(*parallel_file_paths(cfg, cfg.train_split))


def read_parallel_files(
    src_path: Path, tgt_path: Path, *, replace: bool = False, counts: Counter | None = None
) -> Iterator[tuple[str, str]]:
    """Pairs line by line; files of different lengths are refused before anything is read."""
    check_parallel_files(src_path, tgt_path)
    src_lines = read_lines(src_path, replace=replace, counts=counts)
    return zip(src_lines, read_lines(tgt_path, replace=replace, counts=counts), strict=True)


def read_hf_dataset(cfg: DataConfig, split: str) -> Iterator[tuple[str, str]]:
    """Rows of one split ('train', 'valid', 'test') of a Hugging Face dataset: a `translation`
    column of {lang: text}, or two flat text columns (data.hf_src_column / data.hf_tgt_column,
    else the columns named by the language codes)."""
    dataset = hf_split(cfg, split)
    columns = text_columns(dataset.column_names, cfg)
    if columns is None:
        for row in dataset:
            pair = row["translation"]
            if cfg.src_lang not in pair or cfg.tgt_lang not in pair:
                raise DataError(
                    f"dataset '{cfg.hf_path}': languages {cfg.src_lang}, {cfg.tgt_lang} not in "
                    f"its translation column's {sorted(pair)}"
                )
            yield pair[cfg.src_lang], pair[cfg.tgt_lang]
        return
    src_column, tgt_column = columns
    for row in dataset.select_columns([src_column, tgt_column]):
        yield row[src_column], row[tgt_column]


def text_columns(names: list[str], cfg: DataConfig) -> tuple[str, str] | None:
    """The source and target text columns; None for a `translation` column of {lang: text}."""
    if cfg.hf_src_column or cfg.hf_tgt_column:
        wanted = {"data.hf_src_column": cfg.hf_src_column, "data.hf_tgt_column": cfg.hf_tgt_column}
        for key, name in wanted.items():
            if name not in names:
                raise DataError(
                    f"config key '{key}': dataset '{cfg.hf_path}' has no column {name!r} "
                    f"(its columns: {', '.join(names)})"
                )
        return cfg.hf_src_column, cfg.hf_tgt_column
    if "translation" in names:
        return None
    if cfg.src_lang in names and cfg.tgt_lang in names:
        return cfg.src_lang, cfg.tgt_lang
    raise DataError(
        f"dataset '{cfg.hf_path}' has neither a 'translation' column nor columns named "
        f"{cfg.src_lang!r} and {cfg.tgt_lang!r} (its columns: {', '.join(names)}): name the text "
        "columns with data.hf_src_column and data.hf_tgt_column"
    )


def hf_split(cfg: DataConfig, split: str):
    """One split of the dataset; without a split named data.valid_split, 'valid' is
    data.carve_valid pairs drawn from train (seeded by data.seed) and 'train' is the rest
    (data.carve_valid=0: 'train' is all of it, and there is no 'valid')."""
    splits = load_hf_splits(cfg.hf_path, cfg.hf_config, cfg.hf_revision, data_files_key(cfg))
    name = split_name(cfg, split)
    carving = split in ("train", "valid") and cfg.valid_split not in splits
    if carving and split == "train" and cfg.carve_valid == 0:  # nothing carved: all of it
        carving = False
    if not carving:
        if name not in splits:
            raise DataError(
                f"dataset '{cfg.hf_path}' has no split {name!r} (its splits: "
                f"{', '.join(splits)}): see data.train_split, data.valid_split, data.test_split"
            )
        return splits[name]
    train = splits.get(cfg.train_split)
    if train is None or cfg.carve_valid < 1 or cfg.carve_valid >= len(train):
        raise DataError(
            f"dataset '{cfg.hf_path}' has no split {cfg.valid_split!r} (its splits: "
            f"{', '.join(splits)}) to validate on, and data.carve_valid={cfg.carve_valid} pairs "
            f"cannot be carved from its {cfg.train_split!r} split"
        )
    order = np.random.default_rng(cfg.seed).permutation(len(train))
    carved, kept = np.sort(order[: cfg.carve_valid]), np.sort(order[cfg.carve_valid :])
    if split == "valid":
        log.info(
            "no %r split in %s: %d of %d train pairs carved out as the valid split (seed %d)",
            cfg.valid_split,
            cfg.hf_path,
            len(carved),
            len(train),
            cfg.seed,
        )
    return train.select(carved if split == "valid" else kept)


def data_files_key(cfg: DataConfig) -> tuple[tuple[str, str], ...]:
    """data.hf_data_files as a hashable key."""
    return tuple(sorted((cfg.hf_data_files or {}).items()))


@functools.lru_cache(maxsize=4)
def load_hf_splits(path: str, config: str | None, revision: str | None, data_files: tuple):
    """Every split of a dataset (memory-mapped Arrow tables, downloaded once into the HF cache):
    a dataset on the hub (an id, with a revision), a folder written by `save_to_disk`, a local
    folder of parquet / JSON files, or a builder ('parquet', 'json') with data files (paths or
    hf:// URLs) per split. Data files are relative to the dataset's folder or repository (at
    its revision) unless they are absolute paths or URLs."""
    import datasets  # imported here: loading it costs a second, and only this source needs it
    import pyarrow
    from datasets.builder import DatasetGenerationError

    if (Path(path) / "dataset_dict.json").is_file():
        try:
            return dict(datasets.load_from_disk(path))
        except (pyarrow.ArrowException, ValueError, OSError) as error:  # JSON, Arrow, missing
            raise DataError(
                f"{path}: a dataset folder written by save_to_disk that cannot be read "
                f"({type(error).__name__}: {one_line(error)}); write it again with save_to_disk"
            ) from error
    try:
        return dict(
            datasets.load_dataset(
                path, config, revision=revision, data_files=dict(data_files) or None
            )
        )
    except (pyarrow.ArrowException, DatasetGenerationError) as error:  # before OSError, which
        cache = hf_cache_folder(path, config, revision, data_files)  # ArrowIOError also is
        raise DataError(
            f"cannot read {dataset_name(path, config, revision)}: {type(error).__name__}: "
            f"{one_line(error)}. Its copy in the Hugging Face cache ({cache}) is corrupt, or the "
            "dataset's own files are: delete that cache folder and rerun to read it again"
        ) from error
    except Exception as error:
        failure = load_failure(path, config, revision, error)
        if failure is None:
            raise
        raise failure from error


def load_failure(
    path: str, config: str | None, revision: str | None, error: Exception
) -> DataError | None:
    """The one-line message for why `datasets` could not load a dataset: a loading script it
    cannot run, no network (with no copy in the cache), or a path, revision or file that does
    not exist; None for an error of another kind (raised as it is)."""
    import datasets

    name = dataset_name(path, config, revision)
    script = SCRIPT_ONLY.search(str(error)) if isinstance(error, RuntimeError) else None
    if script:
        if Path(path).is_dir():
            fix = "convert it to parquet or JSON files (one per split) in a folder and load that"
        else:
            fix = (
                "load the hub's parquet copy of it instead, data.hf_revision=refs/convert/parquet "
                "with data.hf_data_files naming its files (as data=iwslt17_de_en does), or "
                "local files (data=files data.dir=<folder with {split}.{lang} files>)"
            )
        return DataError(
            f"{name} is a loading script ({script.group(1)}), which datasets "
            f"{datasets.__version__} cannot run (datasets 4.0 and later run no scripts): {fix}"
        )
    if unreachable(error):
        return DataError(
            f"cannot reach the Hugging Face hub for {name}, and it is not in the local cache: "
            f"{type(error).__name__}: {one_line(error)}. Without network access, use "
            "local files: data=files data.dir=<folder with {split}.{lang} files>, or a copy in "
            "the hub's layout: data.hf_path=<folder>"
        )
    if isinstance(error, FileNotFoundError):  # datasets' DatasetNotFoundError and others too
        detail = SUPPORTED_EXTENSIONS.sub("", one_line(error)).rstrip(".")
        return DataError(
            f"{name} not found: {detail} (see data.hf_path, data.hf_revision, data.hf_data_files)"
        )
    if isinstance(error, OSError):
        return DataError(f"cannot load {name}: {type(error).__name__}: {one_line(error)}")
    return None


SCRIPT_ONLY = re.compile(r"Dataset scripts are no longer supported, but found (\S+)")
SUPPORTED_EXTENSIONS = re.compile(r" with any supported extension \[[^\]]*\]")


def unreachable(error: BaseException) -> bool:
    """True when the error, or one it was raised from or during, is a failed connection: the
    hub's offline mode, a refused connection, an unknown host or a timeout (httpx and requests
    errors carry the socket's error beneath them)."""
    chain: list[BaseException] = []
    seen: BaseException | None = error
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    return any(isinstance(e, (ConnectionError, TimeoutError, socket.gaierror)) for e in chain)


def dataset_name(path: str, config: str | None, revision: str | None) -> str:
    """'dataset NAME (config C, revision R)', for messages."""
    details = []
    if config is not None:
        details.append(f"config {config}")
    if revision:
        details.append(f"revision {revision}")
    return f"dataset '{path}'" + (f" ({', '.join(details)})" if details else "")


def hf_cache_folder(path: str, config: str | None, revision: str | None, data_files: tuple) -> str:
    """The folder of the HF cache that holds a dataset's prepared Arrow files, for a message (the
    cache's root when the builder cannot be resolved either)."""
    import datasets

    try:
        builder = datasets.load_dataset_builder(
            path, config, revision=revision, data_files=dict(data_files) or None
        )
        return builder.cache_dir
    except Exception:  # whatever broke the load may break this too; the root still helps
        return str(datasets.config.HF_DATASETS_CACHE)


def one_line(error: Exception) -> str:
    return " ".join(str(error).split())


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


def pair_place(cfg: DataConfig, split: str) -> Callable[[int, int], str]:
    """where(number, side): pair `number` (from 1) of a split, side 0 (source) or 1 (target),
    for a message: FILE:LINE for local files, else the corpus, split and pair."""
    if cfg.source == SourceKind.files:
        paths = parallel_file_paths(cfg, split_name(cfg, split))
        return lambda number, side: f"{paths[side]}:{number}"
    return lambda number, side: f"{corpus_identity(cfg)}, {split} pair {number}"


def corpus_identity(cfg: DataConfig) -> str:
    """A readable description of the corpus, for logs."""
    if cfg.source == SourceKind.files:
        return f"files in {os.path.abspath(cfg.dir or '.')}"
    if cfg.source == SourceKind.hf:
        return f"datasets {cfg.hf_path} ({cfg.hf_config})"
    return f"toy corpus (seed {cfg.toy_seed}, sizes {list(cfg.toy_sizes)})"
