"""Lexically constrained beam search: every finished hypothesis contains each of its sentence's
target terms (a glossary's, decode/glossary.py), as pieces in order, in any order of terms.

Dynamic beam allocation (Post & Vilar, NAACL 2018) in the vectorized form of Hu et al. (NAACL
2019), over the same step as the unconstrained search (search.advance), with tensors only:

- Candidates. Each beam proposes its best 2K continuations (as without constraints) and, for
  each term not met yet, the term's next piece: the piece after the ones written so far of the
  term in progress, or the first piece of each other term when none is in progress. A candidate
  proposed twice counts once.
- State. A hypothesis keeps which terms it has met and the term in progress with how many of
  its pieces are written (`ConstraintState`). Any piece advances the term in progress if it is
  the term's next piece; else it starts the first unmet term that begins with it (or completes
  it, a term of one piece), or leaves no term in progress: the term's pieces so far no longer
  count. (Two unmet terms that begin with the same piece: the first one listed is started.)
- Banks. A candidate's bank is how many term pieces it has written: the pieces of the terms met
  and of the one in progress. The K survivors are taken from the banks in turn, highest bank
  first, each bank's best first (its candidates ranked by score), so that the beam is shared
  among the banks that have candidates, and a bank with fewer takes fewer (Hu et al.'s
  round-robin).
- Word ends. With `Terms.word_ends` (the Translator gives it), a term's last piece leaves the
  term pending, not met: the next piece meets it if it may end a word there (it begins a word,
  '▁', or with a character that is neither a letter nor a digit, or it is EOS), and else drops
  it, so that a term is never the start of a longer word ("Landwirt" is not met by
  "Landwirte"), as a source term is never matched inside one (decode/glossary.py). A pending
  term's pieces count in the bank.
- Ending. EOS is banned until every term is met (or pending); a sentence whose search finds
  no hypothesis that meets them all within its length limit ends with none (the Translator
  then translates it without its terms and marks it).

Every term is at most MAX_TERM_PIECES pieces, a sentence has at most MAX_TERMS terms: a sentence
beyond them (`beyond_search`) is translated without its terms and marked, like one whose terms
the search cannot meet.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from transformer_mt.decode.alignment import WORD_START

NO_TERM = -1
MAX_TERMS = 32
MAX_TERM_PIECES = 32


@dataclass(frozen=True)
class Terms:
    """Each sentence's target terms: pieces (B, M, L) padded with NO_TERM, lengths (B, M) (0:
    no term in that place); word_ends (V,) bool, the pieces that may follow a term's last piece
    (`word_end_pieces`; None: any piece)."""

    pieces: Tensor
    lengths: Tensor
    word_ends: Tensor | None = None

    @classmethod
    def of_ids(
        cls, terms: list[list[list[int]]], device: torch.device, word_ends: Tensor | None = None
    ) -> Terms:
        """Terms from each sentence's list of terms, each a list of piece ids (a sentence may
        have none)."""
        most = max(1, max(len(sentence) for sentence in terms))
        longest = max([1, *(len(term) for sentence in terms for term in sentence)])
        pieces = torch.full((len(terms), most, longest), NO_TERM, dtype=torch.long)
        lengths = torch.zeros((len(terms), most), dtype=torch.long)
        for b, sentence in enumerate(terms):
            for m, term in enumerate(sentence):
                pieces[b, m, : len(term)] = torch.tensor(term, dtype=torch.long)
                lengths[b, m] = len(term)
        ends = None if word_ends is None else word_ends.to(device)
        return cls(pieces.to(device), lengths.to(device), ends)

    def of(self, sentences: Tensor) -> Terms:
        return Terms(
            self.pieces.index_select(0, sentences),
            self.lengths.index_select(0, sentences),
            self.word_ends,
        )

    @property
    def total(self) -> Tensor:
        """(B,) each sentence's term pieces in all: its top bank."""
        return self.lengths.sum(dim=1)


def beyond_search(
    terms: list[list[int]], source_length: int, max_len_a: float, max_len_b: int
) -> bool:
    """Whether a sentence's terms are beyond what the search takes: over MAX_TERMS terms, a
    term of over MAX_TERM_PIECES pieces, or more pieces in all than its length limit leaves
    room for before EOS (source_length: its pieces with EOS). Such a sentence is translated
    without its terms, and marked, without a constrained search."""
    limit = int(max_len_a * source_length + max_len_b)
    return (
        len(terms) > MAX_TERMS
        or any(len(term) > MAX_TERM_PIECES for term in terms)
        or sum(map(len, terms)) >= limit
    )


