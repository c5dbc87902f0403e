"""The Trainer: a loop over parts that each own one decision. It assembles them and runs the
update (`forward_backward` for a micro-batch, `train_step` for an update of every rank's
micro-batches); after each update, each part decides for itself:

- the training batches (train/batches.py): the data and its position;
- the Validator (train/validation.py): when to validate, the best score and the patience;
- the Checkpointer (train/checkpointer.py): when to save, the saving and the resuming;
- the stop rules (train/stopping.py): why the run ends, agreed by all ranks;
- TrainingMetrics (train/metrics.py): what rank 0 reports.

How the device runs the model is the execution policy's (transformer_mt/execution.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
import time
from collections.abc import Callable

import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from transformer_mt.checkpoint import CheckpointRecord, Progress, UpdateCounts
from transformer_mt.config import TrainJob
from transformer_mt.data.batching import Batch, BatchPlan, plan_batches
from transformer_mt.data.corpora import CorpusMix
from transformer_mt.data.prepare import PreparedData
from transformer_mt.data.tokenizer import PAD_ID
from transformer_mt.execution import ExecutionPolicy
from transformer_mt.model import Transformer
from transformer_mt.run_dir import RunDir
from transformer_mt.train.batches import TrainingBatches
from transformer_mt.train.checkpointer import Checkpointer, TrainingParts
from transformer_mt.train.compile_cache import (
    named_compile_failure,
    remove_private_folder,
    use_compile_cache,
)
from transformer_mt.train.distributed import Ranks, small_micro_batch_warning
from transformer_mt.train.flops import update_flops
from transformer_mt.train.loss import LossSums, TrainingLoss
from transformer_mt.train.metrics import TrainingMetrics
from transformer_mt.train.monitor import NonFiniteUpdates, StepStats, ThroughputWindow
from transformer_mt.train.moving_average import WeightAverage
from transformer_mt.train.optimizer import finish_update, optimizer_and_schedule
from transformer_mt.train.start import Start, StartKind, describe
from transformer_mt.train.stopping import StopRules
from transformer_mt.train.validation import Validator, Verdict

log = logging.getLogger(__name__)

# What the first update's time holds, by whether the model compiles.
WARM_UP = {
    True: " (torch.compile's warm-up: compiling the layers' and the loss's graphs)",
    False: "",
}


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
        # What this run's checkpoints say of themselves (progress added when saved).
        record = CheckpointRecord.of_run(cfg.model, data.tokenizers, data.folder.name)
        record = dataclasses.replace(record, precision=policy.precision)  # a resume keeps it
        self.model = record.build_model().to(self.device)
        # Where torch.compile keeps its kernels, on every rank, before anything compiles: a rank
        # left to torch's default would read the shared temp folder's cache. Rank 0 names an
        # older version's cache in the run folder.
        self.compile_cache = None
        if policy.compile:
            old = run.old_compile_cache if self.ranks.is_main else None
            self.compile_cache = use_compile_cache(policy, old)
        # The model and its loss, with the policy's kernels and compiled layers, as a
        # micro-batch runs them (validation's loss runs it too); under DDP with several ranks.
        self.loss_module = TrainingLoss.for_policy(
            self.model, policy, epsilon=cfg.optim.label_smoothing, pad_id=PAD_ID
        )
        self.train_model = self.distributed(self.loss_module)
        self.optimizer, self.scheduler = optimizer_and_schedule(self.model, cfg)
        decay = cfg.trainer.ema_decay
        self.ema = WeightAverage(self.model, decay) if decay else None
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=policy.scales_loss)
        self.mix = CorpusMix.of(data, cfg.data)
        self.plan = self.planned_batches()
        self.counts = UpdateCounts()  # the loop's own; the parts below hold theirs
        self.batches = TrainingBatches(
            self.mix, self.plan, policy, self.ranks, cfg.trainer, on_epoch=self.record_epoch
        )
        validated = self.model if self.ema is None else self.ema.model  # what decoding uses
        self.validator = Validator(
            validated,
            self.validation_loss_module(validated),
            data.valid,
            policy.eager(),
            self.ranks,
            cfg.trainer,
            bleu=valid_bleu,
        )
        parts = TrainingParts(self.model, self.optimizer, self.scheduler, self.scaler, self.ema)
        self.checkpointer = Checkpointer(run, record, parts, self.ranks, self.device, cfg.trainer)
        self.stop_rules = StopRules(cfg.trainer, self.ranks, self.scaler)
        self.micro_batch: Batch | None = None  # in forward_backward: what out of memory names
        self.nonfinite = NonFiniteUpdates(self.device)
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

    def validation_loss_module(self, model: Transformer) -> TrainingLoss:
        """Validation's loss of `model` (the trained one, or its moving average): the step's,
        but eager where the step compiles (policy.eager())."""
        if model is self.model and not self.policy.compile:
            return self.loss_module
        epsilon = self.cfg.optim.label_smoothing
        policy = self.policy.eager() if self.policy.compile else self.policy
        return TrainingLoss.for_policy(model, policy, epsilon=epsilon, pad_id=PAD_ID)

    def planned_batches(self) -> BatchPlan:
        """trainer.global_batch_tokens as ranks x micro-batches (a warning where those are too
        small for a GPU to be busy)."""
        settings, mix = self.cfg.trainer, self.mix
        examples = mix.epoch_examples(settings.seed, 0)  # an epoch as the weights make it
        plan = plan_batches(
            mix.src_lengths[examples],
            mix.tgt_lengths[examples],
            global_target_tokens=settings.global_batch_tokens,
            max_batch_tokens=settings.batch_tokens,
            world_size=self.ranks.world_size,
            padded=settings.global_batch_padded,
            equal_sources=self.policy.equal_source_lengths,
        )
        small = small_micro_batch_warning(plan, self.device)
        if small and self.ranks.is_main:
            log.warning("%s", small)
        return plan

    def record_epoch(self, epoch: int, counts: dict[str, dict[str, int]]) -> None:
        """What each corpus gives an epoch, in the log and history.jsonl, where there are
        several (rank 0)."""
        if len(counts) < 2:
            return
        log.info(
            "epoch %d: %s",
            epoch,
            "; ".join(
                f"{name} {c['pairs']:,} pairs, {c['src_tokens']:,} + {c['tgt_tokens']:,} tokens"
                for name, c in counts.items()
            ),
        )
        record = {"event": "epoch", "epoch": epoch, "step": self.counts.step, "corpora": counts}
        self.run.append_history(record)

    @property
    def progress(self) -> Progress:
        """Where training stands, as checkpoints save it: the loop's counts, the batches' data
        position and the validator's best score."""
        return Progress(self.counts, self.batches.position, self.validator.progress)

    # ---- starting ----------------------------------------------------------------------------
    def begin(self, start: Start) -> None:
        """Resume the checkpoint, or take a parent's weights (fine-tuning), as `start` says."""
        self.checkpointer.remove_partial_writes()
        if start.kind == StartKind.resume:
            saved = self.checkpointer.resume(start.checkpoint)
            self.counts, self.validator.progress = saved.counts, saved.validation
            self.batches.resume(saved.position)
        elif start.kind == StartKind.fine_tune:
            self.checkpointer.take_weights(start.checkpoint)
        log.info("%s", describe(start))

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
        train/batches.py; None: `batches` are the whole update, one rank's alone), so it equals
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
        if self.ema is not None:
            self.ema.update(self.model)
        self.counts.step += 1
        return StepStats(
            loss=loss_sum * self.ranks.world_size / total_tokens,  # this rank's share
            nll=nll_sum * self.ranks.world_size / total_tokens,
            lr=lr,
            grad_norm=grad_norm,
            tokens=total_tokens,
            padding=sum(b.padding_ratio for b in batches) / len(batches),
            flops=update_flops(self.cfg.model, self.model.embed.num_embeddings, batches, PAD_ID),
        )

    # ---- the loop ----------------------------------------------------------------------------
    def fit(self) -> str:
        """Train until a stop rule names a reason, then validate and save the end state (the
        end's validation is left out after a stop signal, which leaves no time for it); return
        the reason. The TensorBoard writer is closed, and a compile cache of this run alone
        removed, however it ends. Stop signals are caught until the end state is saved: one that
        comes during the final validation ends it, and the checkpoint is written without it
        (`finish`)."""
        try:
            with self.stop_rules:
                reason = self.run_updates()
                log.info(
                    "stopped: %s after %d updates, %.1f min of training",
                    reason,
                    self.counts.step,
                    self.counts.train_seconds / 60,
                )
                if not self.finish():
                    reason = (
                        f"{reason}, then a {self.stop_rules.reason(self.progress)} during the "
                        "final validation, which was left out (the same command validates it)"
                    )
            return reason
        except Exception as error:
            failure = named_compile_failure(error, self.compile_cache)  # None: not torch.compile's
            if failure is None:
                raise
            raise failure from error
        finally:
            if self.metrics:
                self.metrics.close()
            remove_private_folder(self.compile_cache)  # where it compiled for this run alone

    def finish(self) -> bool:
        """The end state: its validation, where the last update has none (none after a stop
        signal, which leaves no time for it), and its checkpoint, where last.pt lacks either. A
        stop signal during that validation ends it (a pre-emption's grace period may be shorter
        than a validation): the checkpoint is written without it, and the run counts as stopped
        by the signal. Whether the end state has its validation (False: the signal cut it)."""
        verdict = Verdict()
        if not self.stop_rules.signalled and self.validator.due(self.counts.step, last=True):
            verdict = self.validate()
        if verdict.interrupted:
            self.stop_rules.signalled = True  # every rank learnt it with the verdict
        self.checkpointer.save_if_due(
            self.progress, improved=verdict.improved, last=True, validated=verdict.judged
        )
        return not verdict.interrupted

    def run_updates(self) -> str:
        """Updates until a stop rule names a reason; after each, the parts decide for themselves
        (after_update)."""
        stop = self.stop_rules
        window, bar, first = ThroughputWindow(), self.progress_bar(), True
        updates = self.batches.updates(until_epoch=stop.epoch_limit)
        stop.start(self.counts.train_seconds)
        try:
            while (reason := stop.reason(self.progress)) is None:
                started = time.perf_counter()
                update = next(updates, None)
                if update is None:  # the last epoch's end: the rules name it
                    stop.data_ended = True
                    continue
                waited = time.perf_counter() - started
                window.add(self.train_step(*update), waited)
                self.count_time(time.perf_counter() - started, first)
                first = False
                bar.update(1)
                window = self.after_update(window, bar)
            if window.updates and not stop.signalled:  # the last, partial logging window
                self.log_window(window, bar)
                reason = stop.reason(self.progress)  # its gradients may say the run diverged
            return reason
        finally:
            updates.close()  # ends the DataLoader's worker processes
            bar.close()

    def after_update(self, window: ThroughputWindow, bar: tqdm) -> ThroughputWindow:
        """After an update every part decides for itself: a log line every trainer.log_every
        updates (and a read of the non-finite updates every trainer.max_nonfinite_updates, for
        the stop rules), a validation, the stop rules' agreement among ranks, a checkpoint (the
        time of the last two left out of the window's). Returns the logging window."""
        step, stop, settings = self.counts.step, self.stop_rules, self.cfg.trainer
        if step % settings.log_every == 0:
            window = self.log_window(window, bar)
        elif step % settings.max_nonfinite_updates == 0:
            self.read_nonfinite()
        verdict = Verdict()
        if self.validator.due(step):
            with window.aside():
                verdict = self.validate()
        stop.exhausted = verdict.exhausted
        clock_due = stop.agree(step, self.counts.train_seconds, self.checkpointer.time_due())
        with window.aside():
            self.checkpointer.save_if_due(
                self.progress,
                improved=verdict.improved,
                stopping=stop.signalled,
                clock_due=clock_due,
            )
        return window

    def count_time(self, seconds: float, first: bool) -> None:
        """An update's time (its data's wait included) into the training time; the first's
        logged (with torch.compile: its warm-up)."""
        if first:
            log.info("the first update took %.1f s%s", seconds, WARM_UP[self.policy.compile])
        self.counts.train_seconds += seconds

    def validate(self) -> Verdict:
        """The validator's verdict on this update; its scores reported (rank 0). A stop signal
        ends a validation at once, also one that came before it began: its checkpoint comes
        first (a pre-emption's grace period may be shorter than a validation)."""
        verdict = self.validator.run(self.counts.step, self.stop_rules.signals.interrupting)
        if verdict.interrupted:
            if self.ranks.is_main:
                log.warning(
                    "the validation of update %d is left out: a stop signal came, and the "
                    "checkpoint comes first",
                    self.counts.step,
                )
        elif self.metrics is not None:
            self.metrics.validation(verdict.scores, self.counts.step)
        return verdict

    def log_window(self, window: ThroughputWindow, bar: tqdm) -> ThroughputWindow:
        """Report the window of updates since the last log (rank 0) and have the stop rules
        read its non-finite gradients; returns the next window."""
        self.read_nonfinite()
        if self.metrics is not None:
            stats = self.metrics.window(
                window.updates, window.seconds(), self.progress, window.waited
            )
            shown = stats.bar_postfix()
            left = self.stop_rules.minutes_left(self.counts.train_seconds)
            if left is not None:  # the bar's total counts updates, not the time budget
                shown["time_left"] = f"{left:.1f}min"
            bar.set_postfix(shown, refresh=False)
        return ThroughputWindow()

    def read_nonfinite(self) -> None:
        """The updates skipped for a non-finite gradient since the last read, counted; the stop
        rules judge the longest run of them in a row. A read waits for the device, so it comes
        at each log and every trainer.max_nonfinite_updates updates (the same updates on every
        rank, whose gradients are the same): a run that diverges stops at most that many
        updates minus one past the limit."""
        skipped, in_a_row = self.nonfinite.read()
        self.counts.skipped_updates += skipped
        self.stop_rules.check_gradients(in_a_row)

    def progress_bar(self) -> tqdm:
        """Updates counted on a terminal: a log file (a cluster job's) gets the text lines."""
        settings = self.cfg.trainer
        return tqdm(
            total=settings.max_steps or None,
            initial=self.counts.step,
            desc="train",
            unit="upd",
            disable=not (settings.progress_bar and self.ranks.is_main and sys.stderr.isatty()),
            dynamic_ncols=True,
        )
