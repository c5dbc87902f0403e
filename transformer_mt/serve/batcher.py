"""One worker thread runs the model; requests from concurrent clients that wait for it with the
same decode settings (and asking for the same: translations, or scores of given ones) are
answered together (the Translator then batches their lines by
decode.batch_tokens), so that many small requests cost about one batch each, not one each.

The waiting work is bounded in source pieces (`Busy` beyond it: the server answers 503), and
work whose client stopped waiting is cancelled: it leaves the queue at once and is never
computed. The worker also writes each answer's JSON, so that the event loop never holds up
every other client while a large answer is serialised. One Translator serves the server's
lifetime: each group is translated with its own decode settings, from the piece ids the request
was encoded to when it arrived.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from transformer_mt.config import DecodeConfig, Strategy
from transformer_mt.decode.scoring import PairScore, score_encoded
from transformer_mt.decode.translator import Translation, Translator

Result = list[list[Translation]] | list[PairScore | None]
"""Translations: an n-best list per line, the best with its attention map and word alignment
where asked; scores: a score per pair (None: an empty source)."""
BATCH_SIZES_KEPT = 1000  # Batcher.batch_sizes: how many recent batches it remembers


class Busy(Exception):
    """The pending work is at its bound: the client should try again later."""


@dataclass(eq=False)  # work is itself: two equal requests are two pieces of work
class QueuedWork:
    """One admitted request, waiting for the worker."""

    ids: list[list[int]]  # its lines, encoded by Translator.encode
    decode: DecodeConfig
    attention_layer: int | None  # None: no attention asked for
    pieces: int  # source pieces, EOS included: the batch budget and the bound on pending work
    render: Callable[[Result], bytes]  # the answer's bytes, written by the worker thread
    targets: list[list[int]] | None = None  # scores of these translations of the lines; None:
    # translate them (Translator.encode_targets)
    alignment_layer: int | None = None  # None: no word alignment asked for
    prefixes: list[list[int]] | None = None  # each line's prefix (Translator.encode_prefixes)
    terms: list[list[list[int]]] | None = None  # each line's target terms, encoded; None: none
    result: Future = field(default_factory=Future)  # of the rendered answer

    @property
    def key(self) -> tuple:
        """Work with equal keys can share a Translator call (work with prefixes and without
        too: a line without one has the empty prefix)."""
        return (self.decode, self.attention_layer, self.alignment_layer, self.targets is None)


class Batcher:
    def __init__(self, translator: Translator, *, max_pending_pieces: int):
        self.translator = translator
        self.max_pending_pieces = max_pending_pieces
        self.waiting: deque[QueuedWork] = deque()
        self.pending_pieces = 0  # of the work admitted and neither answered nor cancelled
        self.ready = threading.Condition()
        self.stopped = False
        # Requests per Translator call, the newest BATCH_SIZES_KEPT (a server runs for months).
        self.batch_sizes: deque[int] = deque(maxlen=BATCH_SIZES_KEPT)
        self.worker = threading.Thread(target=self.run, name="translate", daemon=True)
        self.worker.start()

    def submit(self, work: QueuedWork) -> Future:
        """Queue the work; its future gives the answer's bytes (cancel it to drop the work).
        Busy when its pieces would take the pending work over max_pending_pieces."""
        with self.ready:
            if self.pending_pieces + work.pieces > self.max_pending_pieces:
                raise Busy(
                    f"{self.pending_pieces} source pieces are pending and this request has "
                    f"{work.pieces}: the limit is {self.max_pending_pieces}"
                )
            self.pending_pieces += work.pieces
            self.waiting.append(work)
            self.ready.notify()
        work.result.add_done_callback(lambda _: self.forget(work))
        return work.result

    def forget(self, work: QueuedWork) -> None:
        """Work ended (answered, failed or cancelled): its pieces stop counting, and cancelled
        work leaves the queue now, so clients that gave up hold no room."""
        with self.ready:
            self.pending_pieces -= work.pieces
            if work in self.waiting:
                self.waiting.remove(work)

    def stop(self) -> None:
        with self.ready:
            self.stopped = True
            abandoned = list(self.waiting)
            self.ready.notify()
        for work in abandoned:
            work.result.cancel()
        self.worker.join()

    def next_group(self) -> list[QueuedWork] | None:
        """The next work to translate together; None once stopped."""
        with self.ready:
            while True:
                while not self.waiting and not self.stopped:
                    self.ready.wait()
                if self.stopped:
                    return None
                if group := self.take_group():
                    return group

    def take_group(self) -> list[QueuedWork]:
        """(Holding the lock.) The oldest waiting work and all other waiting work with its
        settings, up to decode.batch_tokens source pieces in all (the first always goes).
        Sampling work goes alone: its seed alone decides its output. Work cancelled just now
        is dropped here, uncomputed (the empty list if that was the oldest)."""
        first = self.waiting.popleft()
        if not first.result.set_running_or_notify_cancel():
            return []
        group, pieces, others = [first], first.pieces, deque()
        while self.waiting and first.decode.strategy is not Strategy.sample:
            work = self.waiting.popleft()
            fits = pieces + work.pieces <= first.decode.batch_tokens
            if not (work.key == first.key and fits):
                others.append(work)
            elif work.result.set_running_or_notify_cancel():
                group.append(work)
                pieces += work.pieces
        self.waiting.extendleft(reversed(others))  # the others wait on, in their order
        return group

    def run(self) -> None:
        while (group := self.next_group()) is not None:
            self.batch_sizes.append(len(group))
            self.answer(group)

    def answer(self, group: list[QueuedWork]) -> None:
        """Translate (or score) the group's lines in one Translator call and answer each
        request."""
        first = group[0]
        ids = [line for work in group for line in work.ids]
        try:
            results: Result
            if first.targets is not None:
                targets = [line for work in group for line in work.targets]
                results = score_encoded(self.translator, ids, targets, first.decode)
            else:
                if first.decode.strategy is Strategy.sample:  # its seed decides its sample
                    self.translator.backend.reseed(first.decode.seed)
                results = self.translator.translate_encoded(
                    ids,
                    decode=first.decode,
                    attention=first.attention_layer,
                    alignment=first.alignment_layer,
                    prefixes=per_line(group, "prefixes"),
                    terms=per_line(group, "terms"),
                )
        except Exception as error:  # every waiting client hears of it; the worker goes on
            for work in group:
                work.result.set_exception(error)
            return
        start = 0
        for work in group:
            try:
                work.result.set_result(work.render(results[start : start + len(work.ids)]))
            except Exception as error:
                work.result.set_exception(error)
            start += len(work.ids)


def per_line(group: list[QueuedWork], name: str) -> list | None:
    """The group's lines' `name` (QueuedWork.prefixes or terms), [] for the lines of work that
    has none; None where none has any."""
    if all(getattr(work, name) is None for work in group):
        return None
    return [value for work in group for value in (getattr(work, name) or [[] for _ in work.ids])]
