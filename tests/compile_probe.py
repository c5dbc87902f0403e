"""A small step compiled by Inductor, the way a training run compiles (for the tests of
torch.compile's cache, tests/train/test_compile_cache.py): a model's first compile takes minutes on
a small CPU, one small kernel seconds. A module of its own, run as a script in a process of its
own (the cache's folders and the temp folder are fixed when torch is imported), and imported by
the ranks of a distributed run: the step is the same code wherever it runs, so its cache entries
have the same keys.

    python tests/compile_probe.py    # use_compile_cache as a CPU training run calls it, then
                                     # the step compiled; prints Inductor's counters as JSON
    python tests/compile_probe.py --as-torch    # the step compiled with torch's own settings
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch


def small_step(x: torch.Tensor) -> torch.Tensor:
    return (x * 2 + 1).relu()


def compile_small_step() -> dict[str, int]:
    """small_step compiled by Inductor and run once; Inductor's counters (its cache's hits and
    misses)."""
    torch.compile(small_step)(torch.randn(8))
    return dict(torch._dynamo.utils.counters["inductor"])


def set_up_as_a_training_run() -> None:
    """torch.compile's cache chosen as a compiled CPU training run chooses it."""
    from transformer_mt.config import compose_job
    from transformer_mt.execution import ExecutionPolicy
    from transformer_mt.train.compile_cache import use_compile_cache

    trainer = compose_job("train", ["run_dir=unused", "trainer.compile=true"]).trainer
    no_run_folder = Path("unused") / "compile-cache"
    use_compile_cache(ExecutionPolicy.for_training(trainer, torch.device("cpu")), no_run_folder)


if __name__ == "__main__":
    if "--as-torch" not in sys.argv:
        set_up_as_a_training_run()
    print(json.dumps(compile_small_step()))
