"""Length-bucketed batches under a token budget, shuffled per (seed, epoch), split across ranks.

Two ways to group (`equal_sources`, the execution policy's ExecutionPolicy.equal_source_lengths):
sentences of similar lengths, padded (and masked) to the batch's longest; or, where a source
length has enough sentences, batches of that one length, so that no source position is padding
and attention needs no key mask (targets are still padded, on the right, where causal attention
needs none): `one_length_batches`. Both fill the same budgets: the sentences a length leaves over
(less than half a batch) are packed with their neighbours' as before, padded and masked. On a
WMT-sized corpus 99.5% of the target tokens are in batches of one length, on Multi30k 85-96%,
with no more batches than similar lengths give (benchmarks/batch_plan.txt).

`token_batches` decides which examples go together; `plan_batches` how many of them make one
update and under what budget; `BatchDataset` collates them from the memory-mapped store inside
DataLoader workers, so the training process only receives tensors.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from transformer_mt.data.store import MixedTokens, ParallelTokens, StoredSplit
from transformer_mt.errors import DataError
from transformer_mt.shapes import in_eighth_steps


def token_batches(
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
    max_tokens: int,
    *,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    rank: int = 0,
    world_size: int = 1,
    equal_sources: bool = False,
) -> list[np.ndarray]:
    """This rank's index arrays: its share of `epoch_batches`, which deals the batches out in
    turn (rank r takes batches r, r + world_size, r + 2 world_size, ...)."""
    batches = epoch_batches(
        src_lengths,
        tgt_lengths,
        max_tokens,
        seed=seed,
        epoch=epoch,
        shuffle=shuffle,
        world_size=world_size,
        equal_sources=equal_sources,
    )
    return batches[rank::world_size]


def epoch_batches(
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
    max_tokens: int,
    *,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    world_size: int = 1,
    equal_sources: bool = False,
) -> list[np.ndarray]:
    """Every rank's index arrays of an epoch, in dealing order; a batch's padded size (count x
    longest side + 1) fits max_tokens; with `equal_sources` its sentences share one source
    length wherever that length fills at least half a batch (`one_length_batches`). Every rank
    computes the same list from (seed, epoch), so each knows the others' batches without asking
    them.

    Examples are sorted by source length, then target length (ties broken at random), so that
    a batch holds similar lengths; the batch order is shuffled from (seed, epoch); the count is
    a multiple of world_size, so every rank gets the same number of batches, and every example
    is in exactly one batch.

    The source length is the first key, as in fairseq: sorted by target length first, every
    batch's targets had one length, and the model learned slower per update (valid perplexity
    after 250 updates on Multi30k 28.0 against 23.7, same model, loop and seed:
    benchmarks/vs_fairseq.txt).
    """
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(src_lengths)) if shuffle else np.arange(len(src_lengths))
    order = order.astype(np.int32)  # 4 bytes an example: 18 MB for WMT14 en-de
    order = order[length_order(src_lengths[order], tgt_lengths[order])]
    widths = np.maximum(src_lengths[order], tgt_lengths[order]) + 1  # + BOS / EOS
    batches = pack(order, widths, max_tokens, src_lengths[order] if equal_sources else None)
    batches = split_to_multiple(batches, world_size)
    if shuffle:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def target_tokens_by_turn(
    batches: list[np.ndarray], tgt_lengths: np.ndarray, world_size: int
) -> np.ndarray:
    """Entry i: the target tokens (with EOS, as `collate` counts them) of the ranks' i-th batches
    of `epoch_batches`' list together, what an update's loss is divided by (int64)."""
    sizes = np.fromiter((len(batch) for batch in batches), dtype=np.int64, count=len(batches))
    tokens = tgt_lengths[np.concatenate(batches)].astype(np.int64) + 1
    per_batch = np.add.reduceat(tokens, np.cumsum(sizes) - sizes)  # every batch holds >= 1
    return per_batch.reshape(-1, world_size).sum(axis=1)


def batch_shapes(
    batches: list[np.ndarray],
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
    *,
    round_lengths: bool = False,
    equal_sources: bool = False,
) -> np.ndarray:
    """(batches, 3) int64: each batch's (rows, source width, target width) as `collate` pads it
    (BOS / EOS counted; `round_lengths` and `equal_sources` as collate takes them: with both, a
    batch of one source length keeps it exact). Its distinct rows are the shapes a device meets
    in the epoch, each new one a plan, a kernel or an allocation the first time."""
    sizes = np.fromiter((len(batch) for batch in batches), dtype=np.int64, count=len(batches))
    starts = np.cumsum(sizes) - sizes
    order = np.concatenate(batches)
    widths = [np.maximum.reduceat(side[order], starts) + 1 for side in (src_lengths, tgt_lengths)]
    if round_lengths:
        rounded = [np.fromiter(map(in_eighth_steps, side.tolist()), np.int64) for side in widths]
        one_length = np.minimum.reduceat(src_lengths[order], starts) + 1 == widths[0]
        widths = [np.where(one_length & equal_sources, widths[0], rounded[0]), rounded[1]]
    return np.stack([sizes, *widths], axis=1)


def length_order(src_lengths: np.ndarray, tgt_lengths: np.ndarray) -> np.ndarray:
    """Indices that sort by source length, then target length; stable, so earlier ties stay."""
    return np.lexsort((tgt_lengths, src_lengths))


def pack(
    order: np.ndarray, widths: np.ndarray, max_tokens: int, lengths: np.ndarray | None = None
) -> list[np.ndarray]:
    """Cut the sorted order into batches whose count x max width fits max_tokens: consecutive
    runs (`batch_ends`), or, given the source `lengths` in that order, `one_length_batches`."""
    if lengths is not None:
        return [order[positions] for positions in one_length_batches(widths, lengths, max_tokens)]
    bounds = [0, *batch_ends(widths, max_tokens)]
    return [order[start:end] for start, end in zip(bounds, bounds[1:], strict=False)]


def batch_ends(widths: np.ndarray, max_tokens: int, stops: np.ndarray | None = None) -> list[int]:
    """Where each run ends: the longest from its start whose count x widest fits max_tokens (a
    run's first example always goes in, however wide) and that crosses none of `stops`
    (positions where a run must end). One vectorized step per run, not a Python step per
    example: `plan_batches` packs the corpus some 30 times (4.5M examples in length order:
    0.05-0.15 s a packing here, against 0.7 s example by example)."""
    ends, start = [], 0
    for stop in [*(stops.tolist() if stops is not None else []), len(widths)]:
        while start < stop:
            # count x widest > max_tokens from count max_tokens // widths[start] + 1 on
            window = widths[start : min(start + max_tokens // int(widths[start]) + 1, stop)]
            sizes = np.maximum.accumulate(window) * np.arange(1, len(window) + 1)
            over = np.flatnonzero(sizes[1:] > max_tokens)
            start += int(over[0]) + 1 if len(over) else len(window)
            ends.append(start)
    return ends


def one_length_batches(
    widths: np.ndarray, lengths: np.ndarray, max_tokens: int
) -> list[np.ndarray]:
    """Positions in a sorted order (widths and source `lengths` in that order) of each batch:
    the order cut into runs of one source length as `batch_ends` cuts them; a run that ends
    where the length changes and fills less than half of max_tokens is no batch of its own
    (alone it would leave more than half its budget idle): such runs are packed together, in
    order, as similar lengths are (padded, masked). In order of their first position."""
    kept, left_over = one_length_runs(widths, lengths, max_tokens)
    bounds = [0, *batch_ends(widths[left_over], max_tokens)] if len(left_over) else [0]
    packed = [left_over[start:end] for start, end in zip(bounds, bounds[1:], strict=False)]
    return sorted([np.arange(start, end) for start, end in kept] + packed, key=lambda b: b[0])


def one_length_runs(
    widths: np.ndarray, lengths: np.ndarray, max_tokens: int
) -> tuple[list[tuple[int, int]], np.ndarray]:
    """`one_length_batches`' runs kept as batches, (start, end), and the positions left over."""
    if not len(widths):
        return [], np.zeros(0, dtype=np.int64)
    stops = np.flatnonzero(np.diff(lengths)) + 1  # where the length changes
    ends = np.asarray(batch_ends(widths, max_tokens, stops), dtype=np.int64)
    starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
    sizes = np.maximum.reduceat(widths, starts) * (ends - starts)
    at_change = np.isin(ends, np.append(stops, len(widths)))
    small = at_change & (2 * sizes < max_tokens)
    left = [np.arange(start, end) for start, end in zip(starts[small], ends[small], strict=True)]
    kept = list(zip(starts[~small].tolist(), ends[~small].tolist(), strict=True))
    return kept, np.concatenate(left) if left else np.zeros(0, dtype=np.int64)


def split_to_multiple(batches: list[np.ndarray], world_size: int) -> list[np.ndarray]:
    """Halve the largest batches until the count divides evenly among the ranks."""
    missing = -len(batches) % world_size
    if missing == 0:
        return batches
    largest = sorted(range(len(batches)), key=lambda i: -len(batches[i]))[:missing]
    if len(largest) < missing or any(len(batches[i]) < 2 for i in largest):
        raise DataError(f"{len(batches)} batches cannot be shared evenly by {world_size} ranks")
    halves = [half for i in largest for half in np.array_split(batches[i], 2)]
    chosen = set(largest)
    return [b for i, b in enumerate(batches) if i not in chosen] + halves


@dataclass(frozen=True)
class BatchPlan:
    """How one update is split over ranks and micro-batches, and what it holds."""

    world_size: int
    accumulation: int  # micro-batches per rank and update
    micro_batch_tokens: int  # token budget of one micro-batch (padded size)
    target_tokens: float  # expected real target tokens of one update, all ranks together
    padded: bool = False  # the update was asked for in padded tokens, not target tokens

    @property
    def padded_tokens(self) -> int:
        """The budgets of one update's micro-batches, all ranks together."""
        return self.world_size * self.accumulation * self.micro_batch_tokens

    def describe(self) -> str:
        layout = (
            f"{counted(self.world_size, 'rank')} x {counted(self.accumulation, 'micro-batch')} "
            f"of {self.micro_batch_tokens:,} padded tokens"
        )
        if self.padded:
            return (
                f"{layout} = {self.padded_tokens:,} padded tokens per update (about "
                f"{self.target_tokens:,.0f} target tokens)"
            )
        return f"{layout} = about {self.target_tokens:,.0f} target tokens per update"


def counted(count: int, noun: str) -> str:
    """'1 rank', '2 ranks', '1 micro-batch', '3 micro-batches'."""
    plural = noun + ("es" if noun.endswith("h") else "s")
    return f"{count:,} {noun if count == 1 else plural}"


@dataclass(frozen=True)
class LengthProfile:
    """What a batch plan needs of a corpus: its widths in batching order (the longer side + 1,
    as `token_batches` packs them), its target tokens (with EOS), and its source lengths in
    that order where batches hold one source length (None: similar lengths)."""

    widths: np.ndarray
    target_tokens: int
    lengths: np.ndarray | None = None

    @classmethod
    def of(
        cls, src_lengths: np.ndarray, tgt_lengths: np.ndarray, equal_sources: bool = False
    ) -> LengthProfile:
        order = length_order(src_lengths, tgt_lengths)
        widths = np.maximum(src_lengths[order], tgt_lengths[order]) + 1
        lengths = src_lengths[order] if equal_sources else None
        return cls(widths, int(tgt_lengths.sum()) + len(tgt_lengths), lengths)

    def batch_count(self, max_tokens: int) -> int:
        """Batches per epoch under `max_tokens` (before they are shared out among ranks); never
        more for a larger budget (a batch from a given start only grows with the budget, and a
        later start ends no earlier)."""
        if self.lengths is None:
            return len(batch_ends(self.widths, max_tokens))
        kept, left_over = one_length_runs(self.widths, self.lengths, max_tokens)
        return len(kept) + len(batch_ends(self.widths[left_over], max_tokens))

    def smallest_budget(self, most_batches: int, low: int, high: int) -> int:
        """The smallest budget in [low, high] that packs the corpus into at most `most_batches`
        batches (high when none does): a binary search, since batch_count never rises."""
        while low < high:
            middle = (low + high) // 2
            if self.batch_count(middle) <= most_batches:
                high = middle
            else:
                low = middle + 1
        return low


def target_fill(
    src_lengths: np.ndarray, tgt_lengths: np.ndarray, max_tokens: int, equal_sources: bool = False
) -> float:
    """Real target tokens (with EOS) per budget token in the batches `max_tokens` gives (what a
    test needs to ask for a given number of full micro-batches in target tokens)."""
    profile = LengthProfile.of(src_lengths, tgt_lengths, equal_sources)
    return profile.target_tokens / (profile.batch_count(max_tokens) * max_tokens)


def plan_batches(
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
    *,
    global_target_tokens: int,
    max_batch_tokens: int,
    world_size: int,
    padded: bool = False,
    equal_sources: bool = False,
) -> BatchPlan:
    """Micro-batches per rank (`accumulation`) and their budget for updates of
    `global_target_tokens` (trainer.global_batch_tokens), each budget at most `max_batch_tokens`.

    Target tokens (padded=False; the paper's measure, about 25,000 per update, and the WMT
    presets') are what an update's gradient averages over, but how many of them a padded budget
    holds depends on the corpus, its language pair and its tokenizer. So the plan packs the
    corpus: an update of world_size x accumulation batches holds on average that many times
    target_tokens / batches per epoch. `accumulation` is the fewest that reach the asked size at
    the full budget; the budget, the smallest that reaches it with them, raised as far as the
    same number of batches per epoch allows (a full budget stays `max_batch_tokens`). The plan is
    the smallest update this batching can give at or above the asked size, so it is monotone in
    it, and one token more moves it by no more than the batching's own next step (while a
    budget holds two sentences or more): one batch per epoch fewer, about planned / batches per
    epoch (Multi30k at 4,096 tokens: 128 batches, 0.8%).

    Padded tokens (padded=True, trainer.global_batch_padded) are the budgets themselves, summed
    over ranks and micro-batches: `accumulation` is the fewest whose budgets of at most
    `max_batch_tokens` hold the asked size, the budget the least that shares it out; at least
    the asked size, less than world_size x accumulation tokens above it, and the same plan for
    any corpus. `global_batch_tokens` = `batch_tokens` is then one micro-batch of that budget per
    update (fairseq's --max-tokens) on any language pair and tokenizer. The unit is a switch
    over the global size rather than a number of micro-batches per update because the global
    size is shared out among the ranks: a recipe means the same on 1 or 8 GPUs, where a count
    of micro-batches per rank would multiply the update by the number of ranks.

    The target tokens of either plan are those of one rank's share of the batches; with several
    ranks, an epoch gains at most world_size - 1 halved batches (`split_to_multiple`).
    `equal_sources`: the batches hold sentences of one source length where it fills half a batch
    (`epoch_batches`), so the plan packs the corpus as they are packed.
    """
    profile = LengthProfile.of(src_lengths, tgt_lengths, equal_sources)
    asked, budget = global_target_tokens, max_batch_tokens
    if padded:
        accumulation = ceil_div(asked, world_size * budget)
        micro = ceil_div(asked, world_size * accumulation)
    else:
        accumulation, micro = target_token_layout(profile, asked, budget, world_size)
    batches = world_size * accumulation
    target = batches * profile.target_tokens / profile.batch_count(micro)
    return BatchPlan(world_size, accumulation, micro, target, padded)


def target_token_layout(
    profile: LengthProfile, asked: int, max_tokens: int, world_size: int
) -> tuple[int, int]:
    """(accumulation, budget) of the smallest update of at least `asked` target tokens: an
    update of k batches per epoch of n holds k x target_tokens / n on average, so it reaches
    `asked` when n <= k x target_tokens / asked (integers throughout: no rounding cliffs)."""
    total = profile.target_tokens
    accumulation = max(1, ceil_div(asked * profile.batch_count(max_tokens), world_size * total))
    most_batches = world_size * accumulation * total // asked
    smallest = profile.smallest_budget(most_batches, 1, max_tokens)
    # The largest budget that packs the same number of batches: the next count's first, less 1.
    count = profile.batch_count(smallest)
    return accumulation, profile.smallest_budget(count - 1, smallest, max_tokens + 1) - 1


def ceil_div(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)


@dataclass
class Batch:
    src: torch.Tensor  # (B, S) source ids + EOS, right-padded
    tgt_in: torch.Tensor  # (B, T) BOS + target ids
    tgt_out: torch.Tensor  # (B, T) target ids + EOS, pad where tgt_in is pad
    n_tgt_tokens: int  # real (non-pad) tokens in tgt_out
    n_src_tokens: int = 0  # real (non-pad) tokens in src
    src_padded: bool = True  # False: every source has the batch's length (nothing to mask)

    def to(self, device: torch.device) -> Batch:
        non_blocking = device.type == "cuda"
        return dataclasses.replace(
            self,
            src=self.src.to(device, non_blocking=non_blocking),
            tgt_in=self.tgt_in.to(device, non_blocking=non_blocking),
            tgt_out=self.tgt_out.to(device, non_blocking=non_blocking),
        )

    def pin_memory(self) -> Batch:
        """Called by DataLoader(pin_memory=True) so host-to-GPU copies can be asynchronous."""
        return dataclasses.replace(
            self,
            src=self.src.pin_memory(),
            tgt_in=self.tgt_in.pin_memory(),
            tgt_out=self.tgt_out.pin_memory(),
        )

    @property
    def padding_ratio(self) -> float:
        """Share of the source and target positions that are padding."""
        positions = self.src.numel() + self.tgt_out.numel()
        return 1.0 - (self.n_src_tokens + self.n_tgt_tokens) / positions


def pad_sequences(
    sequences: list[np.ndarray],
    pad_id: int,
    *,
    prefix: int | None = None,
    suffix: int | None = None,
    round_width: bool = False,
) -> torch.Tensor:
    """(len(sequences), width) int64, right-padded; with `round_width` the width rounded up to
    one of few widths (shapes.in_eighth_steps)."""
    extra = (prefix is not None) + (suffix is not None)
    width = max(len(s) for s in sequences) + extra
    if round_width:
        width = in_eighth_steps(width)
    out = np.full((len(sequences), width), pad_id, dtype=np.int64)
    start = int(prefix is not None)
    if prefix is not None:
        out[:, 0] = prefix
    for row, sequence in enumerate(sequences):
        out[row, start : start + len(sequence)] = sequence
        if suffix is not None:
            out[row, start + len(sequence)] = suffix
    return torch.from_numpy(out)


def collate(
    data: ParallelTokens | MixedTokens,
    indices: np.ndarray,
    *,
    pad_id: int,
    bos_id: int,
    eos_id: int,
    round_lengths: bool = False,
    equal_sources: bool = False,
) -> Batch:
    """The pairs `indices` as padded tensors; `round_lengths`: the padded lengths rounded up to
    one of 8 lengths per doubling (`batch_shapes`: a GPU then meets far fewer distinct shapes).
    `equal_sources` (batches cut by `one_length_batches`): where the sources share one length,
    it stays exact, so no source position is padding (Batch.src_padded False) and only the
    target's length is rounded; the left-over batches of several lengths are padded (and
    rounded) as similar ones are."""
    src = [data.src[i] for i in indices]
    tgt = [data.tgt[i] for i in indices]
    one_length = equal_sources and len({len(s) for s in src}) == 1
    rounded = {"round_width": round_lengths}
    return Batch(
        src=pad_sequences(src, pad_id, suffix=eos_id, round_width=round_lengths and not one_length),
        tgt_in=pad_sequences(tgt, pad_id, prefix=bos_id, **rounded),
        tgt_out=pad_sequences(tgt, pad_id, suffix=eos_id, **rounded),
        n_tgt_tokens=sum(len(s) for s in tgt) + len(tgt),  # + EOS each
        n_src_tokens=sum(len(s) for s in src) + len(src),
        src_padded=not one_length,
    )


class BatchDataset(torch.utils.data.Dataset):
    """Batch i of a precomputed list, collated from the stores (read as one: `MixedTokens`, each
    source after its store's prefix), opened lazily per process, so DataLoader workers map the
    files instead of receiving copies of the arrays."""

    def __init__(
        self,
        stores: list[StoredSplit],
        batches: list[np.ndarray],
        *,
        pad_id: int,
        bos_id: int,
        eos_id: int,
        round_lengths: bool = False,
        equal_sources: bool = False,
    ):
        self.stores, self.batches = stores, batches
        self.ids = {"pad_id": pad_id, "bos_id": bos_id, "eos_id": eos_id}
        self.shapes = {"round_lengths": round_lengths, "equal_sources": equal_sources}
        self.data: MixedTokens | None = None

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, index: int) -> Batch:
        if self.data is None:
            self.data = MixedTokens(self.stores)
        return collate(self.data, self.batches[index], **self.ids, **self.shapes)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "data": None}
