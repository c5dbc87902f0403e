"""The Trainer: global-batch updates over ranks and micro-batches, validation, stopping rules and
the loop. It composes what it needs: the execution policy that says how the device runs the model
(transformer_mt/execution.py), the Checkpointer that saves and resumes (train/checkpointer.py)
and the metrics it reports (train/metrics.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import math
import sys
import time
from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from transformer_mt.checkpoint import CheckpointRecord, Progress
from transformer_mt.config import TrainJob
from transformer_mt.data.batching import (
    Batch,
    BatchDataset,
    batch_shapes,
    epoch_batches,
    plan_batches,
    target_tokens_by_turn,
)
from transformer_mt.data.prepare import PreparedData
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer_mt.execution import ExecutionPolicy
from transformer_mt.model import Transformer
from transformer_mt.run_dir import RunDir
from transformer_mt.train.checkpointer import Checkpointer, TrainingParts
from transformer_mt.train.compile_cache import named_compile_failure, use_compile_cache
from transformer_mt.train.distributed import Ranks, small_micro_batch_warning
from transformer_mt.train.flops import update_flops
from transformer_mt.train.loader_workers import start_worker, worker_batches, worker_context
from transformer_mt.train.loss import LossSums, TrainingLoss
from transformer_mt.train.metrics import TrainingMetrics
from transformer_mt.train.monitor import NonFiniteUpdates, StepStats, ThroughputWindow
from transformer_mt.train.optimizer import finish_update, optimizer_and_schedule
from transformer_mt.train.signals import StopSignals
from transformer_mt.train.start import Start, StartKind, describe
from transformer_mt.train.validation import ValidationScores, validation_loss

log = logging.getLogger(__name__)

# What the first update's time holds, by whether the model compiles.
WARM_UP = {
    True: " (torch.compile's warm-up: compiling the layers' and the loss's graphs)",
    False: "",
}
# fp16: a loss scale below this (fairseq's --min-loss-scale default) means the gradient
# overflows however far it is scaled down: the run has diverged.
MIN_LOSS_SCALE = 1e-4


class Trainer:
    def __init__(
        self,
        cfg: TrainJob,
        run: RunDir,
        data: PreparedData,
        policy: ExecutionPolicy,
        ranks: Ranks | None = None,
        *,
        valid_bleu: Callable[[Transformer], float] | None = None,
    ):
        """run: the command's run folder (checkpoints and TensorBoard go there). policy: how the
        device runs the model (ExecutionPolicy.for_training). valid_bleu: the BLEU of a model's
        translations of (part of) the valid split, given by the command (commands/train.py);
        None: validate the loss only."""
        self.cfg, self.run, self.data, self.policy = cfg, run, data, policy
        self.device = policy.device
        self.ranks = ranks or Ranks()
        self.valid_bleu = valid_bleu
        # What this run's checkpoints say of themselves (progress added when saved).
        record = CheckpointRecord.of_run(cfg.model, data.tokenizers, data.folder.name)
        self.model = record.build_model().to(self.device)
        # The model and its loss, with the policy's kernels and compiled layers, as a
        # micro-batch runs them (validation's loss runs it too); under DDP with several ranks.
        self.loss_module = TrainingLoss.for_policy(
            self.model, policy, epsilon=cfg.optim.label_smoothing, pad_id=PAD_ID
        )
        self.train_model = self.distributed(self.loss_module)
        # Validation's loss: the step's, but eager where the step compiles (policy.eager()).
        self.valid_loss_module = (
            TrainingLoss.for_policy(
                self.model, policy.eager(), epsilon=cfg.optim.label_smoothing, pad_id=PAD_ID
            )
            if policy.compile
            else self.loss_module
        )
        self.compile_cache = None  # where torch.compile keeps its kernels (rank 0's, if it does)
        if policy.compile and self.ranks.is_main:
            self.compile_cache = use_compile_cache(policy, run.old_compile_cache)
        self.optimizer, self.scheduler = optimizer_and_schedule(self.model, cfg)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=policy.scales_loss)
        self.plan = plan_batches(
            data.train.src.lengths,
            data.train.tgt.lengths,
            global_target_tokens=cfg.trainer.global_batch_tokens,
            max_batch_tokens=cfg.trainer.batch_tokens,
            world_size=self.ranks.world_size,
            padded=cfg.trainer.global_batch_padded,
            equal_sources=policy.equal_source_lengths,
        )
        small = small_micro_batch_warning(self.plan, self.device)
        if small and self.ranks.is_main:
            log.warning("%s", small)
        parts = TrainingParts(self.model, self.optimizer, self.scheduler, self.scaler)
        self.checkpointer = Checkpointer(run, record, parts, self.ranks, self.device, cfg.trainer)
        self.progress = Progress()
        self.micro_batch: Batch | None = None  # in forward_backward: what out of memory names
        self.tokens_by_turn = np.zeros(0, dtype=np.int64)  # the epoch's; set by epoch_loader
        self.position_fraction: float | None = None  # set by a resume with another layout
        self.validated_step = -1
        self.nonfinite = NonFiniteUpdates(self.device)
        self.signals = StopSignals()
        # Decisions that end the loop, agreed by all ranks (agree_on_stopping: a rank's clock or
        # a signal that reached one rank must not send the ranks down different paths).
        self.out_of_time = self.stop_signalled = False
        self.metrics = (
            TrainingMetrics(str(run.tensorboard), self.device, compiled=policy.compile)
            if self.ranks.is_main
            else None
        )

    def distributed(self, module: torch.nn.Module) -> torch.nn.Module:
        """`module` under DistributedDataParallel when there are several ranks."""
        if not self.ranks.distributed:
            return module
        return DistributedDataParallel(
            module,
            device_ids=[self.device] if self.device.type == "cuda" else None,
            broadcast_buffers=False,  # the only buffer is the constant position table
            # The gradients are views of DDP's all-reduce buckets, not a second copy of them
            # (train_step keeps them allocated between updates, zeroed, for that).
            gradient_as_bucket_view=True,
        )

    # ---- starting ----------------------------------------------------------------------------
    def begin(self, start: Start) -> None:
        """Resume the checkpoint, or take a parent's weights (fine-tuning), as `start` says."""
        self.checkpointer.remove_partial_writes()
        if start.kind == StartKind.resume:
            self.progress = self.checkpointer.resume(start.checkpoint)
            self.continue_data_position()
        elif start.kind == StartKind.fine_tune:
            self.checkpointer.take_weights(start.checkpoint)
        log.info("%s", describe(start))

    def batch_layout(self) -> list[int]:
        """What decides the epoch's batch order besides the seed: [ranks, micro-batch budget],
        then 1 where each batch holds one source length (ExecutionPolicy.equal_source_lengths;
        nothing added otherwise, as checkpoints written before it record)."""
        layout = [self.ranks.world_size, self.plan.micro_batch_tokens]
        return layout + [1] if self.policy.equal_source_lengths else layout

    def continue_data_position(self) -> None:
        """A resume with another layout (ranks, micro-batch budget, one source length a batch)
        has another batch order: it continues at the same fraction of the epoch
        (approximate)."""
        layout = self.batch_layout()
        saved = self.progress
        if saved.layout == layout:
            return
        self.position_fraction = saved.batch_in_epoch / max(saved.batches_in_epoch, 1)
        log.warning(
            "resuming with another layout (ranks, micro-batch budget[, 1: one source length a "
            "batch]) %s -> %s: the global "
            "batch and the schedule continue; the data position continues at %.1f%% of "
            "epoch %d in the new batch order (approximate)",
            saved.layout,
            layout,
            100 * self.position_fraction,
            saved.epoch,
        )

    # ---- data --------------------------------------------------------------------------------
    def epoch_loader(self) -> torch.utils.data.DataLoader:
        """This rank's batches of this epoch from the saved position on, collated in workers.
        Sets `tokens_by_turn`: for each place in the rank's list, the target tokens of every
        rank's batch there (every rank computes the whole epoch's batches, then takes its
        share)."""
        train, settings, world_size = self.data.train, self.cfg.trainer, self.ranks.world_size
        every_rank = epoch_batches(
            train.src.lengths,
            train.tgt.lengths,
            self.plan.micro_batch_tokens,
            seed=settings.seed,
            epoch=self.progress.epoch,
            world_size=world_size,
            equal_sources=self.policy.equal_source_lengths,
        )
        batches = every_rank[self.ranks.rank :: world_size]
        self.tokens_by_turn = target_tokens_by_turn(every_rank, train.tgt.lengths, world_size)
        if self.ranks.is_main:
            self.log_shapes(batches)
        progress = self.progress
        if self.position_fraction is not None:
            progress.batch_in_epoch = round(self.position_fraction * len(batches))
            self.position_fraction = None
        progress.batches_in_epoch = len(batches)
        progress.layout = self.batch_layout()
        dataset = BatchDataset(
            self.data.folder,
            "train",
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
            sampler=range(progress.batch_in_epoch, len(batches)),
            num_workers=workers,
            pin_memory=self.policy.pins_memory,
            prefetch_factor=4 if workers else None,
            worker_init_fn=start_worker if workers else None,
            multiprocessing_context=worker_context() if workers else None,
            # Its own generator: the loader must not draw from the global RNG that dropout uses,
            # or a resumed run would get different dropout masks from an uninterrupted one.
            generator=torch.Generator().manual_seed(settings.seed + progress.epoch),
        )

    def log_shapes(self, batches: list[np.ndarray]) -> None:
        """How many distinct batch shapes this rank's epoch holds (each new one costs a GPU a
        plan, a kernel or an allocation its first time: ExecutionPolicy.round_lengths)."""
        train = self.data.train
        shapes = batch_shapes(
            batches,
            train.src.lengths,
            train.tgt.lengths,
            round_lengths=self.policy.round_lengths,
            equal_sources=self.policy.equal_source_lengths,
        )
        log.info(
            "epoch %d: %d micro-batches in %d distinct shapes (rows, source and target length%s%s)",
            self.progress.epoch,
            len(batches),
            len(np.unique(shapes, axis=0)),
            ", rounded" if self.policy.round_lengths else "",
            "; one source length a batch" if self.policy.equal_source_lengths else "",
        )

    def micro_batches(self) -> Iterator[tuple[Batch, int]]:
        """Endless (epoch-advancing) stream of collated batches, starting at the saved position,
        each with the target tokens of all ranks' batches at its place in the epoch."""
        while True:
            for batch in worker_batches(self.epoch_loader()):
                place = self.progress.batch_in_epoch
                self.progress.batch_in_epoch += 1  # counted before the update uses it
                yield batch, int(self.tokens_by_turn[place])
            self.progress.epoch += 1
            self.progress.batch_in_epoch = 0
            if self.stop_rule():
                return

    # ---- one update --------------------------------------------------------------------------
    def forward_backward(self, batch: Batch, scale: float, sync: bool) -> LossSums:
        """One micro-batch: forward, label-smoothed loss, backward of loss * scale (gradients
        accumulate); `sync`: all-reduce the gradients (DDP: the last micro-batch of an update).
        Returns the summed loss, nll and target tokens, detached."""
        no_sync = self.ranks.distributed and not sync
        self.micro_batch = batch
        with self.train_model.no_sync() if no_sync else contextlib.nullcontext():
            batch = batch.to(self.device)
            with self.policy.forward():
                sums = self.train_model(batch.src, batch.tgt_in, batch.tgt_out, batch.src_padded)
            self.scaler.scale(sums.loss * scale).backward()
        self.micro_batch = None
        return LossSums(sums.loss.detach(), sums.nll.detach(), sums.n_tokens)

    def train_step(self, batches: list[Batch], update_tokens: int | None = None) -> StepStats:
        """One update: the summed loss of every rank's micro-batches divided once by their total
        target tokens, `update_tokens` (known to every rank from the epoch's batches, see
        micro_batches; None: `batches` are the whole update, one rank's alone), so it equals
        the update of one big batch. Returns device tensors."""
        if update_tokens is None and self.ranks.world_size > 1:
            raise ValueError("train_step on several ranks needs the update's update_tokens")
        self.train_model.train()
        total_tokens = (
            update_tokens if update_tokens is not None else sum(b.n_tgt_tokens for b in batches)
        )
        # DDP averages gradients over ranks; multiplying by world_size turns that into a sum.
        scale = self.ranks.world_size / total_tokens
        loss_sum = nll_sum = 0.0
        for index, batch in enumerate(batches):
            sums = self.forward_backward(batch, scale, sync=index == len(batches) - 1)
            loss_sum += sums.loss
            nll_sum += sums.nll
        lr = self.optimizer.param_groups[0]["lr"]
        grad_norm = finish_update(
            self.model,
            self.optimizer,
            self.scheduler,
            self.scaler,
            self.cfg.optim.clip_norm,
            keep_gradients=self.ranks.distributed,
        )
        self.nonfinite.add((~torch.isfinite(grad_norm)).to(torch.int64))
        self.progress.step += 1
        return StepStats(
            loss=loss_sum * self.ranks.world_size / total_tokens,  # this rank's share
            nll=nll_sum * self.ranks.world_size / total_tokens,
            lr=lr,
            grad_norm=grad_norm,
            tokens=total_tokens,
            padding=sum(b.padding_ratio for b in batches) / len(batches),
            flops=update_flops(self.cfg.model, self.model.embed.num_embeddings, batches, PAD_ID),
        )

    # ---- validation, logging, stopping -------------------------------------------------------
    def validate(self) -> ValidationScores:
        """Loss and (when the command gave a scorer) BLEU on the valid split, logged; rank 0."""
        batch_tokens = self.cfg.trainer.batch_tokens
        scores = validation_loss(
            self.valid_loss_module, self.data.valid, batch_tokens, self.policy.eager()
        )
        if self.valid_bleu is not None:
            scores = dataclasses.replace(scores, bleu=self.valid_bleu(self.model))
        self.metrics.validation(scores, self.progress.step)
        return scores

    def validate_and_judge(self) -> tuple[bool, bool]:
        """(a new best score, patience exhausted), decided on rank 0 and shared."""
        improved = exhausted = 0.0
        if self.ranks.is_main:
            scores = self.validate()
            score = scores.bleu if scores.bleu is not None else -scores.loss
            progress = self.progress
            # A non-finite score (a NaN loss) never improves, so it never becomes the best.
            if math.isfinite(score) and (
                progress.best_score is None or score > progress.best_score
            ):
                progress.best_score, progress.validations_without_improvement = score, 0
                progress.best_step = progress.step
                improved = 1.0
            else:
                progress.validations_without_improvement += 1
            patience = self.cfg.trainer.patience
            exhausted = float(
                bool(patience) and progress.validations_without_improvement >= patience
            )
        improved, exhausted = self.ranks.broadcast([improved, exhausted])
        self.validated_step = self.progress.step
        return bool(improved), bool(exhausted)

    def log_train(self, window: list[StepStats], seconds: float, bar) -> str | None:
        """Report the window of updates since the last log (rank 0); a stop reason if the
        gradient has been non-finite too often in a row."""
        skipped, in_a_row = self.nonfinite.read()
        self.progress.skipped_updates += skipped
        if not self.ranks.is_main:
            return self.nonfinite_stop(in_a_row)
        stats = self.metrics.window(window, seconds, self.progress, self.progress.skipped_updates)
        shown = stats.bar_postfix()
        if self.cfg.trainer.max_time_minutes:  # the bar's total counts updates, not the budget
            left = 60 * self.cfg.trainer.max_time_minutes - self.progress.train_seconds
            shown["time_left"] = f"{max(left, 0.0) / 60:.1f}min"
        bar.set_postfix(shown, refresh=False)
        return self.nonfinite_stop(in_a_row)

    def nonfinite_stop(self, in_a_row: int) -> str | None:
        if self.scaler.is_enabled():
            # fp16: the scaler skips updates while it lowers the loss scale, by design (several in
            # a row at the start); a run has diverged only when the scale has collapsed.
            scale = self.scaler.get_scale()
            if scale >= MIN_LOSS_SCALE:
                return None
            return (
                f"the fp16 loss scale fell to {scale:.3g} (below {MIN_LOSS_SCALE:g}): the "
                "gradient overflows whatever the scale; lower optim.lr_scale, set "
                "optim.clip_norm, or train in bf16 / fp32; the checkpoints before this point "
                "are good"
            )
        limit = self.cfg.trainer.max_nonfinite_updates
        if in_a_row < limit:
            return None
        return (
            f"{in_a_row} updates in a row had a non-finite gradient and were skipped "
            f"(trainer.max_nonfinite_updates={limit}): lower optim.lr_scale, set optim.clip_norm, "
            "or train in fp32/bf16; the checkpoints before this point are good"
        )

    def stop_rule(self) -> str | None:
        settings, progress = self.cfg.trainer, self.progress
        if settings.max_steps and progress.step >= settings.max_steps:
            return f"reached trainer.max_steps={settings.max_steps}"
        if settings.max_epochs and progress.epoch >= settings.max_epochs:
            return f"reached trainer.max_epochs={settings.max_epochs}"
        if self.out_of_time:
            return f"reached trainer.max_time_minutes={settings.max_time_minutes}"
        return None

    # ---- the loop ----------------------------------------------------------------------------
    def fit(self) -> str:
        """Train until a stopping rule fires, then validate and save the end state (unless a stop
        signal leaves no time for it, as all ranks agree); return the rule that fired. The
        TensorBoard writer is closed however it ends. Stop signals are caught until the end
        state is saved: one that comes during the final validation lets it finish and save."""
        try:
            with self.signals:
                reason = self.run_until_stopped()
                log.info(
                    "stopped: %s after %d updates, %.1f min of training",
                    reason,
                    self.progress.step,
                    self.progress.train_seconds / 60,
                )
                if not self.stop_signalled:
                    self.finish()
            return reason
        except Exception as error:
            failure = named_compile_failure(error, self.compile_cache)  # None: not torch.compile's
            if failure is None:
                raise
            raise failure from error
        finally:
            if self.metrics:
                self.metrics.close()

    def finish(self) -> None:
        """The final validation and checkpoint, where the last update has none yet."""
        improved = False
        if self.validated_step != self.progress.step:
            improved, _ = self.validate_and_judge()
        if improved or self.checkpointer.saved_step != self.progress.step:
            self.checkpointer.save(self.progress, best=improved)

    def run_until_stopped(self) -> str:
        """The updates, with a progress bar on a terminal, until a stopping rule fires."""
        settings = self.cfg.trainer
        bar = tqdm(
            total=settings.max_steps or None,
            initial=self.progress.step,
            desc="train",
            unit="upd",
            # Only on a terminal: a log file (a cluster job's) gets the text lines instead.
            disable=not (settings.progress_bar and self.ranks.is_main and sys.stderr.isatty()),
            dynamic_ncols=True,
        )
        stream = self.micro_batches()
        try:
            return self.run_updates(stream, bar)
        finally:
            stream.close()  # ends the DataLoader's worker processes
            bar.close()

    def time_is_up(self) -> bool:
        """This rank's view: trainer.max_time_minutes of training time spent (ranks agree on it
        through `agree_on_stopping`)."""
        limit = 60 * self.cfg.trainer.max_time_minutes
        return bool(limit) and self.progress.train_seconds >= limit

    def agree_on_stopping(self, time_due: bool) -> bool:
        """One all-reduce every trainer.agree_every updates (after each update for a lone
        process, which asks nobody): stop when any rank has a stop signal or is out of time;
        checkpoint when rank 0's timer says so. Between agreements every rank goes on as agreed
        last, so all stop (and checkpoint) at the same update, at most agree_every - 1 updates
        after the signal or the clock. Returns whether to checkpoint for time."""
        if self.ranks.distributed and self.progress.step % self.cfg.trainer.agree_every:
            return False
        signalled, out_of_time, time_due_main = self.ranks.sum(
            [
                float(self.signals.received is not None),
                float(self.time_is_up()),
                float(time_due and self.ranks.is_main),
            ]
        )
        self.stop_signalled, self.out_of_time = signalled > 0, out_of_time > 0
        return time_due_main > 0

    def run_updates(self, stream, bar) -> str:
        settings = self.cfg.trainer
        window = ThroughputWindow()
        # Every rank resumed the same saved training time, so this first reading is shared.
        self.out_of_time = self.time_is_up()
        reason, first = self.stop_rule(), True
        while reason is None:
            started = time.perf_counter()
            planned = list(itertools.islice(stream, self.plan.accumulation))
            if not planned:
                return self.stop_rule() or "training data exhausted"
            batches = [batch for batch, _ in planned]
            window.add(self.train_step(batches, sum(tokens for _, tokens in planned)))
            seconds = time.perf_counter() - started
            if first:
                log.info("the first update took %.1f s%s", seconds, WARM_UP[self.policy.compile])
                first = False
            self.progress.train_seconds += seconds
            bar.update(1)
            step = self.progress.step
            if step % settings.log_every == 0:
                reason = self.log_train(window.updates, window.seconds(), bar)
                window = ThroughputWindow()
            improved = exhausted = False
            if settings.valid_every and step % settings.valid_every == 0:
                with window.aside():
                    improved, exhausted = self.validate_and_judge()
            checkpointer = self.checkpointer
            time_due = self.agree_on_stopping(checkpointer.time_due())
            if improved or self.stop_signalled or time_due or checkpointer.periodic_due(step):
                with window.aside():
                    checkpointer.save(self.progress, best=improved)
            if self.stop_signalled:
                return f"stop signal ({self.signals.received or 'on another rank'})"
            if exhausted:
                reason = (
                    f"no better validation score in {settings.patience} validations "
                    "(trainer.patience)"
                )
            reason = reason or self.stop_rule()
        if window.updates:  # the last, partial logging window
            reason = self.log_train(window.updates, window.seconds(), bar) or reason
        return reason
