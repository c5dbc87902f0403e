"""Training throughput of our Transformer next to Hugging Face's MarianMTModel of the same shape.

    make bench                                  # model=small, Multi30k de->en batches, 2 threads
    make bench ARGS="--model base --steps 3"    # any preset from transformer_mt/configs/model
    make bench ARGS="--data toy --vocab 2000"   # the embedded toy corpus instead
    make bench ARGS="--no-marian"               # our model only

Both models train on the identical collated batches (token-budget batches of the training split,
in the same order) with the same update: label_smoothed_loss summed over the target tokens and
divided by their number, fused AdamW (the config's betas, eps, weight decay) under the paper's
schedule, the same gradient-norm clipping. Ours goes through Trainer.train_step; Marian gets
input_ids = src, decoder_input_ids = tgt_in and keep masks (id != pad) for both sides. Marian is
configured to match: same d_model, heads, d_ff, layers, shared vocabulary and pad id, dropout,
attention dropout, ReLU, static sinusoidal positions, one embedding matrix for encoder, decoder
and output projection, embeddings scaled by sqrt(d_model), post-LayerNorm blocks, SDPA attention,
random init, and attention projections without biases (no MarianConfig switch: the script
removes them). Its parameter count is printed next to ours (they are equal; Marian's output bias
`final_logits_bias` is a frozen buffer and its positions a frozen table, neither trained).

How they share the machine: each model lives in its own spawned process (a fresh interpreter, so
`ru_maxrss` is that model's alone), holding `--threads` intra-op threads. The parent runs them one
at a time, never together: first `--warmup` untimed steps each, then blocks of `--block` timed
steps (1 by default: step by step), alternating ABBA (ours-Marian, Marian-ours, ...) so that
machine noise and any drift over the run fall on both alike. Each process times its own steps.
Besides the overall ratio, the median (and quartiles) of the per-block ratios is printed: both
models ran the same batches in a block, so each is a time ratio, and the median shrugs off a load
spike in one block. The machine's load average is printed: other work on the cores lowers both.

Reported per model: target tokens/s and GFLOP/s over the timed steps, peak RSS of its process and
how much the training steps raised that peak above the set-up (model, optimizer, imports) one.
The FLOP count (transformer_mt/train/flops.py) is the usual matmul estimate, the same for both.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import multiprocessing as mp
import os
import resource
import statistics
import tempfile
import time
from dataclasses import dataclass, field

import torch

from transformer_mt.config import ModelConfig, TrainJob, compose_job
from transformer_mt.data.batching import Batch, collate, token_batches
from transformer_mt.data.prepare import prepare
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer_mt.device import autocast_for
from transformer_mt.model import count_parameters
from transformer_mt.train.flops import step_flops
from transformer_mt.train.loss import label_smoothed_loss
from transformer_mt.train.schedule import paper_schedule
from transformer_mt.train.trainer import Trainer

OURS, MARIAN, MARIAN_EAGER = "ours", "marian", "marian eager-attn"
CPU = torch.device("cpu")


def peak_rss_mb() -> float:
    """This process's peak resident set size (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---- the two models' training steps ------------------------------------------------------------
class OursRunner:
    """Our model, trained through the real Trainer."""

    def __init__(self, job: TrainJob):
        self.trainer = Trainer(job, prepare(job.data), CPU)
        self.model = self.trainer.model
        self.label = "transformer_mt"

    def step(self, batch: Batch) -> float:
        """One update; the mean label-smoothed loss per target token."""
        return float(self.trainer.train_step([batch]).loss)


def marian_config(model: ModelConfig, vocab_size: int, attention: str = "sdpa"):
    """A MarianConfig of our model's shape and recipe (post-LN, ReLU, one tied embedding)."""
    from transformers import MarianConfig

    return MarianConfig(
        vocab_size=vocab_size,
        d_model=model.d_model,
        encoder_layers=model.n_encoder_layers,
        decoder_layers=model.n_decoder_layers,
        encoder_attention_heads=model.n_heads,
        decoder_attention_heads=model.n_heads,
        encoder_ffn_dim=model.d_ff,
        decoder_ffn_dim=model.d_ff,
        dropout=model.dropout,
        attention_dropout=model.attention_dropout,
        activation_dropout=0.0,
        activation_function="relu",
        max_position_embeddings=model.max_positions,
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        forced_eos_token_id=EOS_ID,
        decoder_start_token_id=BOS_ID,
        attn_implementation=attention,
    )


