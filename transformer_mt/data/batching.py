"""Length-bucketed batches under a token budget, shuffled deterministically per epoch."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from transformer_mt.data.store import ParallelTokens


def token_batches(
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
    max_tokens: int,
    *,
    seed: int,
    epoch: int,
    shuffle: bool = True,
) -> list[np.ndarray]:
    """Index arrays whose padded size (count x longest, each side, +1 for BOS/EOS) fits max_tokens.

    Examples are sorted by length (ties broken at random) so that each batch holds similar
    lengths; the batch order is then shuffled from (seed, epoch).
    """
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(src_lengths)) if shuffle else np.arange(len(src_lengths))
    order = order[np.lexsort((src_lengths[order], tgt_lengths[order]))]
    batches, start, longest = [], 0, 0
    for position, index in enumerate(order):
        longest_if_added = max(longest, src_lengths[index] + 1, tgt_lengths[index] + 1)
        if position > start and longest_if_added * (position - start + 1) > max_tokens:
            batches.append(order[start:position])
            start, longest_if_added = position, max(src_lengths[index], tgt_lengths[index]) + 1
        longest = longest_if_added
    if start < len(order):
        batches.append(order[start:])
    if shuffle:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


@dataclass
class Batch:
    src: torch.Tensor  # (B, S) source ids + EOS, right-padded
    tgt_in: torch.Tensor  # (B, T) BOS + target ids
    tgt_out: torch.Tensor  # (B, T) target ids + EOS, pad where tgt_in is pad
    n_tgt_tokens: int  # real (non-pad) tokens in tgt_out

    def to(self, device: torch.device) -> Batch:
        non_blocking = device.type == "cuda"
        return Batch(
            self.src.to(device, non_blocking=non_blocking),
            self.tgt_in.to(device, non_blocking=non_blocking),
            self.tgt_out.to(device, non_blocking=non_blocking),
            self.n_tgt_tokens,
        )


def pad_sequences(
    sequences: list[np.ndarray],
    pad_id: int,
    *,
    prefix: int | None = None,
    suffix: int | None = None,
) -> torch.Tensor:
    extra = (prefix is not None) + (suffix is not None)
    width = max(len(s) for s in sequences) + extra
    out = np.full((len(sequences), width), pad_id, dtype=np.int64)
    for row, sequence in enumerate(sequences):
        start = 0
        if prefix is not None:
            out[row, 0] = prefix
            start = 1
        out[row, start : start + len(sequence)] = sequence
        if suffix is not None:
            out[row, start + len(sequence)] = suffix
    return torch.from_numpy(out)


def collate(
    data: ParallelTokens, indices: np.ndarray, *, pad_id: int, bos_id: int, eos_id: int
) -> Batch:
    src = [data.src[i] for i in indices]
    tgt = [data.tgt[i] for i in indices]
    tgt_out = pad_sequences(tgt, pad_id, suffix=eos_id)
    return Batch(
        src=pad_sequences(src, pad_id, suffix=eos_id),
        tgt_in=pad_sequences(tgt, pad_id, prefix=bos_id),
        tgt_out=tgt_out,
        n_tgt_tokens=int((tgt_out != pad_id).sum()),
    )
