"""What tests train on: the tiny configuration, and short toy corpora as local files. A module
of its own (not conftest.py: tests/gpu has another conftest) that any test can import."""

from __future__ import annotations

import itertools
from pathlib import Path

import torch

from transformer_mt.config import TrainJob
from transformer_mt.data.prepare import PreparedData, prepare
from transformer_mt.data.toy import toy_pairs
from transformer_mt.execution import ExecutionPolicy
from transformer_mt.run_dir import RunDir
from transformer_mt.train.distributed import Ranks
from transformer_mt.train.trainer import Trainer

TINY_TRAIN = [
    "data=toy",
    "data.toy_sizes=[1500,40,40]",
    "data.vocab_size=400",
    "model=tiny",
    "optim.warmup_steps=30",
    "optim.lr_scale=2.0",
    "trainer.batch_tokens=1500",
    "trainer.global_batch_tokens=1200",  # one batch of at most 1,500 tokens (~81% target tokens)
    "trainer.max_steps=200",
    "trainer.valid_every=100",
    "trainer.valid_bleu_sentences=8",
    "trainer.checkpoint_every=100",
    "trainer.checkpoint_min_seconds=0",  # toy updates are fast: every checkpoint_every is written
    "trainer.log_every=20",
    "trainer.progress_bar=false",
    "trainer.num_threads=1",  # conftest.py: one thread a test process
    "trainer.loader_workers=0",
]


# The attention kernel of runs compared bitwise on a GPU (tests/gpu: the deterministic fixture):
# the math kernel, whose backward has no atomics (the fused kernels' accumulate in a varying
# order, and torch's warn_only leaves them so), asked for through the run's settings, which the
# execution policy enters for every micro-batch (tests/test_attention_kernels.py).
MATH_ATTENTION = "trainer.sdpa_backends=[math]"


def write_toy_files(
    folder: Path, *, sizes: tuple[int, int, int], seed: int = 1, words: tuple[int, int] = (3, 8)
) -> Path:
    """A toy corpus of short sentences (`words` long) as train / valid / test .en / .de files,
    for `data=files data.dir=folder`: short sentences the tiny model learns in a few hundred
    updates (the embedded toy corpus's take it far longer)."""
    folder.mkdir(parents=True)
    pairs = iter(toy_pairs(sum(sizes), seed=seed, min_words=words[0], max_words=words[1]))
    for split, size in zip(("train", "valid", "test"), sizes, strict=True):
        part = list(itertools.islice(pairs, size))
        (folder / f"{split}.en").write_text("".join(en + "\n" for en, _ in part))
        (folder / f"{split}.de").write_text("".join(de + "\n" for _, de in part))
    return folder


# Short toy sentences as local files (write_toy_files), and a learning rate and batch at which the
# tiny model learns them within a few hundred updates (TINY_TRAIN is tuned for speed, not
# learning).
LEARNING = [
    "data=files",
    "data.src_lang=en",
    "data.tgt_lang=de",
    "optim.lr_scale=0.35",
    "optim.warmup_steps=100",
    "optim.clip_norm=1.0",
    "trainer.batch_tokens=3000",
    "trainer.global_batch_tokens=2400",
]


def train_one_update(folder: Path) -> Path:
    """A run folder, folder/run, with a one-update tiny model (enough to translate with)."""
    from transformer_mt.commands.train import train
    from transformer_mt.config import compose_job

    overrides = [
        "data=toy",
        "data.toy_sizes=[300,20,20]",
        "data.vocab_size=400",
        "model=tiny",
        "trainer.max_steps=1",
        "trainer.batch_tokens=1000",
        "trainer.progress_bar=false",
        "trainer.loader_workers=0",
        f"run_dir={folder / 'run'}",
        f"data.prepared_dir={folder / 'p'}",
    ]
    return train(compose_job("train", overrides)).parents[1]


def learned_toy_run(folder: Path, *extra: str, steps: int = 2000) -> Path:
    """A run folder whose tiny model translates short toy sentences (its test split: 100) at
    about 25 BLEU (2 minutes on 2 busy CPU cores; 400 updates give 5)."""
    from transformer_mt.commands.train import train
    from transformer_mt.config import compose_job

    data = write_toy_files(folder / "data", sizes=(20000, 40, 100), seed=1, words=(3, 8))
    overrides = [f"run_dir={folder / 'run'}", f"data.prepared_dir={folder / 'prepared'}"]
    overrides += [f"data.dir={data}", f"trainer.max_steps={steps}"]
    overrides += ["trainer.valid_every=0", "trainer.valid_bleu_sentences=0"]
    job = compose_job("train", [*TINY_TRAIN, *LEARNING, *overrides, *extra])
    return train(job).parents[1]


def split_bleu(translator, run_dir: Path, split: str = "test") -> tuple[float, list[str]]:
    """sacreBLEU of `translator` on a split of the run's data, and its hypotheses."""
    from transformer_mt.data.sources import read_pairs
    from transformer_mt.metrics import sacrebleu_scores
    from transformer_mt.run_dir import RunDir

    pairs = list(read_pairs(RunDir(run_dir).data_config(), split))
    hypotheses = translator.translate([source for source, _ in pairs])
    return sacrebleu_scores(hypotheses, [target for _, target in pairs]).bleu, hypotheses


def trainer_for(
    job: TrainJob,
    data: PreparedData | None = None,
    device: str | torch.device = "cpu",
    ranks: Ranks | None = None,
) -> Trainer:
    """A Trainer of `job` in its run folder, on `data` (None: the job's, prepared now), run as
    the job's execution policy says on `device` (as tmt-train builds it)."""
    policy = ExecutionPolicy.for_training(job.trainer, torch.device(device))
    data = prepare(job.data) if data is None else data
    return Trainer(job, RunDir(job.run_dir), data, policy, ranks)