def drop_attention_biases(marian: torch.nn.Module) -> None:
    """Remove the biases of Marian's attention projections, as ours (the paper's W^Q, W^K, W^V,
    W^O are plain matrices); MarianConfig has no switch for them."""
    from transformers.models.marian.modeling_marian import MarianAttention

    for attention in (m for m in marian.modules() if isinstance(m, MarianAttention)):
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            getattr(attention, name).bias = None


class MarianRunner:
    """transformers' MarianMTModel with Trainer.train_step's update, step for step."""

    def __init__(self, job: TrainJob, vocab_size: int, attention: str = "sdpa"):
        import transformers

        transformers.logging.set_verbosity_error()
        self.cfg = job
        self.model = transformers.MarianMTModel(marian_config(job.model, vocab_size, attention))
        drop_attention_biases(self.model)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.forward = self.model
        if job.trainer.compile:  # as Trainer does with trainer.compile=true
            self.forward = torch.compile(self.model, dynamic=True)
        self.optimizer = torch.optim.AdamW(
            self.params,
            lr=1.0,
            betas=tuple(job.optim.betas),
            eps=job.optim.eps,
            weight_decay=job.optim.weight_decay,
            fused=True,  # as Trainer's
        )
        self.scheduler = paper_schedule(
            self.optimizer,
            d_model=job.model.d_model,
            warmup_steps=job.optim.warmup_steps,
            scale=job.optim.lr_scale,
        )
        self.label = f"transformers {transformers.__version__}"

    def step(self, batch: Batch) -> float:
        """One update; the mean label-smoothed loss per target token."""
        self.model.train()
        with autocast_for(CPU, self.cfg.trainer.precision):
            logits = self.forward(
                input_ids=batch.src,
                attention_mask=batch.src != PAD_ID,
                decoder_input_ids=batch.tgt_in,
                decoder_attention_mask=batch.tgt_in != PAD_ID,
                use_cache=False,
            ).logits  # (B, T, V)
        sums = label_smoothed_loss(
            logits, batch.tgt_out, epsilon=self.cfg.optim.label_smoothing, pad_id=PAD_ID
        )
        (sums.loss / batch.n_tgt_tokens).backward()
        clip = self.cfg.optim.clip_norm
        torch.nn.utils.clip_grad_norm_(self.params, clip if clip > 0 else math.inf)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(sums.loss.detach()) / batch.n_tgt_tokens


# ---- one process per model -----------------------------------------------------------------------
def worker(kind: str, job: TrainJob, vocab_size: int, batches: list[Batch], threads: int, conn):
    """Build one model, then run the batch indices the parent sends, timing each block."""
    torch.set_num_threads(threads)
    torch.manual_seed(job.trainer.seed)
    if kind == OURS:
        runner = OursRunner(job)
    else:
        runner = MarianRunner(job, vocab_size, "eager" if kind == MARIAN_EAGER else "sdpa")
    setup_mb = peak_rss_mb()
    conn.send({"label": runner.label, "parameters": count_parameters(runner.model)})
    while (indices := conn.recv()) is not None:
        started = time.perf_counter()
        losses = [runner.step(batches[i]) for i in indices]
        conn.send({"seconds": time.perf_counter() - started, "losses": losses})
    conn.send({"setup_mb": setup_mb, "peak_mb": peak_rss_mb()})


@dataclass
class Column:
    """One model's process and what it measured."""

    kind: str
    process: mp.process.BaseProcess
    conn: object
    info: dict
    block_seconds: list[float] = field(default_factory=list)
    tokens: int = 0
    flops: float = 0.0
    loss: float = 0.0  # token-weighted sum of the timed steps' mean losses

    @property
    def seconds(self) -> float:
        return sum(self.block_seconds)

    def ask(self, message):
        self.conn.send(message)
        try:
            return self.conn.recv()
        except EOFError:
            raise RuntimeError(f"the {self.kind} worker died (its traceback is above)") from None


