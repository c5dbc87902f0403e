"""Token ids of a whole split in one flat memory-mapped array plus offsets.

No Python object per sentence: sentence i is tokens[offsets[i]:offsets[i + 1]]. Ids are stored
as uint16 when the vocabulary fits, else int32. Files are opened memory-mapped, so every process
reading a split (data-parallel ranks, loader workers) shares one copy in the page cache.

A folder of stored files is made durable and checkable here too: `seal_files` fsyncs every file
and records its size and sha256, `check_files` compares a folder with that record; a file that a
crash, a power cut or bit rot changed is then a DataError naming it, not a numpy traceback or an
out-of-range id hours into training.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from transformer_mt.errors import DataError
from transformer_mt.files import file_sha256, fsync_path

TOKEN_DTYPES = (np.dtype(np.uint16), np.dtype(np.int32))


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype(np.int32)


def damaged(path: Path, problem: str) -> DataError:
    """The one-line error for a damaged file of a prepared folder: which file, what, the fix."""
    problem = " ".join(str(problem).split())  # numpy and json messages may span lines
    return DataError(f"{path}: {problem}; delete the folder {path.parent} to rebuild it")


@dataclass(frozen=True)
class TokenArray:
    """Sentence i is tokens[offsets[i]:offsets[i + 1]]."""

    tokens: np.ndarray  # (total pieces,) uint16 or int32
    offsets: np.ndarray  # (N + 1,) int64

    @classmethod
    def from_lists(cls, sequences: list[list[int]], dtype: type = np.int32) -> TokenArray:
        lengths = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=len(sequences))
        offsets = np.zeros(len(sequences) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        total = int(offsets[-1])
        tokens = np.fromiter((t for s in sequences for t in s), dtype=dtype, count=total)
        return cls(tokens, offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> np.ndarray:
        return self.tokens[self.offsets[index] : self.offsets[index + 1]]

    @property
    def lengths(self) -> np.ndarray:
        """Pieces per sentence, int32 (half the memory of int64 for WMT-sized splits)."""
        return np.diff(self.offsets).astype(np.int32)

    def save(self, prefix: Path) -> None:
        with TokenArrayWriter(prefix, self.tokens.dtype) as writer:
            writer.append(np.asarray(self.tokens), self.lengths)

    @classmethod
    def load(cls, prefix: Path, *, vocab_size: int | None = None) -> TokenArray:
        """Memory-map a stored array. A missing, empty, truncated or garbled file, offsets that do
        not start at 0 or decrease, or (given vocab_size) an id at or above it: a DataError naming
        the file (the id check reads every token once: 10 ms per 100 MB)."""
        dtype, sentences = read_index(Path(f"{prefix}.json"))
        offsets = read_offsets(Path(f"{prefix}.offsets.npy"), sentences)
        tokens_path = Path(f"{prefix}.bin")
        total = int(offsets[-1])
        try:
            size = tokens_path.stat().st_size
        except OSError as error:
            raise damaged(tokens_path, f"unreadable ({error})") from error
        if size != total * dtype.itemsize:
            raise damaged(tokens_path, f"{size} bytes do not match its index ({total} x {dtype})")
        if total == 0:
            return cls(np.zeros(0, dtype=dtype), offsets)
        tokens = np.memmap(tokens_path, dtype=dtype, mode="r", shape=(total,))
        if vocab_size is not None and (largest := int(tokens.max())) >= vocab_size:
            raise damaged(
                tokens_path, f"token id {largest} is not below the vocabulary size {vocab_size}"
            )
        return cls(tokens, offsets)


def read_index(path: Path) -> tuple[np.dtype, int]:
    """The dtype and sentence count that `{prefix}.json` records."""
    try:
        meta = json.loads(path.read_text())
        dtype, sentences = np.dtype(meta["dtype"]), int(meta["sentences"])
    except Exception as error:  # OSError, JSON, a missing key, a garbled dtype (TypeError) ...
        raise damaged(
            path, f"not a readable token index ({type(error).__name__}: {error})"
        ) from error
    if dtype not in TOKEN_DTYPES or sentences < 0:
        raise damaged(path, f"dtype {dtype} and {sentences} sentences are not a token index")
    return dtype, sentences


def read_offsets(path: Path, sentences: int) -> np.ndarray:
    """The (sentences + 1,) int64 offsets, checked to start at 0 and never decrease."""
    try:
        offsets = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as error:  # an empty file is EOFError or ValueError, a garbled one ValueError
        raise damaged(
            path, f"not a readable offsets array ({type(error).__name__}: {error})"
        ) from error
    if offsets.shape != (sentences + 1,) or offsets.dtype != np.int64:
        raise damaged(
            path,
            f"{offsets.dtype} array of shape {offsets.shape} does not match its index "
            f"({sentences} sentences)",
        )
    if offsets[0] != 0 or bool(np.any(offsets[1:] < offsets[:-1])):
        raise damaged(path, "its offsets do not start at 0, or they decrease somewhere")
    return offsets


class TokenArrayWriter:
    """Appends chunks of sentences to `{prefix}.bin`; on a clean exit writes the offsets index
    (without it the files are never loaded); `count` is then the number of sentences."""

    def __init__(self, prefix: Path, dtype: np.dtype):
        self.prefix, self.dtype = prefix, np.dtype(dtype)
        self.lengths: list[np.ndarray] = []
        self.count = 0

    def __enter__(self) -> TokenArrayWriter:
        self.handle = open(f"{self.prefix}.bin", "wb")  # noqa: SIM115 (closed in __exit__)
        return self

    def append(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        self.handle.write(np.ascontiguousarray(tokens, dtype=self.dtype).tobytes())
        self.lengths.append(np.asarray(lengths, dtype=np.int64))

    def __exit__(self, error_type, error, traceback) -> None:
        self.handle.close()
        if error_type is not None:
            return
        lengths = np.concatenate(self.lengths) if self.lengths else np.zeros(0, dtype=np.int64)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        np.save(f"{self.prefix}.offsets.npy", offsets)
        Path(f"{self.prefix}.json").write_text(
            json.dumps({"dtype": self.dtype.name, "sentences": len(lengths)})
        )
        self.count = len(lengths)


@dataclass(frozen=True)
class ParallelTokens:
    """Source and target ids of one split, aligned by index."""

    src: TokenArray
    tgt: TokenArray

    def __len__(self) -> int:
        return len(self.src)

    def save(self, folder: Path, split: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.src.save(folder / f"{split}.src")
        self.tgt.save(folder / f"{split}.tgt")

    @classmethod
    def load(
        cls, folder: Path, split: str, vocab_sizes: tuple[int, int] | None = None
    ) -> ParallelTokens:
        """The split's two arrays; vocab_sizes (source, target): ids must be below them."""
        return cls.load_sides(folder / f"{split}.src", folder / f"{split}.tgt", vocab_sizes)

    @classmethod
    def load_sides(
        cls, src_prefix: Path, tgt_prefix: Path, vocab_sizes: tuple[int, int] | None = None
    ) -> ParallelTokens:
        """Two stored arrays (by file prefix, `{folder}/{split}.src`) as one split's sides; a
        DataError when their sentence counts differ."""
        src_vocab, tgt_vocab = vocab_sizes or (None, None)
        src = TokenArray.load(src_prefix, vocab_size=src_vocab)
        tgt = TokenArray.load(tgt_prefix, vocab_size=tgt_vocab)
        if len(src) != len(tgt):
            raise DataError(
                f"{src_prefix} has {len(src)} sentences, but its target side {tgt_prefix} "
                f"has {len(tgt)}"
            )
        return cls(src, tgt)


