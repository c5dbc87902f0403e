"""oneDNN's matrix product for our linear layers on the CPU, in float32.

torch's F.linear on the CPU gives MKL the weight as it lies. oneDNN's kernel, with the weight
first reordered into its blocked layout (`torch.ops.mkldnn._reorder_linear_weight`, then
`torch.ops.mkldnn._linear_pointwise`: the pair torch.compile's CPU freezing puts in place of
nn.Linear), multiplies faster on this project's 2-core machine:
- decoding's shapes (a few to a few thousand rows, 256-1024 wide), with the weight reordered once
  when the copy that searches is made: F.linear ran 1.1-3.2x slower than the prepacked product
  (benchmarks/bench_decode_kernels.py, in a process that keeps freed memory as the commands do),
  and a beam search with the prepacked product took 0.85x the time (benchmarks/decode.txt);
- training's shapes (a 4,096-token batch: 2,000-4,000 rows, 256-8,000 wide), the reorder paid
  at every call since the weights change at every update: 1.05-1.42x forward, 0.98-1.43x for
  the gradient of the input. The gradient of the weight, a product along the rows, is faster
  by torch's mm (oneDNN 0.5-0.9x), which keeps it (benchmarks/bench_train_kernels.py,
  benchmarks/train_speed.txt).

Two kinds of layer take it, each in place of an nn.Linear in a copy of the model that the
execution policy makes where it chose oneDNN's products (execution.ExecutionPolicy.with_kernels):
`TrainingLinear` (trainer.cpu_linear=onednn, float32 on the CPU, eager, since torch.compile
traces F.linear), with gradients, over the model's own parameters; `OneDnnLinear`
(decode.cpu_linear=onednn, float32 on the CPU), the weight prepacked once, no gradients. The
same float32 products summed in another order: results differ from F.linear's by float32
rounding (in a search, a near-tie may rank the other way).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn
from torch.nn.utils import skip_init

from transformer_mt.shapes import in_eighth_steps

# The row count oneDNN is told to expect when a weight is reordered. Without one (torch's default)
# it picks a layout for a single row; a product with a new row count then took up to 6.3x the
# time it took with a weight reordered for 1,024 rows (4 rows; 0.97-1.35x at 600-3,000), and at
# 3,000 rows by 8,000 x 256 it left ten times the memory in the heap (899 MB against 92 over ten
# calls; benchmarks/bench_train_kernels.py, part 2). The actual row count of each call, in the
# reorder, cost a reorder of its own in oneDNN's cache for every new count (12 MB each at
# 256 x 1,024, measured outside the project); one fixed count does not.
EXPECTED_ROWS = 1024


def packed(weight: Tensor) -> Tensor:
    """`weight` (out, in), reordered into oneDNN's layout for `packed_product`."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), EXPECTED_ROWS)


def packed_product(x: Tensor, packed_weight: Tensor, bias: Tensor | None = None, *, relu=False):
    """F.linear(x, weight, bias), then ReLU if `relu` (in the same kernel), for
    packed_weight = packed(weight). No gradients."""
    attribute = "relu" if relu else "none"
    return torch.ops.mkldnn._linear_pointwise(x, packed_weight, bias, attribute, [], "")


# oneDNN and torch's wrapper of it (ideep) each keep what they made for a new shape in a cache of
# 1,024 entries, memory included, so the products pad their rows with zeros to a few row counts.
#
# Training's products pad to a multiple of ROW_STEP. Every micro-batch brings new row counts: a
# 400-update Multi30k run's process grew to 5.0 GB and was still growing, against 1.25 GB with
# torch's products (benchmarks/multi30k_recipe.txt, run 6; 1.73 GB and flat in steps of 128). In
# steps of 128 rows a 4,096-token batch has at most 32 row counts per weight, made once. The
# cost: 64 more rows in 2,000-4,000 on average, and a copy of the input; the forward products
# about 8% slower, the loop about 4% (run 6).
ROW_STEP = 128


def training_rows(count: int) -> int:
    """`count` rows rounded up to a multiple of ROW_STEP."""
    return count + -count % ROW_STEP


