"""The training loop: token-budget batches, accumulation, autocast, validation, checkpoints."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from transformer_mt.config import TrainJob, validate_train
from transformer_mt.data.batching import Batch, BatchDataset, collate, token_batches
from transformer_mt.data.prepare import PreparedData, prepare
from transformer_mt.data.store import ParallelTokens
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer_mt.device import autocast_for, resolve_device
from transformer_mt.errors import CheckpointError
from transformer_mt.model import Transformer, count_parameters
from transformer_mt.train.checkpoint import (
    load_checkpoint,
    prune_step_checkpoints,
    publish_as,
    save_checkpoint,
)
from transformer_mt.train.loss import label_smoothed_loss
from transformer_mt.train.schedule import paper_schedule

log = logging.getLogger(__name__)


def config_dict(cfg) -> dict:
    """A dataclass config as plain Python values (safe for torch.load(weights_only=True))."""
    return OmegaConf.to_container(OmegaConf.structured(cfg), enum_to_str=True)


@dataclass
class Progress:
    """Where training stands; saved in every checkpoint."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    train_seconds: float = 0.0


class Trainer:
    def __init__(self, cfg: TrainJob, data: PreparedData, device: torch.device):
        self.cfg, self.data, self.device = cfg, data, device
        self.run_dir = Path(cfg.run_dir)
        tokenizers = data.tokenizers
        self.pad_id, self.bos_id, self.eos_id = PAD_ID, BOS_ID, EOS_ID
        self.vocab_sizes = {
            "vocab_size": tokenizers.tgt.vocab_size,
            "src_vocab_size": None if tokenizers.shared else tokenizers.src.vocab_size,
        }
        self.model = Transformer(cfg.model, pad_id=PAD_ID, **self.vocab_sizes).to(device)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=1.0,
            betas=tuple(cfg.optim.betas),
            eps=cfg.optim.eps,
            weight_decay=cfg.optim.weight_decay,
            fused=device.type == "cuda",
        )
        self.scheduler = paper_schedule(
            self.optimizer,
            d_model=cfg.model.d_model,
            warmup_steps=cfg.optim.warmup_steps,
            scale=cfg.optim.lr_scale,
        )
        self.progress = Progress()
        self.writer = SummaryWriter(str(self.run_dir / "tensorboard"))
        self.checkpoint_dir = self.run_dir / "checkpoints"

    # ---- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "model_config": config_dict(self.cfg.model),
            **self.vocab_sizes,
            "data_folder": self.data.folder.name,
            "step": self.progress.step,
            "progress": vars(self.progress).copy(),
            "rng_cpu": torch.get_rng_state(),
            "rng_cuda": torch.cuda.get_rng_state_all() if self.device.type == "cuda" else [],
        }

    def load_state_dict(self, state: dict, path: Path) -> None:
        if state.get("data_folder") != self.data.folder.name:
            raise CheckpointError(
                f"{path} was trained on prepared data {state.get('data_folder')}, but this "
                f"configuration prepares {self.data.folder.name} (a data or tokenizer setting, or "
                "the corpus, changed): use a new run_dir, or restore the original settings"
            )
        try:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, ValueError) as error:
            raise CheckpointError(
                f"{path} does not fit this configuration's model (was model.* changed?): {error}. "
                "Use a new run_dir, or restore the original settings"
            ) from None
        self.scheduler.load_state_dict(state["scheduler"])
        self.progress = Progress(**state["progress"])
        torch.set_rng_state(state["rng_cpu"])
        if state["rng_cuda"] and self.device.type == "cuda":
            torch.cuda.set_rng_state_all(state["rng_cuda"])

    def save(self) -> Path:
        state = self.state_dict()
        step_path = self.checkpoint_dir / f"step_{self.progress.step}.pt"
        save_checkpoint(state, step_path)
        publish_as(step_path, self.checkpoint_dir / "last.pt")
        prune_step_checkpoints(self.checkpoint_dir, self.cfg.trainer.keep_checkpoints)
        return step_path

    def resume_if_possible(self) -> None:
        last = self.checkpoint_dir / "last.pt"
        if last.is_file():
            # Loaded on the CPU: RNG states must stay there; the optimizer moves its own state.
            self.load_state_dict(load_checkpoint(last, "cpu"), last)
            log.info("resumed from %s at update %d", last, self.progress.step)

    # ---- loop --------------------------------------------------------------------------------
    def should_stop(self) -> str | None:
        trainer, progress = self.cfg.trainer, self.progress
        if trainer.max_steps and progress.step >= trainer.max_steps:
            return f"reached trainer.max_steps={trainer.max_steps}"
        if trainer.max_epochs and progress.epoch >= trainer.max_epochs:
            return f"reached trainer.max_epochs={trainer.max_epochs}"
        if trainer.max_time_minutes and progress.train_seconds >= 60 * trainer.max_time_minutes:
            return f"reached trainer.max_time_minutes={trainer.max_time_minutes}"
        return None

    def epoch_loader(self) -> torch.utils.data.DataLoader:
        """This epoch's batches from the saved position on, collated in background processes."""
        train, trainer = self.data.train, self.cfg.trainer
        batches = token_batches(
            train.src.lengths,
            train.tgt.lengths,
            trainer.batch_tokens,
            seed=trainer.seed,
            epoch=self.progress.epoch,
        )
        dataset = BatchDataset(
            self.data.folder,
            "train",
            batches,
            pad_id=self.pad_id,
            bos_id=self.bos_id,
            eos_id=self.eos_id,
        )
        return torch.utils.data.DataLoader(
            dataset,
            batch_size=None,
            sampler=range(self.progress.batch_in_epoch, len(batches)),
            num_workers=trainer.loader_workers,
            pin_memory=self.device.type == "cuda",
            prefetch_factor=4 if trainer.loader_workers else None,
            # Its own generator: the loader must not draw from the global RNG that dropout uses,
            # or a resumed run would get different dropout masks from an uninterrupted one.
            generator=torch.Generator().manual_seed(trainer.seed + self.progress.epoch),
        )

    def micro_batches(self):
        """Endless (epoch-advancing) stream of collated batches, starting at the saved position."""
        while True:
            for batch in self.epoch_loader():
                self.progress.batch_in_epoch += 1
                yield batch
            self.progress.epoch += 1
            self.progress.batch_in_epoch = 0
            if self.should_stop():
                return

    def train_step(self, batches: list[Batch]) -> dict[str, float]:
        """One update from summed micro-batch losses, divided once by the total target tokens."""
        self.model.train()
        total_tokens = sum(batch.n_tgt_tokens for batch in batches)
        loss_sum = nll_sum = 0.0
        for batch in batches:
            batch = batch.to(self.device)
            with autocast_for(self.device, self.cfg.trainer.precision):
                logits = self.model(batch.src, batch.tgt_in)
            sums = label_smoothed_loss(
                logits, batch.tgt_out, epsilon=self.cfg.optim.label_smoothing, pad_id=self.pad_id
            )
            (sums.loss / total_tokens).backward()
            loss_sum += sums.loss.detach()
            nll_sum += sums.nll.detach()
        clip = self.cfg.optim.clip_norm
        grad_norm = torch.nn.utils.clip_grad_norm_(
            self.model.parameters(), clip if clip > 0 else math.inf
        )
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.progress.step += 1
        return {
            "loss": loss_sum / total_tokens,
            "nll": nll_sum / total_tokens,
            "lr": lr,
            "grad_norm": grad_norm,
            "tokens": total_tokens,
        }

    @torch.no_grad()
    def validate(self, data: ParallelTokens) -> dict[str, float]:
        self.model.eval()
        loss_sum = nll_sum = tokens = 0.0
        for indices in token_batches(
            data.src.lengths,
            data.tgt.lengths,
            self.cfg.trainer.batch_tokens,
            seed=0,
            epoch=0,
            shuffle=False,
        ):
            batch = collate(
                data, indices, pad_id=self.pad_id, bos_id=self.bos_id, eos_id=self.eos_id
            ).to(self.device)
            with autocast_for(self.device, self.cfg.trainer.precision):
                logits = self.model(batch.src, batch.tgt_in)
            sums = label_smoothed_loss(
                logits, batch.tgt_out, epsilon=self.cfg.optim.label_smoothing, pad_id=self.pad_id
            )
            loss_sum, nll_sum, tokens = (
                loss_sum + float(sums.loss),
                nll_sum + float(sums.nll),
                tokens + batch.n_tgt_tokens,
            )
        return {
            "loss": loss_sum / tokens,
            "nll": nll_sum / tokens,
            "ppl": math.exp(min(nll_sum / tokens, 50.0)),
        }

    def log_validation(self) -> None:
        scores = self.validate(self.data.valid)
        for name, value in scores.items():
            self.writer.add_scalar(f"valid/{name}", value, self.progress.step)
        log.info(
            "update %d: valid loss %.3f, nll %.3f, ppl %.2f",
            self.progress.step,
            scores["loss"],
            scores["nll"],
            scores["ppl"],
        )

    def log_train(self, window: list[dict], seconds: float, bar) -> None:
        tokens = sum(m["tokens"] for m in window)
        loss = float(sum(m["loss"] * m["tokens"] for m in window)) / tokens
        nll = float(sum(m["nll"] * m["tokens"] for m in window)) / tokens
        scalars = {
            "loss": loss,
            "nll": nll,
            "ppl": math.exp(min(nll, 50.0)),
            "lr": window[-1]["lr"],
            "grad_norm": float(window[-1]["grad_norm"]),
            "tokens_per_s": tokens / max(seconds, 1e-9),
        }
        for name, value in scalars.items():
            self.writer.add_scalar(f"train/{name}", value, self.progress.step)
        bar.set_postfix(
            loss=f"{loss:.3f}",
            ppl=f"{scalars['ppl']:.1f}",
            lr=f"{scalars['lr']:.2e}",
            tok_s=f"{scalars['tokens_per_s']:.0f}",
            refresh=False,
        )

    def fit(self) -> str:
        """Train until a stopping rule fires; return which one."""
        trainer = self.cfg.trainer
        bar = tqdm(
            total=trainer.max_steps or None,
            initial=self.progress.step,
            desc="train",
            unit="upd",
            disable=not trainer.progress_bar,
            dynamic_ncols=True,
        )
        stream = self.micro_batches()
        try:
            return self.run_updates(stream, bar)
        finally:
            stream.close()  # ends the DataLoader's worker processes
            bar.close()

    def run_updates(self, stream, bar) -> str:
        trainer = self.cfg.trainer
        window, window_start = [], time.perf_counter()
        reason = self.should_stop()
        while reason is None:
            started = time.perf_counter()
            batches = [batch for _, batch in zip(range(trainer.accumulate), stream, strict=False)]
            if not batches:
                reason = self.should_stop() or "training data exhausted"
                break
            window.append(self.train_step(batches))
            self.progress.train_seconds += time.perf_counter() - started
            bar.update(1)
            step = self.progress.step
            if step % trainer.log_every == 0:
                self.log_train(window, time.perf_counter() - window_start, bar)
                window, window_start = [], time.perf_counter()
            if trainer.valid_every and step % trainer.valid_every == 0:
                self.log_validation()
            if trainer.checkpoint_every and step % trainer.checkpoint_every == 0:
                self.save()
            reason = self.should_stop()
        if window:  # the last, partial logging window
            self.log_train(window, time.perf_counter() - window_start, bar)
        return reason


