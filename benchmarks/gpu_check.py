"""The CUDA path in two commands of at most 5 minutes each: `make gpu-check` (benchmarks/
gpu_check.sh, which first installs the wheels carried in .whl/, if any, then runs this). A lent
GPU machine gives about 10 minutes of commands (benchmarks/README.md: how to carry the wheels and
the Multi30k text, and the two calls). Each part prints each figure the moment it is measured,
so a part stopped at its limit keeps what it measured.

`--parts speed` (the first command, 285 s, the sum of its parts' limits, each part stopped at its
own limit and none started with less than 20 s of the budget left):

1. kernels, 25 s: the attention kernel SDPA takes at each call site (the encoder's
   self-attention, the decoder's, the cross-attention) under the execution policy, in a training
   micro-batch of one source length (the policy's on CUDA) and of similar lengths (masked), and
   in beam search (benchmarks/gpu_kernels.py);
2. base eager, 55 s: model=base, eager, two passes over the same updates (the second meets only
   shapes seen before): target tokens/s, TFLOP/s, MFU, and the first pass's speed over the
   second's (the unseen-shapes ratio);
3. base compiled, 130 s: the same with trainer.compile=true (its layers compiled one by one): the
   warm-up's seconds (the compile), graphs and recompiles with the guard that failed, MFU and the
   ratio;
4. decoding, 75 s: beam 4 on 1,000 Multi30k-like sentences (model=small) and 1,000 of WMT
   length (model=base), ours beside transformers' generate of the same weights on the same GPU
   (benchmarks/gpu_decoding.py).

`--parts recipe` (the second command, 290 s): 5. the Multi30k GPU recipe end to end from a fresh
run folder (tmt-train --config-name multi30k_gpu, tmt-average, tmt-eval: test BLEU and wall
time; benchmarks/gpu_recipe.py) on the raw text of --multi30k-dir (default .data/multi30k).

`make gpu-check` with no argument runs both, one after the other (575 s): on a lent machine run
them as two calls. Optional runs, after them, each a command of its own:
`--parts profile` (210 s): the base step under torch.profiler, eager and compiled (kernel time
by kind, how busy the GPU was, the host's operators, the copies by what asked for them);
`--parts levers` (500 s): the base step with one setting changed at a time (torch's attention
kernels, cuDNN's first; batches of similar source lengths, masked; exact lengths; micro-batches
of 25,000 padded tokens; compiled with the loss's chunks eager) and the decoding settings
(decode.batch_tokens, check_every, batch_shape, source_lengths); `--parts tests` (240 s): every
gpu test; `--parts sweep` (540 s): the Multi30k recipe's settings one change at a time by valid
BLEU; `--parts wmt-hour` (540 s): WMT's first hour on generated data and the paper run's 100k
updates projected (benchmarks/wmt_first_hour.py). `--parts all`: every part, in that order.

The throughput parts are benchmarks/bench_train.py on generated WMT-like updates of 25,000 target
tokens in bf16 (batches cut from 2,000,000 pairs' lengths: WMT's padding), 3 warm-up updates
first, then 8 timed updates twice (--passes 2). The parts of one run share a compiler cache made
new with it (TORCHINDUCTOR_CACHE_DIR, in the temporary folder): the first compiled part compiles
from nothing, as a new training run does.

Everything measured goes to GPU_CHECK_OUTPUT (benchmarks/gpu.txt, appended: every run keeps its
section) as it comes, and to stdout; the full output of every command to GPU_CHECK_LOG
(gpu_check.log in the temporary folder). The GPU name, driver, torch version and date head the
section. The exit status is 0 when every part ran and ended well.

Without a CUDA GPU (`--probe`, which gpu_check.sh asks first) it prints one line and does nothing.
`--rehearse-on-cpu` (not in --help) runs the parts chosen as small as they go on the CPU (tiny
models, a few updates, torch.compile's eager backend: Dynamo's graphs and guards without
generated code; the recipe for 6 updates on a generated corpus): the code path, checked before
the one run a lent GPU allows (tests/test_gpu_check.py rehearses both commands).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import platform
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
# The distributions the check's runs import (by their import names), checked before it starts:
# those the lent machine's image lacks come as wheels (gpu_check.sh's WHEELS); the others are in
# it (tests/test_gpu_check.py checks both lists against what the runs import).
REQUIRED_DISTRIBUTIONS = {
    "hydra-core": "hydra",
    "omegaconf": "omegaconf",
    "antlr4-python3-runtime": "antlr4",
    "sacremoses": "sacremoses",
    "sentencepiece": "sentencepiece",
    "sacrebleu": "sacrebleu",
    "tensorboard": "tensorboard",
    "tqdm": "tqdm",
    "numpy": "numpy",
}
# The modules the check's commands run (python -m, the tmt-* commands they start).
RUN_MODULES = (
    "benchmarks.gpu_check", "benchmarks.gpu_kernels", "benchmarks.bench_train",
    "benchmarks.gpu_decoding", "benchmarks.gpu_recipe", "benchmarks.profile_step",
    "benchmarks.wmt_first_hour", "transformer_mt.cli",
    "transformer_mt.commands.prepare", "transformer_mt.commands.train",
    "transformer_mt.commands.average", "transformer_mt.commands.evaluate",
)  # fmt: skip
PREPARE_WHEELS = "bash benchmarks/gpu_check.sh --prepare-wheels"


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
@dataclass(frozen=True)
class Settings:
    """What each part runs: the real check on a GPU, or a small rehearsal of it on the CPU.
    The options are command-line words, split at the spaces."""

    device: str
    model: str  # the presets of the throughput and kernel parts
    bench: str  # bench_train's options in every run
    timed: str  # its warm-up and timed updates
    decoding: str = ""  # gpu_decoding's options beyond --device
    tests: tuple[str, ...] = ()  # pytest's arguments for the tests run
    limit: float | None = None  # every part's limit instead of its own (the rehearsal's)


GPU = Settings(
    device="cuda",
    model="base",
    bench="--data generated --vocab 37000 --batch-tokens 32768 --update-tokens 25000 "
    "--threads 4 --passes 2",
    timed="--warmup 3 --steps 8 --block 4",
)
REHEARSAL = Settings(  # --rehearse-on-cpu: every part's code, as small as it goes, on the CPU
    device="cpu",
    model="tiny",
    bench="--data generated --generated-pairs 5000 --vocab 500 --batch-tokens 2048 "
    "--update-tokens 1500 --threads 1 --gpu-report --passes 2 --compile-backend eager",
    timed="--warmup 1 --steps 1 --block 1",
    decoding="--rehearsal --threads 1",
    tests=("-k", "not 192 and not 200"),  # the SDPA comparisons at lengths 30 and 64 only
    limit=120.0,
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


def run_part(
    report: Report, title: str, arguments: list[str], limit: float, env: dict | None = None
) -> Outcome:
    """`python ARGUMENTS` under `limit`, its stdout echoed into the report as it comes, then the
    part's one-line outcome and, when it failed, the tail of its stderr."""
    section(report, f"{title}, limit {limit:.0f} s")
    outcome = run([sys.executable, *arguments], limit, report, echo=True, env=env)
    report.line(f"-- {title.partition('. ')[2]}: {outcome.describe()}")
    if not outcome.ok:
        report.line(tail(outcome.stderr))
    return outcome


