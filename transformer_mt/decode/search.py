"""Greedy and beam search over a Transformer's encode / decode interface (tensors only; sampling,
which shares the greedy loop, is in sampling.py).

Every search is batched over sentences (times beams) with the decoder's KV cache; cross-attention
keys and values are computed once per sentence and kept for every step (a sentence's beams read
them together: DecoderCache.repeat_rows). A sentence that is done leaves the batch:
its rows are dropped from the tokens, the encoder output and the cache, so later steps compute
only live sentences.

Beam search is a pure step (`beam_step` and `survivors`: best candidates from log-probabilities)
inside a small loop that keeps finished hypotheses and reorders the KV cache by each survivor's
origin. Scores are length-normalised with the GNMT penalty lp(Y) = ((5 + |Y|) / 6) ** alpha,
where |Y| counts the generated tokens including EOS.

Stopping rule (tensor2tensor's, exact for the beam): a sentence keeps its best beam_size finished
hypotheses (an EOS among the best beam_size of the 2 * beam_size candidates of a step finishes
one) and is done only when it holds beam_size of them and no live hypothesis can still beat the
worst: a live hypothesis's log-probability can only fall, so its best normalised score is bounded
by its score divided by the largest penalty it could still get (at the sentence's length limit
for alpha >= 0). Or at its length limit. fairseq's and CTranslate2's rule (done at beam_size
finished hypotheses: `stop_early`) is faster but lets a confident model collect short endings
before its best hypothesis finishes. With alpha = 0 a beam of one is exactly greedy.

Every search runs an `Ensemble`: a single model is the ensemble of one. Members keep their own
encoder output and KV cache (`Decoders`), pruned and reordered together; the next-token
distribution is the mean of the members' probabilities (`combined_log_probs`).

What the loops decide on the host (which rows ended, which sentences are done, the tokens of a
finished hypothesis) comes from the device in one copy per step (`host_values`): on a GPU each
value read on its own is a wait for the device. The tokens generated so far are kept on the host
for that reason, row by row; the device holds only each row's last token.

`fixed_shape_beam_search` is the same beam search for a device where that copy costs (CUDA; the
execution policy chooses it, decode.batch_shape): every row stays to the batch's end in a KV
cache of fixed shape (model.FixedDecoderCache), so every step has the same shapes, and the
search's state (tokens so far, finished hypotheses, which sentences are done) lives on the device
(`advance`, a pure step over `BeamState`). The host reads whether every sentence is done every
`check_every` steps. It finds the hypotheses `beam_search` finds, up to float rounding, and stops
each sentence at the same step (tests/decode/test_fixed_shape.py).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer_mt.execution import score_dtype
from transformer_mt.model import (
    DecoderCache,
    EncoderOutput,
    FixedDecoderCache,
    KVCache,
    Transformer,
)


@dataclass(frozen=True)
class Hypothesis:
    tokens: list[int]  # without BOS and EOS
    score: float  # beam search: length-penalised sum of log-probabilities; else the plain sum


def length_penalty(length: int, alpha: float) -> float:
    """GNMT: ((5 + length) / 6) ** alpha."""
    return ((5.0 + length) / 6.0) ** alpha


def max_lengths(src_keep: Tensor, max_len_a: float, max_len_b: int) -> Tensor:
    """Output limit per sentence, EOS included: a * source length + b (the model's positions
    have no limit of their own)."""
    source_lengths = src_keep.sum(dim=1) - 1  # sources end with EOS, which is not counted
    return (max_len_a * source_lengths + max_len_b).long()  # (B,)


class Ensemble:
    """Models that translate together, as fairseq's EnsembleModel does: at each step the
    distribution of the next token is the mean of the members' probabilities (log-probabilities:
    logsumexp over the members' log-softmaxes - log n). One model is the ensemble of one. The
    members share the vocabulary (decode/loading.py checks the tokenizer files)."""

    def __init__(self, models: Sequence[Transformer]):
        if not models:
            raise ValueError("an ensemble needs at least one model")
        for other in models[1:]:  # one member: any module with encode / decode (tests' scripts)
            first, second = ((m.embed.num_embeddings, m.pad_id) for m in (models[0], other))
            if first != second:
                raise ValueError(
                    f"ensemble members differ in (vocabulary size, pad id): {first}, {second}"
                )
        self.models = list(models)
        self.pad_id = models[0].pad_id

    def start(self, src: Tensor, max_length: int | None = None, padded: bool = True) -> Decoders:
        """Every member's encoder output for src (B, S) and an empty KV cache (given
        max_length, a FixedDecoderCache of that many positions). padded=False: every source
        has the batch's length (decode.source_lengths=equal makes such batches), so attention
        takes no key mask (Transformer.encode)."""
        encoded = [m.encode(src, padded=padded) for m in self.models]
        return Decoders(self.models, encoded, max_length)


def as_ensemble(model: Transformer | Ensemble) -> Ensemble:
    return model if isinstance(model, Ensemble) else Ensemble([model])


class Decoders:
    """The members' encoder outputs and KV caches for the live rows of one search, kept aligned:
    rows leave and beams are reordered in all of them at once."""

    def __init__(
        self,
        models: list[Transformer],
        encoded: list[EncoderOutput],
        max_length: int | None = None,
    ):
        """max_length: the caches are FixedDecoderCaches of this many positions (the search
        keeps every row; `keep` and `repeat_beams` are then not used); None: DecoderCaches."""
        self.models, self.encoded = models, encoded
        self.caches: list[KVCache] = [
            DecoderCache() if max_length is None else FixedDecoderCache(max_length) for _ in models
        ]

    @property
    def src_keep(self) -> Tensor:
        return self.encoded[0].src_keep  # (B, S) per sentence, the same for every member

    def repeat_beams(self, k: int) -> None:
        """Each sentence's row (its cache so far) becomes its k beams' (rows b * k ... b * k +
        k - 1), which read its encoder output and cross-attention keys and values, computed
        once."""
        for model, encoded, cache in zip(self.models, self.encoded, self.caches, strict=True):
            model.fill_cross_attention(encoded, cache)
            cache.repeat_rows(k)

    def keep(self, rows: Tensor) -> None:
        """Rows `rows` of everything: finished sentences leave (and survivors are reordered).
        `rows` holds each kept sentence's beams together, in their sentence's order."""
        self.encoded = [
            keep_rows(encoded, cache, rows)
            for encoded, cache in zip(self.encoded, self.caches, strict=True)
        ]

    def reorder(self, rows: Tensor) -> None:
        for cache in self.caches:
            cache.reorder(rows)

    def next_log_probs(self, last: Tensor) -> Tensor:
        """combined_log_probs of the members' logits for the token after `last` (N, 1)."""
        return combined_log_probs(
            [
                model.decode(last, encoded, cache)[:, -1].float()  # (N, V)
                for model, encoded, cache in zip(
                    self.models, self.encoded, self.caches, strict=True
                )
            ]
        )


