"""The CUDA path in short runs: `make gpu-check` (benchmarks/gpu_check.sh, which first installs
the wheels carried in .whl/, if any, then runs this). Each run fits one call of a lent GPU
machine (10 minutes a command), and each part prints its figures as it measures them, so a part
stopped at its limit keeps what it measured.

The core run (the default, `--parts core`), 240 s, the sum of its parts' limits, each part
stopped at its own limit and none started with less than 20 s of the budget left:

1. correctness, 45 s: a subset of the `gpu` tests (SDPA, ours and torch's default, against the
   math kernel with the model's masks at lengths 64 and 200, fp32 and bf16, and the rows of
   pytorch#196678; beam search GPU = CPU; bitwise resume with the CUDA RNG);
2. base eager, 40 s: ours, then a profile of its step (kernel time by kind, each kernel counted
   once, how busy the GPU was, the host's operators, the copies by what asked for them);
3. base compiled, 70 s: ours with trainer.compile=true (its layers compiled one by one; the
   warm-up, the compile included, printed apart), then a profile of its step: the elementwise
   share left once compile has fused what it fuses;
4. big eager, 40 s: ours;
5. decoding, 45 s: beam 4 on 1,000 generated sentences of WMT length, model=base with random
   weights, ours against CTranslate2 on the GPU (benchmarks/bench_decode.py --generated).

The optional run (`--parts extra`, 420 s, a second call; its results added to the same file):

6.-8. the base step's levers, 3 x 35 s, each off with the rest as in part 2: torch's attention
   kernels (cuDNN's first on H100/H200) instead of ours; exact padded lengths instead of
   rounded ones; micro-batches of 25,000 padded tokens (trainer/paper.yaml's: two an update,
   every weight cast to bf16 twice) instead of one of 32,768;
9. the compiled step with the loss's chunks eager (part 3 has them compiled), 70 s;
10. ours beside transformers' MarianMTModel, base eager, 50 s;
11. big compiled, 80 s;
12. one rank's share at NPROC=8, 80 s: model=base, updates of 3,125 target tokens (the paper's
   25,000 over 8 GPUs), eager and compiled: the launch-bound regime of a multi-GPU run;
13. the step as first shipped (bench_train's ours-plain: the loss over the whole fp32 logits,
   torch's dropout) beside today's, base eager, 35 s.

The tests run (`--parts tests`, 150 s; with the core run, 390 s, fits one call): 14. every gpu
test. The recipes run (`--parts recipes`): 15. learning, 200 s: the demo config for 2 minutes on
the GPU, then beam-search BLEU on its test split (tmt-eval); its log lines without their
throughput fields. The decoding run (`--parts decoding`, 300 s): 16. beam search, ours beside
transformers' generate of the same weights on the same GPU (benchmarks/gpu_decoding.py).
What a GPU user runs, a run of its own each: `--parts multi30k`, 17. 360 s: the Multi30k
recipe for one GPU end to end from a fresh run folder, test BLEU and wall time
(benchmarks/gpu_recipe.py), on the raw text of --multi30k-dir (.data/multi30k: carried with the
tree, benchmarks/README.md says how); `--parts multi30k-sweep`, 18. 540 s: its settings one change
at a time, by valid BLEU; `--parts wmt-hour`, 19. 540 s: WMT's first hour on generated data and
the paper run's 100k updates projected on 1 and 8 GPUs (benchmarks/wmt_first_hour.py).
`--parts all`: every part in one run.

The throughput parts are benchmarks/bench_train.py on generated WMT-like updates of 25,000 target
tokens in bf16 (batches cut from 2,000,000 pairs' lengths: WMT's padding), 3 warm-up updates
first, then 8 timed updates twice (--passes 2: the second pass meets only shapes seen before;
both reported, with their ratio): target tokens/s, TFLOP/s, MFU on real tokens beside MFU on
padded shapes, peak memory. The limits come from the first GPU run (benchmarks/gpu.txt,
2026-12-04: bench_train's set-up took longer than the 22 s its parts had then, and its table
came at the end); they are not yet timed on a GPU in this form.

The parts of one run share a compiler cache made new with it (TORCHINDUCTOR_CACHE_DIR, in the
temporary folder): the first compiled part's warm-up compiles from nothing, as a new training
run does, and later compiled parts reuse the kernels of the layers it compiled, as a resumed run
does (a run of the extra parts alone compiles its first compiled part from nothing).

Everything measured goes to GPU_CHECK_OUTPUT (benchmarks/gpu.txt, appended: every run keeps its
section) as each part ends, and to stdout; the full output of every command to GPU_CHECK_LOG
(gpu_check.log in the temporary folder). The GPU name, driver, torch version and date head the
section. The exit status is 0 when every part ran and every test passed.

Without a CUDA GPU (`--probe`, which gpu_check.sh asks first) it prints one line and does nothing.
`--rehearse-on-cpu` (not in --help) runs every part chosen as small as it goes on the CPU (tiny
models, a few updates, 3 seconds of the demo config with a tiny model on a small toy corpus; of
the gpu tests, those that take the `device` fixture, on the CPU, at one or two of the lengths;
the big parts left out, big and base both being tiny there): the code path, checked before the
one run a lent GPU allows.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from benchmarks.measure import report_header, run_command
from transformer_mt.torch_builds import nvidia_smi
from transformer_mt.train.compile_cache import CACHE_SETTING

ROOT = Path(__file__).resolve().parents[1]
NO_GPU = 3  # --probe's exit status without a GPU; gpu_check.sh turns it into 0
REQUIRED = ("hydra", "omegaconf", "sentencepiece", "sacrebleu", "tensorboard", "tqdm", "numpy")
PREPARE_WHEELS = "bash benchmarks/gpu_check.sh --prepare-wheels"
TRAIN = "from transformer_mt.cli import train_main; train_main()"
EVALUATE = "from transformer_mt.cli import evaluate_main; evaluate_main()"


# ---- without a GPU -------------------------------------------------------------------------------
def probe() -> int:
    """0 with a usable CUDA GPU; else one line saying why, and NO_GPU (none at all) or 1 (GPUs
    that this torch cannot use, a set-up to fix rather than a machine to skip)."""
    if torch.cuda.is_available():
        return 0
    listed = nvidia_smi("-L") or ""
    gpus = [line for line in listed.splitlines() if line.startswith("GPU ")]
    if gpus:
        print(
            f"gpu-check: nvidia-smi lists {len(gpus)} GPU(s) but torch {torch.__version__} "
            f"(CUDA {torch.version.cuda or 'none: a CPU-only build'}) cannot use them: install "
            "a torch build for this driver (https://pytorch.org/get-started/locally/)"
        )
        return 1
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    print(
        f"gpu-check: no CUDA GPU visible to torch: torch.cuda.is_available() is False (torch "
        f"{torch.__version__}, {build}); nothing to measure"
    )
    return NO_GPU


# ---- output --------------------------------------------------------------------------------------
class Report:
    """The results file and stdout, line by line (appended as they come, not written once at the
    end: a run killed at its limit keeps what it measured; the file keeps every earlier run's
    section), and the full log beside it (a new one per run, unless `append`)."""

    def __init__(self, output: Path, log: Path, *, append: bool = False):
        output.parent.mkdir(parents=True, exist_ok=True)
        log.parent.mkdir(parents=True, exist_ok=True)
        self.output = output.open("a", encoding="utf-8", buffering=1)
        self.log = log.open("a" if append else "w", encoding="utf-8", buffering=1)
        self.lock = threading.Lock()
        self.paths = output, log

    def line(self, text: str = "") -> None:
        with self.lock:
            print(text, flush=True)
            self.output.write(text + "\n")
            self.log.write(text + "\n")

    def logged(self, text: str) -> None:
        with self.lock:
            self.log.write(text + "\n")


@dataclass
class Outcome:
    """What a part did: exit status (None: killed at its limit), seconds, output lines."""

    status: int | None
    seconds: float
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == 0

    def describe(self) -> str:
        if self.status is None:
            return f"killed at its limit after {self.seconds:.0f} s"
        return f"{'done' if self.ok else 'FAILED'} in {self.seconds:.0f} s (exit {self.status})"


def run(
    command: list[str], limit: float, report: Report, *, echo: bool, env: dict | None = None
) -> Outcome:
    """Run `command` in its own process group, stopped after `limit` seconds (run_command); its
    stdout goes to the report as it comes when `echo`, both streams to the log."""
    report.logged(f"$ {' '.join(command)}  (limit {limit:.0f} s)")
    done = run_command(
        command,
        limit=max(limit, 1.0),
        env=env,
        on_stdout=report.line if echo else report.logged,
        on_stderr=report.logged,
    )
    return Outcome(done.status, done.seconds, done.stdout, done.stderr)


class Budget:
    """The seconds left of the whole check."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