def start(kind: str, job: TrainJob, vocab_size: int, batches: list[Batch], threads: int) -> Column:
    context = mp.get_context("spawn")
    parent_end, child_end = context.Pipe()
    process = context.Process(
        target=worker, args=(kind, job, vocab_size, batches, threads, child_end), daemon=True
    )
    process.start()
    child_end.close()  # so that recv() raises EOFError if the worker dies
    return Column(kind, process, parent_end, info={})


def run_blocks(columns: list[Column], batches: list[Batch], flops: list[float], args) -> None:
    """Warm-up on the first batches, then alternate timed blocks (ABBA) over the rest."""
    for column in columns:
        column.info = column.conn.recv()  # sent once the model is built
        column.ask(list(range(args.warmup)))
    timed = list(range(args.warmup, len(batches)))
    blocks = [timed[i : i + args.block] for i in range(0, len(timed), args.block)]
    for number, block in enumerate(blocks):
        for column in columns if number % 2 == 0 else columns[::-1]:
            result = column.ask(block)
            column.block_seconds.append(result["seconds"])
            for i, loss in zip(block, result["losses"], strict=True):
                column.tokens += batches[i].n_tgt_tokens
                column.flops += flops[i]
                column.loss += loss * batches[i].n_tgt_tokens
    for column in columns:
        column.info |= column.ask(None)
        column.process.join()


# ---- set-up and report ---------------------------------------------------------------------------
def compose(args, run_dir: str) -> TrainJob:
    overrides = [
        f"run_dir={run_dir}",
        f"model={args.model}",
        f"data.vocab_size={args.vocab}",
        f"trainer.batch_tokens={args.batch_tokens}",
        "trainer.progress_bar=false",
        f"data.prepared_dir={run_dir}/prepared",
    ]
    toy = args.data == "toy"
    overrides += ["data=toy"] if toy else ["data=multi30k_files_de_en", f"data.dir={args.data}"]
    return compose_job("train", overrides)


def first_batches(job: TrainJob, count: int) -> tuple[list[Batch], int]:
    """Prepare the corpus (cached for the workers); the epoch's first `count` batches, vocab."""
    data = prepare(job.data)
    tok = data.tokenizers.tgt
    indices = token_batches(
        data.train.src.lengths,
        data.train.tgt.lengths,
        job.trainer.batch_tokens,
        seed=job.trainer.seed,
        epoch=0,
    )[:count]
    collated = [
        collate(data.train, b, pad_id=tok.pad_id, bos_id=tok.bos_id, eos_id=tok.eos_id)
        for b in indices
    ]
    return collated, tok.vocab_size


def speed_ratios(ours: Column, marian: Column) -> str:
    """The overall ratio, and the median and quartiles of the per-block ones (both models ran
    the same tokens in a block, so each is a time ratio; the median shrugs off load spikes)."""
    overall = (ours.tokens / ours.seconds) / (marian.tokens / marian.seconds)
    per_block = [m / o for o, m in zip(ours.block_seconds, marian.block_seconds, strict=True)]
    if len(per_block) < 2:
        return f"{overall:.2f}x"
    low, median, high = statistics.quantiles(per_block, n=4)
    return (
        f"{overall:.2f}x overall, {median:.2f}x median of {len(per_block)} blocks "
        f"(quartiles {low:.2f}-{high:.2f})"
    )


def matmul_rate(model: ModelConfig, vocab_size: int, tokens: int, threads: int) -> float:
    """FLOP/s of torch.mm alone on this step's largest shapes (the output projection and the
    feed-forward layers over a batch's tokens): what a model made only of matmuls would reach."""
    torch.set_num_threads(threads)
    x = torch.randn(tokens, model.d_model)
    weights = [torch.randn(model.d_model, vocab_size), torch.randn(model.d_model, model.d_ff)]
    for w in weights:
        x @ w  # warm-up
    started, flops = time.perf_counter(), 0.0
    for _ in range(5):
        for w in weights:
            x @ w
            flops += 2.0 * tokens * w.shape[0] * w.shape[1]
    return flops / (time.perf_counter() - started)


