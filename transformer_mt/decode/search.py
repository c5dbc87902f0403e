"""Greedy and beam search over a Transformer's encode / decode interface (tensors only; sampling,
which shares the greedy loop, is in sampling.py).

Every search is batched over sentences (times beams) with the decoder's KV cache; cross-attention
keys and values are computed once per sentence and kept for every step (a sentence's beams read
them together: DecoderCache.repeat_rows). A sentence that is done leaves the batch (except in a
batch of fixed shape, below): its rows are dropped from the tokens, the encoder output and the
cache, so later steps compute only live sentences.

Beam search is one pure step, `advance`, over a typed state (`BeamState`, with `SearchRule`):
`beam_step` and `survivors` choose the best candidates from log-probabilities, `kept_finished`
keeps each sentence's best finished hypotheses, `sentences_done` is the stopping rule. A small
loop (`beam_search`) runs it, reorders the KV cache by each survivor's origin and lets done
sentences leave. Scores are length-normalised with the GNMT penalty lp(Y) = ((5 + |Y|) / 6) **
alpha, where |Y| counts the generated tokens including EOS.

Stopping rule (tensor2tensor's, exact for the beam): a sentence keeps its best beam_size finished
hypotheses (an EOS among the best beam_size of the 2 * beam_size candidates of a step finishes
one) and is done only when it holds beam_size of them and no live hypothesis can still beat the
worst: a live hypothesis's log-probability can only fall, so its best normalised score is bounded
by its score divided by the largest penalty it could still get (at the sentence's length limit
for alpha >= 0). Or at its length limit. A caller that keeps only the best `nbest` (< beam_size)
asks for less: done when the nbest-th best finished one cannot be beaten, which gives the same
best nbest hypotheses, sooner (no hypothesis found later could rank among them). fairseq's and
CTranslate2's rule (done at beam_size finished hypotheses: `stop_early`) is faster but lets a
confident model collect short endings before its best hypothesis finishes. With alpha = 0 a beam
of one is exactly greedy.

Every search runs an `Ensemble`: a single model is the ensemble of one. Members keep their own
encoder output and KV cache (`Decoders`), pruned and reordered together; the next-token
distribution is the mean of the members' probabilities (`combined_log_probs`).

What a loop decides on the host (greedy: which rows ended, and their tokens; beam search: which
sentences are done) comes from the device in one copy per step (`host_values`): on a GPU each
value read on its own is a wait for the device. Greedy keeps its tokens so far on the host, row
by row; beam search keeps its whole state on the device (the tokens so far, the finished
hypotheses) and brings its hypotheses to the host once, at its end.

With fixed_shape (`fixed_shape_beam_search`: for CUDA, where even that copy costs; the execution
policy chooses it, decode.batch_shape) the same search keeps every row to the batch's end in KV
caches of fixed shape (model.FixedDecoderCache), so every step has the same shapes, and the host
reads whether every sentence is done every `check_every` steps. The same step and the same rule:
it finds the hypotheses the shrinking batch finds, up to float rounding (its products run in
batches of other shapes), each sentence stopped at the same step (tests/decode/test_fixed_shape.py).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer_mt.decode.alignment import WORD_START
from transformer_mt.decode.constraints import (
    ConstraintState,
    Terms,
    advanced_state,
    round_robin_order,
    term_candidates,
)
from transformer_mt.execution import score_dtype
from transformer_mt.model import (
    DecoderCache,
    EncoderOutput,
    FixedDecoderCache,
    KVCache,
    Transformer,
)

NO_TOKEN = -1
"""A place that holds no token: in the tokens so far (BeamState.prefixes, Finished.tokens) one
not written yet; in a target prefix (the searches' `prefix`) one past the prefix's end."""


@dataclass(frozen=True)
class Hypothesis:
    tokens: list[int]  # without BOS and EOS
    score: float  # beam search: length-penalised sum of log-probabilities; else the plain sum
    unmet_terms: bool = False  # searched without its target terms, which no hypothesis met


def length_penalty(length: int, alpha: float) -> float:
    """GNMT: ((5 + length) / 6) ** alpha."""
    return ((5.0 + length) / 6.0) ** alpha


def max_lengths(
    src_keep: Tensor, max_len_a: float, max_len_b: int, prefix: Tensor | None = None
) -> Tensor:
    """Output limit per sentence, EOS included: a * source length + b (the model's positions
    have no limit of their own), and at least a target prefix's length + 1 (`prefix`: (B, P)
    token ids, NO_TOKEN past each one's end), so that every prefix is written whole."""
    source_lengths = src_keep.sum(dim=1) - 1  # sources end with EOS, which is not counted
    limits = (max_len_a * source_lengths + max_len_b).long()  # (B,)
    if prefix is None:
        return limits
    return torch.maximum(limits, (prefix >= 0).sum(dim=1) + 1)  # a WORD_NEXT is not a piece


WORD_NEXT = -2
"""In a target prefix (B, P), the place after a prefix text that ends in a space: the token
there is free, but must begin a word (or be EOS): one of the search's `word_starts`."""


def word_start_pieces(pieces: list[str], eos_id: int, size: int) -> Tensor:
    """(size,) bool: the pieces (a vocabulary's, in id order, then up to `size` none) that
    begin a word ('▁' first), and EOS: what may follow a prefix that ends in a space."""
    starts = [piece[:1] == WORD_START for piece in pieces] + [False] * (size - len(pieces))
    starts[eos_id] = True
    return torch.tensor(starts, dtype=torch.bool)


def forced_tokens(prefix: Tensor | None, step: int, rows: int) -> Tensor | None:
    """The token each row must take at `step` (N = sentences x `rows`: each sentence's rows
    together), NO_TOKEN where its prefix has ended (WORD_NEXT where a word must begin); None
    when no prefix reaches `step`."""
    if prefix is None or step >= prefix.shape[1]:
        return None
    return prefix[:, step].repeat_interleave(rows)


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


# Logits a member computes at once when scoring given targets (a chunk of rows): 64 MiB of
# float32, whatever the batch (decode.batch_tokens is 16,384 on CUDA: its logits over
# a 32,000-piece vocabulary would be 2 GiB a member, and as much again for the log-softmax).
SCORE_CHUNK_LOGITS = 2**24


@torch.no_grad()
def teacher_forced_log_probs(
    model: Transformer | Ensemble, src: Tensor, targets: Tensor, *, bos_id: int, src_padded: bool
) -> Tensor:
    """The log-probability (B, T) of each token of `targets` (B, T: a target's ids, then EOS,
    then PAD) after BOS and the target's tokens before it, for sources src (B, S): the members'
    teacher-forced logits combined as every search combines them at a step (`combined_log_probs`
    of float32 logits; tokens a search bans are not renormalised away there either), 0 at PAD.
    Summed over a target, it is the log-probability that a search scores that output with, up
    to float rounding (a search computes a step at a time, in batches of other shapes)."""
    ensemble = as_ensemble(model)
    vocab = ensemble.models[0].embed.num_embeddings
    rows = max(1, SCORE_CHUNK_LOGITS // (targets.shape[1] * vocab))
    if targets.shape[0] > rows:  # a chunk of rows at a time: the logits' memory stays bounded
        chunks = [
            teacher_forced_log_probs(
                ensemble,
                src[start : start + rows],
                targets[start : start + rows],
                bos_id=bos_id,
                src_padded=src_padded,
            )
            for start in range(0, targets.shape[0], rows)
        ]
        return torch.cat(chunks)
    pad_id = ensemble.pad_id
    bos = torch.full_like(targets[:, :1], bos_id)
    tgt_in = torch.cat([bos, targets[:, :-1]], dim=1)  # PAD after EOS: later positions only
    logits = [
        member.decode(tgt_in, member.encode(src, padded=src_padded)).float()
        for member in ensemble.models
    ]
    picked = combined_log_probs(logits).gather(2, targets.unsqueeze(2)).squeeze(2)
    return picked.masked_fill(targets == pad_id, 0.0)


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
    forced: Tensor | None = None,
    word_starts: Tensor | None = None,
) -> Tensor:
    """Log-probabilities (N, V) of the token after `last` (N, 1), the `step`-th generated one,
    with banned tokens at -inf (not renormalised over the tokens left).

    Banned: PAD, BOS and (given unk_id) the unknown piece; EOS before min_len generated tokens;
    anything but EOS in rows `at_limit` (N,). The limit wins over min_len. at_limit None: no row
    is at its limit (the searches know it on the host). forced (N,): in the rows where it holds
    a token (a target prefix's: `forced_tokens`), every other token; the forced token keeps its
    log-probability, so that a prefixed output scores as the same output found unprefixed. In
    the rows where it holds WORD_NEXT, the tokens not in word_starts (V,) (given).
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
    if forced is not None:
        column = forced.clamp(min=0).unsqueeze(1)  # (N, 1)
        only = torch.full_like(log_probs, -torch.inf)
        only.scatter_(1, column, log_probs.gather(1, column))
        free = log_probs
        if word_starts is not None:
            word_next = (forced == WORD_NEXT).unsqueeze(1) & ~word_starts
            free = log_probs.masked_fill(word_next, -torch.inf)
        log_probs = torch.where((forced < 0).unsqueeze(1), free, only)
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
    prefix: Tensor | None = None,
    word_starts: Tensor | None = None,
) -> list[Hypothesis]:
    """One hypothesis per sentence, one token per step picked by `choose` (greedy: the most
    probable; sampling: a draw); scored by the model's log-probabilities. A row leaves the batch
    at its EOS. src_padded=False: no source is padded (Ensemble.start), in every search.
    prefix (B, P): each sentence's output begins with these tokens (NO_TOKEN past its end; a
    WORD_NEXT: the next token begins a word, one of word_starts (V,)), in every search."""
    decoders = as_ensemble(model).start(src, padded=src_padded)
    limits = max_lengths(decoders.src_keep, max_len_a, max_len_b, prefix)  # (N,)
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
            forced=forced_tokens(prefix, step, 1),
            word_starts=word_starts,
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
            prefix = None if prefix is None else prefix[index]
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
    prefix: Tensor | None = None,
    word_starts: Tensor | None = None,
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
        prefix=prefix,
        word_starts=word_starts,
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


# ---- beam search: a pure step over the search's state (`advance`), and the loop that runs it ---


@dataclass(frozen=True)
class Finished:
    """Each sentence's best finished hypotheses so far, on the device, best first (ties: the
    earlier first): B sentences, K = the beam size, L = the batch's longest output. An empty place
    scores -inf."""

    scores: Tensor  # (B, K) length-normalised, in float64 (float32 on MPS, which has no float64)
    tokens: Tensor  # (B, K, L) each one's tokens (no EOS), then NO_TOKEN

    @classmethod
    def none(cls, batch: int, k: int, length: int, device: torch.device) -> Finished:
        dtype = score_dtype(device)  # float64, but on MPS
        return cls(
            torch.full((batch, k), -torch.inf, dtype=dtype, device=device),
            torch.full((batch, k, length), NO_TOKEN, dtype=torch.long, device=device),
        )

    def of(self, sentences: Tensor) -> Finished:
        """Sentences `sentences` (n,) alone."""
        return Finished(
            self.scores.index_select(0, sentences), self.tokens.index_select(0, sentences)
        )


def hypotheses(parts: Sequence[tuple[list[int], Finished]]) -> list[list[Hypothesis]]:
    """Per sentence, its finished hypotheses, best first, from (input indices, their Finished)
    pairs that hold every sentence once: brought to the host in one copy, in the scores' dtype
    (token ids, far below 2 ** 24, are exact in float32 too)."""
    places = torch.cat(
        [torch.cat([f.scores.unsqueeze(2), f.tokens.to(f.scores)], dim=2) for _, f in parts]
    ).tolist()  # (B, K, 1 + L): the score, then the tokens
    order = [sentence for sentences, _ in parts for sentence in sentences]
    found: list[list[Hypothesis]] = [[] for _ in order]
    for sentence, sentence_places in zip(order, places, strict=True):
        found[sentence] = [
            Hypothesis([int(t) for t in place[1:] if t != NO_TOKEN], place[0])
            for place in sentence_places
            if math.isfinite(place[0])
        ]
    return found


def kept_finished(finished: Finished, ended_scores: Tensor, ended_tokens: Tensor) -> Finished:
    """`finished` with this step's ended hypotheses, the best K of each sentence kept.
    ended_scores (B, K): each sentence's best K candidates' normalised scores where they end
    here, -inf where not; ended_tokens (B, K, L) their tokens (no EOS). A stable sort with the
    kept ones first: of equal scores, the one found earlier (or the better candidate of a step)
    stays ahead."""
    all_scores = torch.cat([finished.scores, ended_scores], dim=1)  # (B, 2K): the kept ones first
    order = all_scores.sort(dim=1, descending=True, stable=True).indices[:, : ended_scores.shape[1]]
    return Finished(
        all_scores.gather(1, order),  # (B, K)
        torch.cat([finished.tokens, ended_tokens], dim=1).gather(
            1, order.unsqueeze(2).expand(-1, -1, ended_tokens.shape[2])
        ),
    )


def sentences_done(
    finished: Tensor,
    best_live: Tensor,
    largest_penalty: Tensor,
    stop_early: bool,
    nbest: int | None = None,
) -> Tensor:
    """The stopping rule, for every sentence at once: (B,) True where the sentence holds K
    finished hypotheses (finished: (B, K) normalised scores, best first) and, unless stop_early,
    no live one can beat the worst of them (given nbest < K: where it holds nbest and no live
    one can beat the nbest-th best, for a caller that keeps only those). best_live (B,): the
    best live hypothesis's log-probability, which can only fall; largest_penalty (B,): the
    largest length penalty it could still get (the penalty is monotonic in the length: at the
    next step's length or at the sentence's limit), so its normalised score is at most
    best_live / largest_penalty."""
    if stop_early:
        return finished[:, -1] > -torch.inf
    kept = finished[:, -1] if nbest is None else finished[:, min(nbest, finished.shape[1]) - 1]
    return (kept > -torch.inf) & (kept >= best_live.to(finished.dtype) / largest_penalty)


@dataclass(frozen=True)
class BeamState:
    """What beam search carries from step to step, all on the device."""

    scores: Tensor  # (B, 1) before the first step, then (B, K): the live beams' log-probabilities
    prefixes: Tensor  # (B*K, L) each row's tokens so far (the first `step` places), then NO_TOKEN
    finished: Finished
    done: Tensor  # (B,) which sentences are done: nothing their rows find counts any more
    terms: ConstraintState | None = None  # (B*K rows) progress through target terms, or none

    @classmethod
    def start(
        cls, batch: int, k: int, length: int, device: torch.device, terms: Terms | None = None
    ) -> BeamState:
        return cls(
            scores=torch.zeros(batch, 1, device=device),
            prefixes=torch.full((batch * k, length), NO_TOKEN, dtype=torch.long, device=device),
            finished=Finished.none(batch, k, length, device),
            done=torch.zeros(batch, dtype=torch.bool, device=device),
            terms=None
            if terms is None
            else ConstraintState.start(batch * k, terms.lengths.shape[1], device),
        )

    def of(self, sentences: Tensor, rows: Tensor) -> BeamState:
        """Sentences `sentences` (n,) alone, whose beams are rows `rows` (n*K,)."""
        return BeamState(
            self.scores.index_select(0, sentences),
            self.prefixes.index_select(0, rows),
            self.finished.of(sentences),
            self.done.index_select(0, sentences),
            None if self.terms is None else self.terms.rows(rows),
        )


@dataclass(frozen=True)
class SearchRule:
    """Beam search's settings, with each sentence's length limit (B,) and the length penalty
    there (in the finished scores' dtype: the exact `length_penalty`) on the device."""

    k: int
    eos_id: int
    alpha: float
    stop_early: bool
    limits: Tensor
    limit_penalties: Tensor
    terms: Terms | None = None  # each sentence's target terms (decode/constraints.py), or none
    nbest: int | None = None  # the hypotheses the caller keeps (`sentences_done`); None: K

    def of(self, sentences: Tensor) -> SearchRule:
        """Sentences `sentences` (n,) alone."""
        return replace(
            self,
            limits=self.limits.index_select(0, sentences),
            limit_penalties=self.limit_penalties.index_select(0, sentences),
            terms=None if self.terms is None else self.terms.of(sentences),
        )


def advance(
    state: BeamState, log_probs: Tensor, step: int, rule: SearchRule
) -> tuple[BeamState, Tensor, Tensor]:
    """One step of beam search from next-token log-probabilities, (B, V) at the first step
    (every beam of a sentence is BOS alone: one row each) or (B*K, V): the new state, the rows
    the survivors continue (B*K,) and their tokens (B*K,). Without a copy to the host; pure but
    for `log_probs`, whose EOS column a search with terms sets to -inf where they are unmet.

    Of each sentence's best K candidates, those that end in EOS (at a finite score, in a
    sentence not done) join its finished hypotheses (`kept_finished`); the sentence is done at
    its length limit or by the stopping rule (`sentences_done`)."""
    batch, k = state.done.shape[0], rule.k
    beams = log_probs.view(batch, -1, log_probs.shape[1])  # (B, 1 or K, V)
    beams = beams[:, : state.scores.shape[1]]  # the first step: beam 0 alone
    terms = None
    if rule.terms is None:
        cand_scores, origin, token = beam_step(beams, state.scores, 2 * k)
        scores, rows, next_token = survivors(cand_scores, origin, token, rule.eos_id, k)
        best, best_origin, best_token = cand_scores[:, :k], origin[:, :k], token[:, :k]
    else:
        chosen = constrained_choice(beams, state, rule)
        scores, rows, next_token, terms = chosen.survivors
        best, best_origin, best_token = chosen.best
    # > -inf: a candidate that exists (not NaN either)
    ended = (best_token == rule.eos_id) & (best > -torch.inf) & ~state.done.unsqueeze(1)
    normalised = best.to(state.finished.scores.dtype) / length_penalty(step + 1, rule.alpha)
    ended_rows = torch.arange(batch, device=rows.device).unsqueeze(1) * k + best_origin
    ended_tokens = state.prefixes.index_select(0, ended_rows.view(-1)).view(batch, k, -1)
    finished = kept_finished(
        state.finished, torch.where(ended, normalised, -torch.inf), ended_tokens
    )
    largest_penalty = rule.limit_penalties.clamp(min=length_penalty(step + 2, rule.alpha))
    done = (
        state.done
        | (step + 1 >= rule.limits)
        | sentences_done(
            finished.scores, scores[:, 0], largest_penalty, rule.stop_early, rule.nbest
        )
    )
    prefixes = state.prefixes.index_select(0, rows)
    prefixes[:, step] = next_token
    return BeamState(scores, prefixes, finished, done, terms), rows, next_token


@dataclass(frozen=True)
class ConstrainedChoice:
    """A constrained step's choice (`constrained_choice`): survivors as `survivors` gives them
    (scores (B, K), rows (B*K,), tokens (B*K,)) with their ConstraintState, and the best K
    candidates whose EOS finishes a hypothesis (scores, origin beams, tokens: each (B, K))."""

    survivors: tuple[Tensor, Tensor, Tensor, ConstraintState]
    best: tuple[Tensor, Tensor, Tensor]


def constrained_choice(beams: Tensor, state: BeamState, rule: SearchRule) -> ConstrainedChoice:
    """The step of a search with target terms (decode/constraints.py): from each beam's best 2K
    continuations and its term pieces, candidates taken from the banks in turn
    (`round_robin_order`); the first K in that order are the best (an EOS among them
    finishes), the first K that do not end survive, best first. beams (B, 1 or K, V)."""
    batch, beams_now, vocab = beams.shape
    k, terms = rule.k, rule.terms
    first_beams = (
        torch.arange(batch, device=beams.device).unsqueeze(1) * k
        + torch.arange(beams_now, device=beams.device)
    ).view(-1)
    progress = state.terms.rows(first_beams)  # (B * beams_now) rows, as `beams`
    complete = progress.complete(terms.lengths, beams_now).view(batch, beams_now)
    beams[..., rule.eos_id] = torch.where(complete, beams[..., rule.eos_id], -torch.inf)
    top_log_probs, top_tokens = beams.topk(min(2 * k, vocab), dim=-1)  # (B, b, P)
    generated = top_log_probs + state.scores.unsqueeze(-1)
    term_totals, term_tokens = term_candidates(beams, state.scores, progress, terms, top_tokens)
    totals = torch.cat([generated, term_totals], dim=2).view(batch, -1)  # (B, C)
    tokens = torch.cat([top_tokens, term_tokens], dim=2).view(batch, -1)
    per_beam = top_tokens.shape[2] + term_tokens.shape[2]
    origin = torch.arange(beams_now, device=beams.device).repeat_interleave(per_beam)
    origin = origin.expand(batch, -1)  # (B, C) each candidate's beam
    origin_rows = torch.arange(batch, device=beams.device).unsqueeze(1) * beams_now + origin
    after, banks = advanced_state(progress, origin_rows, tokens, terms, beams_now)
    order = round_robin_order(totals, banks, terms.total)  # (B, C)
    best = order[:, :k]
    positions = torch.arange(order.shape[1], device=order.device).expand_as(order)
    ends = tokens.gather(1, order) == rule.eos_id
    alive = positions + ends * order.shape[1]  # candidates that end go after the others
    kept = order.gather(1, alive.argsort(dim=1, stable=True)[:, :k])  # (B, K)
    kept = kept.gather(1, totals.gather(1, kept).argsort(dim=1, descending=True, stable=True))
    chosen_rows = torch.arange(batch, device=beams.device).unsqueeze(1) * k + origin.gather(1, kept)
    candidates = torch.arange(batch, device=beams.device).unsqueeze(1) * order.shape[1] + kept
    return ConstrainedChoice(
        survivors=(
            totals.gather(1, kept),
            chosen_rows.view(-1),
            tokens.gather(1, kept).view(-1),
            after.rows(candidates.view(-1)),
        ),
        best=(totals.gather(1, best), origin.gather(1, best), tokens.gather(1, best)),
    )


@dataclass
class LiveSentences:
    """The live sentences of a beam search's batch, as its loop keeps them: the members'
    decoders, the search's state and rule, and each row's last token on the device; each
    sentence's input index on the host."""

    decoders: Decoders
    state: BeamState
    rule: SearchRule
    last: Tensor  # (B,) at the first step of a shrinking batch (one row a sentence), else (B*K,)
    sentences: list[int]
    prefix: Tensor | None = None  # (B, P) each live sentence's target prefix, or none

    def forced(self, step: int) -> Tensor | None:
        """The token each row must take at this step (`forced_tokens`)."""
        return forced_tokens(self.prefix, step, len(self.last) // len(self.sentences))

    def at_limit(self, step: int) -> Tensor:
        """Which rows are at their length limit at this step (N,): only EOS may follow there."""
        rows = len(self.last) // len(self.sentences)  # 1 or K a sentence
        return (step + 1 >= self.rule.limits).repeat_interleave(rows)

    def leave(self, done: list[float], rows: Tensor) -> tuple[list[int], Finished]:
        """Sentences `done` (True or False, each) leave: (their input indices, their finished
        hypotheses). The rest's rows become the survivors `rows` (B*K,), as a step's
        `reorder` makes them."""
        live = [b for b, d in enumerate(done) if not d]
        gone = [b for b, d in enumerate(done) if d]
        device, k = rows.device, self.rule.k
        left = self.state.finished.of(torch.tensor(gone, device=device))
        kept = torch.tensor(live, device=device)
        kept_rows = (kept.unsqueeze(1) * k + torch.arange(k, device=device)).view(-1)  # (n*K,)
        self.state, self.rule = self.state.of(kept, kept_rows), self.rule.of(kept)
        # A survivor's origin row lies in its own sentence, whose rows share the encoder output
        # and cross-attention keys and values: one index reorders and prunes.
        self.decoders.keep(rows.index_select(0, kept_rows))
        self.last = self.last.index_select(0, kept_rows)
        if self.prefix is not None:
            self.prefix = self.prefix.index_select(0, kept)
        gone_sentences = [self.sentences[b] for b in gone]
        self.sentences = [self.sentences[b] for b in live]
        return gone_sentences, left


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
    fixed_shape: bool = False,
    check_every: int = 4,
    src_padded: bool = True,
    prefix: Tensor | None = None,
    word_starts: Tensor | None = None,
    terms: Terms | None = None,
    nbest: int | None = None,
) -> list[list[Hypothesis]]:
    """Per sentence, up to beam_size finished hypotheses, best first: `advance` step after
    step until every sentence is done (the module's stopping rule; stop_early: fairseq's).
    nbest: the caller keeps only the best nbest (None: all): the first nbest are exact, and
    the search may stop before the rest are (`sentences_done`).
    prefix (B, P): each sentence's hypotheses begin with these tokens (NO_TOKEN past its end;
    at the steps of a prefix a sentence has one live beam; WORD_NEXT: a token of word_starts,
    (V,)). terms: each sentence's target terms, which every finished hypothesis contains
    (decode/constraints.py); a sentence whose search finds none that does within its length
    limit gets an empty list.

    After each step the host reads which sentences are done (the step's one copy), and their
    rows leave the batch. fixed_shape (for CUDA; the execution policy's decode.batch_shape):
    every row stays to the batch's end, in FixedDecoderCaches, each sentence's K rows from the
    first step (which reads beam 0's log-probabilities alone, as a shrinking batch reads its
    sentence's one row), so every step has the same shapes; a done sentence's rows go on, and
    nothing they find counts. The host then reads whether every sentence is done every
    `check_every` steps. Both find the same hypotheses, up to float rounding.
    """
    k, batch, device = beam_size, src.shape[0], src.device
    ensemble = as_ensemble(model)
    limits = max_lengths(src != ensemble.pad_id, max_len_a, max_len_b, prefix)  # (B,)
    sentence_limits = [int(limit) for limit in host_values(limits)[0]]
    longest = max(sentence_limits)
    state = BeamState.start(batch, k, longest, device, terms)
    penalties = [length_penalty(limit, alpha) for limit in sentence_limits]
    penalties = torch.tensor(penalties, dtype=state.finished.scores.dtype).to(device)
    live = LiveSentences(
        ensemble.start(src, max_length=longest if fixed_shape else None, padded=src_padded),
        state,
        SearchRule(k, eos_id, alpha, stop_early, limits, penalties, terms, nbest),
        torch.full((batch * (k if fixed_shape else 1),), bos_id, dtype=torch.long, device=device),
        list(range(batch)),
        prefix,
    )
    left: list[tuple[list[int], Finished]] = []  # the sentences that left the batch
    for step in range(longest):
        log_probs = next_token_log_probs(
            live.decoders,
            live.last[:, None],
            # a fixed shape: the same work every step; else a mask only once it can matter
            live.at_limit(step) if fixed_shape or step + 1 >= min(sentence_limits) else None,
            step=step,
            min_len=min_len,
            bos_id=bos_id,
            eos_id=eos_id,
            unk_id=unk_id,
            forced=live.forced(step),
            word_starts=word_starts,
        )
        if step == 0 and not fixed_shape:
            live.decoders.repeat_beams(k)  # row b becomes rows b * k ... b * k + k - 1
        live.state, rows, live.last = advance(live.state, log_probs, step, live.rule)
        if not fixed_shape or (step + 1) % check_every == 0:
            done = host_values(live.state.done)[0]
            if all(done):
                break
            if any(done) and not fixed_shape:
                left.append(live.leave(done, rows))
                continue
        live.decoders.reorder(rows)
    return hypotheses([*left, (live.sentences, live.state.finished)])


def fixed_shape_beam_search(
    model: Transformer | Ensemble, src: Tensor, *, check_every: int = 4, **settings
) -> list[list[Hypothesis]]:
    """`beam_search` with fixed_shape: every row to the batch's end (CUDA's)."""
    return beam_search(model, src, fixed_shape=True, check_every=check_every, **settings)
