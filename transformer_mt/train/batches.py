"""The training data as the loop takes it: this rank's micro-batches of each epoch in the epoch's
seeded order, collated in workers, grouped into updates, from the saved data position on. The
position is this module's own (`DataPosition`, saved in every checkpoint), as JoeyNMT's batch
sampler owns its state: the trainer never does arithmetic on it."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator

import numpy as np
import torch

from transformer_mt.checkpoint import DataPosition
from transformer_mt.config import TrainerConfig
from transformer_mt.data.batching import (
    Batch,
    BatchDataset,
    BatchPlan,
    batch_shapes,
    epoch_batches,
    target_tokens_by_turn,
)
from transformer_mt.data.corpora import CorpusMix
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer_mt.execution import ExecutionPolicy
from transformer_mt.train.distributed import Ranks
from transformer_mt.train.loader_workers import start_worker, worker_batches, worker_context

log = logging.getLogger(__name__)


class TrainingBatches:
    """This rank's share of the training data, update by update, and where it stands."""

    def __init__(
        self,
        mix: CorpusMix,
        plan: BatchPlan,
        policy: ExecutionPolicy,
        ranks: Ranks,
        settings: TrainerConfig,
        *,
        on_epoch: Callable[[int, dict[str, dict[str, int]]], None] | None = None,
    ):
        """on_epoch(epoch, counts): told on rank 0 what each corpus gives an epoch (the pairs and
        tokens of CorpusMix.counts) when its batches are computed."""
        self.mix, self.plan, self.policy, self.on_epoch = mix, plan, policy, on_epoch
        self.ranks, self.settings = ranks, settings
        self.position = DataPosition()
        self.tokens_by_turn = np.zeros(0, dtype=np.int64)  # the epoch's; set by epoch_loader
        self.fraction: float | None = None  # set by a resume with another layout

    def layout(self) -> list[int]:
        """What decides the epoch's batch order besides the seed: [ranks, micro-batch budget],
        then 1 where each batch holds one source length (ExecutionPolicy.equal_source_lengths;
        nothing added otherwise, as checkpoints written before it record)."""
        layout = [self.ranks.world_size, self.plan.micro_batch_tokens]
        return layout + [1] if self.policy.equal_source_lengths else layout

    def resume(self, saved: DataPosition) -> None:
        """Continue at a checkpoint's position. A resume with another layout (ranks, micro-batch
        budget, one source length a batch) has another batch order: it continues at the same
        fraction of the epoch (approximate)."""
        self.position = saved
        layout = self.layout()
        if saved.layout == layout:
            return
        self.fraction = saved.batch_in_epoch / max(saved.batches_in_epoch, 1)
        log.warning(
            "resuming with another layout (ranks, micro-batch budget[, 1: one source length a "
            "batch]) %s -> %s: the global "
            "batch and the schedule continue; the data position continues at %.1f%% of "
            "epoch %d in the new batch order (approximate)",
            saved.layout,
            layout,
            100 * self.fraction,
            saved.epoch,
        )

    def updates(self, *, until_epoch: int = 0) -> Iterator[tuple[list[Batch], int]]:
        """Each update's micro-batches (plan.accumulation of them, fewer where the data ends)
        with the target tokens of every rank's share of it, epoch after epoch; `until_epoch`
        (0: none) ends the data where that epoch would begin (StopRules.epoch_limit). Closing
        it ends the DataLoader's worker processes."""
        stream = self.micro_batches(until_epoch=until_epoch)
        try:
            while planned := list(itertools.islice(stream, self.plan.accumulation)):
                yield [batch for batch, _ in planned], sum(tokens for _, tokens in planned)
        finally:
            stream.close()

    def micro_batches(self, *, until_epoch: int = 0) -> Iterator[tuple[Batch, int]]:
        """Collated micro-batches from the position on, each with the target tokens of all
        ranks' batches at its place in the epoch (known to every rank without asking)."""
        position = self.position
        while not until_epoch or position.epoch < until_epoch:
            for batch in worker_batches(self.epoch_loader()):
                place = position.batch_in_epoch
                position.batch_in_epoch += 1  # counted before the update uses it
                yield batch, int(self.tokens_by_turn[place])
            position.epoch += 1
            position.batch_in_epoch = 0

    def epoch_loader(self) -> torch.utils.data.DataLoader:
        """This rank's batches of this epoch from the position on, collated in workers. Sets
        `tokens_by_turn`: for each place in the rank's list, the target tokens of every rank's
        batch there (every rank computes the whole epoch's batches, then takes its share)."""
        mix, settings, world_size = self.mix, self.settings, self.ranks.world_size
        position = self.position
        examples = mix.epoch_examples(settings.seed, position.epoch)
        every_rank = [
            examples[batch]
            for batch in epoch_batches(
                mix.src_lengths[examples],
                mix.tgt_lengths[examples],
                self.plan.micro_batch_tokens,
                seed=settings.seed,
                epoch=position.epoch,
                world_size=world_size,
                equal_sources=self.policy.equal_source_lengths,
            )
        ]
        batches = every_rank[self.ranks.rank :: world_size]
        self.tokens_by_turn = target_tokens_by_turn(every_rank, mix.tgt_lengths, world_size)
        if self.ranks.is_main:
            self.log_shapes(batches)
            if self.on_epoch is not None:
                self.on_epoch(position.epoch, mix.counts(examples))
        if self.fraction is not None:
            position.batch_in_epoch = round(self.fraction * len(batches))
            self.fraction = None
        position.batches_in_epoch = len(batches)
        position.layout = self.layout()
        dataset = BatchDataset(
            mix.stores,
            batches,
            pad_id=PAD_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            round_lengths=self.policy.round_lengths,
            equal_sources=self.policy.equal_source_lengths,
        )
        workers = settings.loader_workers
        return torch.utils.data.DataLoader(
            dataset,
            batch_size=None,
            sampler=range(position.batch_in_epoch, len(batches)),
            num_workers=workers,
            pin_memory=self.policy.pins_memory,
            prefetch_factor=4 if workers else None,
            worker_init_fn=start_worker if workers else None,
            multiprocessing_context=worker_context() if workers else None,
            # Its own generator: the loader must not draw from the global RNG that dropout uses,
            # or a resumed run would get different dropout masks from an uninterrupted one.
            generator=torch.Generator().manual_seed(settings.seed + position.epoch),
        )

    def log_shapes(self, batches: list[np.ndarray]) -> None:
        """How many distinct batch shapes this rank's epoch holds (each new one costs a GPU a
        plan, a kernel or an allocation its first time: ExecutionPolicy.round_lengths)."""
        shapes = batch_shapes(
            batches,
            self.mix.src_lengths,
            self.mix.tgt_lengths,
            round_lengths=self.policy.round_lengths,
            equal_sources=self.policy.equal_source_lengths,
        )
        log.info(
            "epoch %d: %d micro-batches in %d distinct shapes (rows, source and target length%s%s)",
            self.position.epoch,
            len(batches),
            len(np.unique(shapes, axis=0)),
            ", rounded" if self.policy.round_lengths else "",
            "; one source length a batch" if self.policy.equal_source_lengths else "",
        )