def report(columns: list[Column], args, vocab_size: int, n_steps: int, loads, peak: float) -> None:
    print(
        f"model={args.model} vocab={vocab_size} batch_tokens={args.batch_tokens} "
        f"threads={args.threads} data={args.data}"
        + (" torch.compile (both models)" if args.compile else " eager mode (no torch.compile)")
    )
    print(
        f"  machine load (1-min average) {loads[0]:.1f} before, {loads[1]:.1f} after, on "
        f"{os.cpu_count()} cores; the benchmark itself adds about {args.threads}"
    )
    print(
        f"  {args.warmup} warm-up + {n_steps} timed steps each, alternating blocks of "
        f"{args.block} (ABBA), same batches, one process per model"
    )
    print(
        f"  {'':40} {'params':>11} {'tgt tok/s':>10} {'GFLOP/s':>8} {'s/step':>7} "
        f"{'loss':>6} {'peak RSS':>9} {'train +RSS':>10}"
    )
    for c in columns:
        info = c.info
        print(
            f"  {c.kind + ' (' + info['label'] + ')':40} {info['parameters']:>11,} "
            f"{c.tokens / c.seconds:>10,.0f} {c.flops / c.seconds / 1e9:>8.1f} "
            f"{c.seconds / n_steps:>7.2f} {c.loss / c.tokens:>6.3f} "
            f"{info['peak_mb']:>6,.0f} MB {info['peak_mb'] - info['setup_mb']:>7,.0f} MB"
        )
    print(
        f"  for scale: torch.mm alone on the output-projection and feed-forward shapes of a "
        f"{args.batch_tokens}-token batch runs at {peak / 1e9:.1f} GFLOP/s here"
    )
    for marian in columns[1:]:
        print(f"  ours / {marian.kind}: {speed_ratios(columns[0], marian)} target tokens/s")


def marian_available(args) -> bool:
    if args.no_marian:
        return False
    if importlib.util.find_spec("transformers") is None:
        print(
            "transformers is not installed: skipping the Marian column. "
            'Install it with `pip install -e ".[bench]"` (make bench does this on first use).'
        )
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="small")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=60, help="timed steps per model")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per model first")
    parser.add_argument(
        "--block", type=int, default=1, help="timed steps per turn (1: alternate every step)"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-marian", action="store_true", help="time our model only")
    parser.add_argument(
        "--marian-eager",
        action="store_true",
        help="also Marian with eager (unfused) attention, transformers' default before SDPA",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="both models through torch.compile (ours: trainer.compile=true); use --warmup 6",
    )
    parser.add_argument(
        "--data",
        default="toy",
        help="'toy' (the embedded corpus, the default) or a folder with train.de / train.en "
        "(Multi30k layout, as benchmarks/train_speed.txt was measured)",
    )
    args = parser.parse_args()
    kinds = [OURS, MARIAN] if marian_available(args) else [OURS]
    if args.marian_eager and len(kinds) == 2:
        kinds.append(MARIAN_EAGER)
    with tempfile.TemporaryDirectory() as run_dir:
        job = compose(args, run_dir)
        job.trainer.compile = args.compile
        batches, vocab_size = first_batches(job, args.warmup + args.steps)
        flops = [
            step_flops(job.model, vocab_size, *b.src.shape, b.tgt_in.shape[1]) for b in batches
        ]
        load_before = os.getloadavg()[0]
        columns = [start(kind, job, vocab_size, batches, args.threads) for kind in kinds]
        run_blocks(columns, batches, flops, args)
    loads = (load_before, os.getloadavg()[0])
    peak = matmul_rate(job.model, vocab_size, args.batch_tokens, args.threads)
    report(columns, args, vocab_size, len(batches) - args.warmup, loads, peak)


if __name__ == "__main__":
    main()