# ---- the parts -----------------------------------------------------------------------------------
RANK_SHARE = 3125  # one rank's target tokens of a 25,000-token update at NPROC=8
# The gpu tests the core run takes: the SDPA comparisons at two lengths (one where cuDNN's key
# tiles end half full), beam search GPU = CPU, bitwise resume with the CUDA RNG. Every gpu test
# runs in the tests run.
CORE_TESTS = ("-k", "64 or 200 or finds_what_it_finds or resume_on_cuda")


@dataclass(frozen=True)
class Settings:
    """What each part runs: the real check on a GPU, or a small rehearsal of it on the CPU.
    The options are command-line words, split at the spaces."""

    device: str
    big: str  # bench_train's --model for the big runs
    base: str
    bench: str  # bench_train's options in every run
    eager: str  # its warm-up and timed updates, eager
    compiled: str  # and compiled (the warm-up long enough for the graphs to settle)
    decode: str  # bench_decode's options
    learn_minutes: float
    core_tests: tuple[str, ...] = CORE_TESTS  # pytest's arguments for the core run's tests
    tests: tuple[str, ...] = ()  # and for the tests run's (every gpu test)
    learn: str = ""  # tmt-train's overrides beyond the demo config and the check's own
    evaluate: str = ""  # tmt-eval's overrides
    limit: float | None = None  # every part's limit instead of its own (the rehearsal's)
    rank_share: int = RANK_SHARE  # the rank-share part's target tokens per update