def combined_log_probs(logits: list[Tensor]) -> Tensor:
    """The members' next-token logits, each (N, V), as the log-probabilities (N, V) of the mean
    of their probabilities: fairseq's ensemble semantics (logsumexp over the members'
    log-softmaxes, minus log n); one member's own log-softmax.

    One fused log_softmax over the vocabulary: on the CPU, torch.logsumexp (max, subtract, exp,
    sum: four passes, a temporary as large as the logits) took 1.7-2.2x its time (1,200 x
    8,000 logits; benchmarks/bench_decode_kernels.py), although it writes no log-probabilities.
    """
    log_probs = [member.log_softmax(dim=-1) for member in logits]
    if len(log_probs) == 1:
        return log_probs[0]
    return torch.logsumexp(torch.stack(log_probs), dim=0) - math.log(len(log_probs))


def host_values(*tensors: Tensor) -> list[list[float]]:
    """Each tensor's values, flattened, as a list of Python floats: all of them in one copy from
    the device (one `.tolist()`). Through float32 (MPS has no float64): float32 values come back
    exact, integers too below 2 ** 24 (token ids, rows and lengths are far smaller)."""
    values = torch.cat([t.reshape(-1).float() for t in tensors]).tolist()
    ends = itertools.accumulate(t.numel() for t in tensors)
    return [values[end - t.numel() : end] for t, end in zip(tensors, ends, strict=True)]