def module_part(name: str, limit: float, title: str, arguments: list[str], report: Report):
    """A part that runs `python -m ARGUMENTS`."""
    return Part(name, limit, functools.partial(run_part, report, title, ["-m", *arguments]))


def throughput(settings: Settings, report: Report, name: str, limit: float, title: str, options):
    """A part that runs benchmarks/bench_train.py with the settings' options and `options`."""
    arguments = [
        "benchmarks.bench_train", "--device", settings.device, "--model", settings.model,
        *settings.bench.split(), *settings.timed.split(), *options.split(),
    ]  # fmt: skip
    return module_part(name, limit, title, arguments, report)


def speed_parts(settings: Settings, report: Report) -> list[Part]:
    """The first command, 285 s: the kernels, base eager and compiled, beam search."""
    model, device = settings.model, settings.device
    kernels = ["benchmarks.gpu_kernels", "--device", device, "--model", model]
    decoding = ["benchmarks.gpu_decoding", "--device", device, *settings.decoding.split()]
    return [
        module_part("attention kernels", 25, "1. the attention kernel of each call site",
                    kernels, report),
        throughput(settings, report, "base eager", 55,
                   f"2. throughput: model={model}, eager, two passes", "--columns ours"),
        throughput(settings, report, "base compiled", 130,
                   f"3. throughput: model={model}, trainer.compile=true, two passes",
                   "--columns ours-compiled"),
        module_part("beam search", 75, "4. beam search, ours beside transformers' generate",
                    decoding, report),
    ]  # fmt: skip


