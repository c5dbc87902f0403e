"""Token ids of a whole split in one flat array plus offsets: no Python list per sentence.

Saved as .npy files and opened memory-mapped, so every process reading a split shares one copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class TokenArray:
    """Sentence i is tokens[offsets[i]:offsets[i + 1]]."""

    tokens: np.ndarray  # (total pieces,) int32
    offsets: np.ndarray  # (N + 1,) int64

    @classmethod
    def from_lists(cls, sequences: list[list[int]]) -> TokenArray:
        lengths = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=len(sequences))
        offsets = np.zeros(len(sequences) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        tokens = np.fromiter(
            (t for s in sequences for t in s), dtype=np.int32, count=int(offsets[-1])
        )
        return cls(tokens, offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> np.ndarray:
        return self.tokens[self.offsets[index] : self.offsets[index + 1]]

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def save(self, prefix: Path) -> None:
        np.save(f"{prefix}.tokens.npy", self.tokens)
        np.save(f"{prefix}.offsets.npy", self.offsets)

    @classmethod
    def load(cls, prefix: Path) -> TokenArray:
        return cls(
            np.load(f"{prefix}.tokens.npy", mmap_mode="r"),
            np.load(f"{prefix}.offsets.npy", mmap_mode="r"),
        )


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
        return cls(
            TokenArray.load(folder / f"{split}.src"), TokenArray.load(folder / f"{split}.tgt")
        )
