"""int8 products for our linear layers, for decoding on the CPU (decode.quantize): the kinds of
layer the execution policy puts in a decoding copy of the model in place of nn.Linear
(execution.ExecutionPolicy.with_kernels).

- `int8` (`Int8RowLinear`): int8 weights with one scale per output row, and each call's input
  quantized to int8 row by row, each row (a token of one hypothesis) from its own range;
  multiplied in int8 with int32 sums (torch._int_mm, exact) and scaled back to float32. What a
  row gets depends on that row alone, so a sentence's translation never depends on the
  sentences batched with it (in tmt-translate's file, in the server's batch, in a fixed or
  shrinking beam).
- `int8_batch` (`with_int8_batch_linears`): PyTorch's dynamic quantization
  (`torch.ao.quantization.quantize_dynamic`, qint8, fbgemm's kernel): the same int8 weights, but
  each call quantizes its whole input with one scale from the range of the whole batch, so a
  sentence's translation depends on the sentences batched with it (36 of 100 Multi30k lines
  differed between a fixed and a shrinking beam: reliability review, issue 59). PyTorch marks
  torch.ao.quantization deprecated (pytorch/pytorch#184982; torchao is to replace it), but 2.13
  still ships and runs it; it is imported only where int8_batch is asked for, and a torch
  without it refuses int8_batch in one line.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor, nn

from transformer_mt.errors import ConfigError

INT8_STEPS = 127.0
"""Symmetric int8: a value x of a row (or weight row) whose largest magnitude is m becomes
round(127 x / m)."""


def int8_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """(N, K) float32 -> (N, K) int8 and the (N, 1) scale of each row: x ~ int8 * scale."""
    scale = x.abs().amax(dim=1, keepdim=True).clamp(min=torch.finfo(x.dtype).tiny) / INT8_STEPS
    return torch.round(x / scale).to(torch.int8), scale


class Int8RowLinear(nn.Module):
    """y = x W^T + b with W in int8 (a scale per output row) and x quantized to int8 row by row,
    each row from its own range (so a row's result depends on that row alone), multiplied with
    int32 sums by torch._int_mm and scaled back to float32 (inference only)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight, scale = int8_rows(linear.weight.detach().float())
        self.register_buffer("weight_t", weight.t(), persistent=False)  # (K, N), K-major
        self.register_buffer("weight_scale", scale.view(1, -1), persistent=False)  # (1, N)
        self.bias = linear.bias.detach() if linear.bias is not None else None

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.in_features)
        quantized, scale = int8_rows(rows.float())
        y = torch._int_mm(quantized, self.weight_t).float().mul_(scale).mul_(self.weight_scale)
        if self.bias is not None:
            y.add_(self.bias)
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


def with_int8_batch_linears(module: nn.Module) -> None:
    """Every nn.Linear inside `module` replaced by its dynamically quantized int8 twin, in place.
    torch.ao.quantization is imported here, where int8_batch is asked for: it is deprecated, and
    a torch without it must still decode in float32 (ConfigError naming decode.quantize)."""
    try:
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic
    except ImportError as error:
        raise ConfigError(
            f"config key 'decode.quantize': int8_batch needs torch.ao.quantization, which torch "
            f"{torch.__version__} does not have ({error}); decode.quantize=int8 or none decode "
            "without it"
        ) from None
    with warnings.catch_warnings():  # its deprecation notices (see above), once per call
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", "torch.quantize_per_tensor", UserWarning)
        quantize_dynamic(module, {nn.Linear: per_channel_dynamic_qconfig}, inplace=True)
