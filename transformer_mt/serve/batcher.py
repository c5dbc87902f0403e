"""One worker thread runs the model; requests from concurrent clients that wait for it with the
same decode settings are translated together (the Translator then batches their lines by
decode.batch_tokens), so that many small requests cost about one batch each, not one each."""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field

from transformer_mt.config import DecodeConfig
from transformer_mt.decode.translator import AttentionMap, Translation, Translator

Result = list[tuple[list[Translation], AttentionMap | None]]


@dataclass
class Job:
    lines: list[str]
    decode: DecodeConfig
    attention_layer: int | None  # None: no attention asked for
    tokens: int  # source pieces, for the batch budget
    result: Future = field(default_factory=Future)

    @property
    def key(self) -> tuple:
        """Jobs with equal keys can share a Translator call."""
        return (self.decode, self.attention_layer)


class Batcher:
    def __init__(self, translator: Translator):
        self.translator = translator
        self.waiting: deque[Job] = deque()
        self.ready = threading.Condition()
        self.stopped = False
        self.batch_sizes: list[int] = []  # requests per Translator call, for tests and logs
        self.worker = threading.Thread(target=self.run, name="translate", daemon=True)
        self.worker.start()

    def submit(self, lines: list[str], decode: DecodeConfig, attention_layer: int | None) -> Future:
        tokens = sum(map(len, self.translator.encode(lines)))
        job = Job(lines, decode, attention_layer, tokens)
        with self.ready:
            self.waiting.append(job)
            self.ready.notify()
        return job.result

    def stop(self) -> None:
        with self.ready:
            self.stopped = True
            self.ready.notify()
        self.worker.join()

    def next_group(self) -> list[Job] | None:
        """The oldest waiting job and every other waiting job with its settings, up to
        decode.batch_tokens source pieces in all (the first job always goes)."""
        with self.ready:
            while not self.waiting and not self.stopped:
                self.ready.wait()
            if self.stopped:
                return None
            first = self.waiting.popleft()
            group, tokens, others = [first], first.tokens, deque()
            while self.waiting:
                job = self.waiting.popleft()
                fits = tokens + job.tokens <= first.decode.batch_tokens
                if job.key == first.key and fits:
                    group.append(job)
                    tokens += job.tokens
                else:
                    others.append(job)
            self.waiting = others
            return group

    def run(self) -> None:
        while (group := self.next_group()) is not None:
            self.batch_sizes.append(len(group))
            first = group[0]
            lines = [line for job in group for line in job.lines]
            translator = Translator(
                self.translator.backend,
                self.translator.tokenizers,
                first.decode,
                unicode_form=self.translator.unicode_form,
            )
            try:
                if first.attention_layer is None:
                    results = [(n, None) for n in translator.translate_nbest(lines)]
                else:
                    results = translator.translate_with_attention(lines, first.attention_layer)
            except Exception as error:  # every waiting client hears of it; the worker goes on
                for job in group:
                    job.result.set_exception(error)
                continue
            start = 0
            for job in group:
                job.result.set_result(results[start : start + len(job.lines)])
                start += len(job.lines)