def recipe_parts(settings: Settings, report: Report, data: str) -> list[Part]:
    """The second command, 290 s: the Multi30k GPU recipe end to end (the rehearsal: on a
    generated corpus in Multi30k's layout)."""
    given = ["--data", data] if settings.device == "cuda" else ["--rehearse-on-cpu"]
    title = "5. the Multi30k GPU recipe (multi30k_gpu): train, average, test BLEU"
    return [
        run_of_its_own("multi30k recipe", 290, ["benchmarks.gpu_recipe", *given], report, title)
    ]


def run_of_its_own(name: str, limit: float, arguments: list[str], report: Report, title: str):
    """A benchmark that keeps its own clock: given the part's limit less a margin, so that it
    prints what it measured before the part is stopped."""

    def started(seconds: float) -> Outcome:
        own = ["--limit", f"{max(seconds - 15, 1.0):.0f}"]
        return run_part(report, title, ["-m", *arguments, *own], seconds)

    return Part(name, limit, started)


def profile_parts(settings: Settings, report: Report) -> list[Part]:
    """Optional, 210 s: where the base step's time goes, eager and compiled."""
    model = settings.model
    return [
        throughput(settings, report, "profile eager", 60,
                   f"6. profile: model={model}, eager", "--columns ours --passes 1 --profile"),
        throughput(settings, report, "profile compiled", 150,
                   f"7. profile: model={model}, trainer.compile=true",
                   "--columns ours-compiled --passes 1 --profile"),
    ]  # fmt: skip


LEVERS = (
    ("torch's attention kernels", "--sdpa-backends default", "cuDNN's first on H100/H200"),
    ("similar source lengths", "--source-lengths similar", "padded and masked"),
    ("exact lengths", "--exact-lengths", "not rounded"),
    ("micro-batches of 25,000", "--batch-tokens 25000", "two an update"),
)


def lever_parts(settings: Settings, report: Report) -> list[Part]:
    """Optional, 500 s: one setting of the base step changed at a time (part 2 or 3 has the
    default), and the decoding settings (gpu_decoding --levers)."""
    model = settings.model
    parts = [
        throughput(settings, report, f"lever: {name}", 55,
                   f"{number}. lever, model={model} eager: {name} ({why})",
                   f"--columns ours {options}")
        for number, (name, options, why) in enumerate(LEVERS, start=8)
    ]  # fmt: skip
    parts.append(
        throughput(settings, report, "lever: the loss's chunks eager", 130,
                   f"12. lever, model={model} compiled: the loss's chunks eager",
                   "--columns ours-compiled-eager-loss")
    )  # fmt: skip
    decoding = ["benchmarks.gpu_decoding", "--device", settings.device, "--levers"]
    parts.append(
        module_part("decoding levers", 150, "13. decoding levers, ours",
                    [*decoding, *settings.decoding.split()], report)
    )  # fmt: skip
    return parts


def test_parts(settings: Settings, report: Report) -> list[Part]:
    """Optional, 240 s: every gpu test (in the rehearsal: those that take `device`, on the
    CPU)."""

    def tests(limit: float) -> Outcome:
        env = {**os.environ, "GPU_CHECK_REHEARSAL": "1" if settings.device == "cpu" else "0"}
        arguments = [
            "-m", "pytest", "-p", "no:cacheprovider", "tests/gpu", "-m", "gpu", "-v", "-s",
            "--tb=short", "-rfEs", *settings.tests,
        ]  # fmt: skip
        return run_part(report, "14. every gpu test (tests/gpu)", arguments, limit, env)

    return [Part("every gpu test", 240, tests)]