GPU = Settings(
    device="cuda",
    big="big",
    base="base",
    bench="--data generated --vocab 37000 --batch-tokens 32768 --update-tokens 25000 "
    "--threads 4 --passes 2",
    eager="--warmup 3 --steps 8 --block 4",
    compiled="--warmup 3 --steps 8 --block 4",
    decode="--generated 1000 --model base --vocab 37000 --threads 4",
    learn_minutes=2.0,
)
REHEARSAL = Settings(  # --rehearse-on-cpu: every part's code, as small as it goes, on the CPU
    device="cpu",
    big="tiny",
    base="tiny",
    bench="--data generated --generated-pairs 5000 --vocab 500 --batch-tokens 2048 "
    "--update-tokens 1500 --threads 1 --gpu-report --passes 2",
    eager="--warmup 1 --steps 1 --block 1",
    compiled="--warmup 1 --steps 1 --block 1",
    decode="--generated 30 --model tiny --vocab 500 --threads 1",
    learn_minutes=0.05,
    core_tests=("-k", "64 and not backward"),  # the SDPA comparisons at length 64
    tests=("-k", "not 192 and not 200"),  # the SDPA comparisons at lengths 30 and 64 only
    learn="model=tiny data.toy_sizes=[2000,40,40] data.vocab_size=400 trainer.batch_tokens=1500 "
    "trainer.global_batch_tokens=1200",
    evaluate="decode.strategy=greedy decode.max_len_a=0 decode.max_len_b=8",
    limit=180.0,
)


@dataclass(frozen=True)
class Part:
    """One part of the check: its name in the summary, its limit on a GPU, and what runs it
    (given the seconds it may take)."""

    name: str
    limit: float
    run: Callable[[float], Outcome]


def section(report: Report, title: str) -> None:
    report.line()
    report.line(f"== {title} ==")


def python_command(*arguments: str) -> list[str]:
    return [sys.executable, *arguments]


def run_part(
    report: Report, label: str, command: list[str], limit: float, env: dict | None = None
) -> Outcome:
    """A part's command under its limit, echoed into the report, then the part's one-line
    outcome (`-- label: ...`) and, when it failed, the tail of its stderr."""
    outcome = run(command, limit, report, echo=True, env=env)
    report.line(f"-- {label}: {outcome.describe()}")
    if not outcome.ok:
        report.line(tail(outcome.stderr))
    return outcome


