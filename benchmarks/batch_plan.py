"""The training batches of an epoch, as the execution policy groups them: sentences of similar
lengths (padded, masked: the CPU's) or of one source length wherever a length fills half a batch
(no source padding, so attention needs no key mask; the rest packed as similar lengths are:
CUDA's, trainer.source_lengths, data/batching.one_length_batches), with the lengths rounded as
on CUDA (ExecutionPolicy.round_lengths). Recorded in benchmarks/batch_plan.txt.

    python -m benchmarks.batch_plan --multi30k PATH       # Multi30k's raw text, and WMT-like
    python -m benchmarks.batch_plan --wmt-pairs 4500000   # WMT-like lengths only

Per corpus and budget, for each grouping: batches per epoch (of one source length: how many, and
their share of the target tokens), padded positions over real ones (source and target together,
BOS / EOS counted), the distinct (rows, source, target) shapes a GPU meets in the epoch, the
real target tokens of a batch (mean, 10th percentile, least), and the trainer's plan for the
recipe's update (plan_batches). Multi30k is tokenized as its recipe does
(data=multi30k_files_de_en: SentencePiece, 8,000 pieces), prepared in a temporary folder; the
WMT-like lengths are bench_train's generator (WMT14 en-de's under a 37k BPE).
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np

from benchmarks.bench_train import generated_lengths
from benchmarks.measure import report_header
from transformer_mt.config import compose_job
from transformer_mt.data.batching import batch_shapes, epoch_batches, plan_batches
from transformer_mt.data.prepare import prepare


def grouping_row(src: np.ndarray, tgt: np.ndarray, budget: int, equal: bool) -> str:
    """One grouping's figures at micro-batches of `budget` padded tokens."""
    batches = epoch_batches(src, tgt, budget, seed=1, epoch=0, equal_sources=equal)
    shapes = batch_shapes(batches, src, tgt, round_lengths=True, equal_sources=equal)
    exact = batch_shapes(batches, src, tgt, equal_sources=equal)
    real = int((src + 1).sum() + (tgt + 1).sum())
    padded = int((shapes[:, 0] * (shapes[:, 1] + shapes[:, 2])).sum())
    padded_exact = int((exact[:, 0] * (exact[:, 1] + exact[:, 2])).sum())
    targets = np.array([int(tgt[b].sum()) + len(b) for b in batches])
    one = np.array([src[b].min() == src[b].max() for b in batches])
    name = "one source length" if equal else "similar lengths  "
    kept = f" ({one.sum():,} of one length: {targets[one].sum() / targets.sum():.1%} of the tokens)"
    return (
        f"  {name}: {len(batches):7,} batches{kept if equal else ''}, padding "
        f"{padded_exact / real - 1:6.1%} exact / "
        f"{padded / real - 1:6.1%} rounded, {len(np.unique(shapes, axis=0)):5,} distinct shapes "
        f"rounded; target tokens a batch: mean {targets.mean():8,.0f}, 10th percentile "
        f"{np.percentile(targets, 10):8,.0f}, least {targets.min():6,}"
    )


def report(name: str, src: np.ndarray, tgt: np.ndarray, budgets: list[tuple[int, int, bool]]):
    """The corpus's groupings at each (micro-batch budget, update size, update in padded
    tokens) of its recipes."""
    print(f"\n{name}: {len(src):,} pairs, source mean {src.mean():.1f} pieces, "
          f"{len(np.unique(src))} distinct source lengths", flush=True)  # fmt: skip
    for budget, update, padded in budgets:
        unit = "padded" if padded else "target"
        print(f" micro-batches of at most {budget:,} padded tokens, updates of {update:,} {unit} "
              "tokens; the epoch's batches at the plan's budget:")  # fmt: skip
        for equal in (False, True):
            plan = plan_batches(
                src, tgt, global_target_tokens=update, max_batch_tokens=budget, world_size=1,
                padded=padded, equal_sources=equal,
            )  # fmt: skip
            print(f"    plan: {plan.describe()}", flush=True)
            print(grouping_row(src, tgt, plan.micro_batch_tokens, equal), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--multi30k", help="Multi30k's raw text: {train,val,test_2016_flickr}.*")
    parser.add_argument("--wmt-pairs", type=int, default=4_500_000, help="WMT-like pairs")
    args = parser.parse_args()
    print(*report_header("the batches of an epoch, by grouping"), sep="\n")
    if args.multi30k:
        with tempfile.TemporaryDirectory(prefix="batch_plan_") as folder:
            job = compose_job(
                "multi30k",
                ["data=multi30k_files_de_en", f"data.dir={args.multi30k}",
                 f"data.prepared_dir={folder}", f"run_dir={folder}/run"],
            )  # fmt: skip
            train = prepare(job.data).train
            src, tgt = train.src.lengths.astype(np.int64), train.tgt.lengths.astype(np.int64)
        # the CPU recipe's (multi30k) and the GPU recipe's (multi30k_gpu) batches
        report("Multi30k de-en train", src, tgt, [(4096, 4096, True), (16384, 16384, True)])
    src, tgt = generated_lengths(args.wmt_pairs, np.random.default_rng(1))
    # the paper preset's (trainer/paper.yaml) and make gpu-check's (one micro-batch of 32,768)
    budgets = [(25000, 25000, False), (32768, 25000, False)]
    report("WMT-like lengths (bench_train's generator, seed 1)", src, tgt, budgets)


if __name__ == "__main__":
    main()
