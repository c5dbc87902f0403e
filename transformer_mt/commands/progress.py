"""The progress of a command over the lines of a file: tqdm's bar on a terminal (rate, time
left), a log line at most every LOG_SECONDS elsewhere (a cluster job's log file), and a last
line with the rate."""

from __future__ import annotations

import logging
import sys
import time

from tqdm import tqdm

log = logging.getLogger(__name__)


class Progress:
    """`total` items, of which each call says how many were skipped (done by an earlier command)
    or done now. desc: the bar's words ("back-translating"); done: the log's ("back-translated");
    unit: what is counted ("sentences")."""

    LOG_SECONDS = 60.0

    def __init__(self, total: int, desc: str, done: str, unit: str):
        self.total, self.finished, self.new = total, 0, 0
        self.done_word, self.unit = done, unit
        self.started = self.logged = time.perf_counter()
        self.bar = tqdm(
            total=total,
            unit=unit[:4],
            desc=desc,
            dynamic_ncols=True,
            disable=not sys.stderr.isatty(),
        )

    def skipped(self, count: int) -> None:
        self.finished += count
        self.bar.update(count)

    def advanced(self, count: int) -> None:
        self.finished, self.new = self.finished + count, self.new + count
        self.bar.update(count)
        now = time.perf_counter()
        if self.bar.disable and now - self.logged >= self.LOG_SECONDS:
            self.logged = now
            rate = self.new / (now - self.started)
            log.info(
                "%s %d of %d %s (%.1f %s/s, %.1f min left)",
                self.done_word,
                self.finished,
                self.total,
                self.unit,
                rate,
                self.unit,
                (self.total - self.finished) / rate / 60,
            )

    def close(self) -> None:
        self.bar.close()
        seconds = time.perf_counter() - self.started
        if self.new:
            log.info(
                "%s %d %s in %.1f s (%.1f %s/s)",
                self.done_word,
                self.new,
                self.unit,
                seconds,
                self.new / seconds,
                self.unit,
            )