def correctness(
    settings: Settings, report: Report, title: str, tests: tuple[str, ...], limit: float
) -> Outcome:
    where = "" if settings.device == "cuda" else " (a rehearsal: those taking `device`, on the CPU)"
    section(report, f"{title} (tests/gpu){where}, limit {limit:.0f} s")
    command = python_command(
        "-m", "pytest", "-p", "no:cacheprovider", "tests/gpu", "-m", "gpu", "-v", "-s",
        "--tb=short", "-rfEs", *tests,
    )  # fmt: skip
    env = {**os.environ, "GPU_CHECK_REHEARSAL": "1" if settings.device == "cpu" else "0"}
    outcome = run(command, limit, report, echo=True, env=env)
    report.line(f"-- correctness: {outcome.describe()}")
    return outcome


def throughput(settings: Settings, report: Report, title: str, bench: str, limit: float) -> Outcome:
    """benchmarks/bench_train.py with the settings' options and then `bench`'s (which win)."""
    section(report, f"{title}, limit {limit:.0f} s")
    command = python_command(
        "-m", "benchmarks.bench_train", "--device", settings.device, *settings.bench.split(),
        *bench.split(),
    )  # fmt: skip
    return run_part(report, title.partition(". ")[2], command, limit)


def decoding(settings: Settings, report: Report, limit: float) -> Outcome:
    section(report, f"5. decoding: beam 4, ours against CTranslate2, limit {limit:.0f} s")
    env = dict(os.environ)
    found = cublas12_folders()
    report.line(
        "libcublas.so.12 (CTranslate2's CUDA build loads it): "
        + (", ".join(found) if found else "not found on this machine")
    )
    if found:
        env["LD_LIBRARY_PATH"] = os.pathsep.join([*found, env.get("LD_LIBRARY_PATH", "")])
    command = python_command(
        "-m", "benchmarks.bench_decode", "--device", settings.device, *settings.decode.split()
    )
    return run_part(report, "decoding", command, limit, env)


THROUGHPUT_FIELDS = re.compile(r" (?:tok/s|mfu|mfu_padded)=\S+")


def learning(settings: Settings, folder: Path, report: Report, limit: float) -> Outcome:
    """Train the demo config for settings.learn_minutes, then evaluate it (in `limit` seconds
    together); the log lines shown without their throughput fields."""
    section(
        report,
        f"15. learning: the demo config, {settings.learn_minutes:g} min of training on "
        f"{settings.device}, then its test BLEU, limit {limit:.0f} s (throughput: parts 2-13)",
    )
    started = time.monotonic()
    run_dir = folder / "demo"
    train = python_command(
        "-c", TRAIN, "--config-name", "demo", f"run_dir={run_dir}",
        f"data.prepared_dir={folder / 'prepared'}", f"trainer.device={settings.device}",
        "trainer.max_steps=0", f"trainer.max_time_minutes={settings.learn_minutes}",
        "trainer.valid_every=2000", "trainer.checkpoint_every=2000", "trainer.log_every=500",
        "trainer.progress_bar=false", *settings.learn.split(),
    )  # fmt: skip
    trained = run(train, max(limit - 45, 1.0), report, echo=False)
    report.line(f"$ tmt-train {' '.join(train[3:])}")
    keep = ("model:", "update ", "stopped:", "training finished", "ERROR", "Error")
    for line in trained.stderr:
        if any(k in line for k in keep):
            report.line(THROUGHPUT_FIELDS.sub("", strip_log_prefix(line)))
    report.line(f"-- training: {trained.describe()}")
    if not trained.ok:  # stopped at its limit, it still saved a checkpoint to evaluate
        report.line(tail(trained.stderr))
    left = limit - (time.monotonic() - started)
    if trained.status not in (0, None) or left < 15:
        report.line("-- evaluation: not run")
        return Outcome(1, time.monotonic() - started)
    evaluate = python_command(
        "-c", EVALUATE, f"run_dir={run_dir}", f"device={settings.device}",
        *settings.evaluate.split(),
    )  # fmt: skip
    evaluated = run(evaluate, left, report, echo=False)
    report.line(f"$ tmt-eval {' '.join(['run_dir=RUN', *evaluate[4:]])}")
    for line in evaluated.stdout:
        report.line(line)
    if not evaluated.ok:
        report.line(tail(evaluated.stderr))
    report.line(f"-- evaluation: {evaluated.describe()}")
    return Outcome(0 if trained.ok and evaluated.ok else 1, time.monotonic() - started)


