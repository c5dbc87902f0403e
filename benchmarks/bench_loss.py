"""The training loss alone, the plain form against the chunked one: time and peak memory of
forward + backward, and whether they compute the same values.

    python -m benchmarks.bench_loss                        # 37,000 pieces, a 16,384-token batch
    python -m benchmarks.bench_loss --vocab 8000 --tokens 4096 --repeats 5

plain: label_smoothed_loss over the logits of F.linear(hidden, weight), what the trainer ran
before (the (tokens x V) logits, their fp32 log-softmax and its gradient all alive at once).
chunked: projected_loss, what it runs now (transformer_mt/train/loss.py), with its two products by
oneDNN's kernel as trainer.cpu_linear=onednn (the default) has them, or by torch's with
--cpu-linear torch. Each process keeps freed
memory in its heap, as tmt-train does (device.keep_freed_host_memory). Both get the same
hidden states (B, T, D), tied weight (V, D) and targets, with the padding of --padding of the
positions at the end of the rows, as a length-sorted batch has.

Each form runs in a fresh process of its own (benchmarks/measure.py), ABBA (plain, chunked,
chunked, plain), so that the peak RSS it reports is its own: the process's peak after forward +
backward minus its peak after the inputs were made. Time: the median of --repeats forward +
backward passes after one untimed pass. Then, in this process, both forms on the same inputs: the
loss, the nll and both gradients compared (fp32).
"""

from __future__ import annotations

import argparse
import functools
import statistics

import torch

from benchmarks.measure import (
    abba_order,
    in_fresh_process,
    median_seconds,
    peak_rss_mib,
    report_header,
)
from transformer_mt.config import CpuLinear, Precision, TrainerConfig
from transformer_mt.device import prepare_process
from transformer_mt.execution import ExecutionPolicy
from transformer_mt.train.loss import label_smoothed_loss, projected_loss

PAD = 0
FORMS = ("plain", "chunked")
CPU = torch.device("cpu")


def inputs(args, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    rows = args.tokens // args.length
    hidden = torch.randn(rows, args.length, args.d_model, generator=generator)
    weight = torch.randn(args.vocab, args.d_model, generator=generator) * args.d_model**-0.5
    target = torch.randint(1, args.vocab, (rows, args.length), generator=generator)
    target[:, round(args.length * (1 - args.padding)) :] = PAD
    return hidden.requires_grad_(), weight.requires_grad_(), target


def run(form: str, hidden, weight, target, args):
    """Forward + backward; the sums and the gradients."""
    hidden.grad = weight.grad = None
    if form == "plain":
        logits = torch.nn.functional.linear(hidden, weight)
        sums = label_smoothed_loss(logits, target, epsilon=args.epsilon, pad_id=PAD)
    else:
        policy = ExecutionPolicy.for_training(
            TrainerConfig(precision=Precision.fp32, cpu_linear=CpuLinear(args.cpu_linear)), CPU
        )
        with policy.forward():  # as the trainer calls it
            chunks = policy.loss_chunks(weight.shape[0])
            sums = projected_loss(
                hidden, weight, target, epsilon=args.epsilon, pad_id=PAD, chunks=chunks
            )
    sums.loss.backward()
    return float(sums.loss.detach()), float(sums.nll.detach()), hidden.grad, weight.grad


def measure(form: str, args) -> dict:
    """In a process of its own: the median seconds of the form's passes (the first, untimed,
    makes the first-touch allocations) and the peak RSS they added above the inputs'."""
    prepare_process(CPU, args.threads)  # as tmt-train sets its process up on the CPU
    hidden, weight, target = inputs(args)
    setup = peak_rss_mib()
    seconds = median_seconds(
        functools.partial(run, form, hidden, weight, target, args), args.repeats
    )
    return {"seconds": seconds, "peak_mb": peak_rss_mib() - setup}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vocab", type=int, default=37000)
    parser.add_argument("--tokens", type=int, default=16384, help="padded positions B x T")
    parser.add_argument("--length", type=int, default=64, help="T: positions per row")
    parser.add_argument("--padding", type=float, default=0.15, help="share of padded positions")
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--epsilon", type=float, default=0.1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--cpu-linear",
        choices=("onednn", "torch"),
        default="onednn",
        help="the chunked loss's products, as trainer.cpu_linear",
    )
    args = parser.parse_args()
    results = {form: [] for form in FORMS}
    for turn in range(2):
        for form in abba_order(FORMS, turn):
            results[form].append(in_fresh_process(measure, form, args))
    rows = args.tokens // args.length
    print(
        *report_header("the training loss alone: the plain form against the chunked one"), sep="\n"
    )
    print(
        f"loss alone: vocab {args.vocab:,}, {rows} x {args.length} = {rows * args.length:,} "
        f"positions ({args.padding:.0%} padding), d_model {args.d_model}, fp32, "
        f"{args.threads} threads; forward + backward, median of {args.repeats}, ABBA; the "
        f"chunked loss's products by {args.cpu_linear} (trainer.cpu_linear)"
    )
    for form, runs in results.items():
        seconds = statistics.mean(r["seconds"] for r in runs)
        peak = max(r["peak_mb"] for r in runs)
        each = ", ".join(f"{r['seconds']:.3f} s" for r in runs)
        print(f"  {form:8} {seconds:7.3f} s   peak RSS above the inputs {peak:8,.0f} MB   ({each})")
    plain_s = statistics.mean(r["seconds"] for r in results["plain"])
    chunked_s = statistics.mean(r["seconds"] for r in results["chunked"])
    plain_mb = max(r["peak_mb"] for r in results["plain"])
    chunked_mb = max(r["peak_mb"] for r in results["chunked"])
    print(
        f"  chunked / plain: time {chunked_s / plain_s:.2f}x, peak memory "
        f"{chunked_mb / plain_mb:.2f}x"
    )
    torch.set_num_threads(args.threads)
    hidden, weight, target = inputs(args)
    loss_p, nll_p, gh_p, gw_p = (
        t.clone() if torch.is_tensor(t) else t for t in run("plain", hidden, weight, target, args)
    )
    loss_c, nll_c, gh_c, gw_c = run("chunked", hidden, weight, target, args)

    def relative(a, b):
        return (a - b).abs().max().item() / b.abs().max().item()

    loss_difference = abs(loss_c - loss_p) / loss_p
    print(
        f"  same values: loss {loss_p:.4f} vs {loss_c:.4f} (relative {loss_difference:.1e}), "
        f"nll relative {abs(nll_c - nll_p) / nll_p:.1e}; the gradients' largest difference "
        f"over their largest entry: hidden {relative(gh_c, gh_p):.1e}, "
        f"weight {relative(gw_c, gw_p):.1e}"
    )


if __name__ == "__main__":
    main()
