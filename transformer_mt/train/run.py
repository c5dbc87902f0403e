"""`tmt-train`'s work: every rank prepares (rank 0 builds), trains, validates and checkpoints."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from omegaconf import OmegaConf

from transformer_mt.config import TrainJob, validate_train
from transformer_mt.data.prepare import prepare, wait_until_prepared
from transformer_mt.device import keep_freed_host_memory
from transformer_mt.files import write_text_atomically
from transformer_mt.model import count_parameters
from transformer_mt.train.distributed import Ranks, start_ranks, stop_ranks
from transformer_mt.train.trainer import Trainer

log = logging.getLogger(__name__)


def train(cfg: TrainJob) -> Path:
    """Prepare data, train, validate and checkpoint into cfg.run_dir; return the last checkpoint.
    Under torchrun every rank calls it; rank 0 prepares data and writes files."""
    validate_train(cfg)
    ranks, device = start_ranks(cfg.trainer.device, cfg.trainer.rank_timeout_minutes)
    if device.type == "cpu":
        keep_freed_host_memory()  # +16% target tokens/s on Multi30k with 2 cores
    try:
        last = train_ranks(cfg, ranks, device)
        # Leave together: a rank that tears its connections down while another is still in its
        # last collectives (rank 0 validates and saves last) can abort that rank at exit.
        ranks.barrier()
        return last
    finally:
        stop_ranks(ranks)


def train_ranks(cfg: TrainJob, ranks: Ranks, device: torch.device) -> Path:
    run_dir = Path(cfg.run_dir)
    # Absolute paths, so that eval and translate find the corpus from any working directory.
    cfg.data.prepared_dir = str(Path(cfg.data.prepared_dir).resolve())
    if cfg.data.dir is not None:
        cfg.data.dir = str(Path(cfg.data.dir).resolve())
    if ranks.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        config_yaml = OmegaConf.to_yaml(OmegaConf.structured(cfg))
        write_text_atomically(run_dir / "config.yaml", config_yaml)
        data = prepare(cfg.data, run_dir)
        ranks.barrier()
    else:
        logging.getLogger("transformer_mt").setLevel(logging.WARNING)
        wait_until_prepared(cfg.data)  # no collective yet: preparing may outlast its timeout
        ranks.barrier()
        data = prepare(cfg.data, run_dir, main_process=False)
    if cfg.trainer.num_threads:
        torch.set_num_threads(cfg.trainer.num_threads)
    torch.manual_seed(cfg.trainer.seed)  # the same initial parameters on every rank
    trainer = Trainer(cfg, data, device, ranks)
    if ranks.rank:
        torch.manual_seed(cfg.trainer.seed + ranks.rank)  # but other dropout masks
    log.info(
        "model: %s parameters (%s) on %s; %s",
        f"{count_parameters(trainer.model):,}",
        cfg.model.name,
        device,
        trainer.plan.describe(),
    )
    trainer.resume()
    reason = trainer.fit()
    log.info(
        "stopped: %s after %d updates, %.1f min of training",
        reason,
        trainer.progress.step,
        trainer.progress.train_seconds / 60,
    )
    if not trainer.stop_signalled:  # pre-emption leaves no time for more (agreed by all ranks)
        improved = False
        if trainer.validated_step != trainer.progress.step:
            improved, _ = trainer.validate_and_judge()
        if improved or trainer.saved_step != trainer.progress.step:
            trainer.save(best=improved)
    if trainer.writer:
        trainer.writer.close()
    return trainer.checkpoint_dir / "last.pt"
