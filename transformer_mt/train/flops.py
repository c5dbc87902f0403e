"""FLOP count of a training step, for GFLOP/s and model FLOPs utilisation (MFU).

The usual matmul estimate: a forward pass costs 2 FLOPs per multiply-add and the backward pass
twice the forward, so a step costs 6 x (multiply-adds). Counted: every linear layer of the encoder
on source positions, of the decoder and the output projection on target positions, and the
attention products QK^T and AV over the padded batch shapes. Not counted: layer norms, softmax,
dropout, embeddings lookups (all small next to the matmuls).
"""

from __future__ import annotations

from transformer_mt.config import ModelConfig


def step_flops(
    model: ModelConfig, vocab_size: int, batch_size: int, src_len: int, tgt_len: int
) -> float:
    """Forward + backward FLOPs of one training step on a (batch_size x src_len / tgt_len) batch."""
    d, d_ff = model.d_model, model.d_ff
    n_enc, n_dec = model.n_encoder_layers, model.n_decoder_layers
    encoder_layer = 4 * d * d + 2 * d * d_ff  # Q, K, V, output projections + feed-forward
    decoder_layer = 8 * d * d + 2 * d * d_ff  # self- and cross-attention projections + FFN
    linear = batch_size * (
        src_len * n_enc * encoder_layer + tgt_len * (n_dec * decoder_layer + d * vocab_size)
    )
    attention = 2 * d * batch_size * (n_enc * src_len**2 + n_dec * (tgt_len**2 + tgt_len * src_len))
    return 6.0 * (linear + attention)


# Dense bf16 peak of common accelerators (FLOP/s, without sparsity), for MFU. Matched against
# torch.cuda.get_device_name() in this order, so that a specific name comes before one it contains
# ("H100 NVL" before "H100", "GH200" before "H200"); unknown devices report no MFU rather than a
# guessed one, and None marks a name that would otherwise match a wrong entry.
PEAK_BF16_FLOPS: dict[str, float | None] = {
    "H100 NVL": 835e12,
    "H200 NVL": 835e12,
    "GH200": 989e12,
    "H200": 989e12,  # SXM
    "H100 PCIe": 756e12,
    "H100": 989e12,  # SXM
    "H800": 989e12,
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
