"""Greedy and beam search over a Transformer's encode / decode interface (tensors only).

Beam search is a pure step (`beam_step`: best candidates from log-probabilities) inside a small
loop that keeps finished hypotheses and reorders the KV cache by each survivor's origin.
Scores are length-normalised with the GNMT penalty lp(Y) = ((5 + |Y|) / 6) ** alpha, where |Y|
counts the generated tokens including EOS.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer_mt.model import DecoderCache, EncoderOutput, Transformer


@dataclass(frozen=True)
class Hypothesis:
    tokens: list[int]  # without BOS and EOS
    score: float  # beam search: length-penalised sum of log-probabilities; greedy: the plain sum


def length_penalty(length: int, alpha: float) -> float:
    """GNMT: ((5 + length) / 6) ** alpha."""
    return ((5.0 + length) / 6.0) ** alpha


def max_lengths(src_keep: Tensor, max_len_a: float, max_len_b: int, limit: int) -> Tensor:
    """Output limit per sentence, EOS included: a * source length + b, at most `limit`."""
    source_lengths = src_keep.sum(dim=1) - 1  # sources end with EOS, which is not counted
    return (max_len_a * source_lengths + max_len_b).long().clamp(max=limit)  # (B,)


def next_log_probs(
    model: Transformer, last: Tensor, encoded: EncoderOutput, cache: DecoderCache, banned: list[int]
) -> Tensor:
    logits = model.decode(last, encoded, cache)[:, -1]  # (N, V)
    log_probs = F.log_softmax(logits.float(), dim=-1)
    log_probs[:, banned] = -torch.inf
    return log_probs


@torch.no_grad()
def greedy_search(
    model: Transformer,
    src: Tensor,
    *,
    bos_id: int,
    eos_id: int,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
) -> list[Hypothesis]:
    """The most probable token at each step, until EOS or the length limit."""
    encoded = model.encode(src)
    limits = max_lengths(encoded.src_keep, max_len_a, max_len_b, model.positions.shape[0] - 1)
    batch = src.shape[0]
    cache = DecoderCache()
    tokens = torch.full((batch, 1), bos_id, dtype=torch.long, device=src.device)
    scores = torch.zeros(batch, device=src.device)
    finished = torch.zeros(batch, dtype=torch.bool, device=src.device)
    lengths = limits.clone()
    for step in range(int(limits.max())):
        log_probs = next_log_probs(
            model, tokens[:, -1:], encoded, cache, banned=[model.pad_id, bos_id]
        )
        at_limit = step + 1 >= limits
        log_probs[at_limit, :eos_id] = -torch.inf
        log_probs[at_limit, eos_id + 1 :] = -torch.inf
        best_scores, best = log_probs.max(dim=-1)
        scores = torch.where(finished, scores, scores + best_scores)
        ended = ~finished & (best == eos_id)
        lengths = torch.where(ended, torch.full_like(lengths, step + 1), lengths)
        finished |= ended
        tokens = torch.cat(
            [tokens, best.masked_fill(finished & ~ended, model.pad_id)[:, None]], dim=1
        )
        if bool(finished.all()):
            break
    return [
        Hypothesis(tokens[b, 1 : int(lengths[b])].tolist(), float(scores[b])) for b in range(batch)
    ]


def beam_step(
    log_probs: Tensor, scores: Tensor, n_candidates: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Best continuations of every beam.

    log_probs: (B, K, V) next-token log-probabilities; scores: (B, K) cumulative log-probabilities.
    Returns (candidate scores, origin beam, token), each (B, n_candidates), best first.
    """
    batch, beams, vocab = log_probs.shape
    total = (scores.unsqueeze(-1) + log_probs).view(batch, beams * vocab)
    top_scores, flat_index = total.topk(n_candidates, dim=-1)
    return top_scores, flat_index // vocab, flat_index % vocab


def expand_encoded(encoded: EncoderOutput, beam_size: int) -> EncoderOutput:
    return EncoderOutput(
        encoded.memory.repeat_interleave(beam_size, dim=0),  # (B*K, S, D)
        encoded.src_keep.repeat_interleave(beam_size, dim=0),  # (B*K, S)
    )


@torch.no_grad()
def beam_search(
    model: Transformer,
    src: Tensor,
    *,
    beam_size: int,
    bos_id: int,
    eos_id: int,
    alpha: float = 0.6,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
) -> list[list[Hypothesis]]:
    """Per sentence, up to beam_size finished hypotheses, best first.

    A sentence stops once it holds beam_size finished hypotheses (an EOS among the top beam_size
    candidates finishes one), or at its length limit, where only EOS may follow.
    """
    batch, k = src.shape[0], beam_size
    encoded = model.encode(src)
    limits = max_lengths(encoded.src_keep, max_len_a, max_len_b, model.positions.shape[0] - 1)
    encoded = expand_encoded(encoded, k)
    cache = DecoderCache()
    tokens = torch.full((batch * k, 1), bos_id, dtype=torch.long, device=src.device)
    scores = torch.full((batch, k), -torch.inf, device=src.device)
    scores[:, 0] = 0.0  # at the start all beams are the same: expand only the first
    finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
    done = [False] * batch
    row_base = torch.arange(batch, device=src.device).unsqueeze(1) * k  # (B, 1)
    for step in range(int(limits.max())):
        log_probs = next_log_probs(
            model, tokens[:, -1:], encoded, cache, banned=[model.pad_id, bos_id]
        )
        log_probs = log_probs.view(batch, k, -1)
        at_limit = step + 1 >= limits  # (B,)
        log_probs[at_limit, :, :eos_id] = -torch.inf
        log_probs[at_limit, :, eos_id + 1 :] = -torch.inf
        cand_scores, origin, token = beam_step(log_probs, scores, 2 * k)
        collect_finished(finished, done, tokens, cand_scores, origin, token, eos_id, k, step, alpha)
        # Continue with the best beam_size candidates that did not end.
        alive_scores = cand_scores.masked_fill(token == eos_id, -torch.inf)
        scores, pick = alive_scores.topk(k, dim=-1)  # (B, K)
        rows = (row_base + origin.gather(1, pick)).view(-1)  # (B*K,) each survivor's origin row
        tokens = torch.cat([tokens[rows], token.gather(1, pick).view(-1, 1)], dim=1)
        cache.reorder(rows)
        for b in torch.nonzero(at_limit).view(-1).tolist():
            done[b] = True
        if all(done):
            break
    return [sorted(hyps, key=lambda h: h.score, reverse=True) for hyps in finished]


def collect_finished(
    finished: list[list[Hypothesis]],
    done: list[bool],
    tokens: Tensor,
    cand_scores: Tensor,
    origin: Tensor,
    token: Tensor,
    eos_id: int,
    k: int,
    step: int,
    alpha: float,
) -> None:
    """Move candidates that end in EOS (among each sentence's top k) into `finished`."""
    ends = (token[:, :k] == eos_id) & torch.isfinite(cand_scores[:, :k])
    if not bool(ends.any()):
        return
    penalty = length_penalty(step + 1, alpha)
    for b, j in torch.nonzero(ends).tolist():
        if done[b]:
            continue
        prefix = tokens[b * k + int(origin[b, j]), 1:].tolist()
        finished[b].append(Hypothesis(prefix, float(cand_scores[b, j]) / penalty))
        if len(finished[b]) >= k:
            done[b] = True
