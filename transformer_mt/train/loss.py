"""Label-smoothed cross-entropy, returned as sums so the trainer divides once by the token count.

Convention (PyTorch's, also fairseq's up to the target's own share): the smoothed target puts
1 - eps on the reference token and eps / V on every token of the vocabulary (the reference
included), so loss_i = (1 - eps) * nll_i + eps * mean_v(-log p_v). Padding positions count zero.
"""

from __future__ import annotations

from typing import NamedTuple

import torch.nn.functional as F
from torch import Tensor


class LossSums(NamedTuple):
    loss: Tensor  # summed label-smoothed loss (what is minimised)
    nll: Tensor  # summed negative log-likelihood of the references (for perplexity)
    n_tokens: Tensor  # non-pad target tokens


def label_smoothed_loss(logits: Tensor, target: Tensor, *, epsilon: float, pad_id: int) -> LossSums:
    """logits (B, T, V), target (B, T) -> sums over non-pad positions (no host synchronisation)."""
    log_probs = F.log_softmax(logits.float(), dim=-1)  # (B, T, V)
    keep = target != pad_id  # (B, T)
    nll = F.nll_loss(
        log_probs.flatten(0, 1), target.flatten(), ignore_index=pad_id, reduction="sum"
    )
    uniform = -(log_probs.mean(dim=-1) * keep).sum()
    loss = (1.0 - epsilon) * nll + epsilon * uniform
    return LossSums(loss, nll, keep.sum())
