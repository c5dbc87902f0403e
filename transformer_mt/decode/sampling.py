"""Sampling: one random draw per sentence, token by token (e.g. to generate back-translations).

The distribution is reshaped in the usual order (as Hugging Face's logits warpers do):
temperature, then top-k, then top-p (nucleus). Draws come from a caller's torch.Generator, so a
seed reproduces them whatever the global RNG has done. A hypothesis's score is its sum of
log-probabilities under the model itself, before temperature and truncation.
"""

from __future__ import annotations

import torch
from torch import Tensor

from transformer_mt.decode.search import Ensemble, Hypothesis, single_path_search
from transformer_mt.model import Transformer


def sampling_logits(
    log_probs: Tensor, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
) -> Tensor:
    """Logits (N, V) to draw the next token from: log_probs / temperature, with -inf outside the
    top_k most probable tokens (0: off) and outside the smallest set of most probable tokens whose
    probability reaches top_p (1.0: off). The most probable token always stays."""
    logits = log_probs / temperature
    if top_k > 0:
        top = logits.topk(min(top_k, logits.shape[-1]), dim=-1).indices  # (N, k)
        keep = torch.zeros_like(logits, dtype=torch.bool).scatter(1, top, True)
        logits = logits.masked_fill(~keep, -torch.inf)
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)  # (N, V)
        probs = sorted_logits.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # of the more probable tokens
        drop_sorted = mass_before >= top_p
        drop_sorted[:, 0] = False  # the most probable stays, even where top_p is 0 in float32
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)  # vocabulary order
        logits = logits.masked_fill(drop, -torch.inf)
    return logits


def sample_search(
    model: Transformer | Ensemble,
    src: Tensor,
    *,
    generator: torch.Generator,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    bos_id: int,
    eos_id: int,
    unk_id: int | None = None,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    min_len: int = 0,
    src_padded: bool = True,
    prefix: Tensor | None = None,
    word_starts: Tensor | None = None,
) -> list[Hypothesis]:
    """One sampled translation per sentence, until EOS or the length limit; an Ensemble samples
    from the mean of its members' probabilities."""

    def draw(log_probs: Tensor) -> Tensor:
        logits = sampling_logits(log_probs, temperature=temperature, top_k=top_k, top_p=top_p)
        return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(1)

    return single_path_search(
        model,
        src,
        draw,
        bos_id=bos_id,
        eos_id=eos_id,
        unk_id=unk_id,
        max_len_a=max_len_a,
        max_len_b=max_len_b,
        min_len=min_len,
        src_padded=src_padded,
        prefix=prefix,
        word_starts=word_starts,
    )
