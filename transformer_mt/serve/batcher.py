"""One worker thread runs the model; requests from concurrent clients that wait for it with the
same decode settings are translated together (the Translator then batches their lines by
decode.batch_tokens), so that many small requests cost about one batch each, not one each.

The waiting work is bounded in source pieces (`Busy` beyond it: the server answers 503), and a
job whose client stopped waiting is cancelled: it leaves the queue at once and is never
computed. The worker also writes each answer's JSON, so that the event loop never holds up
every other client while a large answer is serialised.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from transformer_mt.config import DecodeConfig, Strategy
from transformer_mt.decode.translator import AttentionMap, Translation, Translator

Result = list[tuple[list[Translation], AttentionMap | None]]


class Busy(Exception):
    """The pending work is at its bound: the client should try again later."""


@dataclass(eq=False)  # a job is itself: two equal requests are two jobs
class Job:
    lines: list[str]
    decode: DecodeConfig
    attention_layer: int | None  # None: no attention asked for
    pieces: int  # source pieces, EOS included: the batch budget and the bound on pending work
    render: Callable[[Result], bytes]  # the answer's bytes, written by the worker thread
    result: Future = field(default_factory=Future)  # of the rendered answer

    @property
    def key(self) -> tuple:
        """Jobs with equal keys can share a Translator call."""
        return (self.decode, self.attention_layer)


class Batcher:
    def __init__(self, translator: Translator, *, max_pending_pieces: int):
        self.translator = translator
        self.max_pending_pieces = max_pending_pieces
        self.waiting: deque[Job] = deque()
        self.pending_pieces = 0  # of the jobs admitted and neither answered nor cancelled
        self.ready = threading.Condition()
        self.stopped = False
        self.batch_sizes: list[int] = []  # requests per Translator call, for tests and logs
        self.worker = threading.Thread(target=self.run, name="translate", daemon=True)
        self.worker.start()

    def submit(self, job: Job) -> Future:
        """Queue the job; its future gives the answer's bytes (cancel it to drop the job).
        Busy when its pieces would take the pending work over max_pending_pieces."""
        with self.ready:
            if self.pending_pieces + job.pieces > self.max_pending_pieces:
                raise Busy(
                    f"{self.pending_pieces} source pieces are pending and this request has "
                    f"{job.pieces}: the limit is {self.max_pending_pieces}"
                )
            self.pending_pieces += job.pieces
            self.waiting.append(job)
            self.ready.notify()
        job.result.add_done_callback(lambda _: self.forget(job))
        return job.result

    def forget(self, job: Job) -> None:
        """A job ended (answered, failed or cancelled): its pieces stop counting, and a
        cancelled one leaves the queue now, so clients that gave up hold no room."""
        with self.ready:
            self.pending_pieces -= job.pieces
            if job in self.waiting:
                self.waiting.remove(job)

    def stop(self) -> None:
        with self.ready:
            self.stopped = True
            abandoned = list(self.waiting)
            self.ready.notify()
        for job in abandoned:
            job.result.cancel()
        self.worker.join()

    def next_group(self) -> list[Job] | None:
        """The next jobs to translate together; None once stopped."""
        with self.ready:
            while True:
                while not self.waiting and not self.stopped:
                    self.ready.wait()
                if self.stopped:
                    return None
                if group := self.take_group():
                    return group

    def take_group(self) -> list[Job]:
        """(Holding the lock.) The oldest waiting job and every other waiting job with its
        settings, up to decode.batch_tokens source pieces in all (the first job always goes).
        A sampling job goes alone: its seed alone decides its output. A job cancelled just now
        is dropped here, uncomputed (the empty list if that was the oldest)."""
        first = self.waiting.popleft()
        if not first.result.set_running_or_notify_cancel():
            return []
        group, pieces, others = [first], first.pieces, deque()
        while self.waiting and first.decode.strategy is not Strategy.sample:
            job = self.waiting.popleft()
            fits = pieces + job.pieces <= first.decode.batch_tokens
            if not (job.key == first.key and fits):
                others.append(job)
            elif job.result.set_running_or_notify_cancel():
                group.append(job)
                pieces += job.pieces
        self.waiting.extendleft(reversed(others))  # the others wait on, in their order
        return group

    def run(self) -> None:
        while (group := self.next_group()) is not None:
            self.batch_sizes.append(len(group))
            self.translate(group)

    def translate(self, group: list[Job]) -> None:
        """Translate the group's lines in one Translator call and answer each job."""
        first = group[0]
        lines = [line for job in group for line in job.lines]
        translator = Translator(
            self.translator.backend,
            self.translator.tokenizers,
            first.decode,
            unicode_form=self.translator.unicode_form,
        )
        if first.decode.strategy is Strategy.sample:  # only ModelSearch offers it
            self.translator.backend.reseed(first.decode.seed)
        try:
            if first.attention_layer is None:
                results = [(n, None) for n in translator.translate_nbest(lines)]
            else:
                results = translator.translate_with_attention(lines, first.attention_layer)
        except Exception as error:  # every waiting client hears of it; the worker goes on
            for job in group:
                job.result.set_exception(error)
            return
        start = 0
        for job in group:
            try:
                job.result.set_result(job.render(results[start : start + len(job.lines)]))
            except Exception as error:
                job.result.set_exception(error)
            start += len(job.lines)
