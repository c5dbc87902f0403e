"""decode.quantize=int8: our model with int8 weights, for decoding on the CPU.

PyTorch's dynamic quantization (`torch.ao.quantization.quantize_dynamic`, qint8): the weights of
every nn.Linear are stored in int8 with one scale per output row; each call quantizes its input
from the input's own range, multiplies in int8 (fbgemm / oneDNN) and returns float32. The output
projection is no nn.Linear in the model (`Transformer.decode` multiplies by the shared embedding
matrix, V x D: the largest matmul of a decoding step), so a linear layer built from a copy of the
embedding takes its place here, quantized likewise. The embeddings themselves and LayerNorm stay
float32.

The model given is left as it is (the quantized model is a copy), and so is its checkpoint. PyTorch
marks torch.ao.quantization and its quantized tensors deprecated (pytorch/pytorch#184982; torchao
is to replace them), but 2.13 still ships and runs them.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor, nn
from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

from transformer_mt.model import DecoderCache, EncoderOutput, Transformer


class Int8Transformer(nn.Module):
    """A Transformer's encode / decode interface (what the searches and ModelSearch use) over an
    int8 copy of it."""

    def __init__(self, model: Transformer):
        super().__init__()
        projection = nn.Linear(model.cfg.d_model, model.embed.num_embeddings, bias=False)
        projection.weight = nn.Parameter(model.embed.weight.detach().clone())  # (V, D)
        float_parts = nn.ModuleDict({"model": model, "projection": projection}).eval()
        with warnings.catch_warnings():  # its deprecation notices (see above), once per call
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.filterwarnings("ignore", "torch.quantize_per_tensor", UserWarning)
            quantized = quantize_dynamic(float_parts, {nn.Linear: per_channel_dynamic_qconfig})
        self.model, self.projection = quantized["model"], quantized["projection"]

    @property
    def pad_id(self) -> int:
        return self.model.pad_id

    @property
    def embed(self) -> nn.Embedding:
        return self.model.embed

    @property
    def decoder(self) -> nn.ModuleList:
        return self.model.decoder

    def encode(self, src: Tensor) -> EncoderOutput:
        return self.model.encode(src)

    def fill_cross_attention(self, encoded: EncoderOutput, cache: DecoderCache) -> None:
        self.model.fill_cross_attention(encoded, cache)

    def decode(
        self, tgt_in: Tensor, encoded: EncoderOutput, cache: DecoderCache | None = None
    ) -> Tensor:
        """Logits (B, T, V), as Transformer.decode, through the int8 output projection."""
        return self.projection(self.model.decode_hidden(tgt_in, encoded, cache))

    @torch.no_grad()
    def cross_attention(self, src: Tensor, tgt_in: Tensor, layer: int = -1) -> Tensor:
        """Transformer.cross_attention of the int8 layers (B, T, S)."""
        return self.model.cross_attention(src, tgt_in, layer)
