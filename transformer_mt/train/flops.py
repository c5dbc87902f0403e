"""FLOP count of a training step, for TFLOP/s and model FLOPs utilisation (MFU).

The usual matmul estimate: a forward pass costs 2 FLOPs per multiply-add and the backward pass
twice the forward, so a step costs 6 x (multiply-adds). Counted: every linear layer on the
positions it runs on (the encoder's, and each decoder layer's cross-attention keys and values,
on source positions; the rest of the decoder and the output projection on target positions),
and the attention products QK^T and AV (causal self-attention counted over the whole T x T, a
convention). Not counted: layer norms, softmax, dropout, embedding lookups (all small next to
the matmuls).

Two counts of a batch (`Flops`): on its real tokens, sentence by sentence, which is what MFU
counts (padding is no model work), and on its padded shapes, which is what the kernels ran
(closer to hardware FLOPs utilisation; about 3% more on WMT-like batches).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from transformer_mt.config import ModelConfig
from transformer_mt.data.batching import Batch


@dataclass(frozen=True)
class Flops:
    """Model FLOPs of some training work: on the real tokens (MFU's count) and on the padded
    shapes the kernels ran."""

    real: float = 0.0
    padded: float = 0.0

    def __add__(self, other: Flops) -> Flops:
        return Flops(self.real + other.real, self.padded + other.padded)


def step_flops(
    model: ModelConfig,
    vocab_size: int,
    src_lengths: Sequence[int] | np.ndarray,
    tgt_lengths: Sequence[int] | np.ndarray,
) -> float:
    """Forward + backward FLOPs of one training step on sentence pairs of these lengths (in
    positions: a source with its EOS, a target input with its BOS)."""
    src = np.asarray(src_lengths, dtype=np.float64)
    tgt = np.asarray(tgt_lengths, dtype=np.float64)
    d, d_ff = model.d_model, model.d_ff
    n_enc, n_dec = model.n_encoder_layers, model.n_decoder_layers
    encoder_layer = 4 * d * d + 2 * d * d_ff  # Q, K, V, output projections + feed-forward
    cross_kv = 2 * d * d  # a decoder layer's cross-attention K, V: on the source positions
    decoder_layer = 6 * d * d + 2 * d * d_ff  # self Q, K, V, O; cross Q, O; feed-forward
    linear = src.sum() * (n_enc * encoder_layer + n_dec * cross_kv) + tgt.sum() * (
        n_dec * decoder_layer + d * vocab_size
    )
    attention = (
        2 * d * (n_enc * (src**2).sum() + n_dec * ((tgt**2).sum() + (tgt * src).sum()))
    )  # QK^T and AV: 2 x (query positions x key positions x D) multiply-adds per layer
    return 6.0 * float(linear + attention)


def batch_flops(model: ModelConfig, vocab_size: int, batch: Batch, pad_id: int) -> Flops:
    """A collated batch's FLOPs on its real tokens and on its padded shape. The batch is read
    where it is: on the host (as the trainer has it before the copy), that is no device sync."""
    src_lengths = (batch.src != pad_id).sum(dim=1).cpu().numpy()  # (B,) with EOS
    tgt_lengths = (batch.tgt_out != pad_id).sum(dim=1).cpu().numpy()  # (B,), as tgt_in's
    rows, src_width = batch.src.shape
    tgt_width = batch.tgt_in.shape[1]
    return Flops(
        real=step_flops(model, vocab_size, src_lengths, tgt_lengths),
        padded=step_flops(model, vocab_size, [src_width] * rows, [tgt_width] * rows),
    )


def update_flops(
    model: ModelConfig, vocab_size: int, batches: Iterable[Batch], pad_id: int
) -> Flops:
    """The FLOPs of an update's micro-batches together."""
    return sum((batch_flops(model, vocab_size, batch, pad_id) for batch in batches), Flops())


# Dense bf16 peak of common accelerators (FLOP/s, without sparsity), for MFU: NVIDIA's datasheet
# figures "with sparsity" halved (H200 NVL: 1,671 -> 835; HGX B200: 4.5 PF -> 2.25 PF per GPU;
# L40S: 733 -> 362). Matched against torch.cuda.get_device_name() in this order, so that a
# specific name comes before one it contains ("H100 NVL" before "H100", "GH200" before "H200");
# unknown devices report no MFU rather than a guessed one, and None marks a name that would
# otherwise match a wrong entry.
PEAK_BF16_FLOPS: dict[str, float | None] = {
    "H100 NVL": 835e12,  # PCIe card, lower clocks than SXM
    "H200 NVL": 835e12,
    "GH200": 989e12,
    "H200": 989e12,  # SXM
    "H100 PCIe": 756e12,
    "H100": 989e12,  # SXM
    "H800": 989e12,  # SXM, H100's compute with less NVLink bandwidth
    "GB200": None,  # not B200's figure; unmeasured here
    "B200": 2250e12,
    "A100": 312e12,
    "L40S": 362e12,
}


def peak_flops(device_name: str) -> float | None:
    """The dense bf16 peak of the first PEAK_BF16_FLOPS key that `device_name` contains."""
    for key, flops in PEAK_BF16_FLOPS.items():
        if key in device_name:
            return flops
    return None