def decoding_rows(count: int) -> int:
    """`count` rows as they are up to 15, above in steps of an eighth of the power of two below
    them (16-31 in steps of 2, 32-63 of 4, ...): under 1/8 more rows, 8 row counts per doubling.

    A decoding step's rows are its live hypotheses, a new count whenever a sentence finishes.
    10,000 lines of Multi30k (test_2016_flickr ten times over, one call) gave the linear layers
    1,320 shapes unpadded, and the process grew steadily to 1,606 MiB; in these steps 241
    shapes, 963 MiB and flat, the same translations, 0.96x the time. On the 1,000 lines once,
    1.03x the time (benchmarks/decode.txt, 2026-12-04). A single sentence's 1-15 rows stay as
    they are: padding them would multiply small products by up to 8."""
    return in_eighth_steps(count)


def product_in_row_steps(
    x: Tensor, packed_weight: Tensor, bias: Tensor | None = None, *, relu=False, rows=training_rows
):
    """`packed_product` of x (..., in) with its rows padded with zeros to `rows(count)`
    for the kernel, and the padding's rows dropped from the result (..., out)."""
    flat = x.reshape(-1, x.shape[-1])
    count = flat.shape[0]
    padding = rows(count) - count
    if padding:
        flat = torch.cat([flat, flat.new_zeros(padding, flat.shape[1])])
    product = packed_product(flat, packed_weight, bias, relu=relu)[:count]
    return product.reshape(*x.shape[:-1], product.shape[-1])


@functools.cache
def available() -> bool:
    """Whether this torch's oneDNN reorders and multiplies a weight on this CPU (x86 and Arm
    builds have the ops): tried once on a 2 x 2 product, so that a build or CPU without them
    falls back to F.linear instead of failing."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        product = packed_product(torch.ones(1, 2), packed(torch.ones(2, 2)))
    except (AttributeError, NotImplementedError, RuntimeError):  # an op torch does not have
        return False
    return torch.equal(product, torch.full((1, 2), 2.0))


class OneDnnProduct(torch.autograd.Function):
    """y = x W^T + b (then ReLU) forward, and the gradient of x, by oneDNN's kernel (W reordered
    at each call: the weights change at every update); the gradient of W by torch.mm."""

    @staticmethod
    def forward(ctx, x, weight, bias, relu):
        y = product_in_row_steps(x, packed(weight), bias, relu=relu)
        ctx.relu = relu
        ctx.save_for_backward(x, weight, y if relu else None)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, weight, y = ctx.saved_tensors
        if ctx.relu:  # as F.relu's backward: no gradient where the output is 0
            grad_y = torch.ops.aten.threshold_backward(grad_y, y, 0)
        needs_x, needs_weight, needs_bias, _ = ctx.needs_input_grad
        grad_x = product_in_row_steps(grad_y, packed(weight.t())) if needs_x else None
        grad_rows = grad_y.reshape(-1, grad_y.shape[-1])  # (N, out)
        grad_weight = grad_rows.t() @ x.reshape(-1, x.shape[-1]) if needs_weight else None
        grad_bias = grad_rows.sum(0) if needs_bias else None
        return grad_x, grad_weight, grad_bias, None


class TrainingLinear(nn.Linear):
    """An nn.Linear whose product y = x W^T + b (then ReLU, in the same kernel, where asked) runs
    OneDnnProduct: float32 on the CPU, with gradients. Only a policy that chose oneDNN's products
    makes one (execution.ExecutionPolicy.with_kernels), over an existing layer's parameters."""

    fuses_relu = True  # model.project asks for the ReLU in the call

    @classmethod
    def over(cls, linear: nn.Linear) -> TrainingLinear:
        """A TrainingLinear holding `linear`'s own weight and bias (the same Parameters)."""
        layer = skip_init(cls, linear.in_features, linear.out_features, bias=False)
        layer.weight, layer.bias = linear.weight, linear.bias
        return layer

    def forward(self, x: Tensor, relu: bool = False) -> Tensor:
        return OneDnnProduct.apply(x, self.weight, self.bias, relu)


class OneDnnLinear(nn.Module):
    """y = x W^T + b with W reordered once for oneDNN's kernel (inference only: no gradients),
    the rows padded to `decoding_rows` so that oneDNN's caches hold few shapes. Only a search's
    policy that chose oneDNN's products makes one, over a copy's linear layer."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = packed(linear.weight.detach())
        self.bias = linear.bias.detach() if linear.bias is not None else None

    def forward(self, x: Tensor) -> Tensor:
        return product_in_row_steps(x, self.packed, self.bias, rows=decoding_rows)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"
