"""Training throughput of our Transformer next to Hugging Face's MarianMTModel of the same shape.

    make bench                                  # model=small, Multi30k de->en batches, 2 threads
    make bench ARGS="--model base --steps 3"    # any preset from transformer_mt/configs/model
    make bench ARGS="--data toy --vocab 2000"   # the embedded toy corpus instead
    make bench ARGS="--no-marian"               # our model only

Both models train on the identical collated batches (token-budget batches of the training split,
in the same order) with the same update: the loss summed over the target tokens and divided by
their number, fused AdamW (the config's betas, eps, weight decay) under the paper's schedule, the
same gradient-norm clipping. Ours goes through Trainer.train_step; Marian (MarianRunner says why
it cannot) through a copy of its update, with label_smoothed_loss over its logits, and gets
input_ids = src, decoder_input_ids = tgt_in and keep masks (id != pad) for both sides. Marian is
configured to match: same d_model, heads, d_ff, layers, shared vocabulary and pad id, dropout,
attention dropout, ReLU, static sinusoidal positions, one embedding matrix for encoder, decoder
and output projection, embeddings scaled by sqrt(d_model), post-LayerNorm blocks, SDPA attention,
random init, and attention projections without biases (no MarianConfig switch: the script
removes them). Its parameter count is printed next to ours (they are equal; Marian's output bias
`final_logits_bias` is a frozen buffer and its positions a frozen table, neither trained).

How they share the machine: each model lives in its own spawned process (a fresh interpreter, so
its peak RSS is that model's alone; benchmarks/measure.py), holding `--threads` intra-op threads
and, on the CPU, keeping freed memory in its heap as tmt-train's process does
(device.keep_freed_host_memory: without it the plain loss's large blocks are mapped and zeroed
afresh at every step). The parent runs them one at a time, never together: first `--warmup`
untimed steps each, then blocks of `--block` timed steps (1 by default: step by step),
alternating ABBA (ours-Marian, Marian-ours, ...) so that machine noise and any drift over the run
fall on both alike. Each process times its own steps.
Besides the overall ratio, the median (and quartiles) of the per-block ratios is printed: both
models ran the same batches in a block, so each is a time ratio, and the median shrugs off a load
spike in one block. The machine's load average is printed: other work on the cores lowers both.

Reported per model: target tokens/s and GFLOP/s over the timed steps, peak RSS of its process and
how much the training steps raised that peak above the set-up (model, optimizer, imports) one.
For scale, the rate of one matrix product on the step's largest shapes (torch.mm's, and on the
CPU oneDNN's, each its fastest of 5 rounds; 50 on a GPU), and each model's GFLOP/s as a share of
the faster.
The FLOP count (transformer_mt/train/flops.py) is the usual matmul estimate, the same for both,
on the real (non-padding) tokens. --passes 2 runs the timed steps twice: the second pass meets
only shapes seen before (as every epoch after the first: cuDNN's attention plans and the caching
allocator's blocks are cached by shape), and the reports give the last pass, beside the first.

On a GPU (what `make gpu-check` runs, benchmarks/gpu_check.py):

    python -m benchmarks.bench_train --device cuda --data generated --model base --vocab 37000 \
        --batch-tokens 32768 --update-tokens 25000 --warmup 5 --steps 8 --block 4 --passes 2 \
        [--columns ours-compiled] [--profile]

--data generated: WMT-like sentence pairs of random pieces (roughly WMT14 en-de's lengths, ids
Zipf-distributed over --vocab pieces: what a batch costs does not depend on which pieces it
holds), no corpus or tokenizer needed: the lengths of --generated-pairs pairs (2,000,000, so
that length-sorted batches are as densely packed as WMT's: about 3% padding at 25,000 tokens),
pieces drawn only for the sentences of the batches timed. --update-tokens: target tokens per
update, split into micro-batches of at most --batch-tokens padded tokens as the trainer plans
them (trainer.global_batch_tokens); without it an update is one batch of --batch-tokens.
--precision: autocast as trainer.precision (auto: bf16 on a GPU, fp32 on the CPU), for both
models; the columns ours-fp32 and ours-bf16 set it for ours alone, so that the two precisions are
timed side by side on the same batches in alternating blocks
(`make bench ARGS="--columns ours-fp32,ours-bf16"`). The GPU report gives TFLOP/s, model FLOPs
utilisation against the GPU's dense bf16 peak (flops.py) on real tokens and beside it on padded
shapes, the batches' padding, and peak GPU memory (allocated by torch) instead of RSS. Each
timed block ends with a device synchronisation.
--update-tokens 3125 (or 1563) on one GPU is one rank's share of the paper's 25,000-token update
at NPROC=8 (or 2 nodes x 8): the small micro-batches where kernel launches, not the GPU, set the
pace.

Every figure is printed the moment it is measured (lines starting `..`): each column's warm-up
seconds and, compiled, its graphs and recompiles with the guard that failed; after each pass each
column's target tokens/s, TFLOP/s, MFU and seconds an update; after the last, the first pass's
time over the last's. The table follows at the end. The batches are grouped as the trainer's
policy groups them on the device (--source-lengths, trainer.source_lengths: on CUDA one source
length a batch where a length fills half a batch); every model's process is set up as tmt-train's
(device.set_up_process: on CUDA the allocator's expandable segments and TF32).

--profile (GPU or CPU): after the table, ours runs its last timed update again under
torch.profiler, 3 times after one skipped and one warm-up (benchmarks/profile_step.py): time by kind
of kernel or operator, the longest ones, how busy the device was over those updates' wall time,
and on a GPU the host's operators by their own CPU time.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from pathlib import Path

import numpy as np
import torch

from benchmarks.measure import (
    abba_order,
    fastest_seconds,
    peak_rss_mib,
    report_header,
    spawned,
    synchronize,
)
from benchmarks.profile_step import StepProfile, profile_update
from transformer_mt import onednn
from transformer_mt.checkpoint.record import CheckpointRecord
from transformer_mt.config import (
    CpuLinear,
    ModelConfig,
    Precision,
    SdpaBackend,
    SourceLengths,
    TrainJob,
    compose_job,
)
from transformer_mt.data.batching import Batch, collate, plan_batches, token_batches
from transformer_mt.data.prepare import PreparedData, prepare
from transformer_mt.data.store import ParallelTokens, TokenArray
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizers
from transformer_mt.device import keep_freed_host_memory, set_up_process
from transformer_mt.errors import TransformerMTError
from transformer_mt.execution import ExecutionPolicy
from transformer_mt.export.transformers import import_transformers, marian_shape
from transformer_mt.model import Dropout, count_parameters
from transformer_mt.run_dir import RunDir
from transformer_mt.train.compiling import CompileCounts, recompile_reasons
from transformer_mt.train.flops import PEAK_BF16_FLOPS, Flops, peak_flops, update_flops
from transformer_mt.train.loss import LossSums, label_smoothed_loss
from transformer_mt.train.optimizer import finish_update, optimizer_and_schedule
from transformer_mt.train.trainer import Trainer

OURS, MARIAN, MARIAN_EAGER = "ours", "marian", "marian eager-attn"
OURS_PLAIN, OURS_COMPILED = "ours plain", "ours compiled"
OURS_COMPILED_EAGER_LOSS = "ours compiled, loss eager"
OURS_FP32, OURS_BF16 = "ours fp32", "ours bf16"  # trainer.precision, whatever --precision says
PRECISION_OF = {OURS_FP32: Precision.fp32, OURS_BF16: Precision.bf16}
COMPILED_KINDS = (OURS_COMPILED, OURS_COMPILED_EAGER_LOSS)  # trainer.compile=true
# --columns: what each name runs (ours: the trainer as configured, with its chunked loss).
COLUMNS = {
    "ours-plain": OURS_PLAIN,  # the step before issue 25: the whole fp32 logits, torch's dropout
    "ours": OURS,
    "ours-compiled": OURS_COMPILED,  # trainer.compile=true: its layers and loss chunks compiled
    "ours-compiled-eager-loss": OURS_COMPILED_EAGER_LOSS,  # the same, the loss's chunks eager
    "ours-fp32": OURS_FP32,  # ours with trainer.precision=fp32 (a column beside ours-bf16)
    "ours-bf16": OURS_BF16,  # ours with trainer.precision=bf16 (autocast, on any device)
    "marian": MARIAN,
    "marian-eager": MARIAN_EAGER,
}
CPU = torch.device("cpu")
ONEDNN_PRODUCT = "oneDNN (weight reordered)"
# --data generated: the pairs whose lengths the length-sorted batches are cut from. WMT14 en-de
# has 4.5M; 120,000 left the batches sparse (11.8% padding at 25,000 tokens against 2.5% on
# WMT): a million or two give WMT's padding. Pieces are drawn only for the batches timed.
GENERATED_PAIRS = 2_000_000


# ---- generated WMT-like data -------------------------------------------------------------------
class GeneratedVocabulary:
    """Stands in for a SentencePiece model where only the vocabulary is read (the Trainer's
    vocabulary size, CTranslate2's export): '<pad>' '<unk>' '<s>' '</s>' at ids 0-3, then pieces
    'p4', 'p5', ..."""

    def __init__(self, size: int):
        self.vocab_size = size
        self.path = Path(f"generated-{size}")
        self.sha256 = f"generated-{size}"  # what a checkpoint records of its tokenizer
        self.processor = self  # id_to_piece, as SentencePieceProcessor spells it

    def id_to_piece(self, index: int) -> str:
        return ("<pad>", "<unk>", "<s>", "</s>")[index] if index < 4 else f"p{index}"


def generated_lengths(count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Source and target lengths in pieces, roughly WMT14 en-de's under a 37k BPE: sources
    log-normal around a median of 24 (mean about 29, a long tail cut at 250, the default
    data.max_tokens_per_sentence), targets about 5% longer with a spread of their own."""
    src = np.clip(np.rint(rng.lognormal(np.log(24.0), 0.6, count)), 1, 250).astype(np.int64)
    tgt = np.clip(np.rint(src * rng.lognormal(np.log(1.05), 0.2, count)), 1, 250).astype(np.int64)
    return src, tgt


def generated_pieces(lengths: np.ndarray, vocab_size: int, rng: np.random.Generator) -> TokenArray:
    """Sentences of the given lengths, piece ids drawn Zipf-like (p ~ 1 / rank) from 4..vocab-1."""
    ids = np.arange(4, vocab_size)
    weights = 1.0 / np.arange(1, len(ids) + 1)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = rng.choice(ids, size=int(offsets[-1]), p=weights / weights.sum()).astype(np.int32)
    return TokenArray(tokens, offsets)


def generated_pairs(count: int, vocab_size: int, seed: int) -> ParallelTokens:
    rng = np.random.default_rng(seed)
    src_lengths, tgt_lengths = generated_lengths(count, rng)
    src = generated_pieces(src_lengths, vocab_size, rng)
    return ParallelTokens(src, generated_pieces(tgt_lengths, vocab_size, rng))


def generated_data(
    job: TrainJob,
    pairs: int,
    updates: int,
    update_tokens: int | None,
    folder: Path,
    device: torch.device,
) -> tuple[PreparedData, list[list[np.ndarray]]]:
    """The first `updates` updates' batches (as `first_batches` cuts them) from the lengths of
    `pairs` generated pairs, and a prepared corpus of only the sentences they hold, in batch
    order, with the batches' indices into it (no valid split is read here)."""
    vocab_size = job.data.vocab_size
    rng = np.random.default_rng(1)
    src_lengths, tgt_lengths = generated_lengths(pairs, rng)
    batches = first_batches(job, src_lengths, tgt_lengths, updates, update_tokens, device)
    used = np.concatenate([b for update in batches for b in update])  # each sentence once
    src = generated_pieces(src_lengths[used], vocab_size, rng)
    train = ParallelTokens(src, generated_pieces(tgt_lengths[used], vocab_size, rng))
    ends = np.cumsum([len(b) for update in batches for b in update])
    within = iter(np.split(np.arange(len(used)), ends[:-1]))  # positions in the small corpus
    batches = [[next(within) for _ in update] for update in batches]
    vocabulary = GeneratedVocabulary(vocab_size)
    data = PreparedData(Tokenizers(vocabulary, vocabulary), train=train, valid=train, folder=folder)
    return data, batches


# ---- the two models' training steps ------------------------------------------------------------
class OursRunner:
    """Our model, trained through the real Trainer under the execution policy its settings give
    (trainer.compile, cpu_linear, ...). The benchmark's own levers are settings of that policy,
    passed in: `compile_backend` (ExecutionPolicy.compile_backend) and `eager_loss_chunks`, the
    loss's chunks eager where the policy would compile them (ExecutionPolicy.compile_loss: a
    lever of make gpu-check)."""

    def __init__(
        self,
        job: TrainJob,
        data: PreparedData,
        device: torch.device,
        eager_loss_chunks: bool = False,
        compile_backend: str = "inductor",
    ):
        policy = dataclasses.replace(
            ExecutionPolicy.for_training(job.trainer, device),
            compile_backend=compile_backend,
            compile_loss=not eager_loss_chunks,
        )
        self.trainer = Trainer(job, RunDir(job.run_dir), data, policy)
        self.model = self.trainer.model
        self.label = "transformer_mt"

    def step(self, batches: list[Batch]) -> torch.Tensor:
        """One update; the mean label-smoothed loss per target token (on the device)."""
        return self.trainer.train_step(batches).loss


class UpdateRunner:
    """A model the Trainer does not take, under the trainer's update: Trainer.train_step's, step
    for step, on one rank without a loss scaler (no fp16 here): each micro-batch's summed loss
    (`sums`, the forward in the trainer's execution policy), divided once by the update's
    target tokens, then train/optimizer.py's optimizer, schedule and update after the backward
    passes (`finish_update`), as the Trainer's."""

    def __init__(self, job: TrainJob, model: torch.nn.Module, device: torch.device, label: str):
        self.cfg, self.model, self.device, self.label = job, model, device, label
        self.policy = ExecutionPolicy.for_training(job.trainer, device)  # as Trainer runs
        self.optimizer, self.scheduler = optimizer_and_schedule(model, job)  # as Trainer's
        self.scaler = torch.amp.GradScaler(device.type, enabled=False)  # no fp16 here

    def sums(self, batch: Batch) -> LossSums:
        """One micro-batch's summed loss, nll and target tokens (on the device)."""
        raise NotImplementedError

    def step(self, batches: list[Batch]) -> torch.Tensor:
        """One update over the micro-batches; the mean label-smoothed loss per target token."""
        self.model.train()
        total_tokens = sum(batch.n_tgt_tokens for batch in batches)
        loss_sum = torch.zeros((), device=self.device)
        for batch in batches:
            sums = self.sums(batch.to(self.device))
            (sums.loss / total_tokens).backward()
            loss_sum += sums.loss.detach()
        finish_update(
            self.model, self.optimizer, self.scheduler, self.scaler, self.cfg.optim.clip_norm
        )
        return loss_sum / total_tokens


class PlainRunner(UpdateRunner):
    """Our model as its step was before the trainer's loss was chunked, its CPU dropout drew
    cheaper masks and its CPU products took oneDNN's kernel (issue 25): the loss over the whole
    logits in fp32 (label_smoothed_loss), torch's own nn.Dropout and F.linear
    (trainer.cpu_linear=torch); with --compile the whole step through torch.compile, as the
    trainer compiled it then. Built as the Trainer builds ours (the run's record, the same
    seed), but outside it: the Trainer's parts stay its own."""

    def __init__(self, job: TrainJob, data: PreparedData, device: torch.device):
        job.trainer.cpu_linear = CpuLinear.torch
        record = CheckpointRecord.of_run(job.model, data.tokenizers, data.folder.name)
        model = record.build_model().to(device)
        use_torch_dropout(model)
        super().__init__(job, model, device, "transformer_mt")
        loss = PlainLoss(model, job.optim.label_smoothing)
        # compiled whole, as the trainer compiled it then (the policy compiles layer by layer now)
        self.loss = torch.compile(loss, dynamic=True) if self.policy.compile else loss

    def sums(self, batch: Batch) -> LossSums:
        with self.policy.forward():
            return self.loss(batch.src, batch.tgt_in, batch.tgt_out, batch.src_padded)


def use_torch_dropout(model: torch.nn.Module) -> None:
    """Every model.Dropout of `model` replaced by torch's nn.Dropout of the same p."""
    for module in list(model.modules()):
        for name, child in module.named_children():
            if isinstance(child, Dropout):
                setattr(module, name, torch.nn.Dropout(child.p))


class PlainLoss(torch.nn.Module):
    """TrainingLoss's interface over the plain loss: logits (B, T, V), then label_smoothed_loss."""

    def __init__(self, model: torch.nn.Module, epsilon: float):
        super().__init__()
        self.model, self.epsilon = model, epsilon

    def forward(self, src, tgt_in, tgt_out, src_padded: bool = True):
        logits = self.model.decode(tgt_in, self.model.encode(src, padded=src_padded))
        return label_smoothed_loss(logits, tgt_out, epsilon=self.epsilon, pad_id=PAD_ID)


def drop_attention_biases(marian: torch.nn.Module) -> None:
    """Remove the biases of Marian's attention projections, as ours (the paper's W^Q, W^K, W^V,
    W^O are plain matrices); MarianConfig has no switch for them."""
    from transformers.models.marian.modeling_marian import MarianAttention

    for attention in (m for m in marian.modules() if isinstance(m, MarianAttention)):
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            getattr(attention, name).bias = None


class MarianRunner(UpdateRunner):
    """transformers' MarianMTModel under the trainer's update (UpdateRunner). Not through
    Trainer.train_step: a Trainer builds its own model (our Transformer, from the run's record)
    with its optimizer and schedule over that model's parameters, and takes no other model;
    re-wired after construction to train Marian, it would leave our model's weights in this
    process (counted in the peak RSS and GPU memory reported for Marian). And a micro-batch of
    the trainer runs TrainingLoss, which projects our decoder's hidden states through our tied
    embedding, where Marian gives logits (its lm_head and final_logits_bias): here
    label_smoothed_loss over them. Compiled whole where the policy compiles (Marian has no
    repeated_layers for the policy's regional compilation)."""

    def __init__(
        self, job: TrainJob, vocab_size: int, device: torch.device, attention: str = "sdpa"
    ):
        transformers = import_transformers()
        transformers.logging.set_verbosity_error()
        shape = marian_shape(
            job.model, transformers, vocab_size=vocab_size, attn_implementation=attention
        )
        model = transformers.MarianMTModel(shape)
        drop_attention_biases(model)
        model.to(device)
        super().__init__(job, model, device, f"transformers {transformers.__version__}")
        # compiled whole: Marian has no repeated_layers for the policy's regional compilation
        self.forward = torch.compile(model, dynamic=True) if self.policy.compile else model

    def sums(self, batch: Batch) -> LossSums:
        with self.policy.forward():
            logits = self.forward(
                input_ids=batch.src,
                attention_mask=batch.src != PAD_ID,
                decoder_input_ids=batch.tgt_in,
                decoder_attention_mask=batch.tgt_in != PAD_ID,
                use_cache=False,
            ).logits  # (B, T, V)
        return label_smoothed_loss(
            logits, batch.tgt_out, epsilon=self.cfg.optim.label_smoothing, pad_id=PAD_ID
        )


# ---- one process per model -----------------------------------------------------------------------
def gpu_memory_gib(device: torch.device) -> float | None:
    """The most memory torch has allocated on the GPU so far (None on the CPU)."""
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def worker(
    kind: str,
    job: TrainJob,
    data: PreparedData | None,
    vocab_size: int,
    steps: list[list[Batch]],
    threads: int,
    device: torch.device,
    compile_backend: str,
    conn,
):
    """Build one model, then run the update indices the parent sends, timing each block (up to
    the device's last kernel), with what torch.compile did so far where it compiles. `data`:
    None prepares (reads the cache of) the job's corpus."""
    set_up_process(str(device), threads)  # as tmt-train sets its process up, for both models
    torch.manual_seed(job.trainer.seed)
    if device.type == "cuda":  # as the trainer's DataLoader hands them over: pinned
        steps = [[batch.pin_memory() for batch in step] for step in steps]
    if kind in (OURS, OURS_PLAIN, *COMPILED_KINDS, *PRECISION_OF):
        if kind in COMPILED_KINDS:
            job.trainer.compile = "true"
        job.trainer.precision = PRECISION_OF.get(kind, job.trainer.precision)
        data = data if data is not None else prepare(job.data)
        if kind == OURS_PLAIN:
            runner = PlainRunner(job, data, device)
        else:
            runner = OursRunner(
                job,
                data,
                device,
                eager_loss_chunks=kind == OURS_COMPILED_EAGER_LOSS,
                compile_backend=compile_backend,
            )
    else:
        attention = "eager" if kind == MARIAN_EAGER else "sdpa"
        runner = MarianRunner(job, vocab_size, device, attention)
    setup_mb, setup_gib = peak_rss_mib(), gpu_memory_gib(device)
    conn.send({"label": runner.label, "parameters": count_parameters(runner.model)})
    while (indices := conn.recv()) is not None:
        started = time.perf_counter()
        losses = [runner.step(steps[i]) for i in indices]
        losses = [float(loss) for loss in losses]  # waits for the device
        synchronize(device)
        seconds = time.perf_counter() - started
        compiled = compile_report() if kind in COMPILED_KINDS else None
        conn.send({"seconds": seconds, "losses": losses, "compiled": compiled})
    conn.send(
        {
            "setup_mb": setup_mb,
            "peak_mb": peak_rss_mib(),
            "gpu_setup_gib": setup_gib,
            "gpu_peak_gib": gpu_memory_gib(device),
        }
    )
    if device.type == "cuda":  # waiting for the report: leave the GPU's memory to the parent
        torch.cuda.empty_cache()
    index = conn.recv()  # after the memory figures, which the profiler's own memory would raise
    if index is not None:
        conn.send(profiled(runner, steps[index], device))


def compile_report() -> tuple[int, int, list[str]]:
    """What torch.compile did so far in this process: graphs, recompiles, and why each recompile
    happened (train/compiling.py)."""
    counts = CompileCounts.now()
    return counts.graphs, counts.recompiles, recompile_reasons()


def profiled(runner, step: list[Batch], device: torch.device) -> StepProfile | str:
    """The update again under torch.profiler (profile_step.SKIPPED + WARMUP + PROFILED times),
    or what went wrong (the timings stand without it)."""
    try:
        return profile_update(lambda: float(runner.step(step)), device)
    except Exception as error:  # e.g. no CUPTI for the CUDA kernels: report it, keep the rest
        return f"{type(error).__name__}: {error}"


@dataclass
class Timing:
    """One pass of a column over the timed updates: its blocks' seconds and what they held."""

    block_seconds: list[float] = field(default_factory=list)
    tokens: int = 0
    flops: Flops = Flops()
    loss: float = 0.0  # token-weighted sum of the updates' mean losses
    updates: int = 0

    @property
    def seconds(self) -> float:
        return sum(self.block_seconds)

    def add(self, block: list[int], result: dict, steps, update_flops: list[Flops]) -> None:
        """A timed block's result (the worker's answer) for updates `block` of `steps`."""
        self.block_seconds.append(result["seconds"])
        for i, loss in zip(block, result["losses"], strict=True):
            tokens = sum(batch.n_tgt_tokens for batch in steps[i])
            self.tokens += tokens
            self.flops += update_flops[i]
            self.loss += loss * tokens
            self.updates += 1


@dataclass
class Column:
    """One model's process and what it measured: a Timing per pass over the timed updates (the
    last is the one reported first: every shape in it has been seen before)."""

    kind: str
    process: BaseProcess
    conn: object
    info: dict
    update_flops: list[Flops]  # of the updates as this column runs them (rounded up, compiled)
    passes: list[Timing] = field(default_factory=list)
    warmup_seconds: float = 0.0
    compiled: tuple = (0, 0, [])  # torch.compile's graphs, recompiles, reasons reported so far

    @property
    def timed(self) -> Timing:
        return self.passes[-1]

    def ask(self, message):
        self.conn.send(message)
        try:
            return self.conn.recv()
        except EOFError:
            raise RuntimeError(f"the {self.kind} worker died (its traceback is above)") from None


def start(kind: str, job: TrainJob, data, vocab_size: int, steps, args) -> Column:
    device = torch.device(args.device)
    process, conn = spawned(
        worker, kind, job, data, vocab_size, steps, args.threads, device, args.compile_backend
    )
    flops = [update_flops(job.model, vocab_size, step, PAD_ID) for step in steps]
    return Column(kind, process, conn, info={}, update_flops=flops)


def run_blocks(columns: list[Column], steps: list[list[Batch]], args) -> None:
    """Warm-up on the first updates, then alternate timed blocks (ABBA) over the rest, in
    --passes passes over the same updates (shapes seen before from the second one on); each
    figure printed as soon as it is measured (`progress`)."""
    peak = device_peak(torch.device(args.device))
    for column in columns:
        column.info = column.conn.recv()  # sent once the model is built
        result = column.ask(list(range(args.warmup)))
        column.warmup_seconds = result["seconds"]
        progress(f"{column.kind}: {args.warmup} warm-up update(s) in {column.warmup_seconds:.1f} s")
        report_compiling(column, result.get("compiled"), "the warm-up")
    timed = list(range(args.warmup, len(steps)))
    blocks = [timed[i : i + args.block] for i in range(0, len(timed), args.block)]
    for number in range(args.passes):
        for column in columns:
            column.passes.append(Timing())
        for turn, block in enumerate(blocks):
            for column in abba_order(columns, turn):
                result = column.ask(block)
                column.timed.add(block, result, steps, column.update_flops)
                report_compiling(column, result.get("compiled"), f"update {block[-1] + 1}")
        for column in columns:
            progress(pass_figures(column, number, args.passes, peak))
    if args.passes > 1:
        for column in columns:
            first, last = column.passes[0].seconds, column.timed.seconds
            progress(
                f"{column.kind}: pass 1 (shapes unseen) took {first / last:.2f}x the last "
                f"pass's time: {last / first:.2f}x the steady state's speed"
            )
    for number, column in enumerate(columns):
        column.info |= column.ask(None)
        if not (args.profile and number == 0):
            column.conn.send(None)  # not to be profiled: it exits
            column.process.join()


def device_peak(device: torch.device) -> float | None:
    """The GPU's dense bf16 peak FLOP/s (flops.py); None on the CPU or a GPU not listed."""
    return peak_flops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None


def pass_figures(column: Column, number: int, passes: int, peak: float | None) -> str:
    """One pass's figures for a column: tok/s, TFLOP/s, MFU (real and padded), s/update."""
    timing = column.passes[number]
    real, padded = (flops / timing.seconds for flops in (timing.flops.real, timing.flops.padded))
    mfu = f"MFU {real / peak:.1%} (padded {padded / peak:.1%})" if peak else "MFU -"
    return (
        f"pass {number + 1} of {passes}, {column.kind}: {timing.tokens / timing.seconds:,.0f} "
        f"target tok/s, {real / 1e12:.2f} TFLOP/s, {mfu}, "
        f"{timing.seconds / max(timing.updates, 1):.3f} s/update"
    )


def report_compiling(column: Column, compiled, when: str) -> None:
    """A compiled column's graphs and recompiles when they changed, each new recompile's reason
    (the guard that failed) on a line of its own."""
    if compiled is None or tuple(compiled[:2]) == column.compiled[:2]:
        return
    graphs, recompiles, reasons = compiled
    progress(
        f"{column.kind}: torch.compile by {when}: {graphs} graph(s), {recompiles} recompile(s)"
    )
    for reason in reasons[len(column.compiled[2]) :]:
        progress(f"{column.kind}: recompiled: {reason}")
    column.compiled = (graphs, recompiles, list(reasons))


def progress(text: str) -> None:
    """A line as soon as its figure is known: a run stopped at a limit (gpu_check's parts)
    keeps what it measured before the report."""
    print(f"  .. {text}", flush=True)


def finish(columns: list[Column], steps: list[list[Batch]], args) -> None:
    """With --profile, after the report (a profiler that hangs cannot take the timings with it):
    ours runs its last timed update once more under torch.profiler, then exits."""
    if args.profile:
        print_profile(columns[0].ask(len(steps) - 1))
        columns[0].process.join()


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
    toy = args.data in ("toy", "generated")  # generated data needs no data settings
    overrides += ["data=toy"] if toy else ["data=multi30k_files_de_en", f"data.dir={args.data}"]
    return compose_job("train", overrides)


def first_batches(
    job: TrainJob,
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
    count: int,
    update_tokens: int | None,
    device: torch.device,
) -> list[list[np.ndarray]]:
    """The epoch's first `count` updates, each a list of micro-batches (index arrays): one
    batch of trainer.batch_tokens, or (update_tokens) the trainer's plan for that many target
    tokens; of one source length each where the trainer's policy on `device` has them so
    (trainer.source_lengths)."""
    equal = ExecutionPolicy.for_training(job.trainer, device).equal_source_lengths
    budget, accumulation = job.trainer.batch_tokens, 1
    if update_tokens:
        plan = plan_batches(
            src_lengths,
            tgt_lengths,
            global_target_tokens=update_tokens,
            max_batch_tokens=budget,
            world_size=1,
            equal_sources=equal,
        )
        budget, accumulation = plan.micro_batch_tokens, plan.accumulation
    indices = token_batches(
        src_lengths, tgt_lengths, budget, seed=job.trainer.seed, epoch=0, equal_sources=equal
    )
    indices = indices[: count * accumulation]
    return [indices[i : i + accumulation] for i in range(0, len(indices), accumulation)]


def collated(
    data: PreparedData,
    batches: list[list[np.ndarray]],
    round_lengths: bool = False,
    equal_sources: bool = False,
) -> list[list[Batch]]:
    """The updates' micro-batches collated as the trainer collates them: padded lengths rounded
    where its execution policy rounds them (ExecutionPolicy.round_lengths), sources unpadded
    where each batch has one source length (ExecutionPolicy.equal_source_lengths)."""
    return [
        [
            collate(
                data.train,
                b,
                pad_id=PAD_ID,
                bos_id=BOS_ID,
                eos_id=EOS_ID,
                round_lengths=round_lengths,
                equal_sources=equal_sources,
            )
            for b in update
        ]
        for update in batches
    ]


def speed_ratios(ours: Timing, marian: Timing) -> str:
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


def product_rates(
    model: ModelConfig,
    vocab_size: int,
    tokens: int,
    threads: int,
    device: torch.device = CPU,
    dtype: torch.dtype = torch.float32,
    with_onednn: bool = True,
) -> dict[str, float]:
    """FLOP/s of one matrix product on this step's largest shapes (the output projection and the
    feed-forward layers over a batch's tokens): what a model made only of matmuls would reach.
    By torch.mm, and in float32 on the CPU also by oneDNN's kernel with the weight reordered once
    (onednn.py, the product ours makes there), which can be the faster of the two. Each product
    counts its fastest of several rounds: a round the machine slowed says nothing of the kernel."""
    torch.set_num_threads(threads)
    x = torch.randn(tokens, model.d_model, device=device, dtype=dtype)
    weights = [  # (out, in), as a linear layer's
        torch.randn(size, model.d_model, device=device, dtype=dtype)
        for size in (vocab_size, model.d_ff)
    ]
    # Into outputs made once: a fresh (tokens x vocabulary) block per product would time the
    # allocator (on the CPU, pages mapped and zeroed afresh), not the matmul.
    outputs = [torch.empty(tokens, w.shape[0], device=device, dtype=dtype) for w in weights]
    products = {
        "torch.mm": [
            functools.partial(torch.mm, x, w.t(), out=out)
            for w, out in zip(weights, outputs, strict=True)
        ]
    }
    if with_onednn and device.type == "cpu" and dtype == torch.float32 and onednn.available():
        keep_freed_host_memory()  # its outputs come from the heap, as in the trainer's process
        products[ONEDNN_PRODUCT] = [
            functools.partial(onednn.product_in_row_steps, x, onednn.packed(w)) for w in weights
        ]
    flops = sum(2.0 * tokens * w.shape[0] * w.shape[1] for w in weights)
    rounds = 5 if device.type == "cpu" else 50
    return {
        name: flops / sum(fastest_seconds(call, rounds, device=device) for call in calls)
        for name, calls in products.items()
    }


def report(columns: list[Column], args, vocab_size: int, n_steps: int, loads, rates) -> None:
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
        f"  {args.warmup} warm-up + {n_steps} timed steps each{passes_said(args)}, alternating "
        f"blocks of {args.block} (ABBA), same batches, one process per model"
    )
    print(
        f"  {'':40} {'params':>11} {'tgt tok/s':>10} {'GFLOP/s':>8} {'s/step':>7} "
        f"{'loss':>6} {'peak RSS':>9} {'train +RSS':>10}"
    )
    for c in columns:
        info, t = c.info, c.timed
        print(
            f"  {c.kind + ' (' + info['label'] + ')':40} {info['parameters']:>11,} "
            f"{t.tokens / t.seconds:>10,.0f} {t.flops.real / t.seconds / 1e9:>8.1f} "
            f"{t.seconds / n_steps:>7.2f} {t.loss / t.tokens:>6.3f} "
            f"{info['peak_mb']:>6,.0f} MB {info['peak_mb'] - info['setup_mb']:>7,.0f} MB"
        )
    said = ", ".join(f"{name} {rate / 1e9:.1f}" for name, rate in rates.items())
    print(
        f"  for scale: one product on the output-projection and feed-forward shapes of a "
        f"{args.batch_tokens}-token batch, the fastest of 5 rounds, in GFLOP/s here: {said}"
    )
    best = max(rates.values())
    shares = ", ".join(
        f"{c.kind} {c.timed.flops.real / c.timed.seconds / best:.0%}" for c in columns
    )
    print(f"  GFLOP/s as a share of the faster product's: {shares}")
    print_ratios(columns)
    print(
        "  (peak RSS: the whole process; train +RSS: what the training steps added above the "
        "set-up's peak)"
    )