def strip_log_prefix(line: str) -> str:
    """'[2026-11-30 17:40:28,573][transformer_mt.train.run][INFO] - text' -> 'HH:MM:SS text'."""
    if line.startswith("[") and "] - " in line:
        stamp, _, text = line.partition("] - ")
        return f"{stamp[12:20]} {text}"
    return line


def bench_part(
    settings: Settings, report: Report, name: str, limit: float, title: str, options: str
):
    """A part that runs benchmarks/bench_train.py with the settings' options and `options`."""
    return Part(name, limit, functools.partial(throughput, settings, report, title, options))


def core_parts(settings: Settings, report: Report) -> list[Part]:
    """The core run, 240 s: a subset of the tests, then the headline figures, each of ours alone
    (its levers and Marian: the optional run)."""
    base, big, eager = settings.base, settings.big, settings.eager
    compiled = f"--columns ours-compiled {settings.compiled}"
    tests = functools.partial(
        correctness, settings, report, "1. correctness: the core gpu tests", settings.core_tests
    )
    parts = [Part("correctness (core tests)", 45, tests)]
    parts.append(
        bench_part(
            settings, report, "throughput base eager", 40,
            f"2. throughput: model={base}, eager, ours, then its profile",
            f"--model {base} --columns ours {eager} --profile",
        )
    )  # fmt: skip
    parts.append(
        bench_part(
            settings, report, "throughput base compiled", 70,
            f"3. throughput: model={base}, trainer.compile=true (its layers, one by one), ours, "
            "then its profile",
            f"--model {base} {compiled} --profile",
        )
    )  # fmt: skip
    if big != base:  # the rehearsal's big and base are both tiny: once is enough
        parts.append(
            bench_part(
                settings, report, "throughput big eager", 40,
                f"4. throughput: model={big}, eager, ours", f"--model {big} --columns ours {eager}",
            )
        )  # fmt: skip
    return [*parts, Part("decoding", 45, functools.partial(decoding, settings, report))]


def extra_parts(settings: Settings, report: Report) -> list[Part]:
    """The optional run, 420 s (under the device's 10 minutes a command): each lever of the
    base step on and off, Marian beside ours, big compiled, one rank's share of a multi-GPU
    update, the step as first shipped."""
    base, big, eager = settings.base, settings.big, settings.eager
    compiled = f"--columns ours-compiled {settings.compiled}"
    levers = [
        bench_part(
            settings, report, f"lever: {name}", 35,
            f"{number}. lever, model={base} eager, ours: {name} (part 2 has the default)",
            f"--model {base} --columns ours {eager} {options}",
        )
        for number, name, options in (
            (6, "torch's attention kernels (cuDNN's first)", "--sdpa-backends default"),
            (7, "exact lengths (not rounded)", "--exact-lengths"),
            (8, "micro-batches of 25,000 padded tokens (two an update)", "--batch-tokens 25000"),
        )
    ]  # fmt: skip
    eager_loss = bench_part(
        settings, report, "lever: the loss's chunks eager", 70,
        f"9. lever, model={base}, trainer.compile=true, ours: the loss's chunks eager (part 3 "
        "has them compiled)",
        f"--model {base} --columns ours-compiled-eager-loss {settings.compiled}",
    )  # fmt: skip
    marian = bench_part(
        settings, report, "ours and Marian base eager", 50,
        f"10. throughput: model={base}, eager, ours beside transformers' MarianMTModel",
        f"--model {base} --columns ours,marian {eager}",
    )  # fmt: skip
    big_compiled = bench_part(
        settings, report, "throughput big compiled", 80,
        f"11. throughput: model={big}, trainer.compile=true, ours", f"--model {big} {compiled}",
    )  # fmt: skip
    share = bench_part(
        settings, report, f"rank share {settings.rank_share} tokens", 80,
        f"12. one rank's share: model={base}, updates of {settings.rank_share:,} target tokens "
        f"(the paper's 25,000 over {25_000 / settings.rank_share:.0f} GPUs), eager and compiled",
        f"--model {base} --update-tokens {settings.rank_share} --columns ours,ours-compiled "
        f"{settings.compiled}",
    )  # fmt: skip
    first = bench_part(
        settings, report, "first step base eager", 35,
        f"13. the step as first shipped (ours-plain) beside today's: model={base}, eager",
        f"--model {base} --columns ours-plain,ours {eager}",
    )  # fmt: skip
    big_runs = [big_compiled] if big != base else []  # the rehearsal's big is its base: once
    return [*levers, eager_loss, marian, *big_runs, share, first]


