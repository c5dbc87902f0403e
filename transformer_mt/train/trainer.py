"""The Trainer: global-batch updates over ranks and micro-batches, validation, stopping rules
and checkpoints that let any interrupted run continue exactly."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import math
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from transformer_mt.checkpoint import CheckpointRecord
from transformer_mt.config import CpuLinear, TrainJob
from transformer_mt.data.batching import (
    Batch,
    BatchDataset,
    epoch_batches,
    plan_batches,
    target_tokens_by_turn,
)
from transformer_mt.data.prepare import PreparedData
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer_mt.device import attention_kernels, autocast_dtype, autocast_for
from transformer_mt.errors import CheckpointError
from transformer_mt.files import remove_partial_writes
from transformer_mt.model import Transformer
from transformer_mt.onednn import products_by_onednn
from transformer_mt.run_dir import RunDir
from transformer_mt.train.compiling import LENGTH_MULTIPLE, CompileWatch, should_compile
from transformer_mt.train.distributed import Ranks, small_micro_batch_warning
from transformer_mt.train.flops import peak_flops, update_flops
from transformer_mt.train.loader_workers import start_worker, worker_batches, worker_context
from transformer_mt.train.loss import LossSums, TrainingLoss
from transformer_mt.train.monitor import (
    NonFiniteUpdates,
    StepStats,
    ThroughputWindow,
    WindowStats,
)
from transformer_mt.train.run_state import Progress, restore_rng, rng_states
from transformer_mt.train.schedule import paper_schedule
from transformer_mt.train.signals import StopSignals
from transformer_mt.train.start import Start, StartKind, describe, shape_refusal
from transformer_mt.train.validation import ValidationScores, validation_loss

log = logging.getLogger(__name__)

# fp16: a loss scale below this (fairseq's --min-loss-scale default) means the gradient
# overflows however far it is scaled down: the run has diverged.
MIN_LOSS_SCALE = 1e-4


class Trainer:
    def __init__(
        self,
        cfg: TrainJob,
        run: RunDir,
        data: PreparedData,
        device: torch.device,
        ranks: Ranks | None = None,
        *,
        valid_bleu: Callable[[Transformer], float] | None = None,
    ):
        """run: the command's run folder (checkpoints and TensorBoard go there). valid_bleu: the
        BLEU of a model's translations of (part of) the valid split, given by the command
        (commands/train.py); None: validate the loss only."""
        self.cfg, self.run, self.data, self.device = cfg, run, data, device
        self.ranks = ranks or Ranks()
        self.valid_bleu = valid_bleu
        self.checkpoints = run.checkpoints
        # What this run's checkpoints say of themselves (step and progress added when saved).
        self.record = CheckpointRecord.of_run(cfg.model, data.tokenizers, data.folder.name)
        self.model = self.record.build_model().to(device)
        # What a micro-batch runs: the model up to its loss sums, in one module.
        self.train_model = TrainingLoss(
            self.model, epsilon=cfg.optim.label_smoothing, pad_id=PAD_ID
        )
        if self.ranks.distributed:
            self.train_model = DistributedDataParallel(
                self.train_model,
                device_ids=[device] if device.type == "cuda" else None,
                broadcast_buffers=False,  # the only buffer is the constant position table
                # The gradients are views of DDP's all-reduce buckets, not a second copy of them
                # (train_step keeps them allocated between updates, zeroed, for that).
                gradient_as_bucket_view=True,
            )
        self.compiled = should_compile(cfg.trainer.compile, device)
        self.compile_watch = CompileWatch() if self.compiled else None
        if self.compiled:
            self.train_model = torch.compile(self.train_model, dynamic=True)
        # Fused Adam (CPU and GPU) can skip an update on a device-side flag, without a host sync.
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=1.0,
            betas=tuple(cfg.optim.betas),
            eps=cfg.optim.eps,
            weight_decay=cfg.optim.weight_decay,
            fused=True,
        )
        self.scheduler = paper_schedule(
            self.optimizer,
            d_model=cfg.model.d_model,
            warmup_steps=cfg.optim.warmup_steps,
            scale=cfg.optim.lr_scale,
        )
        fp16 = autocast_dtype(device, cfg.trainer.precision) == torch.float16
        self.scaler = torch.amp.GradScaler(device.type, enabled=fp16)
        self.plan = plan_batches(
            data.train.src.lengths,
            data.train.tgt.lengths,
            global_target_tokens=cfg.trainer.global_batch_tokens,
            max_batch_tokens=cfg.trainer.batch_tokens,
            world_size=self.ranks.world_size,
            padded=cfg.trainer.global_batch_padded,
        )
        small = small_micro_batch_warning(self.plan, device)
        if small and self.ranks.is_main:
            log.warning("%s", small)
        self.progress = Progress()
        self.tokens_by_turn = np.zeros(0, dtype=np.int64)  # the epoch's; set by epoch_loader
        self.position_fraction: float | None = None  # set by a resume with another layout
        self.saved_step = self.validated_step = -1
        self.last_save_time = time.monotonic()
        self.nonfinite = NonFiniteUpdates(device)
        self.signals = StopSignals()
        # Decisions that end the loop, agreed by all ranks (agree_on_stopping: a rank's clock or
        # a signal that reached one rank must not send the ranks down different paths).
        self.out_of_time = self.stop_signalled = False
        self.peak_flops = (
            peak_flops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
        )
        self.writer = SummaryWriter(str(self.run.tensorboard)) if self.ranks.is_main else None

    # ---- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The run's whole state; a collective (every rank's RNG is gathered)."""
        record = self.record.with_progress(self.progress.step, vars(self.progress))
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            **record.as_state(),
            **rng_states(self.ranks, self.device),
        }

    def check_fits(self, state: dict, path: Path) -> None:
        """CheckpointError unless the checkpoint's model has this run's shape and vocabulary."""
        mismatch = self.record.first_mismatch(
            CheckpointRecord.read(state, path), ["shape", "vocabulary"]
        )
        if mismatch is not None:
            raise CheckpointError(shape_refusal(mismatch, path))

    def load_state_dict(self, state: dict, path: Path) -> None:
        """Continue the run whose checkpoint `state` is (train/start.py checked that it may)."""
        self.check_fits(state, path)
        try:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
        except (RuntimeError, ValueError, KeyError) as error:
            raise CheckpointError(f"{path}: cannot continue from it: {error}") from error
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.progress = Progress.from_state(state["progress"])
        self.saved_step = self.progress.step
        layout = [self.ranks.world_size, self.plan.micro_batch_tokens]
        if self.progress.layout != layout:
            saved = self.progress
            self.position_fraction = saved.batch_in_epoch / max(saved.batches_in_epoch, 1)
            log.warning(
                "resuming with another layout (ranks, micro-batch budget) %s -> %s: the global "
                "batch and the schedule continue; the data position continues at %.1f%% of "
                "epoch %d in the new batch order (approximate)",
                saved.layout,
                layout,
                100 * self.position_fraction,
                saved.epoch,
            )
        seed = self.cfg.trainer.seed
        if not restore_rng(state, self.ranks, self.device, seed, self.progress.step):
            log.warning("another number of ranks: dropout draws fresh random numbers")

    def save(self, *, best: bool = False) -> Path:
        """Write the checkpoint of this update (rank 0; a collective: every rank calls it)."""
        state = self.state_dict()
        path = self.checkpoints.step_file(self.progress.step)
        if self.ranks.is_main:
            keep = self.cfg.trainer.keep_checkpoints
            path = self.checkpoints.save(
                state, self.progress.step, best=best, keep=keep, previous=self.saved_step
            )
        self.saved_step = self.progress.step
        self.last_save_time = time.monotonic()
        return path

    def begin(self, start: Start) -> None:
        """Resume the checkpoint, or take a parent's weights (fine-tuning), as `start` says."""
        if self.ranks.is_main:
            # Only what tmt-train writes: tmt-eval or tmt-average may be writing the rest now.
            stale = [*self.checkpoints.remove_partial_writes()]
            if self.run.path.is_dir():
                stale += remove_partial_writes(self.run.path, self.run.written_by_training)
            for path in stale:
                log.info("removed %s, left by an interrupted write", path.name)
        self.ranks.barrier()
        if start.kind == StartKind.resume:
            self.load_state_dict(start.state, start.path)
            self.relink_best()
        elif start.kind == StartKind.fine_tune:
            self.load_parent_weights(start.state, start.path)
        log.info("%s", describe(start))

    def relink_best(self) -> None:
        """The best checkpoint's link at the checkpoint of the recorded best score (rank 0; see
        CheckpointFolder.point_best_at)."""
        best_step = self.progress.best_step
        if (
            self.ranks.is_main
            and best_step is not None
            and self.checkpoints.point_best_at(best_step)
        ):
            log.info(
                "%s now points at update %d, the recorded best",
                self.checkpoints.best.name,
                best_step,
            )

    def load_parent_weights(self, state: dict, path: Path) -> None:
        """The parent's model weights only: optimizer, schedule and update count start afresh."""
        parent, ours = CheckpointRecord.read(state, path), self.record
        if ours.first_mismatch(parent, ["vocabulary"]) is not None:
            raise CheckpointError(
                f"{path}: the parent model's embedding has {pieces(parent)}, but this run's "
                f"tokenizer (data.spm_model={self.cfg.data.spm_model}) has {pieces(ours)}: "
                "fine-tuning needs the parent's own SentencePiece model (leave data.spm_model "
                "unset and trainer.init_from supplies it)"
            )
        self.check_fits(state, path)
        try:
            self.model.load_state_dict(state["model"])
        except RuntimeError as error:
            raise CheckpointError(f"{path}: cannot take its weights: {error}") from error

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
        )
        batches = every_rank[self.ranks.rank :: world_size]
        self.tokens_by_turn = target_tokens_by_turn(every_rank, train.tgt.lengths, world_size)
        progress = self.progress
        if self.position_fraction is not None:
            progress.batch_in_epoch = round(self.position_fraction * len(batches))
            self.position_fraction = None
        progress.batches_in_epoch = len(batches)
        progress.layout = [self.ranks.world_size, self.plan.micro_batch_tokens]
        dataset = BatchDataset(
            self.data.folder,
            "train",
            batches,
            pad_id=PAD_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            length_multiple=LENGTH_MULTIPLE if self.compiled else 1,
        )
        workers = settings.loader_workers
        return torch.utils.data.DataLoader(
            dataset,
            batch_size=None,
            sampler=range(progress.batch_in_epoch, len(batches)),
            num_workers=workers,
            pin_memory=self.device.type == "cuda",
            prefetch_factor=4 if workers else None,
            worker_init_fn=start_worker if workers else None,
            multiprocessing_context=worker_context() if workers else None,
            # Its own generator: the loader must not draw from the global RNG that dropout uses,
            # or a resumed run would get different dropout masks from an uninterrupted one.
            generator=torch.Generator().manual_seed(settings.seed + progress.epoch),
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
        with self.train_model.no_sync() if no_sync else contextlib.nullcontext():
            batch = batch.to(self.device)
            with (
                autocast_for(self.device, self.cfg.trainer.precision),
                attention_kernels(self.cfg.trainer.sdpa_backends),
                products_by_onednn(self.cfg.trainer.cpu_linear == CpuLinear.onednn),
            ):
                sums = self.train_model(batch.src, batch.tgt_in, batch.tgt_out)
            self.scaler.scale(sums.loss * scale).backward()
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
        self.scaler.unscale_(self.optimizer)
        grad_norm = self.clipped_gradient_norm()
        nonfinite = (~torch.isfinite(grad_norm)).to(torch.int64)
        lr = self.optimizer.param_groups[0]["lr"]
        if self.scaler.is_enabled():
            self.scaler.step(self.optimizer)  # skips non-finite updates itself
            self.scaler.update()
        else:
            # The protocol GradScaler uses with fused optimizers: where found_inf is 1 the step
            # changes neither parameters nor moments nor Adam's step count.
            self.optimizer.found_inf = nonfinite.to(torch.float32)
            self.optimizer.step()
            del self.optimizer.found_inf
        self.scheduler.step()
        # Under DDP the gradients are views of its buckets: set to None, they would be made
        # afresh by the next backward and copied into the buckets again.
        self.optimizer.zero_grad(set_to_none=not self.ranks.distributed)
        self.nonfinite.add(nonfinite)
        self.progress.step += 1
        return StepStats(
            loss=loss_sum * self.ranks.world_size / total_tokens,  # this rank's share
            nll=nll_sum * self.ranks.world_size / total_tokens,
            lr=lr,
            grad_norm=grad_norm,
            tokens=total_tokens,
            padding=sum(b.padding_ratio for b in batches) / len(batches),
            flops=update_flops(self.cfg.model, self.record.vocab_size, batches, PAD_ID),
        )

    def clipped_gradient_norm(self) -> torch.Tensor:
        """The gradients' norm before clipping, clipped to optim.clip_norm where it is set; with
        clipping off, only measured (clip_grad_norm_ with an infinite bound would still multiply
        every gradient by 1)."""
        clip = self.cfg.optim.clip_norm
        if clip > 0:
            return torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        return torch.nn.utils.get_total_norm(grads)

    # ---- validation, logging, stopping -------------------------------------------------------
    def validate(self) -> ValidationScores:
        """Loss and (when the command gave a scorer) BLEU on the valid split, logged; rank 0."""
        scores = validation_loss(self.model, self.data.valid, self.cfg, self.device)
        if self.valid_bleu is not None:
            scores = dataclasses.replace(scores, bleu=self.valid_bleu(self.model))
        for name, value in scores.scalars().items():
            self.writer.add_scalar(f"valid/{name}", value, self.progress.step)
        log.info("%s", scores.format(self.progress.step))
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
        """Scalars for the window of updates since the last log; a stop reason if the gradient
        has been non-finite too often in a row."""
        skipped, in_a_row = self.nonfinite.read()
        self.progress.skipped_updates += skipped
        if not self.ranks.is_main:
            return self.nonfinite_stop(in_a_row)
        stats = WindowStats.of(window, seconds, self.peak_flops)
        scalars = {**stats.scalars(), "skipped_updates": self.progress.skipped_updates}
        if self.device.type == "cuda":
            scalars["memory_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        for name, value in scalars.items():
            self.writer.add_scalar(f"train/{name}", value, self.progress.step)
        progress = self.progress
        log.info("%s", stats.format(progress.step, progress.epoch, progress.train_seconds))
        if self.compile_watch is not None:
            self.compile_watch.check(progress.step)  # logs the counts when they changed
            counts = self.compile_watch.last
            self.writer.add_scalar("compile/graphs", counts.graphs, progress.step)
            self.writer.add_scalar("compile/recompiles", counts.recompiles, progress.step)
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
        TensorBoard writer is closed however it ends."""
        try:
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
        finally:
            if self.writer:
                self.writer.close()

    def finish(self) -> None:
        """The final validation and checkpoint, where the last update has none yet."""
        improved = False
        if self.validated_step != self.progress.step:
            improved, _ = self.validate_and_judge()
        if improved or self.saved_step != self.progress.step:
            self.save(best=improved)

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
            with self.signals:
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
        reason = self.stop_rule()
        while reason is None:
            started = time.perf_counter()
            planned = list(itertools.islice(stream, self.plan.accumulation))
            if not planned:
                return self.stop_rule() or "training data exhausted"
            batches = [batch for batch, _ in planned]
            window.add(self.train_step(batches, sum(tokens for _, tokens in planned)))
            self.progress.train_seconds += time.perf_counter() - started
            bar.update(1)
            step = self.progress.step
            if step % settings.log_every == 0:
                reason = self.log_train(window.updates, window.seconds(), bar)
                window = ThroughputWindow()
            improved = exhausted = False
            if settings.valid_every and step % settings.valid_every == 0:
                with window.aside():
                    improved, exhausted = self.validate_and_judge()
            minutes = settings.checkpoint_every_minutes
            time_due = bool(minutes) and time.monotonic() - self.last_save_time >= 60 * minutes
            time_due = self.agree_on_stopping(time_due)
            periodic = settings.checkpoint_every and step % settings.checkpoint_every == 0
            if improved or self.stop_signalled or time_due or periodic:
                with window.aside():
                    self.save(best=improved)
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


def pieces(record: CheckpointRecord) -> str:
    """'400 target pieces' (and the source's with separate vocabularies)."""
    source = "" if record.src_vocab_size is None else f" and {record.src_vocab_size} source pieces"
    return f"{record.vocab_size} target pieces{source}"
