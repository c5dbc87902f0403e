"""The linear products of a CPU training step, by torch (MKL) and by oneDNN (transformer_mt/
onednn.py, trainer.cpu_linear), and what the row count a weight is reordered for does to
oneDNN's product (benchmarks/train_speed.txt quotes both).

    .venv/bin/python -m benchmarks.bench_train_kernels [--threads 2] [--reps 15]

1. At a 4,096-token batch's shapes (4,000 rows; model=small's and model=base's layers and the
   8,000-piece output projection's chunk of 2,097 rows), in GFLOP/s: the forward product
   (F.linear against oneDNN with the weight reordered in the call, as the trainer does at every
   update), the input's gradient (torch.mm against oneDNN, the weight's transpose reordered)
   and the weight's gradient (torch.mm against oneDNN, the input's transpose reordered).
2. oneDNN's product of about 4, 600 and 3,000 rows with the weight reordered without a row
   count (torch's default, a layout for one row) and for onednn.EXPECTED_ROWS: ten calls, each
   with a new row count (a new primitive for oneDNN), their mean time and how much the
   process's heap grew.

Each time is the median of --reps calls after two warm-up calls, in one process that keeps
freed memory as the commands do (device.keep_freed_host_memory).
"""

from __future__ import annotations

import argparse
import ctypes
import time

import torch
import torch.nn.functional as F

from benchmarks.measure import kernel_milliseconds, peak_rss_mib, report_header
from transformer_mt import onednn
from transformer_mt.device import prepare_process

# rows x (out x in): model=small's layers, model=base's, the output projection's chunk
PRODUCTS = [
    (4000, 768, 256),
    (4000, 256, 256),
    (4000, 1024, 256),
    (4000, 256, 1024),
    (4000, 1536, 512),
    (4000, 2048, 512),
    (4000, 512, 2048),
    (2097, 8000, 256),
]
HINTED = [(1024, 256), (8000, 256), (2048, 512)]  # out x in


def onednn_product(x: torch.Tensor, weight: torch.Tensor, rows: int | None) -> torch.Tensor:
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), rows)
    return onednn.packed_product(x, packed)


def report_products(reps: int) -> None:
    print("1. a training step's products, GFLOP/s (torch / oneDNN, the reorder included)")
    heads = ("forward", "input gradient", "weight gradient")
    print(f"  {'rows x out x in':>20}  " + "  ".join(f"{head:>15}" for head in heads))
    rows_hint = onednn.EXPECTED_ROWS
    for rows, out, width in PRODUCTS:
        x, weight, grad = torch.randn(rows, width), torch.randn(out, width), torch.randn(rows, out)
        rate = 2 * rows * out * width / 1e6  # GFLOP per ms
        pairs = [  # (torch's call, oneDNN's call), each a function and its arguments
            ((F.linear, x, weight), (onednn_product, x, weight, rows_hint)),
            ((torch.mm, grad, weight), (onednn_product, grad, weight.t(), rows_hint)),
            ((torch.mm, grad.t(), x), (onednn_product, grad.t(), x.t(), rows_hint)),
        ]
        rates = [
            (rate / kernel_milliseconds(reps, *a), rate / kernel_milliseconds(reps, *b))
            for a, b in pairs
        ]
        cells = [f"{by_torch:6.0f} / {by_onednn:<6.0f}" for by_torch, by_onednn in rates]
        print(f"  {f'{rows} x {out} x {width}':>20}  " + "  ".join(f"{c:>15}" for c in cells))


class MallInfo2(ctypes.Structure):
    """glibc's struct mallinfo2 (malloc.h): ten size_t fields, the heap's size first."""

    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", *(f"field{i}" for i in range(9)))]


def heap_mb() -> float:
    """The size of the C library's heap (glibc's mallinfo2; elsewhere the peak RSS), in MB."""
    try:
        info = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return peak_rss_mib()
    info.restype = MallInfo2
    return info().arena / 2**20


def report_row_hints(reps: int) -> None:
    print("2. oneDNN's product by the row count the weight was reordered for: ten calls, each")
    print("   with a new row count (as a training step's batches come), mean ms and heap growth")
    for out, width in HINTED:
        weight = torch.randn(out, width)
        for hint in (None, onednn.EXPECTED_ROWS):  # a weight reordered once, as decoding does
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, hint)
            cells = []
            for rows in (4, 600, 3000):
                inputs = [torch.randn(rows + i, width) for i in range(11)]
                onednn.packed_product(inputs[0], packed)
                before, started = heap_mb(), time.perf_counter()
                for x in inputs[1:]:
                    onednn.packed_product(x, packed)
                ms = 1e3 * (time.perf_counter() - started) / 10
                cells.append(f"{rows} rows {ms:7.2f} ms +{heap_mb() - before:4.0f} MB")
            print(f"  {out} x {width}, reordered for {str(hint):>4} rows: " + "  ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args()
    prepare_process(torch.device("cpu"), args.threads)  # as tmt-train sets its process up
    if not onednn.available():
        print("this torch has no oneDNN product: nothing to compare")
        return
    print(*report_header("a CPU training step's linear products, torch's and oneDNN's"), sep="\n")
    print(f"# {args.threads} threads, float32")
    report_products(args.reps)
    report_row_hints(args.reps)


if __name__ == "__main__":
    main()