def long_parts(settings: Settings, report: Report, data: str, group: str) -> list[Part]:
    """Optional runs of their own, 540 s each: the Multi30k recipe's sweep, WMT's first hour."""
    rehearsal = ["--rehearse-on-cpu"] if settings.device == "cpu" else []
    given = ["--data", data] if settings.device == "cuda" else []
    if group == "sweep":
        arguments = ["benchmarks.gpu_recipe", *given, "--sweep-only", *rehearsal]
        title = "15. the Multi30k GPU recipe's settings one change at a time, valid BLEU"
    else:
        arguments = ["benchmarks.wmt_first_hour", *rehearsal]
        title = "16. WMT's first hour on generated data, 100k updates projected on 1 and 8 GPUs"
    return [run_of_its_own(group, 540, arguments, report, title)]


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
    versions = [f"{name} {package_version(name)}" for name in ("transformers", "sacremoses")]
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


# The two commands of the prepared run, then the optional ones, in the order `all` runs them.
DEFAULT_PARTS = "speed,recipe"
PART_GROUPS = ("speed", "recipe", "profile", "levers", "tests", "sweep", "wmt-hour")


def chosen_parts(args, settings: Settings, report: Report) -> list[Part]:
    groups = {
        "speed": lambda: speed_parts(settings, report),
        "recipe": lambda: recipe_parts(settings, report, args.multi30k_dir),
        "profile": lambda: profile_parts(settings, report),
        "levers": lambda: lever_parts(settings, report),
        "tests": lambda: test_parts(settings, report),
        "sweep": lambda: long_parts(settings, report, args.multi30k_dir, "sweep"),
        "wmt-hour": lambda: long_parts(settings, report, args.multi30k_dir, "wmt-hour"),
    }
    return [part for group in args.parts for part in groups[group]()]


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
    # A later run of the same check adds its command output to the first command's log.
    report = Report(Path(args.output), Path(args.log), append=args.parts[0] != "speed")
    started = time.monotonic()
    results: dict[str, Outcome | None] = {}
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as folder:
        parts = chosen_parts(args, settings, report)
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


def main_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--probe", action="store_true", help="only say whether a GPU is there")
    parser.add_argument(
        "--parts",
        type=part_groups,
        default=DEFAULT_PARTS,
        help="speed: the first command, 285 s (the attention kernels, base eager and compiled, "
        "beam search beside transformers' generate); recipe: the second, 290 s (the Multi30k "
        "GPU recipe end to end, --multi30k-dir); the default runs both. Optional runs: "
        "profile, 210 s; levers, 500 s; tests (every gpu test), 240 s; sweep (the recipe's "
        "settings by valid BLEU), 540 s; wmt-hour, 540 s. Several joined by commas; all: every "
        "part; each run's results are added to the same file",
    )
    parser.add_argument(
        "--multi30k-dir",
        default=str(ROOT / ".data" / "multi30k"),
        help="Multi30k's raw text, {train,val,test_2016_flickr}.{de,en}, for --parts recipe "
        "and sweep (default: .data/multi30k, an ignored folder carried with the tree)",
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
    return parser


def main() -> int:
    args = main_parser().parse_args()
    if args.probe:
        return probe()
    if not args.rehearse_on_cpu and (status := probe()) != 0:
        return 0 if status == NO_GPU else status
    missing = [
        name
        for name, module in REQUIRED_DISTRIBUTIONS.items()
        if importlib.util.find_spec(module) is None
    ]
    if missing:
        print(
            f"gpu-check: {', '.join(missing)} not importable by {sys.executable}: pip install -e "
            f"'.[hf]' where there is a network; on a machine without one, carry wheels: "
            f"{PREPARE_WHEELS} (where pip reaches PyPI), then rerun (they install from .whl/)"
        )
        return 1
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
