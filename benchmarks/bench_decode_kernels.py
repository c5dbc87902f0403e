"""The kernels of a decoding step on the CPU, each beside the form it replaced, and where the time
of a whole beam search goes (benchmarks/decode.txt quotes both).

    .venv/bin/python -m benchmarks.bench_decode_kernels
    .venv/bin/python -m benchmarks.bench_decode_kernels --profile RUN [--int8 int8|int8_batch]

At decoding's shapes (Multi30k's small model: D 256, 4 heads, 1,024-wide feed-forward, 8,000
pieces; a batch of 4,000 source tokens is about 1,200 beam rows), in one process with --threads
threads, each timed as the median of --reps calls after two warm-up calls:

  - the linear products: torch's F.linear against oneDNN's with a weight prepacked once
    (onednn.OneDnnLinear), and the two int8 products (decode.quantize=int8: each row of the
    input quantized from its own range, torch._int_mm; int8_batch: one scale for the call,
    fbgemm), in GFLOP/s;
  - attention of one query row against 8-40 keys (a decoding step's self- and cross-attention):
    F.scaled_dot_product_attention against model.attend_few_queries, in ms;
  - beam search's shared rows: a step's cross-attention of a sentence's 4 beams against keys
    and values copied to every beam, against those of the sentence read by its beams together
    (model.rows_by_source); the self-attention cache reordered by a gather and then grown by a
    concatenation, against both in one copy (model.appended), in ms;
  - the next-token distribution over the vocabulary: torch.logsumexp (the normaliser alone)
    against F.log_softmax (the log-probabilities themselves); the per-beam top-k after it.

The process keeps freed memory as the commands do (device.keep_freed_host_memory).
--profile: Translator.translate of the run's 1,000 test sentences (CTranslate2's stopping rule,
as make bench-decode compares) under torch.profiler, after a warm-up on 32 of them: the
operators with the largest shares of self CPU time.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.measure import kernel_milliseconds, report_header
from transformer_mt import onednn
from transformer_mt.config import INT8_PRODUCTS, CpuLinear, DecodeConfig, Precision
from transformer_mt.decode.loading import load_translator
from transformer_mt.device import prepare_process
from transformer_mt.int8 import Int8RowLinear, with_int8_batch_linears
from transformer_mt.model import appended, attend_few_queries, rows_by_source, rows_by_target
from transformer_mt.onednn import OneDnnLinear
from transformer_mt.run_dir import RunDir

PRODUCTS = [  # rows x (out x in): the output projection at several batch sizes, then the layers
    (16, 8000, 256),
    (128, 8000, 256),
    (600, 8000, 256),
    (1200, 8000, 256),
    (600, 768, 256),
    (1200, 1024, 256),
    (1200, 256, 1024),
]
ROWS, HEADS, HEAD_DIM, VOCAB, BEAM = 1200, 4, 64, 8000, 4


def report_products(reps: int) -> None:
    if not onednn.available():
        print("linear products: this torch or CPU has no oneDNN product (decoding uses F.linear)")
        return
    print(
        "linear products, GFLOP/s (F.linear / oneDNN prepacked / int8, a scale per row / "
        "int8_batch, a scale per call):"
    )
    print(
        f"  {'rows x (out x in)':22s} {'F.linear':>9s} {'prepacked':>10s} {'int8':>9s} "
        f"{'int8_batch':>11s}"
    )
    for rows, out, width in PRODUCTS:
        layer = nn.Linear(width, out, bias=False)
        prepacked, x = OneDnnLinear(layer), torch.randn(rows, width)
        by_rows, by_batch = Int8RowLinear(layer), nn.Sequential(nn.Linear(width, out, bias=False))
        with_int8_batch_linears(by_batch)
        flop = 2 * rows * out * width
        with torch.no_grad():
            plain = flop / kernel_milliseconds(reps, F.linear, x, layer.weight) / 1e6
            packed = flop / kernel_milliseconds(reps, prepacked, x) / 1e6
            rowwise = flop / kernel_milliseconds(reps, by_rows, x) / 1e6
            batchwise = flop / kernel_milliseconds(reps, by_batch, x) / 1e6
        print(
            f"  {f'{rows} x ({out} x {width})':22s} {plain:9.1f} {packed:10.1f} {rowwise:9.1f} "
            f"{batchwise:11.1f}"
        )


def step_attention_inputs(sources: int, keys: int) -> tuple[torch.Tensor, ...]:
    """A decoding step's attention inputs: q (ROWS, H, 1, Dh); k, v (sources, H, keys, Dh) and
    keep (sources, keys), a tenth of the keys masked (never the first)."""
    q = torch.randn(ROWS, HEADS, 1, HEAD_DIM)
    k, v = torch.randn(2, sources, HEADS, keys, HEAD_DIM).unbind(0)
    keep = torch.rand(sources, keys) > 0.1
    keep[:, 0] = True
    return q, k, v, keep


def report_attention(reps: int) -> None:
    print(f"\nattention of one query row, {ROWS} rows x {HEADS} heads, ms (SDPA / ours):")
    for keys in (8, 20, 40):
        q, k, v, keep = step_attention_inputs(ROWS, keys)
        mask = keep[:, None, None, :]
        self_sdpa = kernel_milliseconds(reps, F.scaled_dot_product_attention, q, k, v)
        self_ours = kernel_milliseconds(reps, attend_few_queries, q, k, v)
        cross_sdpa = kernel_milliseconds(
            reps, F.scaled_dot_product_attention, q, k, v, attn_mask=mask
        )
        cross_ours = kernel_milliseconds(reps, attend_few_queries, q, k, v, keep)
        print(
            f"  {keys:2d} keys: unmasked (self) {self_sdpa:6.2f} / {self_ours:5.2f} "
            f"({self_sdpa / self_ours:.1f}x); masked (cross) {cross_sdpa:6.2f} / "
            f"{cross_ours:5.2f} ({cross_sdpa / cross_ours:.1f}x)"
        )


def report_shared_rows(reps: int) -> None:
    sentences = ROWS // BEAM
    print(f"\nbeam search's rows, {sentences} sentences x {BEAM} beams x {HEADS} heads, ms:")
    for keys in (8, 20, 40):
        q, k, v, keep = step_attention_inputs(sentences, keys)
        copied = [t.repeat_interleave(BEAM, dim=0) for t in (k, v, keep)]

        def together(q, k, v, keep):
            return rows_by_target(attend_few_queries(rows_by_source(q, len(k)), k, v, keep), ROWS)

        per_beam = kernel_milliseconds(reps, attend_few_queries, q, *copied)
        shared = kernel_milliseconds(reps, together, q, k, v, keep)
        print(
            f"  cross-attention, {keys:2d} keys: copied per beam {per_beam:5.2f}, read per "
            f"sentence {shared:5.2f} ({per_beam / shared:.1f}x)"
        )
    for length in (10, 30):
        cached = torch.randn(ROWS, HEADS, length, HEAD_DIM)
        new = torch.randn(ROWS, HEADS, 1, HEAD_DIM)
        rows = torch.arange(ROWS).view(sentences, BEAM)[:, torch.tensor([0, 0, 1, 2])].flatten()

        def gather_then_cat(cached, rows, new):
            return torch.cat([cached.index_select(0, rows), new], dim=2)

        two = kernel_milliseconds(reps, gather_then_cat, cached, rows, new)
        one = kernel_milliseconds(reps, appended, cached, rows, new)
        print(
            f"  a layer's cached keys, {length} positions, reordered and grown by one: gather "
            f"then concatenate {two:5.2f}, one copy {one:5.2f} ({two / one:.1f}x)"
        )


def report_distribution(reps: int) -> None:
    logits = torch.randn(ROWS, VOCAB)
    normaliser = kernel_milliseconds(reps, torch.logsumexp, logits, dim=-1)
    log_softmax = kernel_milliseconds(reps, F.log_softmax, logits, dim=-1)
    top = kernel_milliseconds(reps, torch.topk, logits, 2 * BEAM, dim=-1)
    print(
        f"\nnext-token distribution, {ROWS} x {VOCAB} logits, ms: torch.logsumexp {normaliser:.2f}"
        f", F.log_softmax {log_softmax:.2f} ({normaliser / log_softmax:.1f}x); the {2 * BEAM} "
        f"largest of each row (torch.topk) {top:.2f}"
    )


def report_profile(run: str, int8: str | None, top: int) -> None:
    data = RunDir(run).data_config()
    path = Path(data.dir) / f"{data.test_split}.{data.src_lang}"
    sources = path.read_text(encoding="utf-8").splitlines()
    decode = DecodeConfig(stop_early=True, precision=Precision.fp32)  # as its report says
    if int8:
        decode = dataclasses.replace(decode, quantize=CpuLinear(int8))
    translator = load_translator(run, decode=decode, device="cpu")
    translator.translate(sources[:32])
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        started = time.perf_counter()
        translator.translate(sources)
        wall = time.perf_counter() - started
    events = sorted(profile.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    kind = int8 or "float32"
    print(
        f"\nwhere a beam search goes: {run}, {len(sources)} sentences of {path.name}, {kind}, "
        f"{wall:.2f} s under the profiler; share of self CPU time:"
    )
    for event in events[:top]:
        share = 100 * event.self_cpu_time_total / total
        print(f"  {event.key[:45]:45s} {share:5.1f}%  {event.count:6d} calls")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=30, help="timed calls of each kernel")
    parser.add_argument("--profile", metavar="RUN", help="profile a beam search of this run")
    parser.add_argument(
        "--int8",
        choices=[q.value for q in INT8_PRODUCTS],
        help="--profile: with this decode.quantize",
    )
    parser.add_argument("--top", type=int, default=12, help="--profile: operators listed")
    args = parser.parse_args()
    prepare_process(torch.device("cpu"), args.threads)  # as the commands set theirs up
    print(*report_header("a decoding step's kernels on the CPU"), sep="\n")
    print(f"# threads: {args.threads}")
    if args.profile:
        report_profile(args.profile, args.int8, args.top)
        return
    report_products(args.reps)
    report_attention(args.reps)
    report_shared_rows(args.reps)
    report_distribution(args.reps)


if __name__ == "__main__":
    main()
