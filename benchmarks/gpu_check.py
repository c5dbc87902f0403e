"""The CUDA path in two short runs: `make gpu-check` (benchmarks/gpu_check.sh, which first
installs the wheels carried in .whl/, if any, then runs this).

The core run (the default, `--parts core`) fits in 4 minutes: --budget 240 s, the sum of its
parts' limits, each part stopped at its own limit and none started with less than 20 s of the
budget left. The headline figures come first:

1. correctness, 55 s: the `gpu` tests (tests/gpu: SDPA's default kernel against the math one with
   the model's masks, fp32 and bf16, lengths 30/64/192/200, and the rows of pytorch#196678; KV
   cache in bf16; fused Adam's device-side skip; 1-rank NCCL DDP = the plain run; bitwise resume
   with the CUDA RNG; fp16 with the scaler; beam search on the GPU);
2. compiled big, 70 s, and 3. compiled base, 46 s: ours with trainer.compile=true;
4. eager base, 22 s, and 5. eager big, 22 s: ours beside transformers' MarianMTModel;
6. decoding, 25 s: beam 4 on 1,000 generated sentences of WMT length, model=base with random
   weights, ours against CTranslate2 on the GPU (benchmarks/bench_decode.py --generated).

The optional run (`--parts extra`, a second invocation, 460 s, its results added to the same
file; `--parts all`: both runs in one, 700 s):

7. one rank's share at NPROC=8 and at 2 x 8, 2 x 90 s: model=base, updates of 3,125 and 1,563
   target tokens (the paper's 25,000 over 8 and 16 GPUs), eager and compiled: the launch-bound
   regime of a multi-GPU run, on one GPU;
8. the step as first shipped, 2 x 40 s: base and big eager, bench_train's ours-plain (the loss
   over the whole fp32 logits, torch's dropout) beside the step the trainer runs now;
9. learning, 200 s: the demo config (`make demo`'s) for 2 minutes on the GPU, then beam-search
   BLEU on its test split (tmt-eval); its log lines without their throughput fields (parts 2-8
   measure throughput).

Parts 2-5, 7 and 8 are benchmarks/bench_train.py on generated WMT-like updates of 25,000 target
tokens in bf16 (batches cut from 2,000,000 pairs' lengths: WMT's padding), warm-up updates first
(5 compiled: the dynamic-shape graph and its recompiles settle; 3 eager), then 8 timed updates
twice (--passes 2: the second pass meets only shapes seen before; both reported, with their
ratio): target tokens/s, TFLOP/s, MFU on real tokens beside MFU on padded shapes, peak memory,
and a profile of 3 more updates of ours (kernel time by kind, each kernel counted once, how busy
the GPU was, the host's operators). The limits are estimates for one H200 (no run on a GPU has
timed them yet); a part stopped at its limit keeps the lines it printed.

Everything measured goes to GPU_CHECK_OUTPUT (benchmarks/gpu.txt) as each part ends, so a run
killed half-way keeps what it measured, and to stdout; the full output of every command to
GPU_CHECK_LOG (gpu_check.log in the temporary folder). The GPU name, driver, torch version and
date head the file. The exit status is 0 when every part ran and every test passed.

Without a CUDA GPU (`--probe`, which gpu_check.sh asks first) it prints one line and does nothing.
`--rehearse-on-cpu` (not in --help) runs every part chosen as small as it goes on the CPU (tiny
models, a few updates, 3 seconds of the demo config with a tiny model on a small toy corpus; of
the gpu tests, those that take the `device` fixture, on the CPU, at two of the lengths; each
bench_train command once, where big and base would repeat it: 7 parts): the code path, checked
before the one run a lent GPU allows.
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
RANK_SHARES = (3125, 1563)  # one rank's target tokens of a 25,000-token update: NPROC=8, 2 x 8
COMPILED_LIMITS = {"big": 70, "base": 46}  # parts 2 and 3, seconds on a GPU


@dataclass(frozen=True)
class Settings:
    """What each part runs: the real check on a GPU, or a small rehearsal of it on the CPU.
    The options are command-line words, split at the spaces."""

    device: str
    big: str  # bench_train's --model for the big runs
    base: str
    bench: str  # bench_train's options in every run
    eager: str  # its warm-up and timed updates, eager
    compiled: str  # and compiled (the warm-up long enough for the graph to settle)
    decode: str  # bench_decode's options
    learn_minutes: float
    tests: tuple[str, ...] = ()  # pytest's arguments beyond the gpu marker
    learn: str = ""  # tmt-train's overrides beyond the demo config and the check's own
    evaluate: str = ""  # tmt-eval's overrides
    limit: float | None = None  # every part's limit instead of its own (the rehearsal's)
    rank_shares: tuple[int, ...] = RANK_SHARES  # part 7's target tokens per update

    def models(self, *roles: str) -> list[tuple[str, str]]:
        """(role, model) for these roles ("big", "base") in this order, each model once: the
        rehearsal's big and base are both tiny, and a part that would repeat another's command
        runs once."""
        chosen: dict[str, str] = {}  # model -> its first role
        for role in roles:
            chosen.setdefault(getattr(self, role), role)
        return [(role, model) for model, role in chosen.items()]


GPU = Settings(
    device="cuda",
    big="big",
    base="base",
    bench="--data generated --vocab 37000 --batch-tokens 32768 --update-tokens 25000 "
    "--threads 4 --passes 2 --profile",
    eager="--warmup 3 --steps 8 --block 4",
    compiled="--warmup 5 --steps 8 --block 4",
    decode="--generated 1000 --model base --vocab 37000 --threads 4",
    learn_minutes=2.0,
)
REHEARSAL = Settings(  # --rehearse-on-cpu: every part's code, as small as it goes, on the CPU
    device="cpu",
    big="tiny",
    base="tiny",
    bench="--data generated --generated-pairs 5000 --vocab 500 --batch-tokens 2048 "
    "--update-tokens 1500 --threads 1 --gpu-report --passes 2 --profile",
    eager="--warmup 1 --steps 1 --block 1",
    compiled="--warmup 1 --steps 1 --block 1",
    decode="--generated 30 --model tiny --vocab 500 --threads 1",
    learn_minutes=0.05,
    tests=("-k", "not 192 and not 200"),  # the SDPA comparisons at lengths 30 and 64 only
    learn="model=tiny data.toy_sizes=[2000,40,40] data.vocab_size=400 trainer.batch_tokens=1500 "
    "trainer.global_batch_tokens=1200",
    evaluate="decode.strategy=greedy decode.max_len_a=0 decode.max_len_b=8",
    limit=180.0,
    rank_shares=RANK_SHARES[:1],
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


def correctness(settings: Settings, report: Report, limit: float) -> Outcome:
    where = "" if settings.device == "cuda" else " (a rehearsal: those taking `device`, on the CPU)"
    section(report, f"1. correctness: the gpu-marked tests (tests/gpu){where}, limit {limit:.0f} s")
    command = python_command(
        "-m", "pytest", "-p", "no:cacheprovider", "tests/gpu", "-m", "gpu", "-v", "-s",
        "--tb=short", "-rfEs", *settings.tests,
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
    outcome = run(command, limit, report, echo=True)
    report.line(f"-- {title.partition('. ')[2]}: {outcome.describe()}")
    if not outcome.ok:
        report.line(tail(outcome.stderr))
    return outcome


def decoding(settings: Settings, report: Report, limit: float) -> Outcome:
    section(report, f"6. decoding: beam 4, ours against CTranslate2, limit {limit:.0f} s")
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
    outcome = run(command, limit, report, echo=True, env=env)
    report.line(f"-- decoding: {outcome.describe()}")
    if not outcome.ok:
        report.line(tail(outcome.stderr))
    return outcome


THROUGHPUT_FIELDS = re.compile(r" (?:tok/s|mfu|mfu_padded)=\S+")


def learning(settings: Settings, folder: Path, report: Report, limit: float) -> Outcome:
    """Train the demo config for settings.learn_minutes, then evaluate it (in `limit` seconds
    together); the log lines shown without their throughput fields."""
    section(
        report,
        f"9. learning: the demo config, {settings.learn_minutes:g} min of training on "
        f"{settings.device}, then its test BLEU, limit {limit:.0f} s (throughput: parts 2-8)",
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
    """The core run, in this order: the tests, then the headline figures (compiled, big first)."""
    compiled, eager = f"--columns ours-compiled {settings.compiled}", settings.eager
    parts = [Part("correctness", 55, functools.partial(correctness, settings, report))]
    for role, model in settings.models("big", "base"):
        parts.append(
            bench_part(
                settings, report, f"throughput {role} compiled", COMPILED_LIMITS[role],
                f"{2 if role == 'big' else 3}. throughput: model={model}, trainer.compile=true "
                "(ours)",
                f"--model {model} {compiled}",
            )
        )  # fmt: skip
    for role, model in settings.models("base", "big"):
        parts.append(
            bench_part(
                settings, report, f"throughput {role} eager", 22,
                f"{4 if role == 'base' else 5}. throughput: model={model}, eager, ours and Marian",
                f"--model {model} --columns ours,marian {eager}",
            )
        )  # fmt: skip
    return [*parts, Part("decoding", 25, functools.partial(decoding, settings, report))]


def extra_parts(settings: Settings, report: Report, folder: Path) -> list[Part]:
    """The optional run: one rank's share of a multi-GPU update, the step as first shipped
    beside today's, learning."""
    shares = [
        bench_part(
            settings, report, f"rank share {tokens} tokens", 90,
            f"7. one rank's share: model={settings.base}, updates of {tokens:,} target tokens "
            f"(the paper's 25,000 over {25_000 / tokens:.0f} GPUs), eager and compiled",
            f"--model {settings.base} --update-tokens {tokens} --columns ours,ours-compiled "
            f"{settings.compiled}",
        )
        for tokens in settings.rank_shares
    ]  # fmt: skip
    steps = [
        bench_part(
            settings, report, f"first step {role} eager", 40,
            f"8. the step as first shipped (ours-plain) beside today's: model={model}, eager",
            f"--model {model} --columns ours-plain,ours {settings.eager}",
        )
        for role, model in settings.models("base", "big")
    ]  # fmt: skip
    learn = Part("learning", 200, functools.partial(learning, settings, folder, report))
    return [*shares, *steps, learn]


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
    report.line(f"# {'; '.join(versions)}; parts: {args.parts}, budget {budget:.0f} s")
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


def chosen_parts(args, settings: Settings, report: Report, folder: Path) -> list[Part]:
    core, extra = core_parts(settings, report), extra_parts(settings, report, folder)
    return {"core": core, "extra": extra, "all": core + extra}[args.parts]


def check(args) -> int:
    settings = REHEARSAL if args.rehearse_on_cpu else GPU
    # The optional run adds its results to the core run's file.
    report = Report(Path(args.output), Path(args.log), append=args.parts == "extra")
    started = time.monotonic()
    results: dict[str, Outcome | None] = {}
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as folder:
        parts = chosen_parts(args, settings, report, Path(folder))
        limits = [settings.limit or part.limit for part in parts]
        budget = Budget(args.budget if args.budget is not None else sum(limits))
        header(report, args, budget.seconds)
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
        choices=["core", "extra", "all"],
        default="core",
        help="core: the tests and the headline figures, 4 minutes; extra: the optional run "
        "(one rank's share of a multi-GPU update, the losses, learning), its results added to "
        "the same file; all: both",
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