def test_parts(settings: Settings, report: Report) -> list[Part]:
    """The tests run, 150 s: every gpu test."""
    tests = functools.partial(
        correctness, settings, report, "14. correctness: every gpu test", settings.tests
    )
    return [Part("every gpu test", 150, tests)]


def beam_search_vs_transformers(settings: Settings, report: Report, limit: float) -> Outcome:
    """benchmarks/gpu_decoding.py: ours beside transformers' generate, on the same GPU."""
    section(report, f"16. decoding: ours beside transformers' generate, limit {limit:.0f} s")
    rehearsal = ["--rehearsal", "--threads", "1"] if settings.device == "cpu" else []
    command = python_command(
        "-m", "benchmarks.gpu_decoding", "--device", settings.device, *rehearsal
    )  # fmt: skip
    return run_part(report, "decoding beside transformers", command, limit)


def decoding_parts(settings: Settings, report: Report) -> list[Part]:
    """A run of its own (`--parts decoding`), 300 s: beam search at the GPU's speed (issue 47)."""
    part = functools.partial(beam_search_vs_transformers, settings, report)
    return [Part("decoding beside transformers", 300, part)]


def recipe_parts(settings: Settings, report: Report, folder: Path) -> list[Part]:
    """A third run: what a user's recipe learns on the GPU."""
    return [Part("learning", 200, functools.partial(learning, settings, folder, report))]


def module_part(
    settings: Settings, report: Report, title: str, arguments: list[str], limit: float
) -> Outcome:
    """A benchmark module of its own (`python -m benchmarks.NAME`), given the part's limit less a
    margin for its own clock (so that it prints what it measured before the part is stopped);
    --rehearse-on-cpu in the rehearsal."""
    section(report, f"{title}, limit {limit:.0f} s")
    rehearsal = ["--rehearse-on-cpu"] if settings.device == "cpu" else []
    own_limit = f"{max(limit - 15, 1.0):.0f}"
    command = python_command("-m", *arguments, "--limit", own_limit, *rehearsal)
    return run_part(report, title.partition(". ")[2], command, limit)


def user_run_parts(settings: Settings, report: Report, data: str, group: str) -> list[Part]:
    """Runs of their own (benchmarks/gpu_recipe.py, benchmarks/wmt_first_hour.py): `multi30k`,
    the Multi30k recipe for one GPU end to end from a fresh run folder on the raw text in `data`
    (the rehearsal: a generated corpus); `multi30k-sweep`, its settings one change at a time by
    valid BLEU; `wmt-hour`, WMT's first hour on generated data and the paper run's projection."""
    given = ["--data", data] if settings.device == "cuda" else []
    parts = {
        "multi30k": (
            "multi30k gpu recipe", 360, ["benchmarks.gpu_recipe", *given],
            "17. the Multi30k GPU recipe (multi30k_gpu): train, average, alpha, test BLEU",
        ),
        "multi30k-sweep": (
            "multi30k sweep", 540, ["benchmarks.gpu_recipe", *given, "--sweep-only"],
            "18. the Multi30k GPU recipe's sweep: one change at a time, valid BLEU",
        ),
        "wmt-hour": (
            "wmt first hour", 540, ["benchmarks.wmt_first_hour"],
            "19. WMT's first hour on generated data, and 100k updates projected on 1 and 8 GPUs",
        ),
    }  # fmt: skip
    name, limit, arguments, title = parts[group]
    run_it = functools.partial(module_part, settings, report, title, arguments)
    return [Part(name, limit, run_it)]


