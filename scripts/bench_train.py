"""Training throughput of our Transformer: target tokens/s, GFLOP/s and peak memory.

    make bench                                  # model=small, Multi30k de->en batches, 2 threads
    make bench ARGS="--model base --steps 3"    # any preset from configs/model
    make bench ARGS="--data toy --vocab 2000"   # the embedded toy corpus instead

The FLOP count is the usual matmul estimate: 6 x (multiply-adds per token) for forward + backward,
summed over the encoder on source tokens, the decoder and output projection on target tokens, and
attention scores (QK^T and AV) over the padded batch shapes.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

import torch

from transformer_mt.config import compose_job
from transformer_mt.data.batching import Batch, collate, token_batches
from transformer_mt.data.prepare import prepare
from transformer_mt.train.trainer import Trainer


def step_flops(batch: Batch, d_model: int, d_ff: int, n_enc: int, n_dec: int, vocab: int) -> float:
    """Forward + backward FLOPs of one training step (3 x forward, forward = 2 x multiply-adds)."""
    b, s = batch.src.shape
    t = batch.tgt_in.shape[1]
    enc_layer = 4 * d_model * d_model + 2 * d_model * d_ff
    dec_layer = 8 * d_model * d_model + 2 * d_model * d_ff
    linear = b * s * n_enc * enc_layer + b * t * (n_dec * dec_layer + d_model * vocab)
    attention = 2 * d_model * b * (n_enc * s * s + n_dec * (t * t + t * s))
    return 6.0 * (linear + attention)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="small")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--data",
        default="../shared/data/multi30k",
        help="folder with train.de / train.en (Multi30k layout); 'toy' for the embedded corpus",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as run_dir:
        overrides = [
            f"run_dir={run_dir}",
            f"model={args.model}",
            f"data.vocab_size={args.vocab}",
            f"trainer.batch_tokens={args.batch_tokens}",
            "trainer.progress_bar=false",
            f"data.prepared_dir={run_dir}/prepared",
        ]
        toy = args.data == "toy"
        overrides += ["data=toy"] if toy else ["data=multi30k_de_en", f"data.dir={args.data}"]
        job = compose_job("train", overrides)
        data = prepare(job.data, Path(run_dir))
        trainer = Trainer(job, data, torch.device("cpu"))
        tok = data.tokenizers.tgt
        batches = [
            collate(data.train, b, pad_id=tok.pad_id, bos_id=tok.bos_id, eos_id=tok.eos_id)
            for b in token_batches(
                data.train.src.lengths, data.train.tgt.lengths, args.batch_tokens, seed=1, epoch=0
            )[: args.steps + 2]
        ]
        m = job.model
        trainer.train_step(batches[:1])  # warm-up
        tokens = flops = 0.0
        started = time.perf_counter()
        for batch in batches[2:]:
            trainer.train_step([batch])
            tokens += batch.n_tgt_tokens
            flops += step_flops(
                batch, m.d_model, m.d_ff, m.n_encoder_layers, m.n_decoder_layers, tok.vocab_size
            )
        seconds = time.perf_counter() - started
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"model={args.model} vocab={tok.vocab_size} batch_tokens={args.batch_tokens} "
        f"threads={args.threads} "
        f"data={args.data}"
    )
    print(
        f"  {len(batches) - 2} steps in {seconds:.1f} s: {tokens / seconds:,.0f} target tokens/s, "
        f"{flops / seconds / 1e9:.1f} GFLOP/s "
        f"({flops / (len(batches) - 2) / 1e9:.1f} GFLOP per step), "
        f"peak RSS {peak_mb:,.0f} MB"
    )


if __name__ == "__main__":
    main()