def word_end_pieces(pieces: list[str], eos_id: int, size: int) -> Tensor:
    """(size,) bool: the pieces (a vocabulary's, in id order, then up to `size` none) that may
    follow a term's last piece: EOS, and a piece that begins a word ('▁') or begins with a
    character that is neither a letter nor a digit. Control and byte pieces ('<0xC3>') may not."""
    ends = [False] * size
    for index, piece in enumerate(pieces):
        special = piece.startswith("<") and piece.endswith(">") and len(piece) > 2
        starts_word = piece[:1] == WORD_START or not piece[:1].isalnum()
        ends[index] = bool(piece) and not special and starts_word
    ends[eos_id] = True
    return torch.tensor(ends, dtype=torch.bool)


@dataclass(frozen=True)
class ConstraintState:
    """Each row's progress through its sentence's terms (rows: a sentence's beams together)."""

    met: Tensor  # (N, M) bool: the terms written whole
    current: Tensor  # (N,) the term in progress, or NO_TERM
    written: Tensor  # (N,) how many of its pieces are written (0 with NO_TERM)
    pending: Tensor  # (N,) the term written whole whose word must end next, or NO_TERM

    @classmethod
    def start(cls, rows: int, terms: int, device: torch.device) -> ConstraintState:
        return cls(
            torch.zeros((rows, terms), dtype=torch.bool, device=device),
            torch.full((rows,), NO_TERM, dtype=torch.long, device=device),
            torch.zeros((rows,), dtype=torch.long, device=device),
            torch.full((rows,), NO_TERM, dtype=torch.long, device=device),
        )

    def rows(self, index: Tensor) -> ConstraintState:
        return ConstraintState(
            self.met.index_select(0, index),
            self.current.index_select(0, index),
            self.written.index_select(0, index),
            self.pending.index_select(0, index),
        )

    def met_or_pending(self) -> Tensor:
        """(N, M) the terms met, and the pending one."""
        which = torch.arange(self.met.shape[1], device=self.met.device)
        return self.met | (which == self.pending.unsqueeze(1))

    def complete(self, terms: Tensor, rows_per_sentence: int) -> Tensor:
        """(N,) whether a row has met every term of its sentence (`terms`: Terms.lengths), the
        pending one counted: EOS may end its word."""
        wanted = (terms > 0).repeat_interleave(rows_per_sentence, dim=0)  # (N, M)
        return (self.met_or_pending() | ~wanted).all(dim=1)


def term_candidates(
    log_probs: Tensor, scores: Tensor, state: ConstraintState, terms: Terms, generated: Tensor
) -> tuple[Tensor, Tensor]:
    """Each beam's term pieces to propose: (totals, tokens), each (B, K, M): the beam's score
    plus the piece's log-probability, -inf where there is no such piece (a term met, or not
    the one in progress, or a piece among the beam's own best continuations `generated`
    (B, K, P), or proposed by an earlier term). log_probs (B, K, V), scores (B, K); `state`
    has the (B*K) rows."""
    batch, beams, _ = log_probs.shape
    pieces, lengths = terms.pieces, terms.lengths  # (B, M, L), (B, M)
    terms_count = pieces.shape[1]
    met = state.met_or_pending().view(batch, beams, terms_count)  # nothing to propose
    current = state.current.view(batch, beams)
    written = state.written.view(batch, beams)
    in_progress = current >= 0  # (B, K)
    # The next piece of the term in progress: pieces[b, current, written].
    flat = pieces.view(batch, terms_count * pieces.shape[2])
    place = current.clamp(min=0) * pieces.shape[2] + written
    continuing = flat.gather(1, place).view(batch, beams)  # (B, K)
    firsts = pieces[:, :, 0].unsqueeze(1).expand(batch, beams, terms_count)  # (B, K, M)
    which = torch.arange(terms_count, device=pieces.device)
    tokens = torch.where(in_progress.unsqueeze(2), continuing.unsqueeze(2), firsts)
    valid = (lengths > 0).unsqueeze(1) & ~met
    valid &= ~in_progress.unsqueeze(2) | (which == current.unsqueeze(2))
    valid &= ~(tokens.unsqueeze(3) == generated.unsqueeze(2)).any(dim=3)
    earlier = which.view(1, 1, -1, 1) < which.view(1, 1, 1, -1)  # (1, 1, M', M): m' < m
    same = (tokens.unsqueeze(3) == tokens.unsqueeze(2)).transpose(2, 3)  # [m', m]
    valid &= ~(same & earlier & valid.unsqueeze(3)).any(dim=2)
    totals = log_probs.gather(2, tokens.clamp(min=0)) + scores.unsqueeze(2)
    return totals.masked_fill(~valid, -torch.inf), tokens.clamp(min=0)