def cublas12_folders() -> list[str]:
    """Folders with libcublas.so.12: the nvidia-cublas-cu12 wheel's, or a CUDA 12 toolkit's."""
    candidates = [Path(entry) / "nvidia" / "cublas" / "lib" for entry in sys.path if entry]
    candidates += sorted(Path("/usr/local").glob("cuda*/lib64"))
    candidates += [Path("/usr/lib/x86_64-linux-gnu")]
    return sorted({str(c) for c in candidates if (c / "libcublas.so.12").exists()})


def tail(lines: list[str], count: int = 12) -> str:
    return "\n".join(f"   {line}" for line in lines[-count:])


# ---- the whole check -----------------------------------------------------------------------------
def header(report: Report, args, budget: float) -> None:
    device = torch.device("cuda") if torch.cuda.is_available() else None
    title = "make gpu-check (benchmarks/gpu_check.sh): the CUDA path of transformer_mt"
    for line in report_header(title):
        report.line(line)
    report.line(f"# code: {code_version()}")
    if device is not None:
        props = torch.cuda.get_device_properties(device)
        query = ("--query-gpu=name,driver_version,memory.total", "--format=csv,noheader")
        smi = (nvidia_smi(*query) or "").strip()
        report.line(
            f"# GPU: {props.name}, {props.total_memory / 2**30:.0f} GiB, compute capability "
            f"{props.major}.{props.minor}, {props.multi_processor_count} SMs; nvidia-smi: "
            f"{smi.splitlines()[0] if smi else 'not available'}"
        )
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except (AttributeError, RuntimeError):
            nccl = "-"
        report.line(
            f"# torch's CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, NCCL "
            f"{nccl}; Python {platform.python_version()}"
        )
    else:
        report.line("# a CPU rehearsal, no GPU")
    versions = [f"{name} {package_version(name)}" for name in ("transformers", "ctranslate2")]
    report.line(f"# {'; '.join(versions)}; parts: {','.join(args.parts)}, budget {budget:.0f} s")
    if device is not None:
        from transformer_mt.train.flops import peak_flops

        peak = peak_flops(torch.cuda.get_device_name(device))
        report.line(
            f"# MFU against {peak / 1e12:.0f} TFLOP/s dense bf16 (transformer_mt/train/flops.py)"
            if peak
            else "# MFU: no dense bf16 peak listed for this GPU in transformer_mt/train/flops.py"
        )


def code_version() -> str:
    """The commit (GPU_CHECK_COMMIT where the tree travelled without .git), and local changes."""
    if os.environ.get("GPU_CHECK_COMMIT"):
        return f"commit {os.environ['GPU_CHECK_COMMIT']} (GPU_CHECK_COMMIT)"
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        commit, changed = "", ""
    if not commit:
        return "unknown (no git here; set GPU_CHECK_COMMIT)"
    return f"commit {commit}" + (" with local changes" if changed else "")


def package_version(name: str) -> str:
    if importlib.util.find_spec(name) is None:
        return "not installed"
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "installed"


MIN_START = 20.0  # seconds of the budget a part needs left to be started


PART_GROUPS = (
    "core", "extra", "tests", "recipes", "decoding", "multi30k", "multi30k-sweep", "wmt-hour"
)  # fmt: skip


def chosen_parts(args, settings: Settings, report: Report, folder: Path) -> list[Part]:
    groups = {
        "core": core_parts(settings, report),
        "extra": extra_parts(settings, report),
        "tests": test_parts(settings, report),
        "recipes": recipe_parts(settings, report, folder),
        "decoding": decoding_parts(settings, report),
        **{
            group: user_run_parts(settings, report, args.multi30k_dir, group)
            for group in ("multi30k", "multi30k-sweep", "wmt-hour")
        },
    }
    return [part for group in args.parts for part in groups[group]]


def part_groups(value: str) -> list[str]:
    """--parts: one group, several joined by commas (in that order), or all of them."""
    chosen = list(PART_GROUPS) if value == "all" else value.split(",")
    if unknown := [group for group in chosen if group not in PART_GROUPS]:
        raise argparse.ArgumentTypeError(
            f"unknown part group(s) {', '.join(unknown)}: choose from {', '.join(PART_GROUPS)}, "
            "several joined by commas, or all"
        )
    return chosen