def next_token_log_probs(
    decoders: Decoders,
    last: Tensor,
    at_limit: Tensor | None,
    *,
    step: int,
    min_len: int,
    bos_id: int,
    eos_id: int,
    unk_id: int | None = None,
) -> Tensor:
    """Log-probabilities (N, V) of the token after `last` (N, 1), the `step`-th generated one,
    with banned tokens at -inf (not renormalised over the tokens left).

    Banned: PAD, BOS and (given unk_id) the unknown piece; EOS before min_len generated tokens;
    anything but EOS in rows `at_limit` (N,). The limit wins over min_len. at_limit None: no row
    is at its limit (the searches know it on the host).
    """
    log_probs = decoders.next_log_probs(last)  # (N, V)
    eos = log_probs[:, eos_id].clone() if at_limit is not None else None
    pad_id = decoders.models[0].pad_id
    banned = [pad_id, bos_id] if unk_id is None else [pad_id, bos_id, unk_id]
    # Column by column and by masks, never through an index made on the host (a list, a boolean
    # mask's nonzero rows): on a GPU that is a copy to the device, which waits for it.
    for token in banned:
        log_probs[:, token] = -torch.inf
    if step < min_len:
        log_probs[:, eos_id] = -torch.inf
    if at_limit is not None:
        log_probs.masked_fill_(at_limit[:, None], -torch.inf)
        log_probs[:, eos_id] = torch.where(at_limit, eos, log_probs[:, eos_id])
    return log_probs


def keep_rows(encoded: EncoderOutput, cache: DecoderCache, rows: Tensor) -> EncoderOutput:
    """Rows `rows` of the whole cache and the encoder output of their sentences: finished
    sentences leave."""
    sentences = cache.keep(rows)
    return EncoderOutput(
        encoded.memory.index_select(0, sentences),
        encoded.src_keep.index_select(0, sentences),
        encoded.padded,
    )


Choose = Callable[[Tensor], Tensor]
"""Picks one token per row (N,) from next-token log-probabilities (N, V)."""


@torch.no_grad()
def single_path_search(
    model: Transformer | Ensemble,
    src: Tensor,
    choose: Choose,
    *,
    bos_id: int,
    eos_id: int,
    unk_id: int | None = None,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    min_len: int = 0,
    src_padded: bool = True,
) -> list[Hypothesis]:
    """One hypothesis per sentence, one token per step picked by `choose` (greedy: the most
    probable; sampling: a draw); scored by the model's log-probabilities. A row leaves the batch
    at its EOS. src_padded=False: no source is padded (Ensemble.start), in every search."""
    decoders = as_ensemble(model).start(src, padded=src_padded)
    limits = max_lengths(decoders.src_keep, max_len_a, max_len_b)  # (N,)
    row_limits = [int(limit) for limit in host_values(limits)[0]]
    sentence = list(range(src.shape[0]))  # input index of each live row
    generated: list[list[int]] = [[] for _ in sentence]  # each live row's tokens after BOS
    last = torch.full((src.shape[0],), bos_id, dtype=torch.long, device=src.device)
    scores = torch.zeros(src.shape[0], device=src.device)
    results: list[Hypothesis | None] = [None] * src.shape[0]
    for step in range(max(row_limits)):
        log_probs = next_token_log_probs(
            decoders,
            last[:, None],
            step + 1 >= limits if step + 1 >= min(row_limits) else None,
            step=step,
            min_len=min_len,
            bos_id=bos_id,
            eos_id=eos_id,
            unk_id=unk_id,
        )
        last = choose(log_probs)  # (N,)
        scores = scores + log_probs.gather(1, last[:, None]).squeeze(1)
        tokens, row_scores = host_values(last, scores)
        live = []
        for row, (token, score) in enumerate(zip(tokens, row_scores, strict=True)):
            if token == eos_id:
                results[sentence[row]] = Hypothesis(generated[row], score)
            else:
                generated[row].append(int(token))
                live.append(row)
        if not live:
            break
        if len(live) < len(sentence):
            index = torch.tensor(live, dtype=torch.long, device=src.device)
            last, scores, limits = last[index], scores[index], limits[index]
            decoders.keep(index)
            sentence, generated, row_limits = (
                [values[row] for row in live] for values in (sentence, generated, row_limits)
            )
    return results  # every row ends by its limit, where only EOS may follow