def print_ratios(columns: list[Column]) -> None:
    """Each of our columns against the first column, then against Marian."""
    references = [columns[0]] + [c for c in columns if c.kind.startswith(MARIAN)]
    for reference in references:
        for column in columns:
            if column.kind.startswith(OURS) and column is not reference:
                ratio = speed_ratios(column.timed, reference.timed)
                print(f"  {column.kind} / {reference.kind}: {ratio} target tokens/s")


def gpu_report(columns: list[Column], args, vocab_size: int, steps, precision: str, mm_rate: float):
    """The report on a GPU: TFLOP/s, MFU against the GPU's dense bf16 peak, GPU memory."""
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "a CPU rehearsal"
    timed = steps[args.warmup :]
    tokens = [sum(b.n_tgt_tokens for b in step) for step in timed]
    padding = statistics.mean(b.padding_ratio for step in timed for b in step)
    compiled = [c.kind for c in columns if compiles(c.kind, args)]
    mode = f"torch.compile ({', '.join(compiled)})" if compiled else "eager"
    lengths = "exact lengths" if args.exact_lengths else "lengths as the policy rounds them"
    print(
        f"model={args.model} vocab={vocab_size} data={args.data} device={device} ({name}) "
        f"{precision} {mode}; attention [{args.sdpa_backends}], {lengths}"
    )
    print(
        f"  updates: {len(timed[0])} micro-batch(es) of at most {max_padded(timed):,} padded "
        f"tokens; {statistics.mean(tokens):,.0f} target tokens per update on average "
        f"({min(tokens):,}-{max(tokens):,}), padding {padding:.1%}"
    )
    print(
        f"  {args.warmup} warm-up + {len(timed)} timed updates each{passes_said(args)}, "
        f"alternating blocks of {args.block} (ABBA), same batches, one process per model; "
        f"torch {torch.__version__}"
    )
    peak = peak_flops(name)
    print(
        f"  {'':34} {'params':>11} {'tgt tok/s':>10} {'pass 1':>10} {'ratio':>6} "
        f"{'TFLOP/s':>8} {'MFU':>6} {'padded':>6} {'s/update':>8} {'loss':>6} {'warm-up':>8} "
        f"{'peak GPU':>9} {'train +GPU':>10}"
    )
    for c in columns:
        info, t, first = c.info, c.timed, c.passes[0]
        real, padded = (flops / t.seconds for flops in (t.flops.real, t.flops.padded))
        mfu, mfu_padded = (f"{f / peak:.1%}" if peak else "-" for f in (real, padded))
        peak_gib, setup_gib = info["gpu_peak_gib"] or 0.0, info["gpu_setup_gib"] or 0.0
        print(
            f"  {c.kind + ' (' + info['label'] + ')':34} {info['parameters']:>11,} "
            f"{t.tokens / t.seconds:>10,.0f} {first.tokens / first.seconds:>10,.0f} "
            f"{first.seconds / t.seconds:>5.2f}x {real / 1e12:>8.1f} {mfu:>6} {mfu_padded:>6} "
            f"{t.seconds / len(timed):>8.3f} {t.loss / t.tokens:>6.3f} "
            f"{c.warmup_seconds:>6.1f} s {peak_gib:>5.1f} GiB {peak_gib - setup_gib:>6.1f} GiB"
        )
    print(
        f"  tgt tok/s, TFLOP/s, MFU, s/update, loss: the last of {args.passes} pass(es) over the "
        "timed updates (every shape seen before from the second on); pass 1: tok/s of the "
        "first; ratio: pass 1's time over the last's"
    )
    known = next((key for key in PEAK_BF16_FLOPS if key in name), None)
    print(
        f"  MFU: model FLOPs/s on the real (non-padding) tokens, flops.py's count, over "
        f"{peak / 1e12:.0f} TFLOP/s, the dense bf16 peak listed for '{known}' in "
        "transformer_mt/train/flops.py; padded: the same on the padded shapes the kernels ran"
        if peak
        else f"  MFU: no dense bf16 peak is listed for '{name}' in transformer_mt/train/flops.py"
    )
    print(
        f"  for scale: torch.mm in {precision} on the output-projection and feed-forward shapes "
        f"of {max_padded(timed):,} tokens runs at {mm_rate / 1e12:.{0 if mm_rate >= 1e13 else 2}f} "
        "TFLOP/s here (the fastest of 50 calls)"
    )
    print_ratios(columns)


