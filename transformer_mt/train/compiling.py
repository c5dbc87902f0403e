"""What torch.compile did in a training run (graphs compiled, recompiles), for the log and
TensorBoard. Whether a run compiles, and auto's rule, is the execution policy's
(transformer_mt/execution.py: should_compile); where its cache lies, train/compile_cache.py.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from torch._dynamo.callback import CallbackArgs

log = logging.getLogger(__name__)


class RecompileCount:
    """Recompiles so far in this process: a frame (a code object) compiled once more because no
    compiled graph's guards held. Dynamo keeps no counter of them (its counters count graphs and
    frames), but it calls back after every compilation with the id "frame/compilation of that
    frame"; this counts the ones whose frame was compiled before. A lazily compiled backward
    calls back too, with its forward's id and another trigger, and is not counted again."""

    def __init__(self):
        self.value = 0

    def __call__(self, args: CallbackArgs) -> None:
        compilation = args.compile_id.rpartition("/")[2]
        if args.callback_trigger.name == "DYNAMO" and compilation.isdigit() and int(compilation):
            self.value += 1


RECOMPILES = RecompileCount()


@dataclass
class CompileCounts:
    """What Dynamo did so far in this process (recompiles counted since the first CompileWatch
    or count_recompiles)."""

    graphs: int
    recompiles: int

    @staticmethod
    def now() -> CompileCounts:
        return CompileCounts(
            graphs=int(torch._dynamo.utils.counters["stats"]["unique_graphs"]),
            recompiles=RECOMPILES.value,
        )


def count_recompiles() -> None:
    """Have Dynamo report every compilation from now on (once; again after torch._dynamo.reset,
    which forgets its callbacks)."""
    from torch._dynamo.callback import callback_handler

    if RECOMPILES not in callback_handler.end_callbacks:
        callback_handler.register_end_callback(RECOMPILES)


class CompileWatch:
    """Logs the compiler's counts as they change, and warns when recompiles keep coming (a new
    shape every few updates, or the recompile limit reached and the frame run eagerly)."""

    def __init__(self, warn_after: int | None = None):
        count_recompiles()
        self.last = CompileCounts(0, 0)
        limit = torch._dynamo.config.recompile_limit
        self.warn_after = warn_after if warn_after is not None else limit
        self.warned = False

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
        if counts.recompiles >= self.warn_after and not self.warned:
            self.warned = True
            log.warning(
                "torch.compile recompiled %d times: a frame that reaches "
                "torch._dynamo.config.recompile_limit (%d) runs eagerly from then on; the "
                "shapes keep changing (is trainer.compile worth it for this data?)",
                counts.recompiles,
                torch._dynamo.config.recompile_limit,
            )
        return counts
