"""The CUDA path in one command of at most 8 minutes: `make gpu-check` (scripts/gpu_check.sh,
which first installs the wheels carried in .whl/, if any, then runs this).

Parts, in this order, each with a time limit, none started once the budget (--budget, 480 s) is
spent:

1. correctness: the `gpu` tests (tests/gpu: KV cache in bf16, fused Adam's device-side skip,
   1-rank NCCL DDP = the plain run, bitwise resume with the CUDA RNG, fp16 with the scaler, beam
   search on the GPU); beside them, on the same GPU,
2. learning: the demo config (`make demo`'s) for 2 minutes of training on the GPU, then
   beam-search BLEU on its test split (tmt-eval) and its log lines with model FLOPs utilisation;
3. throughput: model=base and model=big, bf16, on generated WMT-like updates of 25,000 target
   tokens, ours through the Trainer beside transformers' MarianMTModel of the same shape
   (scripts/bench_train.py): target tokens/s, TFLOP/s, MFU, peak GPU memory, and a profile of
   one more update of ours (where its GPU time goes, and how busy the GPU was);
4. decoding: beam 4 on 3,000 generated sentences of WMT length, model=base with random weights,
   ours against CTranslate2 on the GPU (scripts/bench_decode.py --generated): sentences/s;
5. throughput with trainer.compile=true (ours; Marian is timed in eager mode only, in part 3:
   compiling it too would add about a minute per model).

Parts 3 and 5 time ours with the loss over the whole fp32 logits (as first shipped,
bench_train's ours-plain) beside the chunked loss the trainer runs now, eager and compiled.

Everything measured goes to GPU_CHECK_OUTPUT (benchmarks/gpu.txt) as each part ends, so a run
killed half-way keeps what it measured, and to stdout; the full output of every command to
GPU_CHECK_LOG (gpu_check.log in the temporary folder). The GPU name, driver, torch version and
date head the file. The exit status is 0 when every part ran and every test passed.

Without a CUDA GPU (`--probe`, which gpu_check.sh asks first) it prints one line and does nothing.
`--rehearse-on-cpu` (not in --help) runs every part small on the CPU (tiny models, a few steps,
6 seconds of the demo config; the gpu tests are skipped there): the code path, checked before the
one run a lent GPU allows.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import importlib.util
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
NO_GPU = 3  # --probe's exit status without a GPU; gpu_check.sh turns it into 0
REQUIRED = ("hydra", "omegaconf", "sentencepiece", "sacrebleu", "tensorboard", "tqdm", "numpy")
PREPARE_WHEELS = "bash scripts/gpu_check.sh --prepare-wheels"
TRAIN = "from transformer_mt.cli import train_main; train_main()"
EVALUATE = "from transformer_mt.cli import evaluate_main; evaluate_main()"


# ---- without a GPU -------------------------------------------------------------------------------
def probe() -> int:
    """0 with a usable CUDA GPU; else one line saying why, and NO_GPU (none at all) or 1 (GPUs
    that this torch cannot use, a set-up to fix rather than a machine to skip)."""
    if torch.cuda.is_available():
        return 0
    listed = nvidia_smi("-L")
    gpus = [line for line in listed.splitlines() if line.startswith("GPU ")]
    if gpus:
        print(
            f"gpu-check: nvidia-smi lists {len(gpus)} GPU(s) but torch {torch.__version__} "
            f"(CUDA {torch.version.cuda or 'none: a CPU-only build'}) cannot use them: install "
            "a torch build for this driver (https://pytorch.org/get-started/locally/)"
        )
        return 1
    print("gpu-check: no CUDA GPU visible (torch.cuda.is_available() is False); nothing to measure")
    return NO_GPU


def nvidia_smi(*arguments: str) -> str:
    if shutil.which("nvidia-smi") is None:
        return ""
    try:
        done = subprocess.run(
            ["nvidia-smi", *arguments], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip()


# ---- output --------------------------------------------------------------------------------------
class Report:
    """The results file and stdout, line by line (appended as they come, not written once at the
    end: a run killed at its limit keeps what it measured); the full log beside it."""

    def __init__(self, output: Path, log: Path):
        output.parent.mkdir(parents=True, exist_ok=True)
        log.parent.mkdir(parents=True, exist_ok=True)
        self.output = output.open("w", encoding="utf-8", buffering=1)
        self.log = log.open("w", encoding="utf-8", buffering=1)
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
    """What a command did: exit status (None: killed at its limit), seconds, output lines."""

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
    """Run `command` in its own process group; its stdout goes to the report as it comes when
    `echo`, both streams to the log; the group is stopped after `limit` seconds."""
    report.logged(f"$ {' '.join(command)}  (limit {limit:.0f} s)")
    started = time.monotonic()
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group: the limit ends its workers too
    )
    outcome = Outcome(None, 0.0)

    def read(stream, lines: list[str], to_report: bool) -> None:
        for raw in stream:
            text = raw.rstrip("\n")
            lines.append(text)
            if to_report:
                report.line(text)
            else:
                report.logged(text)

    readers = [
        threading.Thread(target=read, args=(process.stdout, outcome.stdout, echo)),
        threading.Thread(target=read, args=(process.stderr, outcome.stderr, False)),
    ]
    for reader in readers:
        reader.start()
    try:
        outcome.status = process.wait(timeout=max(limit, 1.0))
    except subprocess.TimeoutExpired:
        stop_group(process)
    for reader in readers:
        reader.join()
    outcome.seconds = time.monotonic() - started
    return outcome


def stop_group(process: subprocess.Popen) -> None:
    """SIGTERM to the command's process group (the trainer writes a checkpoint and stops), then
    SIGKILL to what is left after 10 s."""
    for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


class Budget:
    """The seconds left of the whole check."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