def passes_said(args) -> str:
    return f", {args.passes} passes over them" if args.passes > 1 else ""


def print_profile(profiled: StepProfile | str) -> None:
    if isinstance(profiled, StepProfile):
        print("\n".join(profiled.lines("ours, the last timed update again")))
    else:
        print(f"  profile of ours: failed ({profiled})")


def max_padded(steps: list[list[Batch]]) -> int:
    """The largest padded size (batch x longer side) of the micro-batches."""
    return max(b.src.shape[0] * max(b.src.shape[1], b.tgt_in.shape[1]) for s in steps for b in s)


def compiles(kind: str, args) -> bool:
    return kind in COMPILED_KINDS or (args.compile and kind in (OURS, OURS_PLAIN))


def rounds_lengths(kind: str, job: TrainJob, device: torch.device, args) -> bool:
    """Whether the trainer's execution policy would round this column's padded lengths."""
    settings = dataclasses.replace(job.trainer, compile=str(compiles(kind, args)).lower())
    return ExecutionPolicy.for_training(settings, device).round_lengths


def chosen_columns(args) -> list[str]:
    """--columns as kinds, in order; Marian's left out (said why) where transformers is not."""
    names = [name.strip() for name in args.columns.split(",") if name.strip()]
    unknown = [name for name in names if name not in COLUMNS]
    if unknown or not names:
        raise SystemExit(f"--columns: {unknown or names} not among {', '.join(COLUMNS)}")
    if args.no_marian:
        names = [name for name in names if not name.startswith("marian")]
    if args.marian_eager and "marian-eager" not in names:
        names.append("marian-eager")
    if any(name.startswith("marian") for name in names) and not marian_available(args):
        names = [name for name in names if not name.startswith("marian")]
    return [COLUMNS[name] for name in names]


