"""The tutorial approach to beam search, kept as the reference that ours must equal: every step
runs the decoder over each beam's whole prefix (no KV cache), one beam and one sentence at a
time. tests/decode/test_search.py checks our batched, cached search against it; `make bench-decode`
times both (bench_decode.py)."""

import torch
import torch.nn.functional as F

from transformer_mt.config import DecodeConfig
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from transformer_mt.decode.search import length_penalty
from transformer_mt.model import Transformer


@torch.no_grad()
def reference_beam_search(model: Transformer, source: list[int], cfg: DecodeConfig) -> list[int]:
    """The tutorial approach for one sentence: every step runs the decoder over each beam's
    whole prefix (no KV cache), one beam at a time. The search rule is ours: 2k candidates, an
    EOS among the best k finishes a hypothesis, the best k finished are kept (GNMT-normalised),
    stop when k are kept and no live hypothesis can beat the worst of them, or at the length
    limit (where only EOS may follow); PAD, UNK and BOS banned."""
    k, alpha = cfg.beam_size, cfg.length_penalty
    encoded = model.encode(torch.tensor([[*source, EOS_ID]]))
    limit = int(cfg.max_len_a * len(source) + cfg.max_len_b)
    beams: list[tuple[float, list[int]]] = [(0.0, [BOS_ID])]
    finished: list[tuple[float, list[int]]] = []
    for step in range(limit):
        candidates = []
        for score, tokens in beams:
            logits = model.decode(torch.tensor([tokens]), encoded)[0, -1]  # whole prefix
            log_probs = F.log_softmax(logits.float(), dim=-1)
            log_probs[[PAD_ID, UNK_ID, BOS_ID]] = -torch.inf
            if step + 1 >= limit:  # only EOS may follow
                log_probs = torch.where(
                    torch.arange(log_probs.shape[0]) == EOS_ID, log_probs, -torch.inf
                )
            best = log_probs.topk(2 * k)
            for log_prob, token in zip(best.values.tolist(), best.indices.tolist(), strict=True):
                if log_prob > -torch.inf:
                    candidates.append((score + log_prob, [*tokens, token]))
        candidates.sort(key=lambda candidate: candidate[0], reverse=True)
        beams = []
        for rank, (score, tokens) in enumerate(candidates[: 2 * k]):
            if tokens[-1] == EOS_ID:
                if rank < k:
                    finished.append((score / length_penalty(step + 1, alpha), tokens))
            elif len(beams) < k:
                beams.append((score, tokens))
        finished = sorted(finished, key=lambda hypothesis: hypothesis[0], reverse=True)[:k]
        if step + 1 >= limit or not beams:
            break
        best_penalty = max(length_penalty(step + 2, alpha), length_penalty(limit, alpha))
        if len(finished) == k and finished[-1][0] >= beams[0][0] / best_penalty:
            break
    return finished[0][1][1:-1]
