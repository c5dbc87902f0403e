"""Token ids of a whole split in one flat memory-mapped array plus offsets.

No Python object per sentence: sentence i is tokens[offsets[i]:offsets[i + 1]]. Ids are stored
as uint16 when the vocabulary fits, else int32. Files are opened memory-mapped, so every process
reading a split (data-parallel ranks, loader workers) shares one copy in the page cache.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from transformer_mt.errors import DataError


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype(np.int32)


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
    def load(cls, prefix: Path) -> TokenArray:
        """Memory-map a stored array; a missing or inconsistent file is a DataError naming it."""
        try:
            meta = json.loads(Path(f"{prefix}.json").read_text())
            offsets = np.load(f"{prefix}.offsets.npy", mmap_mode="r")
            dtype, total = np.dtype(meta["dtype"]), int(offsets[-1])
            size = Path(f"{prefix}.bin").stat().st_size
        except (OSError, ValueError, KeyError) as error:
            raise DataError(
                f"{prefix}.*: unreadable token store ({error}); delete its folder to rebuild"
            ) from error
        if size != total * dtype.itemsize or len(offsets) != meta["sentences"] + 1:
            raise DataError(
                f"{prefix}.bin: {size} bytes do not match its index; delete its folder to rebuild"
            )
        if total == 0:
            return cls(np.zeros(0, dtype=dtype), offsets)
        return cls(np.memmap(f"{prefix}.bin", dtype=dtype, mode="r", shape=(total,)), offsets)


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
    def load(cls, folder: Path, split: str) -> ParallelTokens:
        src, tgt = (
            TokenArray.load(folder / f"{split}.src"),
            TokenArray.load(folder / f"{split}.tgt"),
        )
        if len(src) != len(tgt):
            raise DataError(
                f"{folder}: {split} has {len(src)} source and {len(tgt)} target sentences"
            )
        return cls(src, tgt)
