"""What tests train on: the tiny configuration, and short toy corpora as local files. A module
of its own (not conftest.py: tests/gpu has another conftest) that any test can import."""

from __future__ import annotations

import itertools
from pathlib import Path

from transformer_mt.data.toy import toy_pairs

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
    "trainer.log_every=20",
    "trainer.progress_bar=false",
    "trainer.num_threads=2",
    "trainer.loader_workers=0",
]


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