# ---- the parts -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Settings:
    """What each part runs: the real check on a GPU, or a small rehearsal of it on the CPU.
    The options are command-line words, split at the spaces."""

    device: str
    train_models: tuple[str, ...]  # bench_train's --model, eager then compiled
    train_options: str
    eager_steps: str
    compiled_steps: str
    decode_options: str
    learn_minutes: float


GPU = Settings(
    device="cuda",
    train_models=("base", "big"),
    train_options="--data generated --vocab 37000 --batch-tokens 32768 --update-tokens 25000 "
    "--threads 4 --profile",
    eager_steps="--warmup 2 --steps 15 --block 5",
    compiled_steps="--warmup 2 --steps 15 --block 5",  # the eager run's batches
    decode_options="--generated 3000 --model base --vocab 37000 --threads 4",
    learn_minutes=2.0,
)
REHEARSAL = Settings(  # --rehearse-on-cpu: every part's code, small, on the CPU
    device="cpu",
    train_models=("tiny",),
    train_options="--data generated --vocab 1000 --batch-tokens 2048 --update-tokens 1500 "
    "--threads 1 --gpu-report --profile",
    eager_steps="--warmup 1 --steps 2 --block 1",
    compiled_steps="--warmup 1 --steps 2 --block 1",
    decode_options="--generated 30 --model tiny --vocab 500 --threads 1",
    learn_minutes=0.1,
)


def section(report: Report, title: str) -> None:
    report.line()
    report.line(f"== {title} ==")


def python_command(*arguments: str) -> list[str]:
    return [sys.executable, *arguments]


def correctness(report: Report, budget: Budget) -> Outcome:
    section(report, "1. correctness: the gpu-marked tests (tests/gpu), limit 150 s")
    command = python_command(
        "-m", "pytest", "-p", "no:cacheprovider", "tests/gpu", "-m", "gpu", "-v", "-s",
        "--tb=short", "-rfEs",
    )  # fmt: skip
    outcome = run(command, min(150, budget.left()), report, echo=True)
    report.line(f"-- correctness: {outcome.describe()}")
    return outcome


