"""Settings chosen on the valid split instead of by hand: tmt-eval's decode.length_penalty=auto
and tmt-average's last=auto translate the first sentences of the run's valid split once per
candidate and keep the candidate with the best sacreBLEU BLEU (the first of equal ones: the
smaller alpha, the fewer checkpoints)."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from transformer_mt.config import DataConfig
from transformer_mt.data.sources import read_pairs
from transformer_mt.errors import ConfigError
from transformer_mt.metrics import sacrebleu_scores

log = logging.getLogger(__name__)

LENGTH_PENALTY_GRID = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.5)
"""decode.length_penalty=auto: the GNMT alphas tried (0.6 is the paper's)."""
LENGTH_PENALTY_BEYOND = (2.0, 2.5, 3.0, 4.0)
"""decode.length_penalty=auto: the alphas tried next, in turn, while the largest alpha tried
is the best so far (a model whose outputs stay short at 1.5 gets a larger one)."""
AVERAGE_GRID = (1, 2, 3, 5, 8, 13, 20)
"""last=auto: the numbers of newest step checkpoints tried (up to all that are kept, which are
tried too); 1 is the newest checkpoint alone."""


@dataclass(frozen=True)
class ValidChoice:
    """What a choice on the valid split tried, how each candidate scored, and what won."""

    grid: list
    valid_bleu: dict[str, float]  # sacreBLEU BLEU of each candidate, keyed by str(candidate)
    chosen: float | int
    valid_sentences: int

    def to_json(self) -> dict:
        return {
            "grid": list(self.grid),
            "valid_bleu": dict(self.valid_bleu),
            "chosen": self.chosen,
            "valid_sentences": self.valid_sentences,
        }


def valid_prefix(data: DataConfig, count: int, key: str) -> tuple[list[str], list[str]]:
    """Sources and references of the first `count` pairs of the valid split (as tmt-eval
    split=valid reads it); `key` is the config key that set `count`."""
    if count < 1:
        raise ConfigError(f"config key '{key}': must be >= 1, got {count}")
    pairs = list(itertools.islice(read_pairs(data, "valid"), count))
    if not pairs:
        raise ConfigError(f"config key '{key}': the run's valid split has no sentences to score")
    return [src for src, _ in pairs], [tgt for _, tgt in pairs]


def valid_bleu(hypotheses: list[str], references: list[str]) -> float:
    """The score a choice maximises: sacreBLEU's BLEU (13a tokenization, the reported one)."""
    return sacrebleu_scores(hypotheses, references).bleu


def choose_on_valid(
    setting: str,
    grid: Sequence,
    translate: Callable[[object], list[str]],
    references: list[str],
    beyond: Sequence = (),
) -> ValidChoice:
    """The candidate of `grid` whose translations of the valid sources (`translate(candidate)`)
    score best against `references`; one log line per candidate as it is scored. While the
    last candidate tried is the best so far, the next of `beyond` is tried too (the choice
    records every candidate tried as its grid)."""
    log.info(
        "%s=auto: trying %s on the first %d valid sentences (sacreBLEU BLEU)",
        setting,
        ", ".join(map(str, grid)),
        len(references),
    )
    scores: dict[str, float] = {}
    tried = list(grid)
    following = iter(beyond)
    done = 0
    while done < len(tried):
        candidate = tried[done]
        scores[str(candidate)] = valid_bleu(translate(candidate), references)
        done += 1
        log.info(
            "%s=%s: valid BLEU %.2f (%d of %d)",
            setting,
            candidate,
            scores[str(candidate)],
            done,
            len(tried),
        )
        if done == len(tried) and max(tried, key=lambda c: scores[str(c)]) == candidate:
            extension = next(following, None)
            if extension is not None:
                log.info("%s=auto: the last one is the best so far: trying %s", setting, extension)
                tried.append(extension)
    chosen = max(tried, key=lambda candidate: scores[str(candidate)])  # the first of equals
    log.info("%s=auto: chose %s (valid BLEU %.2f)", setting, chosen, scores[str(chosen)])
    return ValidChoice(
        grid=tried,
        valid_bleu=scores,
        chosen=chosen,
        valid_sentences=len(references),
    )


def average_grid(kept: int) -> list[int]:
    """The numbers of checkpoints last=auto tries when `kept` step checkpoints are kept."""
    return sorted({n for n in AVERAGE_GRID if n <= kept} | {kept})