def greedy_search(
    model: Transformer | Ensemble,
    src: Tensor,
    *,
    bos_id: int,
    eos_id: int,
    unk_id: int | None = None,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    min_len: int = 0,
    src_padded: bool = True,
) -> list[Hypothesis]:
    """The most probable token at each step, until EOS or the length limit."""
    return single_path_search(
        model,
        src,
        lambda log_probs: log_probs.argmax(dim=-1),
        bos_id=bos_id,
        eos_id=eos_id,
        unk_id=unk_id,
        max_len_a=max_len_a,
        max_len_b=max_len_b,
        min_len=min_len,
        src_padded=src_padded,
    )


def beam_step(
    log_probs: Tensor, scores: Tensor, n_candidates: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Best continuations of every beam.

    log_probs: (B, K, V) next-token log-probabilities (banned tokens -inf; next_token_log_probs);
    scores: (B, K) cumulative log-probabilities. Returns (candidate scores, origin beam, token),
    each (B, n_candidates), best first. Where K * V < n_candidates (one beam of a tiny
    vocabulary), the candidates after the K * V real ones score -inf (with the origin and token
    of the last beam's last).

    A beam can only contribute its own best n_candidates tokens: the top-k runs over each beam's
    V log-probabilities, then over the K * n_candidates survivors (not the (B, K, V) sums).
    """
    batch, beams, vocab = log_probs.shape
    per_beam = min(n_candidates, vocab)
    top_log_probs, top_tokens = log_probs.topk(per_beam, dim=-1)  # (B, K, per_beam)
    totals = (top_log_probs + scores.unsqueeze(-1)).view(batch, beams * per_beam)
    if beams * per_beam < n_candidates:
        totals = F.pad(totals, (0, n_candidates - beams * per_beam), value=-torch.inf)
    cand_scores, flat_index = totals.topk(n_candidates, dim=-1)
    flat_index = flat_index.clamp(max=beams * per_beam - 1)
    token = top_tokens.view(batch, beams * per_beam).gather(1, flat_index)
    return cand_scores, flat_index // per_beam, token


def survivors(
    cand_scores: Tensor, origin: Tensor, token: Tensor, eos_id: int, k: int
) -> tuple[Tensor, Tensor, Tensor]:
    """The best k candidates that did not end: their scores (B, K), origin rows (B*K,) in the
    flattened (sentence, beam) batch, and tokens (B*K,)."""
    alive_scores = cand_scores.masked_fill(token == eos_id, -torch.inf)
    scores, pick = alive_scores.topk(k, dim=-1)  # (B, K)
    row_base = torch.arange(cand_scores.shape[0], device=cand_scores.device).unsqueeze(1) * k
    rows = (row_base + origin.gather(1, pick)).view(-1)
    return scores, rows, token.gather(1, pick).view(-1)


@dataclass(frozen=True)
class StepOnHost:
    """What the beam search loop reads of one step, copied from the device at once: of each
    sentence's best k candidates (k = the beams per sentence), flattened row by row (B*K,),
    their scores, origin beams and tokens; the best live score of each sentence (B,); and the
    survivors' origin rows and tokens (B*K,), as `survivors` gives them."""

    cand_scores: list[float]
    origin: list[float]
    token: list[float]
    best_live: list[float]
    rows: list[float]
    next_token: list[float]


def ended_hypotheses(
    step: StepOnHost, prefixes: list[list[int]], eos_id: int, penalty: float
) -> list[tuple[int, Hypothesis]]:
    """(sentence row, hypothesis) for the candidates among each row's best k that end in EOS,
    best first within a row; scores divided by the length penalty. prefixes: each beam row's
    tokens so far (B*K lists)."""
    k = len(prefixes) // len(step.best_live)
    ended = []
    for index, (score, beam, token) in enumerate(
        zip(step.cand_scores, step.origin, step.token, strict=True)
    ):
        if token == eos_id and math.isfinite(score):
            b = index // k
            ended.append((b, Hypothesis(prefixes[b * k + int(beam)], score / penalty)))
    return ended


@torch.no_grad()
def beam_search(
    model: Transformer | Ensemble,
    src: Tensor,
    *,
    beam_size: int,
    bos_id: int,
    eos_id: int,
    unk_id: int | None = None,
    alpha: float = 0.6,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    min_len: int = 0,
    stop_early: bool = False,
    prune_finished: bool = True,
    src_padded: bool = True,
) -> list[list[Hypothesis]]:
    """Per sentence, up to beam_size finished hypotheses, best first.

    A sentence stops by the module's stopping rule (stop_early: by fairseq's); with
    prune_finished (the default) its rows then leave the batch. False keeps them to the end, for
    tests: the outputs are the same.
    """
    k = beam_size
    decoders = as_ensemble(model).start(src, padded=src_padded)
    limits = max_lengths(decoders.src_keep, max_len_a, max_len_b)  # (B,)
    sentence_limits = [int(limit) for limit in host_values(limits)[0]]
    # A sentence's beams all start from BOS alone: the first step runs one row per sentence,
    # whose cache then becomes its k beams' (decoders.repeat_beams).
    row_limits = limits  # each row's limit: (B,), then (B*K,)
    last = torch.full((src.shape[0],), bos_id, dtype=torch.long, device=src.device)
    prefixes: list[list[int]] = [[] for _ in range(src.shape[0] * k)]  # each row's tokens so far
    scores = torch.zeros(src.shape[0], 1, device=src.device)  # (B, beams so far)
    sentence = list(range(src.shape[0]))  # input index of each live sentence
    done = [False] * src.shape[0]
    finished: list[list[Hypothesis]] = [[] for _ in sentence]
    for step in range(max(sentence_limits)):
        at_limit = [step + 1 >= limit for limit in sentence_limits]
        log_probs = next_token_log_probs(
            decoders,
            last[:, None],
            step + 1 >= row_limits if any(at_limit) else None,
            step=step,
            min_len=min_len,
            bos_id=bos_id,
            eos_id=eos_id,
            unk_id=unk_id,
        )
        if step == 0:
            decoders.repeat_beams(k)  # row b becomes rows b * k ... b * k + k - 1
            row_limits = limits.repeat_interleave(k)  # (B*K,)
        beams = log_probs.view(len(sentence), scores.shape[1], -1)  # (B, 1 or K, V)
        cand_scores, origin, token = beam_step(beams, scores, 2 * k)
        scores, rows, next_token = survivors(cand_scores, origin, token, eos_id, k)
        on_host = StepOnHost(
            *host_values(
                cand_scores[:, :k], origin[:, :k], token[:, :k], scores[:, 0], rows, next_token
            )
        )
        penalty = length_penalty(step + 1, alpha)
        for b, hypothesis in ended_hypotheses(on_host, prefixes, eos_id, penalty):
            if not done[b]:
                keep_best(finished[sentence[b]], hypothesis, k)
        done = [
            d
            or at
            or sentence_done(finished[sentence[b]], best, step + 2, limit, alpha, k, stop_early)
            for b, (d, at, best, limit) in enumerate(
                zip(done, at_limit, on_host.best_live, sentence_limits, strict=True)
            )
        ]
        if all(done):
            break
        kept_rows = range(len(prefixes))
        if prune_finished and any(done):
            live = [b for b, d in enumerate(done) if not d]
            keep = beam_rows(live, k, src.device)
            scores, rows, last, row_limits = (
                scores[live],
                rows[keep],
                next_token[keep],
                row_limits[keep],
            )
            # A survivor's origin row lies in its own sentence, whose rows share the encoder
            # output and cross-attention keys and values: one index reorders and prunes.
            decoders.keep(rows)
            kept_rows = [b * k + j for b in live for j in range(k)]
            sentence, sentence_limits = (
                [sentence[b] for b in live],
                [sentence_limits[b] for b in live],
            )
            done = [False] * len(live)
        else:
            decoders.reorder(rows)
            last = next_token
        prefixes = [
            prefixes[int(on_host.rows[i])] + [int(on_host.next_token[i])] for i in kept_rows
        ]  # (B*K lists, step + 1 tokens each)
    return finished  # each list kept best first


def keep_best(kept: list[Hypothesis], hypothesis: Hypothesis, k: int) -> None:
    """Add `hypothesis` to a sentence's finished ones, keeping the best k, best first (ties: the
    earlier first)."""
    kept.append(hypothesis)
    kept.sort(key=lambda h: h.score, reverse=True)
    del kept[k:]


def sentence_done(
    kept: list[Hypothesis],
    best_live: float,
    next_length: int,
    limit: int,
    alpha: float,
    k: int,
    stop_early: bool,
) -> bool:
    """True when `kept` holds k finished hypotheses and, unless stop_early, no live one can beat
    the worst of them.

    best_live: the best live hypothesis's log-probability, which can only fall; it would finish
    with at least next_length and at most `limit` tokens (EOS included), so its normalised score
    is at most best_live divided by the larger of the penalties at those lengths (the penalty is
    monotonic in the length: increasing for alpha > 0)."""
    if len(kept) < k:
        return False
    if stop_early:
        return True
    largest_penalty = max(length_penalty(next_length, alpha), length_penalty(limit, alpha))
    return kept[-1].score >= best_live / largest_penalty


def beam_rows(sentences: list[int], k: int, device: torch.device) -> Tensor:
    """Rows of these sentences' beams in the flattened (sentence, beam) batch: (len * K,)."""
    index = torch.tensor(sentences, dtype=torch.long, device=device)
    return (index.unsqueeze(1) * k + torch.arange(k, device=device)).view(-1)


# ---- the fixed-shape search: every row to the batch's end, its state on the device -------------
@dataclass(frozen=True)
class Finished:
    """Each sentence's best finished hypotheses so far, on the device, best first (ties: the
    earlier first, as `keep_best`): B sentences, K = the beam size, L = the batch's longest
    output. An empty place scores -inf."""

    scores: Tensor  # (B, K) length-normalised, in float64 (float32 on MPS, which has no float64)
    tokens: Tensor  # (B, K, L) the first `lengths` of each are its tokens (no EOS)
    lengths: Tensor  # (B, K)

    @classmethod
    def none(cls, batch: int, k: int, length: int, device: torch.device) -> Finished:
        dtype = score_dtype(device)  # float64, but on MPS
        return cls(
            torch.full((batch, k), -torch.inf, dtype=dtype, device=device),
            torch.zeros(batch, k, length, dtype=torch.long, device=device),
            torch.zeros(batch, k, dtype=torch.long, device=device),
        )

    def hypotheses(self) -> list[list[Hypothesis]]:
        """Per sentence, its finished hypotheses, best first: brought to the host at once."""
        scores = self.scores.tolist()
        rows = torch.cat([self.lengths.unsqueeze(2), self.tokens], dim=2).tolist()  # (B, K, 1 + L)
        return [
            [
                Hypothesis(row[1 : 1 + row[0]], score)
                for score, row in zip(sentence_scores, sentence_rows, strict=True)
                if math.isfinite(score)
            ]
            for sentence_scores, sentence_rows in zip(scores, rows, strict=True)
        ]


def kept_finished(
    finished: Finished,
    ended: Tensor,
    ended_scores: Tensor,
    ended_rows: Tensor,
    prefixes: Tensor,
    step: int,
    penalty: float,
) -> Finished:
    """`finished` with this step's ended hypotheses, the best K kept (the device's
    `ended_hypotheses` and `keep_best`). ended (B, K): which of each sentence's best K
    candidates end here (EOS, a finite score, a sentence not done); ended_scores (B, K) their
    log-probabilities; ended_rows (B, K) the rows they continue, whose tokens so far are
    prefixes[row, :step] (prefixes: (B*K, L))."""
    batch, k = ended.shape
    scores = torch.where(ended, ended_scores.to(finished.scores.dtype) / penalty, -torch.inf)
    tokens = prefixes.index_select(0, ended_rows.view(-1)).view(batch, k, -1)  # (B, K, L)
    lengths = torch.full_like(finished.lengths, step)
    all_scores = torch.cat([finished.scores, scores], dim=1)  # (B, 2K): the kept ones first
    order = all_scores.sort(dim=1, descending=True, stable=True).indices[:, :k]  # (B, K)
    return Finished(
        all_scores.gather(1, order),
        torch.cat([finished.tokens, tokens], dim=1).gather(
            1, order.unsqueeze(2).expand(-1, -1, tokens.shape[2])
        ),
        torch.cat([finished.lengths, lengths], dim=1).gather(1, order),
    )


def sentences_done(
    finished: Tensor, best_live: Tensor, largest_penalty: Tensor, stop_early: bool
) -> Tensor:
    """`sentence_done` for every sentence at once, on the device: (B,) True where the sentence
    holds K finished hypotheses (finished: (B, K), best first) and, unless stop_early, the worst
    of them is at least the best live log-probability best_live (B,) divided by the largest
    penalty that hypothesis could still get, largest_penalty (B,)."""
    full = finished[:, -1] > -torch.inf
    if stop_early:
        return full
    return full & (finished[:, -1] >= best_live.to(finished.dtype) / largest_penalty)


@dataclass(frozen=True)
class BeamState:
    """What the fixed-shape search carries from step to step, all on the device."""

    scores: Tensor  # (B, 1) before the first step, then (B, K): the live beams' log-probabilities
    prefixes: Tensor  # (B*K, L) each row's tokens so far (the first `step` columns)
    finished: Finished
    done: Tensor  # (B,) which sentences are done: their rows go on, but nothing they find counts


@dataclass(frozen=True)
class SearchRule:
    """The fixed-shape search's settings, with each sentence's limit (B,) and its penalty
    (float64: the host's `length_penalty`) on the device."""

    k: int
    eos_id: int
    alpha: float
    stop_early: bool
    limits: Tensor
    limit_penalties: Tensor


def advance(
    state: BeamState, log_probs: Tensor, step: int, rule: SearchRule
) -> tuple[BeamState, Tensor, Tensor]:
    """One step of the fixed-shape search from next-token log-probabilities (B*K, V): the new
    state, the rows the survivors continue (B*K,) and their tokens (B*K,). Pure: the device's
    counterpart of the loop body of `beam_search`, without a copy to the host."""
    batch, k = state.done.shape[0], rule.k
    beams = log_probs.view(batch, k, -1)[:, : state.scores.shape[1]]  # step 0: beam 0 alone
    cand_scores, origin, token = beam_step(beams, state.scores, 2 * k)
    scores, rows, next_token = survivors(cand_scores, origin, token, rule.eos_id, k)
    best = (cand_scores[:, :k], origin[:, :k], token[:, :k])  # (B, K) each
    ended = (best[2] == rule.eos_id) & best[0].isfinite() & ~state.done.unsqueeze(1)
    sentence_rows = torch.arange(batch, device=scores.device).unsqueeze(1) * k
    finished = kept_finished(
        state.finished,
        ended,
        best[0],
        sentence_rows + best[1],
        state.prefixes,
        step,
        length_penalty(step + 1, rule.alpha),
    )
    largest_penalty = rule.limit_penalties.clamp(min=length_penalty(step + 2, rule.alpha))
    done = (
        state.done
        | (step + 1 >= rule.limits)
        | sentences_done(finished.scores, scores[:, 0], largest_penalty, rule.stop_early)
    )
    prefixes = state.prefixes.index_select(0, rows)
    prefixes[:, step] = next_token
    return BeamState(scores, prefixes, finished, done), rows, next_token


@torch.no_grad()
def fixed_shape_beam_search(
    model: Transformer | Ensemble,
    src: Tensor,
    *,
    beam_size: int,
    bos_id: int,
    eos_id: int,
    unk_id: int | None = None,
    alpha: float = 0.6,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    min_len: int = 0,
    stop_early: bool = False,
    check_every: int = 4,
    src_padded: bool = True,
) -> list[list[Hypothesis]]:
    """`beam_search` with every row kept to the batch's end and the search's state on the
    device: the same hypotheses (up to float rounding), for a device where each copy to the
    host waits for it (CUDA).

    The batch is rows x the longest output from the first step (each sentence's K beams, all
    BOS at first; the first step reads beam 0's log-probabilities alone, as `beam_search` reads
    its one row), in FixedDecoderCaches, so every step has the same shapes. Finished hypotheses,
    the tokens so far and the stopping rule are tensors (`advance`); a done sentence's rows go
    on, masked: what they find is not kept. Whether every sentence is done is read every
    `check_every` steps, the search's only copies to the host but the limits at its start and
    the hypotheses at its end.
    """
    k, batch, device = beam_size, src.shape[0], src.device
    ensemble = as_ensemble(model)
    limits = max_lengths(src != ensemble.pad_id, max_len_a, max_len_b)  # (B,)
    sentence_limits = [int(limit) for limit in host_values(limits)[0]]
    longest = max(sentence_limits)
    decoders = ensemble.start(src, max_length=longest, padded=src_padded)
    state = BeamState(
        scores=torch.zeros(batch, 1, device=device),
        prefixes=torch.zeros(batch * k, longest, dtype=torch.long, device=device),
        finished=Finished.none(batch, k, longest, device),
        done=torch.zeros(batch, dtype=torch.bool, device=device),
    )
    penalties = [length_penalty(limit, alpha) for limit in sentence_limits]
    penalties = torch.tensor(penalties, dtype=state.finished.scores.dtype).to(device)
    rule = SearchRule(k, eos_id, alpha, stop_early, limits, penalties)
    row_limits = limits.repeat_interleave(k)  # (B*K,)
    last = torch.full((batch * k,), bos_id, dtype=torch.long, device=device)
    for step in range(longest):
        log_probs = next_token_log_probs(
            decoders,
            last[:, None],
            step + 1 >= row_limits,
            step=step,
            min_len=min_len,
            bos_id=bos_id,
            eos_id=eos_id,
            unk_id=unk_id,
        )
        state, rows, last = advance(state, log_probs, step, rule)
        decoders.reorder(rows)
        if (step + 1) % check_every == 0 and host_values(state.done.all())[0][0]:
            break
    return state.finished.hypotheses()