def learning(settings: Settings, folder: Path, budget: Budget, report: Report, lines: list[str]):
    """Train the demo config for settings.learn_minutes, then evaluate it; `lines` receives
    what the report shows (the caller writes them after the tests' own lines), the last one
    saying how evaluation ended."""
    run_dir = folder / "demo"
    train = python_command(
        "-c", TRAIN, "--config-name", "demo", f"run_dir={run_dir}",
        f"data.prepared_dir={folder / 'prepared'}", f"trainer.device={settings.device}",
        "trainer.max_steps=0", f"trainer.max_time_minutes={settings.learn_minutes}",
        "trainer.valid_every=2000", "trainer.checkpoint_every=2000", "trainer.log_every=500",
        "trainer.progress_bar=false",
    )  # fmt: skip
    trained = run(train, min(60 * settings.learn_minutes + 60, budget.left()), report, echo=False)
    lines.append(f"$ tmt-train {' '.join(train[3:])}")
    keep = ("model:", "update ", "stopped:", "training finished", "ERROR", "Error")
    lines += [strip_log_prefix(line) for line in trained.stderr if any(k in line for k in keep)]
    lines.append(f"-- training: {trained.describe()}")
    if not trained.ok:  # stopped at its limit, it still saved a checkpoint to evaluate
        lines.append(tail(trained.stderr))
    if trained.status not in (0, None) or budget.left() < 15:
        lines.append("-- evaluation: not run")
        return
    evaluate = python_command("-c", EVALUATE, f"run_dir={run_dir}", f"device={settings.device}")
    evaluated = run(evaluate, min(60, budget.left()), report, echo=False)
    lines += [f"$ tmt-eval run_dir=RUN device={settings.device}", *evaluated.stdout]
    if not evaluated.ok:
        lines.append(tail(evaluated.stderr))
    lines.append(f"-- evaluation: {evaluated.describe()}")


def strip_log_prefix(line: str) -> str:
    """'[2026-11-30 17:40:28,573][transformer_mt.train.run][INFO] - text' -> 'HH:MM:SS text'."""
    if line.startswith("[") and "] - " in line:
        stamp, _, text = line.partition("] - ")
        return f"{stamp[12:20]} {text}"
    return line


def throughput(settings: Settings, model: str, compiled: bool, report, budget) -> Outcome:
    mode = "trainer.compile=true, ours with either loss" if compiled else "eager, ours and Marian"
    limit = min(150 if compiled else 110, budget.left())
    section(
        report, f"{5 if compiled else 3}. throughput: model={model}, {mode}, limit {limit:.0f} s"
    )
    command = python_command(
        "scripts/bench_train.py", "--device", settings.device, "--model", model,
        *settings.train_options.split(),
        *(settings.compiled_steps if compiled else settings.eager_steps).split(),
        # Eager: the loss over the whole logits (as first shipped), the chunked one, Marian;
        # compiled: the model compiled with each of the two losses.
        "--columns", "ours-plain,ours" if compiled else "ours-plain,ours,marian",
        *(("--compile",) if compiled else ()),
    )  # fmt: skip
    outcome = run(command, limit, report, echo=True)
    report.line(
        f"-- throughput {model} {'compiled' if compiled else 'eager'}: {outcome.describe()}"
    )
    if not outcome.ok:
        report.line(tail(outcome.stderr))
    return outcome


def decoding(settings: Settings, report: Report, budget: Budget) -> Outcome:
    limit = min(100, budget.left())
    section(report, f"4. decoding: beam 4, ours against CTranslate2, limit {limit:.0f} s")
    env = dict(os.environ)
    found = cublas12_folders()
    report.line(
        "libcublas.so.12 (CTranslate2's CUDA build loads it): "
        + (", ".join(found) if found else "not found on this machine")
    )
    if found:
        env["LD_LIBRARY_PATH"] = os.pathsep.join([*found, env.get("LD_LIBRARY_PATH", "")])
    command = python_command(
        "scripts/bench_decode.py", "--device", settings.device, *settings.decode_options.split()
    )
    outcome = run(command, limit, report, echo=True, env=env)
    report.line(f"-- decoding: {outcome.describe()}")
    if not outcome.ok:
        report.line(tail(outcome.stderr))
    return outcome