def marian_available(args) -> bool:
    if args.no_marian:
        return False
    try:
        import_transformers()
    except TransformerMTError as error:
        print(f"{error}; skipping the Marian column (make bench installs it on first use)")
        return False
    return True


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="small")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument(
        "--update-tokens",
        type=int,
        help="target tokens per update, in micro-batches of at most --batch-tokens padded "
        "tokens (the trainer's plan for trainer.global_batch_tokens); default: one batch",
    )
    parser.add_argument("--steps", type=int, default=60, help="timed steps per model")
    parser.add_argument(
        "--passes",
        type=int,
        default=1,
        help="passes over the timed steps (2: the second runs shapes already seen, as every "
        "epoch after the first; both are reported, with their ratio)",
    )
    parser.add_argument(
        "--generated-pairs",
        type=int,
        default=GENERATED_PAIRS,
        help=f"--data generated: pairs whose lengths the batches are cut from (default "
        f"{GENERATED_PAIRS:,}: WMT-like padding; pieces only for the batches timed)",
    )
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per model first")
    parser.add_argument(
        "--block", type=int, default=1, help="timed steps per turn (1: alternate every step)"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument(
        "--precision",
        choices=["auto", "fp32", "bf16"],
        default="auto",
        help="autocast of both models, as trainer.precision (auto: bf16 on a GPU, else fp32)",
    )
    parser.add_argument("--gpu-report", action="store_true", help=argparse.SUPPRESS)  # on a CPU
    parser.add_argument("--no-marian", action="store_true", help="time our model only")
    parser.add_argument(
        "--columns",
        default="ours,marian",
        help="what to time, in this order, the first being the reference of the ratios: "
        + ", ".join(COLUMNS)
        + " (ours-plain: our model's step before issue 25, the loss over the whole fp32 logits "
        "and torch's dropout; ours-compiled: trainer.compile=true; ours-compiled-eager-loss: the "
        "same with the loss's chunks eager; use --warmup 6 with them)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="then one more update of ours under torch.profiler: where its time goes "
        "(benchmarks/profile_step.py)",
    )
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
        "--sdpa-backends",
        default="auto",
        help="trainer.sdpa_backends for both models, comma-separated (auto: ours, on CUDA "
        "flash,efficient,math; default: torch's choice, on H100/H200 cuDNN's first)",
    )
    parser.add_argument(
        "--source-lengths",
        choices=[value.value for value in SourceLengths],
        default="auto",
        help="trainer.source_lengths: batches of one source length (equal: attention with no "
        "key mask, flash on CUDA), of similar lengths (padded, masked), or the policy's choice "
        "for the device (auto: equal on CUDA)",
    )
    parser.add_argument("--compile-backend", default="inductor", help=argparse.SUPPRESS)
    parser.add_argument(
        "--exact-lengths",
        action="store_true",
        help="padded lengths as they are, where the execution policy would round them (on CUDA "
        "and compiled: ExecutionPolicy.round_lengths)",
    )
    parser.add_argument(
        "--data",
        default="toy",
        help="'toy' (the embedded corpus, the default), 'generated' (WMT-like random pairs of "
        "--vocab pieces), or a folder with train.de / train.en (Multi30k layout, as "
        "benchmarks/train_speed.txt was measured)",
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    device = set_up_process(args.device)  # the allocator's settings reach the workers too
    print(*report_header("make bench: training throughput, ours beside Marian", device), sep="\n")
    kinds = chosen_columns(args)
    with tempfile.TemporaryDirectory() as run_dir:
        job = compose(args, run_dir)
        job.trainer.compile = "true" if args.compile else "false"
        job.trainer.precision = Precision(args.precision)
        job.trainer.sdpa_backends = [SdpaBackend(name) for name in args.sdpa_backends.split(",")]
        job.trainer.source_lengths = SourceLengths(args.source_lengths)
        updates = args.warmup + args.steps
        if args.data == "generated":
            pairs = args.generated_pairs
            data, batches = generated_data(
                job, pairs, updates, args.update_tokens, Path(run_dir), device
            )
        else:
            data = prepare(job.data)
            lengths = data.train.src.lengths, data.train.tgt.lengths
            batches = first_batches(job, *lengths, updates, args.update_tokens, device)
        vocab_size = data.tokenizers.tgt.vocab_size
        equal = ExecutionPolicy.for_training(job.trainer, device).equal_source_lengths
        steps = collated(data, batches, equal_sources=equal)
        # Where the trainer's policy rounds padded lengths (on CUDA, and compiled), a column gets
        # the same batches rounded as the trainer collates them (its padded FLOPs count the
        # rounding; its real ones are the same).
        rounded = collated(data, batches, round_lengths=True, equal_sources=equal)
        load_before = os.getloadavg()[0]
        generated = args.data == "generated"
        worker_data = data if generated else None  # the workers read the prepared corpus's cache
        columns = [
            start(
                kind,
                job,
                worker_data,
                vocab_size,
                rounded
                if rounds_lengths(kind, job, device, args) and not args.exact_lengths
                else steps,
                args,
            )
            for kind in kinds
        ]
        run_blocks(columns, steps, args)
        loads = (load_before, os.getloadavg()[0])
        if device.type == "cpu" and not args.gpu_report:
            rates = product_rates(job.model, vocab_size, args.batch_tokens, args.threads)
            report(columns, args, vocab_size, len(steps) - args.warmup, loads, rates)
        else:
            dtype = ExecutionPolicy.for_training(job.trainer, device).dtype or torch.float32
            tokens = max_padded(steps[args.warmup :])
            rates = product_rates(
                job.model, vocab_size, tokens, args.threads, device, dtype, with_onednn=False
            )
            mm_rate = rates["torch.mm"]
            precision = "bf16 autocast" if dtype == torch.bfloat16 else "fp32"
            gpu_report(columns, args, vocab_size, steps, precision, mm_rate)
        finish(columns, steps, args)  # the profile, if asked for, then ours exits


if __name__ == "__main__":
    main()