def advanced_state(
    state: ConstraintState, origin_rows: Tensor, tokens: Tensor, terms: Terms, beams: int
) -> tuple[ConstraintState, Tensor]:
    """Every candidate's state after its token, and its bank: origin_rows (B, C) in the
    flattened (sentence, beam) rows of `state` (`beams` rows a sentence), tokens (B, C).
    Returns the state of the B*C candidates and the banks (B, C)."""
    batch, candidates = tokens.shape
    pieces, lengths = terms.pieces, terms.lengths
    terms_count, longest = pieces.shape[1], pieces.shape[2]
    met = state.met.index_select(0, origin_rows.view(-1)).view(batch, candidates, terms_count)
    current = state.current.index_select(0, origin_rows.view(-1)).view(batch, candidates)
    written = state.written.index_select(0, origin_rows.view(-1)).view(batch, candidates)
    pending = state.pending.index_select(0, origin_rows.view(-1)).view(batch, candidates)
    which = torch.arange(terms_count, device=tokens.device)
    if terms.word_ends is not None:  # the pending term is met where its word ends, else dropped
        ends_word = terms.word_ends.gather(0, tokens.view(-1)).view(batch, candidates)
        met = met | ((which == pending.unsqueeze(2)) & ends_word.unsqueeze(2))
    flat = pieces.view(batch, terms_count * longest)
    place = current.clamp(min=0) * longest + written.clamp(max=longest - 1)
    advances = (current >= 0) & (flat.gather(1, place) == tokens)
    starts = (pieces[:, :, 0].unsqueeze(1) == tokens.unsqueeze(2)) & ~met
    starts &= (lengths > 0).unsqueeze(1)  # (B, C, M)
    first_start = torch.where(
        starts.any(dim=2), starts.int().argmax(dim=2), torch.full_like(current, NO_TERM)
    )
    new_current = torch.where(advances, current, first_start)
    new_written = torch.where(advances, written + 1, (first_start >= 0).long())
    term_lengths = lengths.unsqueeze(1).expand(batch, candidates, terms_count)
    length_of_current = term_lengths.gather(2, new_current.clamp(min=0).unsqueeze(2)).squeeze(2)
    finished_term = (new_current >= 0) & (new_written == length_of_current)
    no_term = torch.full_like(new_current, NO_TERM)
    if terms.word_ends is None:
        met = met | (finished_term.unsqueeze(2) & (which == new_current.unsqueeze(2)))
        new_pending = no_term
    else:
        new_pending = torch.where(finished_term, new_current, no_term)
    new_current = torch.where(finished_term, no_term, new_current)
    new_written = torch.where(finished_term, torch.zeros_like(new_written), new_written)
    pending_length = torch.where(finished_term & (new_pending >= 0), length_of_current, 0)
    banks = (met * term_lengths).sum(dim=2) + new_written + pending_length
    return (
        ConstraintState(
            met.view(batch * candidates, terms_count),
            new_current.view(-1),
            new_written.view(-1),
            new_pending.view(-1),
        ),
        banks,
    )


def round_robin_order(scores: Tensor, banks: Tensor, top_bank: Tensor) -> Tensor:
    """The candidates' order (B, C) for taking survivors: each bank's best, from the highest
    bank down, then each bank's second best, and so on; candidates at -inf last. scores, banks
    (B, C); top_bank (B,) the sentence's highest bank (its term pieces in all)."""
    by_score = scores.argsort(dim=1, descending=True, stable=True)
    banks_by_score = banks.gather(1, by_score)
    by_bank = banks_by_score.argsort(dim=1, stable=True)  # within a bank: by score
    order = by_score.gather(1, by_bank)  # (B, C): by bank, then by score
    sorted_banks = banks.gather(1, order)
    positions = torch.arange(order.shape[1], device=order.device).expand_as(order)
    starts = torch.ones_like(sorted_banks, dtype=torch.bool)
    starts[:, 1:] = sorted_banks[:, 1:] != sorted_banks[:, :-1]
    bank_start = torch.where(starts, positions, torch.zeros_like(positions)).cummax(dim=1).values
    rank = positions - bank_start  # each candidate's place in its bank, by score
    span = top_bank.unsqueeze(1) + 1
    key = rank * span + (top_bank.unsqueeze(1) - sorted_banks)
    key = torch.where(scores.gather(1, order) > -torch.inf, key, torch.iinfo(key.dtype).max)
    return order.gather(1, key.argsort(dim=1, stable=True))
