"""The Transformer encoder-decoder of Vaswani et al. (2017), as pure tensor computation.

Shape legend: B batch, S source length, T target length, D d_model, H heads, Dh = D / H,
V vocabulary. Masks are boolean *keep* masks (True = this key may be attended), the meaning a
boolean ``attn_mask`` has in ``F.scaled_dot_product_attention``; keys are masked, never queries;
causality is a flag.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_mt.config import ModelConfig
from transformer_mt.execution import attends_few_queries, draws_cpu_dropout_masks, gathers_in_place


class EncoderOutput(NamedTuple):
    memory: Tensor  # (B, S, D)
    src_keep: Tensor  # (B, S) True at real source tokens
    padded: bool = True  # False: every source has the batch's length, and no key is masked


@dataclass
class DecoderCache:
    """Keys and values of earlier target positions, per decoder layer, for incremental decoding.

    Cross-attention keys and values depend only on the source and are computed once, one row per
    source. The target rows may come `beams` to a source (beam search): rows b * beams, ...,
    b * beams + beams - 1 read source row b's, which are shared, never copied.

    Reordering the target rows (beam search: each survivor's origin) is only noted: the layer's
    next `extend` gathers the rows and appends the new positions in one copy, where a gather
    and then a concatenation copied everything twice.
    """

    self_k: list[Tensor] = field(default_factory=list)  # per layer (N0, H, t, Dh): stored rows
    # (N0 = N until a reorder, which pending_rows holds; extend returns the current rows)
    self_v: list[Tensor] = field(default_factory=list)
    cross_k: list[Tensor] = field(default_factory=list)  # per layer (N / beams, H, S, Dh)
    cross_v: list[Tensor] = field(default_factory=list)
    beams: int = 1
    pending_rows: list[Tensor | None] = field(default_factory=list)  # per layer: to gather

    @property
    def length(self) -> int:
        """Target positions already decoded."""
        return self.self_k[0].shape[2] if self.self_k else 0

    def extend(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Layer `layer`'s keys and values (N, H, t + T, Dh) with the new positions k, v
        (N, H, T, Dh) appended; they are what the cache holds from now on."""
        if len(self.self_k) == layer:
            self.self_k.append(k)
            self.self_v.append(v)
            self.pending_rows.append(None)
            return k, v
        rows, self.pending_rows[layer] = self.pending_rows[layer], None
        self.self_k[layer] = appended(self.self_k[layer], rows, k)
        self.self_v[layer] = appended(self.self_v[layer], rows, v)
        return self.self_k[layer], self.self_v[layer]

    def reorder(self, index: Tensor) -> None:
        """Keep target rows `index` (beam search: each survivor's origin, in its own source's
        group of rows). Cross-attention keys and values are left alone."""
        self.pending_rows = [index if r is None else r[index] for r in self.pending_rows]

    def repeat_rows(self, times: int) -> None:
        """Each target row `times` times in a row (beam search: a sentence's beams), all of them
        reading its source's cross-attention keys and values."""
        if self.self_k:
            stored = torch.arange(self.self_k[0].shape[0], device=self.self_k[0].device)
            self.pending_rows = [
                (stored if rows is None else rows).repeat_interleave(times)
                for rows in self.pending_rows
            ]
        self.beams *= times

    def keep(self, index: Tensor) -> Tensor:
        """Keep target rows `index` and the sources they read (search: finished sentences leave
        the batch). `index` holds whole groups of `beams` rows, each group within one source,
        sources in the order they keep. Returns the kept sources' rows (len(index) / beams,)."""
        self.reorder(index)
        sources = index[:: self.beams] // self.beams
        self.cross_k = [k.index_select(0, sources) for k in self.cross_k]
        self.cross_v = [v.index_select(0, sources) for v in self.cross_v]
        return sources


@dataclass
class FixedDecoderCache:
    """A DecoderCache of fixed shape, for a search whose step should have the same shapes every
    step (on CUDA: no new shapes, so no kernel plans or allocator blocks made afresh): each
    layer's keys and values preallocated for `max_length` positions of every row, the batch's
    rows kept to its end (a search masks finished rows instead of removing them).

    `extend` writes one position and returns the positions written so far, views of the
    (N, H, max_length, Dh) buffers: attention reads them with no mask (on CUDA the flash kernel
    can take the call), and the views make no new allocation however long they grow. A reorder
    is noted and gathered at the next `extend`, positions written so far only, into a second
    buffer that then takes the first's place.
    """

    max_length: int
    self_k: list[Tensor] = field(default_factory=list)  # per layer (N, H, max_length, Dh)
    self_v: list[Tensor] = field(default_factory=list)
    spare_k: list[Tensor] = field(default_factory=list)  # per layer: a reorder's destination
    spare_v: list[Tensor] = field(default_factory=list)
    cross_k: list[Tensor] = field(default_factory=list)  # per layer (B, H, S, Dh)
    cross_v: list[Tensor] = field(default_factory=list)
    filled: list[int] = field(default_factory=list)  # per layer: positions written
    pending_rows: list[Tensor | None] = field(default_factory=list)  # per layer: to gather

    @property
    def length(self) -> int:
        """Target positions already decoded."""
        return self.filled[0] if self.filled else 0

    def extend(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Layer `layer`'s positions written so far (N, H, t + 1, Dh), views of its buffers, the
        new position k, v (N, H, 1, Dh) written after the ones before it."""
        if k.shape[2] != 1:
            raise ValueError(f"a fixed-shape cache takes one position a step, not {k.shape[2]}")
        if len(self.self_k) == layer:
            shape = (*k.shape[:2], self.max_length, k.shape[3])
            for buffers in (self.self_k, self.self_v, self.spare_k, self.spare_v):
                buffers.append(k.new_zeros(shape))
            self.filled.append(0)
            self.pending_rows.append(None)
        length = self.filled[layer]
        if length == self.max_length:
            raise ValueError(f"the fixed-shape cache holds {self.max_length} positions")
        rows, self.pending_rows[layer] = self.pending_rows[layer], None
        if rows is not None:
            for kept, spare in ((self.self_k, self.spare_k), (self.self_v, self.spare_v)):
                gathered(kept[layer], rows, length, spare[layer])
                kept[layer], spare[layer] = spare[layer], kept[layer]
        self.self_k[layer][:, :, length] = k[:, :, 0]
        self.self_v[layer][:, :, length] = v[:, :, 0]
        self.filled[layer] = length + 1
        return self.self_k[layer][:, :, : length + 1], self.self_v[layer][:, :, : length + 1]

    def reorder(self, index: Tensor) -> None:
        """Keep rows `index` (N,): every row's keys and values become those of row index[i]."""
        self.pending_rows = [index if r is None else r[index] for r in self.pending_rows]


KVCache = DecoderCache | FixedDecoderCache


def gathered(cached: Tensor, rows: Tensor, length: int, out: Tensor) -> None:
    """out[:, :, :length] = cached[rows, :, :length], for tensors (N, H, positions, Dh): in one
    copy where index_select writes into a strided slice in place (execution.gathers_in_place),
    else the rows gathered first, then copied."""
    if gathers_in_place(cached.device):
        torch.index_select(cached[:, :, :length], 0, rows, out=out[:, :, :length])
    else:
        out[:, :, :length] = cached[:, :, :length].index_select(0, rows)


def appended(cached: Tensor, rows: Tensor | None, new: Tensor) -> Tensor:
    """Rows `rows` (None: all) of `cached` (N0, H, t, Dh) followed, along the positions, by
    `new` (N, H, T, Dh): one copy into a new (N, H, t + T, Dh) tensor on the CPU and CUDA
    (`gathered`). With gradients (out= takes none) the rows are gathered first."""
    if rows is not None and cached.requires_grad:
        cached, rows = cached.index_select(0, rows), None
    if rows is None:
        return torch.cat([cached, new], dim=2)
    length = cached.shape[2]
    out = new.new_empty(new.shape[0], new.shape[1], length + new.shape[2], new.shape[3])
    gathered(cached, rows, length, out)
    out[:, :, length:] = new
    return out


def sinusoidal_table(length: int, d_model: int, start: int = 0) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(...) for the positions
    start, ..., start + length - 1: (length, D)."""
    position = torch.arange(start, start + length, dtype=torch.float32).unsqueeze(1)
    inv_freq = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model)
    )
    table = torch.zeros(length, d_model)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq)
    return table


def grown_table(table: Tensor, length: int, block: int) -> Tensor:
    """`table` (sinusoidal_table(block, D), then blocks after it) with whole blocks of `block`
    positions appended until it holds `length`. Each block is computed as the first one was (on
    the CPU, the same shape), so a position's values never depend on how far the table has grown:
    a vectorised sin and its scalar tail may round differently. Rows already there are kept."""
    blocks = [
        sinusoidal_table(block, table.shape[1], start=start).to(table.device, table.dtype)
        for start in range(table.shape[0], length, block)
    ]
    return torch.cat([table, *blocks])  # (multiple of block >= length, D)


def split_heads(x: Tensor, n_heads: int) -> Tensor:
    batch, length, width = x.shape
    return x.view(batch, length, n_heads, width // n_heads).transpose(1, 2)  # (B, H, L, Dh)


def merge_heads(x: Tensor) -> Tensor:
    batch, n_heads, length, head_dim = x.shape
    return x.transpose(1, 2).reshape(batch, length, n_heads * head_dim)  # (B, L, D)


def attend_few_queries(q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None = None) -> Tensor:
    """softmax(q k^T / sqrt(Dh)) v over the keys to attend, for a few query rows per (batch,
    head), what each step of incremental decoding asks (one row; beam search's cross-attention:
    one per beam): q (B, H, Q, Dh), k and v (B, H, L, Dh), keep (B, L) True at the keys to
    attend (None: all). Returns (B, H, Q, Dh).

    The values of F.scaled_dot_product_attention up to float rounding, as two batched matrix
    products around a softmax: on the CPU, SDPA's kernel (built to block long queries) took
    1.5-2.9x their time for one query row (1,200 rows, 4 heads, 8-40 keys, the mask's bias built
    in the call; benchmarks/bench_decode_kernels.py, benchmarks/decode.txt).
    """
    batch, heads, queries, head_dim = q.shape
    q, k, v = (t.reshape(batch * heads, t.shape[2], head_dim) for t in (q, k, v))
    scale = head_dim**-0.5
    if keep is None:
        scores = torch.bmm(q * scale, k.transpose(1, 2))  # (B*H, Q, L)
    else:
        bias = torch.zeros(keep.shape, dtype=q.dtype, device=q.device)
        bias = bias.masked_fill(~keep, -torch.inf)[:, None, None, :]  # (B, 1, 1, L)
        bias = bias.expand(batch, heads, 1, k.shape[1]).reshape(batch * heads, 1, -1)
        scores = torch.baddbmm(bias, q, k.transpose(1, 2), alpha=scale)  # bias broadcast over Q
    return torch.bmm(scores.softmax(dim=-1), v).view(batch, heads, queries, head_dim)


def rows_by_source(q: Tensor, sources: int) -> Tensor:
    """Queries (N, H, T, Dh) of target rows that come N / sources to a source (consecutive rows:
    beam search's beams) as (sources, H, N / sources * T, Dh): each source's rows together."""
    rows, heads, length, head_dim = q.shape
    grouped = q.view(sources, rows // sources, heads, length, head_dim).transpose(1, 2)
    return grouped.reshape(sources, heads, rows // sources * length, head_dim)


def rows_by_target(attended: Tensor, rows: int) -> Tensor:
    """`rows_by_source`'s inverse for its output: (sources, H, N / sources * T, Dh) to
    (N, H, T, Dh)."""
    sources, heads, _, head_dim = attended.shape
    grouped = attended.view(sources, heads, rows // sources, -1, head_dim).transpose(1, 2)
    return grouped.reshape(rows, heads, -1, head_dim)


def project(layer: nn.Module, x: Tensor, *, relu: bool = False) -> Tensor:
    """layer(x), then ReLU if `relu`: in the layer's own call where it fuses the two (a layer
    with `fuses_relu`, e.g. the training step's oneDNN products that its execution policy puts in
    a copy of the model), else after it. The model itself has plain nn.Linear layers; the policy
    decides which kernels multiply (transformer_mt/execution.py)."""
    if relu and getattr(layer, "fuses_relu", False):
        return layer(x, relu=True)
    y = layer(x)
    return F.relu(y) if relu else y


def init_attention(in_projections: list[nn.Linear], out: nn.Linear, d_model: int) -> None:
    """fairseq's initialisation of attention (the paper states none): Xavier-uniform with gain
    2^-1/2 on each D x D block of the input projections (W^Q, W^K, W^V), which fairseq sets per
    block and which is the variance Xavier gives a fused 3D x D in-projection (as
    torch.nn.MultiheadAttention initialises it); W^O with gain 1.

    With gain 1 on every block, q and k start with twice this variance and the logits
    q.k / sqrt(Dh) with four times it; at the warm-up's peak learning rate such a model stalled
    or learned slower per update than fairseq's (benchmarks/vs_fairseq.txt,
    tests/test_model.py).
    """
    for projection in in_projections:
        for block in projection.weight.data.split(d_model, dim=0):
            nn.init.xavier_uniform_(block, gain=2**-0.5)
    nn.init.xavier_uniform_(out.weight)


class SelfAttention(nn.Module):
    """Multi-head self-attention with one fused QKV projection. The projections have no biases,
    as in the paper's equations and its tensor2tensor code (a key bias would be a parameter
    without gradient: softmax ignores a shift shared by all keys)."""

    def __init__(self, d_model: int, n_heads: int, dropout: float):
        super().__init__()
        self.n_heads = n_heads
        self.dropout = dropout
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)
        init_attention([self.qkv], self.out, d_model)

    def forward(
        self,
        x: Tensor,
        *,
        keep: Tensor | None = None,
        causal: bool = False,
        cache: KVCache | None = None,
        layer: int = 0,
    ) -> Tensor:
        q, k, v = (
            split_heads(t, self.n_heads) for t in project(self.qkv, x).chunk(3, dim=-1)
        )  # (B, H, L, Dh)
        mask = keep[:, None, None, :] if keep is not None else None  # (B, 1, 1, S)
        if cache is not None:
            k, v = cache.extend(layer, k, v)
            if causal and q.shape[2] > 1:  # several new positions: causal, aligned bottom-right
                offset = k.shape[2] - q.shape[2]
                mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=x.device)
                mask = mask.tril(diagonal=offset)
            causal = False  # one new position may attend to every cached one
            if attends_few_queries(q, self.training):
                return project(self.out, merge_heads(attend_few_queries(q, k, v, keep)))
        attended = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=causal,
        )
        return project(self.out, merge_heads(attended))


class CrossAttention(nn.Module):
    """Decoder-to-encoder attention; keys and values come from the encoder memory (no biases)."""

    def __init__(self, d_model: int, n_heads: int, dropout: float):
        super().__init__()
        self.n_heads = n_heads
        self.dropout = dropout
        self.q = nn.Linear(d_model, d_model, bias=False)
        self.kv = nn.Linear(d_model, 2 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)
        init_attention([self.q, self.kv], self.out, d_model)
        self.kept_weights: list[Tensor] | None = None  # a list: forward appends its weights

    def memory_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        k, v = (split_heads(t, self.n_heads) for t in project(self.kv, memory).chunk(2, dim=-1))
        return k, v  # (B, H, S, Dh) each

    def forward(self, x: Tensor, k: Tensor, v: Tensor, src_keep: Tensor | None) -> Tensor:
        """x (N, T, D) attends to k, v (B, H, S, Dh) at src_keep (B, S; None: at every source
        position): N = B or, where target rows come N / B to a source (beam search's beams,
        consecutive), N a multiple of B."""
        q = split_heads(project(self.q, x), self.n_heads)  # (N, H, T, Dh)
        if self.kept_weights is not None:  # Transformer.cross_attention: the weights themselves
            scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
            if src_keep is not None:
                scores = scores.masked_fill(~src_keep[:, None, None, :], float("-inf"))
            weights = scores.softmax(-1)
            self.kept_weights.append(weights)  # (B, H, T, S)
            return project(self.out, merge_heads(weights @ v))
        one_query = attends_few_queries(q, self.training)
        rows = q.shape[0]
        shared = rows != k.shape[0]  # several target rows per source (beam search's beams)
        if shared:
            q = rows_by_source(q, k.shape[0])  # the attention of a source's rows in one product
        if one_query:
            attended = attend_few_queries(q, k, v, src_keep)
        else:
            attended = F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=None if src_keep is None else src_keep[:, None, None, :],
                dropout_p=self.dropout if self.training else 0.0,
            )
        if shared:
            attended = rows_by_target(attended, rows)
        return project(self.out, merge_heads(attended))


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2. Initialised as nn.Linear's default, U(+-1/sqrt(fan_in))
    for weights and biases, as in fairseq: W2 starts about 2x smaller than under Xavier."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.inner = nn.Linear(d_model, d_ff)
        self.outer = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return project(self.outer, project(self.inner, x, relu=True))


class Dropout(nn.Module):
    """Dropout as nn.Dropout defines it (each element zeroed with probability p, the others
    scaled by 1 / (1 - p)), with cheaper masks on the CPU.

    torch's CPU dropout draws a double from the generator for every element, in one thread
    (outside Intel CPUs, where MKL draws them): about a tenth of a CPU training step here
    (benchmarks/train_speed.txt). Eagerly on the CPU this cuts each 64-bit draw of the same
    generator into four 16-bit numbers and keeps an element where its number is at or above
    p * 2^16, rounded: p itself is rounded to a multiple of 2^-16 (0.1 becomes 0.1000061). Under
    torch.compile and on other devices it is F.dropout (execution.draws_cpu_dropout_masks
    decides). Either way the masks come from torch's global generator, which checkpoints
    save, so a resumed run draws the masks an uninterrupted one would.
    """

    def __init__(self, p: float):
        super().__init__()
        self.p = p
        self.threshold = round(p * 2**16) - 2**15  # on int16 numbers, uniform over [-2^15, 2^15)

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        if not draws_cpu_dropout_masks(x):
            return F.dropout(x, self.p, training=True)
        numbers = torch.empty((x.numel() + 3) // 4, dtype=torch.int64)
        numbers.random_(-(2**63), None)  # every 64-bit value equally likely
        keep = numbers.view(torch.int16)[: x.numel()].view(x.shape) >= self.threshold
        return x * torch.where(keep, 1.0 / (1.0 - self.p), 0.0).to(x.dtype)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class Sublayer(nn.Module):
    """Residual connection with dropout and LayerNorm: post-norm (paper) or pre-norm."""

    def __init__(self, d_model: int, dropout: float, norm_first: bool):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: Tensor, compute) -> Tensor:
        if self.norm_first:
            return x + self.dropout(compute(self.norm(x)))
        return self.norm(x + self.dropout(compute(x)))


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = SelfAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff)
        self.attn_block = Sublayer(cfg.d_model, cfg.dropout, cfg.norm_first)
        self.ffn_block = Sublayer(cfg.d_model, cfg.dropout, cfg.norm_first)

    def forward(self, x: Tensor, src_keep: Tensor | None) -> Tensor:
        """src_keep (B, S): the keys to attend; None: all of them (no source is padded)."""
        x = self.attn_block(x, lambda h: self.self_attn(h, keep=src_keep))
        return self.ffn_block(x, self.ffn)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = SelfAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.cross_attn = CrossAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff)
        self.self_block = Sublayer(cfg.d_model, cfg.dropout, cfg.norm_first)
        self.cross_block = Sublayer(cfg.d_model, cfg.dropout, cfg.norm_first)
        self.ffn_block = Sublayer(cfg.d_model, cfg.dropout, cfg.norm_first)

    def forward(
        self,
        x: Tensor,
        memory_k: Tensor,
        memory_v: Tensor,
        src_keep: Tensor | None,
        cache: KVCache | None = None,
        layer: int = 0,
    ) -> Tensor:
        """src_keep (B, S): the source positions to attend; None: all of them. `layer`: this
        layer's index in `cache` (incremental decoding only, so that a compiled layer's training
        graph sees no integer that differs from layer to layer)."""
        x = self.self_block(x, lambda h: self.self_attn(h, causal=True, cache=cache, layer=layer))
        x = self.cross_block(x, lambda h: self.cross_attn(h, memory_k, memory_v, src_keep))
        return self.ffn_block(x, self.ffn)


class Transformer(nn.Module):
    """Encoder-decoder; one embedding matrix serves encoder, decoder and output projection."""

    def __init__(
        self, cfg: ModelConfig, *, vocab_size: int, pad_id: int, src_vocab_size: int | None = None
    ):
        """vocab_size: the (shared) vocabulary; src_vocab_size: a separate source vocabulary, in
        which case the encoder gets its own embedding and only the decoder's are tied."""
        super().__init__()
        self.cfg = cfg
        self.pad_id = pad_id
        self.embed = nn.Embedding(vocab_size, cfg.d_model, padding_idx=pad_id)
        self.src_embed = (
            nn.Embedding(src_vocab_size, cfg.d_model, padding_idx=pad_id)
            if src_vocab_size
            else None
        )
        # Positions for cfg.max_positions; embed_tokens grows the table for longer sequences
        # (not persistent: a checkpoint holds no table, whatever length it was used for).
        self.register_buffer(
            "positions", sinusoidal_table(cfg.max_positions, cfg.d_model), persistent=False
        )
        self.embed_dropout = Dropout(cfg.dropout)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_decoder_layers))
        # Pre-norm stacks end with a LayerNorm; post-norm blocks already end with one.
        self.encoder_norm = nn.LayerNorm(cfg.d_model) if cfg.norm_first else nn.Identity()
        self.decoder_norm = nn.LayerNorm(cfg.d_model) if cfg.norm_first else nn.Identity()
        # None: logits are the product with the shared embedding; a decoding copy's module that
        # computes that product with other kernels (execution.decoding_copy), never trained or
        # saved.
        self.output_projection: nn.Module | None = None
        self.init_embeddings()

    def init_embeddings(self) -> None:
        """Embeddings N(0, D^-0.5) with a zero pad row; the layers initialise themselves
        (fairseq's scheme: see `init_attention`; feed-forward layers keep nn.Linear's default)."""
        for table in (self.embed, self.src_embed):
            if table is not None:
                nn.init.normal_(table.weight, mean=0.0, std=self.cfg.d_model**-0.5)
                with torch.no_grad():
                    table.weight[self.pad_id].zero_()

    def embed_tokens(self, tokens: Tensor, table: nn.Embedding, start: int = 0) -> Tensor:
        """Scaled embeddings plus the sinusoids of positions start, ...: any length (the table
        grows, by blocks of cfg.max_positions, to the longest sequence seen)."""
        length = tokens.shape[1]
        if start + length > self.positions.shape[0]:
            self.positions = grown_table(self.positions, start + length, self.cfg.max_positions)
        x = table(tokens) * math.sqrt(self.cfg.d_model) + self.positions[start : start + length]
        return self.embed_dropout(x)  # (B, L, D)

    def encode(self, src: Tensor, *, padded: bool = True) -> EncoderOutput:
        """src: (B, S) token ids, right-padded with pad_id. padded=False: no source is padded
        (the caller knows it from the lengths on the host: a batch of one source length), so
        attention takes no key mask, here and in `decode`."""
        src_keep = src != self.pad_id  # (B, S)
        keep = src_keep if padded else None
        x = self.embed_tokens(src, self.embed if self.src_embed is None else self.src_embed)
        for layer in self.encoder:
            x = layer(x, keep)
        return EncoderOutput(self.encoder_norm(x), src_keep, padded)

    def fill_cross_attention(self, encoded: EncoderOutput, cache: KVCache) -> None:
        """Every decoder layer's cross-attention keys and values, computed once into `cache`."""
        for layer in self.decoder[len(cache.cross_k) :]:
            memory_k, memory_v = layer.cross_attn.memory_kv(encoded.memory)
            cache.cross_k.append(memory_k.contiguous())  # read at every step: laid out once
            cache.cross_v.append(memory_v.contiguous())

    def decode(
        self, tgt_in: Tensor, encoded: EncoderOutput, cache: KVCache | None = None
    ) -> Tensor:
        """Logits (N, T, V) for the next token at each position of tgt_in (N, T).

        N is encoded's batch B, or a multiple of it with a cache whose target rows come
        N / B to a source (DecoderCache.repeat_rows: beam search's beams). With a cache, tgt_in
        holds only the new positions; the cache grows by T.
        """
        hidden = self.decode_hidden(tgt_in, encoded, cache)
        if self.output_projection is not None:
            return self.output_projection(hidden)
        return F.linear(hidden, self.embed.weight)

    def decode_hidden(
        self, tgt_in: Tensor, encoded: EncoderOutput, cache: KVCache | None = None
    ) -> Tensor:
        """The decoder's output (B, T, D) before the output projection (`decode` without its
        last matmul: the training loss projects it a chunk of tokens at a time)."""
        start = cache.length if cache is not None else 0
        x = self.embed_tokens(tgt_in, self.embed, start)
        if cache is not None:
            self.fill_cross_attention(encoded, cache)  # no-op after the first call
        keep = encoded.src_keep if encoded.padded else None
        for index, layer in enumerate(self.decoder):
            if cache is None:
                memory_k, memory_v = layer.cross_attn.memory_kv(encoded.memory)
                x = layer(x, memory_k, memory_v, keep)
            else:
                memory_k, memory_v = cache.cross_k[index], cache.cross_v[index]
                x = layer(x, memory_k, memory_v, keep, cache, index)
        return self.decoder_norm(x)

    def repeated_layers(self) -> list[nn.Module]:
        """The encoder's and the decoder's layers: what the execution policy compiles one by
        one (execution.compile_repeated_layers)."""
        return [*self.encoder, *self.decoder]

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits (B, T, V)."""
        return self.decode(tgt_in, self.encode(src))

    @torch.no_grad()
    def cross_attention(self, src: Tensor, tgt_in: Tensor, layer: int = -1) -> Tensor:
        """Where decoder layer `layer` (negative: from the last) looks: its cross-attention
        weights (B, T, S), averaged over heads, for teacher-forced tgt_in; row t is the
        attention that predicts target position t. Padded source positions get 0."""
        attention = self.decoder[layer].cross_attn
        attention.kept_weights = []
        try:
            self.forward(src, tgt_in)
            return attention.kept_weights[0].mean(dim=1)
        finally:
            attention.kept_weights = None


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters, each shared tensor counted once."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
