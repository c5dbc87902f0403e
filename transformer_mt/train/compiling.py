"""trainer.compile: whether the model and its loss go through torch.compile, and what the compiler
did (graphs compiled, recompiles) for the log and TensorBoard.

auto decides by the device kind. On the CPU the compiled step measured slower than the eager one
(benchmarks/train_speed.txt: model=small on Multi30k, 0.81x the eager step's speed per update in
the median in run 7, 0.68x in run 8 on another machine, before counting its compile time), so
auto leaves it off there. On CUDA it is on: no GPU has run it yet, and the reading of the CUDA
path expects fused elementwise kernels and fewer launches to pay there; `make gpu-check` times
eager against compiled on the first GPU it runs on, and this rule follows what it measures.
Compiling needs a C compiler and the Python headers (Inductor builds its kernels' wrappers with
them); without them the run says so in one line and trains eagerly.
"""

from __future__ import annotations

import logging
import os
import shutil
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from transformer_mt.errors import ConfigError

if TYPE_CHECKING:
    from torch._dynamo.callback import CallbackArgs

log = logging.getLogger(__name__)

# Device kinds where auto compiles, and why (the log line says it).
AUTO_COMPILES = {
    "cuda": "on for CUDA (fused elementwise kernels, fewer launches; not yet measured on a GPU)",
    "cpu": "off on the CPU, where the compiled step measured slower than the eager one "
    "(benchmarks/train_speed.txt)",
}
SETTINGS = {"auto": None, "true": True, "false": False}
# Padded lengths are rounded up to a multiple of this when compiling, so that the compiled
# graphs meet a few shapes again and again instead of a new one every micro-batch.
LENGTH_MULTIPLE = 8


def compile_setting(value: object) -> bool | None:
    """trainer.compile as given (Hydra may hand over a bool or its text): True, False or None
    (auto)."""
    text = str(value).strip().lower()
    if text not in SETTINGS:
        raise ConfigError(
            f"config key 'trainer.compile': {value!r} is not one of auto, true, false"
        )
    return SETTINGS[text]


def should_compile(value: object, device: torch.device) -> bool:
    """Decide, and log the decision and why."""
    setting = compile_setting(value)
    if setting is None:
        setting = device.type == "cuda"
        why = AUTO_COMPILES.get(device.type, f"off on {device.type}: not measured there")
        log.info("trainer.compile=auto: %s", why)
    if setting and (missing := missing_build_tools()):
        log.warning("trainer.compile: %s, so the model trains without torch.compile", missing)
        return False
    return setting


def missing_build_tools() -> str | None:
    """What torch.compile's code generation lacks here, or None."""
    compilers = [os.environ.get("CXX"), "g++", "clang++", "c++"]
    if not any(name and shutil.which(name) for name in compilers):
        return "no C++ compiler (g++ or clang++; or set CXX) is installed"
    header = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not header.is_file():
        return (
            f"the Python headers ({header}) are not installed (Debian/Ubuntu: the python3-dev "
            "package)"
        )
    return None


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