def check(args) -> int:
    settings = REHEARSAL if args.rehearse_on_cpu else GPU
    # A later run of the same check adds its command output to the core run's log.
    report = Report(Path(args.output), Path(args.log), append=args.parts != ["core"])
    started = time.monotonic()
    results: dict[str, Outcome | None] = {}
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as folder:
        parts = chosen_parts(args, settings, report, Path(folder))
        limits = [settings.limit or part.limit for part in parts]
        budget = Budget(args.budget if args.budget is not None else sum(limits))
        header(report, args, budget.seconds)
        # One compiler cache for the check's parts, new with it (a cache set in the environment
        # is not used): the first compiled part compiles from nothing, as a new run does; the
        # later ones find the kernels of the layers it compiled, as a resumed run does.
        os.environ[CACHE_SETTING] = str(Path(folder) / "compile-cache")
        report.line(
            "# torch.compile's cache: new with this run, shared by its parts (the first "
            "compiled part's warm-up compiles from nothing; later ones reuse its kernels)"
        )
        for part, limit in zip(parts, limits, strict=True):
            if budget.left() < MIN_START:
                left = max(budget.left(), 0.0)
                section(report, f"{part.name}: not run, {left:.0f} s of the budget left")
                results[part.name] = None
                continue
            results[part.name] = part.run(min(limit, budget.left()))
    summary(report, results, time.monotonic() - started)
    return 0 if all(outcome is not None and outcome.ok for outcome in results.values()) else 1


def summary(report: Report, results: dict, seconds: float) -> None:
    section(report, f"summary: {seconds:.0f} s in all")
    for name, outcome in results.items():
        if outcome is None:
            state = "not run (budget spent)"
        else:
            state = ("ok" if outcome.ok else "FAILED") + (
                f", {outcome.seconds:.0f} s" if outcome.seconds else ""
            )
        report.line(f"  {name:28s} {state}")
    report.line(f"results in {report.paths[0]}; every command's output in {report.paths[1]}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--probe", action="store_true", help="only say whether a GPU is there")
    parser.add_argument(
        "--parts",
        type=part_groups,
        default="core",
        help="core: a subset of the gpu tests and the headline figures, 240 s; extra: the "
        "optional run, 420 s (the levers on and off, Marian, big compiled, a rank's share, "
        "the step as first shipped); tests: every gpu test, 150 s; recipes: what the recipes "
        "learn; decoding: beam search beside "
        "transformers' generate, 300 s; multi30k: the Multi30k GPU recipe "
        "end to end, 360 s (--multi30k-dir); multi30k-sweep: its settings by valid BLEU, 540 s; "
        "wmt-hour: WMT's first hour on generated data and the paper run's projection, 540 s; "
        "each run's results are added to the same file; several joined by commas "
        "(core,extra); all: every part, in one run",
    )
    parser.add_argument(
        "--multi30k-dir",
        default=str(ROOT / ".data" / "multi30k"),
        help="Multi30k's raw text, {train,val,test_2016_flickr}.{de,en}, for --parts multi30k "
        "and multi30k-sweep (default: .data/multi30k, an ignored folder carried with the tree)",
    )
    parser.add_argument(
        "--budget", type=float, help="seconds for all parts (default: the sum of their limits)"
    )
    parser.add_argument(
        "--output", default=os.environ.get("GPU_CHECK_OUTPUT", str(ROOT / "benchmarks/gpu.txt"))
    )
    parser.add_argument(
        "--log",
        default=os.environ.get("GPU_CHECK_LOG", str(Path(tempfile.gettempdir()) / "gpu_check.log")),
    )
    parser.add_argument("--rehearse-on-cpu", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        return probe()
    if not args.rehearse_on_cpu and (status := probe()) != 0:
        return 0 if status == NO_GPU else status
    missing = [name for name in REQUIRED if importlib.util.find_spec(name) is None]
    if missing:
        print(
            f"gpu-check: {', '.join(missing)} not importable by {sys.executable}: pip install -e "
            f"'.[bench,export]' where there is a network; on a machine without one, carry wheels: "
            f"{PREPARE_WHEELS} (where pip reaches PyPI), then rerun (they install from .whl/)"
        )
        return 1
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