@dataclass(frozen=True)
class StoredSplit:
    """Where a training corpus's pairs lie: its source and target stores (file prefixes, as
    `{folder}/{split}.src`; a sampled segmentation's may lie in another folder than the other
    side's), and the ids put before each of its sources (a corpus's tag)."""

    src: Path
    tgt: Path
    src_prefix: tuple[int, ...] = ()

    @classmethod
    def of(cls, folder: Path, split: str, src_prefix: tuple[int, ...] = ()) -> StoredSplit:
        """A split of a prepared folder."""
        return cls(folder / f"{split}.src", folder / f"{split}.tgt", src_prefix)


class PrefixedTokens:
    """Sentence i of a TokenArray with `prefix` before it (what a batch reads of one side)."""

    def __init__(self, array: TokenArray, prefix: tuple[int, ...]):
        self.array, self.prefix = array, np.asarray(prefix, dtype=array.tokens.dtype)

    def __getitem__(self, index: int) -> np.ndarray:
        tokens = self.array[index]
        return np.concatenate([self.prefix, tokens]) if len(self.prefix) else tokens


class MixedTokens:
    """Several stored splits read as one: example i is pair i - offsets[k] of split k (the k
    with offsets[k] <= i < offsets[k + 1]), its source after split k's prefix. Has `src` and
    `tgt` as ParallelTokens has, for `collate`."""

    def __init__(self, stores: list[StoredSplit]):
        parts = [ParallelTokens.load_sides(store.src, store.tgt) for store in stores]
        self.offsets = np.cumsum([0, *(len(part) for part in parts)])
        prefixed = zip(parts, stores, strict=True)
        self.src = MixedSide(
            [PrefixedTokens(p.src, s.src_prefix) for p, s in prefixed], self.offsets
        )
        self.tgt = MixedSide([PrefixedTokens(part.tgt, ()) for part in parts], self.offsets)

    def __len__(self) -> int:
        return int(self.offsets[-1])


class MixedSide:
    """One side of MixedTokens."""

    def __init__(self, parts: list[PrefixedTokens], offsets: np.ndarray):
        self.parts, self.offsets = parts, offsets

    def __getitem__(self, index: int) -> np.ndarray:
        part = int(np.searchsorted(self.offsets, index, side="right")) - 1
        return self.parts[part][int(index - self.offsets[part])]


# ---- a folder's files: durable before it is published, checked when it is opened ---------
def seal_files(folder: Path) -> dict[str, dict]:
    """fsync every file of `folder` and return {name: {"bytes", "sha256"}}: the record that
    `check_files` compares the folder with. Without the fsync, a power cut soon after the folder
    is renamed into place can leave its files empty (ext4's delayed allocation)."""
    record = {}
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        fsync_path(path)
        record[path.name] = {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
    return record


def check_files(folder: Path, record: dict[str, dict]) -> None:
    """DataError naming the first file of `record` (as `seal_files` wrote it) that is missing or
    whose size or sha256 differ from what was written (hashing reads every file: 0.08 s per
    100 MB here, which a run start can afford)."""
    for name, entry in record.items():
        path = folder / name
        try:
            size = path.stat().st_size
        except OSError as error:
            raise damaged(path, f"missing or unreadable ({error.strerror})") from error
        if size != entry["bytes"]:
            raise damaged(
                path,
                f"{size} bytes, but {entry['bytes']} were written when it was prepared (cut "
                "short by a crash or a power cut?)",
            )
        if file_sha256(path) != entry["sha256"]:
            raise damaged(path, "its content changed since it was prepared (sha256 differs)")
