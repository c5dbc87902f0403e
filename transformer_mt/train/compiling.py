"""What torch.compile did in a training run (graphs compiled, recompiles), for the log and
TensorBoard. Whether a run compiles, and auto's rule, is the execution policy's
(transformer_mt/execution.py: should_compile); where its cache lies, train/compile_cache.py.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from torch._dynamo.callback import CallbackArgs

log = logging.getLogger(__name__)


class RecompileCount:
    """Recompiles so far in this process, by frame: a frame (a code object) compiled once more
    because no compiled graph's guards held. Dynamo keeps no counter of them (its counters count
    graphs and frames), but it calls back after every compilation with the id "frame/compilation
    of that frame"; this counts the ones whose frame was compiled before. A lazily compiled
    backward calls back too, with its forward's id and another trigger, and is not counted
    again."""

    def __init__(self):
        self.by_frame: dict[str, int] = {}

    @property
    def value(self) -> int:
        return sum(self.by_frame.values())

    def __call__(self, args: CallbackArgs) -> None:
        frame, _, compilation = args.compile_id.rpartition("/")
        if args.callback_trigger.name == "DYNAMO" and compilation.isdigit() and int(compilation):
            self.by_frame[frame] = self.by_frame.get(frame, 0) + 1


RECOMPILES = RecompileCount()


@dataclass
class CompileCounts:
    """What Dynamo did so far in this process (recompiles counted since the first CompileWatch
    or count_recompiles): graphs, recompiles of all frames, and the most of one frame."""

    graphs: int
    recompiles: int
    most_in_a_frame: int = 0

    @staticmethod
    def now() -> CompileCounts:
        return CompileCounts(
            graphs=int(torch._dynamo.utils.counters["stats"]["unique_graphs"]),
            recompiles=RECOMPILES.value,
            most_in_a_frame=max(RECOMPILES.by_frame.values(), default=0),
        )


def count_recompiles() -> None:
    """Have Dynamo report every compilation from now on (once; again after torch._dynamo.reset,
    which forgets its callbacks)."""
    from torch._dynamo.callback import callback_handler

    if RECOMPILES not in callback_handler.end_callbacks:
        callback_handler.register_end_callback(RECOMPILES)


def recompile_reasons() -> list[str]:
    """Why each recompile so far in this process happened, as Dynamo recorded it
    (torch._dynamo.utils.guard_failures): the frame, and the first line of the guard that
    failed."""
    return [
        f"{code.co_name} ({Path(code.co_filename).name}:{code.co_firstlineno}): "
        f"{str(reason).strip().splitlines()[0] if str(reason).strip() else '?'}"
        for code, reasons in list(torch._dynamo.utils.guard_failures.items())
        for reason in reasons
    ]


class CompileWatch:
    """Logs the compiler's counts as they change, each new recompile's reason (the guard that
    failed), and warns when one frame keeps recompiling:
    torch._dynamo.config.recompile_limit is a limit per frame (the graphs it keeps for one code
    object), so a frame that holds that many runs eagerly for any shape none of them takes.
    `warn_after`: recompiles of one frame (default: the limit less its first compilation)."""

    def __init__(self, warn_after: int | None = None):
        count_recompiles()
        self.last = CompileCounts(0, 0)
        limit = torch._dynamo.config.recompile_limit
        self.warn_after = warn_after if warn_after is not None else limit - 1
        self.warned = False
        self.reasons_logged = len(recompile_reasons())

    def check(self, step: int) -> CompileCounts | None:
        """The counts when they changed since the last check (log them), else None."""
        count_recompiles()
        counts = CompileCounts.now()
        if counts == self.last:
            return None
        self.last = counts
        log.info(
            "torch.compile by update %d: %d graph(s) compiled, %d recompile(s)",
            step,
            counts.graphs,
            counts.recompiles,
        )
        reasons = recompile_reasons()
        for reason in reasons[self.reasons_logged :]:
            log.info("torch.compile recompiled %s", reason)
        self.reasons_logged = len(reasons)
        if counts.most_in_a_frame >= self.warn_after and not self.warned:
            self.warned = True
            log.warning(
                "torch.compile recompiled one frame %d times (%d recompiles in all): a frame "
                "that holds torch._dynamo.config.recompile_limit (%d) graphs runs eagerly for "
                "a shape none of them takes; the shapes keep changing (is trainer.compile worth "
                "it for this data?)",
                counts.most_in_a_frame,
                counts.recompiles,
                torch._dynamo.config.recompile_limit,
            )
        return counts