def train(cfg: TrainJob) -> Path:
    """Prepare data, train, validate and checkpoint into cfg.run_dir; return the last checkpoint."""
    validate_train(cfg)
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    # Absolute paths, so that eval and translate find the corpus from any working directory.
    cfg.data.prepared_dir = str(Path(cfg.data.prepared_dir).resolve())
    if cfg.data.dir is not None:
        cfg.data.dir = str(Path(cfg.data.dir).resolve())
    config_yaml = OmegaConf.to_yaml(OmegaConf.structured(cfg))
    (run_dir / "config.yaml").write_text(config_yaml, encoding="utf-8")
    torch.manual_seed(cfg.trainer.seed)
    if cfg.trainer.num_threads:
        torch.set_num_threads(cfg.trainer.num_threads)
    device = resolve_device(cfg.trainer.device)
    data = prepare(cfg.data, run_dir)
    trainer = Trainer(cfg, data, device)
    log.info(
        "model: %s parameters (%s) on %s",
        f"{count_parameters(trainer.model):,}",
        cfg.model.name,
        device,
    )
    trainer.resume_if_possible()
    reason = trainer.fit()
    log.info(
        "stopped: %s after %d updates, %.1f min of training",
        reason,
        trainer.progress.step,
        trainer.progress.train_seconds / 60,
    )
    if (
        not trainer.cfg.trainer.valid_every
        or trainer.progress.step % trainer.cfg.trainer.valid_every
    ):
        trainer.log_validation()
    trainer.save()
    trainer.writer.close()
    return trainer.checkpoint_dir / "last.pt"