def cublas12_folders() -> list[str]:
    """Folders with libcublas.so.12: the nvidia-cublas-cu12 wheel's, or a CUDA 12 toolkit's."""
    candidates = [Path(entry) / "nvidia" / "cublas" / "lib" for entry in sys.path if entry]
    candidates += sorted(Path("/usr/local").glob("cuda*/lib64"))
    candidates += [Path("/usr/lib/x86_64-linux-gnu")]
    return sorted({str(c) for c in candidates if (c / "libcublas.so.12").exists()})


def tail(lines: list[str], count: int = 12) -> str:
    return "\n".join(f"   {line}" for line in lines[-count:])


# ---- the whole check -----------------------------------------------------------------------------
def header(report: Report, args) -> None:
    device = torch.device("cuda") if torch.cuda.is_available() else None
    report.line("# make gpu-check (scripts/gpu_check.sh): the CUDA path of transformer_mt")
    report.line(f"# date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}")
    report.line(f"# code: {code_version()}")
    if device is not None:
        props = torch.cuda.get_device_properties(device)
        smi = nvidia_smi("--query-gpu=name,driver_version,memory.total", "--format=csv,noheader")
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
            f"# torch {torch.__version__} (CUDA {torch.version.cuda}, cuDNN "
            f"{torch.backends.cudnn.version()}, NCCL {nccl}); Python {platform.python_version()}"
        )
    else:
        report.line(f"# a CPU rehearsal, no GPU: torch {torch.__version__}")
    versions = [f"{name} {package_version(name)}" for name in ("transformers", "ctranslate2")]
    report.line(f"# {'; '.join(versions)}; {os.cpu_count()} CPUs; budget {args.budget:.0f} s")
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


def check(args) -> int:
    settings = REHEARSAL if args.rehearse_on_cpu else GPU
    report = Report(Path(args.output), Path(args.log))
    budget = Budget(args.budget)
    started = time.monotonic()
    header(report, args)
    results: dict[str, Outcome | None] = {}
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as folder:
        learned: list[str] = []
        learner = threading.Thread(
            target=learning, args=(settings, Path(folder), budget, report, learned)
        )
        learner.start()  # beside the tests, which time nothing
        results["correctness"] = correctness(report, budget)
        learner.join()
        section(
            report,
            f"2. learning: the demo config, {settings.learn_minutes:g} min of training on "
            f"{settings.device} (beside the tests)",
        )
        for line in learned:
            report.line(line)
        evaluated = bool(learned) and learned[-1].startswith("-- evaluation: done")
        results["learning"] = Outcome(0 if evaluated else 1, 0.0)
        for name, part in later_parts(settings, report, budget):
            if budget.left() < 30:
                left = max(budget.left(), 0.0)
                section(report, f"{name}: not run, {left:.0f} s of the budget left")
                results[name] = None
                continue
            results[name] = part()
    summary(report, results, time.monotonic() - started)
    return 0 if all(outcome is not None and outcome.ok for outcome in results.values()) else 1


def later_parts(settings: Settings, report: Report, budget: Budget):
    """Parts 3 to 5 as (name, function), in the order they run: the GPU to themselves."""

    def timed_training(model: str, compiled: bool):
        name = f"throughput {model} {'compiled' if compiled else 'eager'}"
        return name, functools.partial(throughput, settings, model, compiled, report, budget)

    return [
        *(timed_training(model, compiled=False) for model in settings.train_models),
        ("decoding", functools.partial(decoding, settings, report, budget)),
        *(timed_training(model, compiled=True) for model in settings.train_models),
    ]


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
    parser.add_argument("--budget", type=float, default=480.0, help="seconds for all parts")
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
