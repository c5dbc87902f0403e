"""torch.compile's first compile of a training step on the CPU, with Inductor's precompiled
headers kept in the private compile cache (what tmt-train runs: train/compile_cache.py moves
them there, since torch keeps them in the shared temp folder and compiles in a header it finds
there) against headers off (the other way to close that hole).

    python -m benchmarks.bench_compile_headers                    # model=tiny, 2 rounds
    python -m benchmarks.bench_compile_headers --model small --rounds 3

Each way runs in a fresh process (benchmarks/measure.py) with a new, empty compile cache (a
folder of its own in TORCHINDUCTOR_CACHE_DIR, set up by use_compile_cache as the trainer does):

  off          precompiled headers off;
  private-new  as tmt-train runs: the first compile also builds the header (about 155 MB) in the
               new cache's precompiled_headers/ before its kernels;
  private-old  as tmt-train runs, with the header built already (copied from private-new's
               cache): a later first compile (other settings or another model) into a cache
               whose header is there.

What is timed: the first forward and backward pass of the --model preset's training loss
(TrainingLoss.for_policy: the policy's compiled layers and loss chunks, fp32) on one batch of
random tokens, which compiles the step; then the next pass, compiled already. Rounds alternate
the order (off first, then private first; private-old always after its private-new), and each
way's fastest round is reported with every round's figure (the machine is shared).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.measure import in_fresh_process, report_header
from transformer_mt.config import Precision, TrainerConfig, compose_job
from transformer_mt.data.tokenizer import PAD_ID
from transformer_mt.device import prepare_process
from transformer_mt.execution import ExecutionPolicy
from transformer_mt.model import Transformer
from transformer_mt.train.compile_cache import CACHE_SETTING, use_compile_cache
from transformer_mt.train.loss import TrainingLoss

CPU = torch.device("cpu")
WAYS = ("off", "private-new", "private-old")


def random_batch(args) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Source, target input and target output of --rows random sentences (ids 3 and up)."""
    generator = torch.Generator().manual_seed(0)
    src = torch.randint(3, args.vocab, (args.rows, args.length), generator=generator)
    tgt = torch.randint(3, args.vocab, (args.rows, args.length + 1), generator=generator)
    return src, tgt[:, :-1], tgt[:, 1:]


def first_passes(way: str, cache: Path, args) -> dict:
    """In a process of its own: the seconds of the first (compiling) and the second training pass
    of the preset's loss, compiled `way` into the cache `cache`; the header's size."""
    from torch._inductor import config as inductor_config

    os.environ[CACHE_SETTING] = str(cache)  # a new folder only this user can write: used as set
    prepare_process(CPU, args.threads)
    policy = ExecutionPolicy.for_training(
        TrainerConfig(compile="true", precision=Precision.fp32), CPU
    )
    use_compile_cache(policy, None)  # as the trainer sets its compiler up
    if way == "off":
        inductor_config.cpp_cache_precompile_headers = False
    model_cfg = compose_job("train", ["run_dir=unused", f"model={args.model}"]).model
    torch.manual_seed(0)
    model = Transformer(model_cfg, vocab_size=args.vocab, pad_id=PAD_ID)
    loss = TrainingLoss.for_policy(model, policy, epsilon=0.1, pad_id=PAD_ID)
    batch = random_batch(args)
    seconds = []
    for _ in range(2):
        started = time.perf_counter()
        model.zero_grad(set_to_none=True)
        with policy.forward():
            sums = loss(*batch)
        sums.loss.backward()
        seconds.append(time.perf_counter() - started)
    header_mb = sum(path.stat().st_size for path in cache.glob("precompiled_headers/*.gch")) / 1e6
    return {"first": seconds[0], "next": seconds[1], "header_mb": header_mb}


def round_order(turn: int) -> list[str]:
    """off first at even turns, last at odd ones; private-old always after private-new."""
    return list(WAYS) if turn % 2 == 0 else ["private-new", "private-old", "off"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="tiny", help="the model preset (configs/model)")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--rows", type=int, default=32, help="the batch's sentences")
    parser.add_argument("--length", type=int, default=24, help="their source length in pieces")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    results: dict[str, list[dict]] = {way: [] for way in WAYS}
    for turn in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="bench_compile_headers-") as folder:
            for way in round_order(turn):
                cache = Path(folder) / f"cache-{way}"
                if way == "private-old":  # the header private-new built, alone
                    built = Path(folder) / "cache-private-new" / "precompiled_headers"
                    shutil.copytree(built, cache / "precompiled_headers")
                results[way].append(in_fresh_process(first_passes, way, cache, args))
    print(
        *report_header("torch.compile's first compile: precompiled headers private or off"),
        sep="\n",
    )
    print(
        f"model={args.model}, vocab {args.vocab:,}, a batch of {args.rows} x {args.length} "
        f"pieces, fp32, {args.threads} threads; each way in a fresh process with a new cache; "
        "seconds of the first pass (forward + backward: the compile) and of the next"
    )
    for way, runs in results.items():
        best = min(runs, key=lambda run: run["first"])
        each = ", ".join(f"{run['first']:.1f}" for run in runs)
        header = f", header {best['header_mb']:,.0f} MB" if way != "off" else ""
        print(
            f"  {way:12} first {best['first']:7.1f} s (rounds: {each})   next "
            f"{best['next']:.3f} s{header}"
        )
    off = min(run["first"] for run in results["off"])
    for way in WAYS[1:]:
        ratio = off / min(run["first"] for run in results[way])
        print(f"  off takes {ratio:.2f}x the first-compile time of {way}")


if __name__ == "__main__":
    main()
