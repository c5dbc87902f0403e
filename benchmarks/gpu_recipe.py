"""The Multi30k recipe for one GPU, end to end as a user runs it (`make gpu-check`'s second
command, `ARGS="--parts recipe"`; its sweep: `--parts sweep`; benchmarks/gpu_check.py):

    python -m benchmarks.gpu_recipe --data .data/multi30k             # the recipe, timed
    python -m benchmarks.gpu_recipe --data .data/multi30k --sweep     # then a sweep on valid BLEU

--data: a folder of Multi30k's raw text, {train,val,test_2016_flickr}.{de,en} (29,000 / 1,014 /
1,000 pairs; the lent GPU machine has no network, so the folder travels with the repository:
benchmarks/README.md says how). From a fresh run folder and a fresh prepared folder, the README's
three commands: tmt-train --config-name multi30k_gpu (preparation included), tmt-average last=auto
and tmt-eval with checkpoint=averaged.pt decode.length_penalty=auto, the last two choosing on 500
valid sentences. It prints each command's seconds, the test BLEU and the wall time against the
recipe's target (test_2016_flickr sacreBLEU >= 42.0 in <= 5 minutes on one H200).

--sweep (after the recipe) or --sweep-only: the preset and one change at a time (dropout, batch,
warm-up, model size), each trained for 1 minute on the recipe's prepared folder, compared by
the valid BLEU of the trainer's last validation (500 valid sentences, greedy): the measurement
that chooses the preset's values (transformer_mt/configs/multi30k_gpu.yaml), on valid, never on
test. A sweep started alone (--sweep-only) prepares the corpus in its first run.

--rehearse-on-cpu: the same commands on the CPU with a tiny model for 6 updates, on a tiny
corpus in Multi30k's layout generated from the embedded toy pairs (no --data): the code path,
checked before a GPU runs it.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.measure import report_header, run_command
from transformer_mt.data.toy import toy_pairs

MAINS = {
    "prepare": "prepare_main",
    "train": "train_main",
    "average": "average_main",
    "eval": "evaluate_main",
}
TARGET_BLEU, TARGET_SECONDS = 42.0, 300.0  # the recipe's target on one H200
SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}  # Multi30k's file names

# One setting changed at a time from the preset (transformer_mt/configs/multi30k_gpu.yaml).
SWEEP = (
    (),
    ("model.dropout=0.1",),
    ("trainer.batch_tokens=32768", "trainer.global_batch_tokens=32768"),
    ("trainer.batch_tokens=8192", "trainer.global_batch_tokens=8192"),
    ("optim.warmup_steps=400",),
    ("model=base", "model.dropout=0.3"),
)
REHEARSAL_TRAIN = (
    "model=tiny", "data.vocab_size=400", "trainer.batch_tokens=1500",
    "trainer.global_batch_tokens=1500", "trainer.max_time_minutes=0", "trainer.max_steps=6",
    "trainer.checkpoint_every_minutes=0.0001", "trainer.valid_bleu_sentences=20",
    "trainer.loader_workers=0", "trainer.log_every=20",
)  # fmt: skip
REHEARSAL_DECODE = ("decode.max_len_a=0", "decode.max_len_b=8")


@dataclass(frozen=True)
class Settings:
    device: str
    train: tuple[str, ...] = ()  # tmt-train's overrides beyond the recipe's
    decode: tuple[str, ...] = ()  # tmt-average's and tmt-eval's
    valid_sentences: int = 500
    sweep: tuple[tuple[str, ...], ...] = SWEEP
    sweep_minutes: float = 1.0


GPU = Settings(device="cuda")
REHEARSAL = Settings(
    device="cpu",
    train=REHEARSAL_TRAIN,
    decode=REHEARSAL_DECODE,
    valid_sentences=20,
    sweep=SWEEP[1:2],
    sweep_minutes=0.05,
)


def tmt(command: str, *overrides: str) -> list[str]:
    """The tmt-COMMAND console script as this interpreter runs it (gpu_check.sh puts the
    repository on PYTHONPATH: the package need not be installed)."""
    main = MAINS[command]
    return [sys.executable, "-c", f"from transformer_mt.cli import {main}; {main}()", *overrides]


@dataclass
class Clock:
    """The wall time since the recipe began; every command runs within what `limit` leaves."""

    limit: float
    start: float = field(default_factory=time.monotonic)

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float:
        return max(self.limit - self.elapsed(), 1.0)


@dataclass
class Ran:
    """A command's outcome: ok, seconds, its output lines (stderr: the log)."""

    ok: bool
    seconds: float
    stdout: list[str]
    stderr: list[str]


def run_step(
    title: str, command: list[str], clock: Clock, on_log: Callable[[str], None] | None = None
) -> Ran:
    """Run one command within what the clock leaves, each line of its log (stderr) handed to
    `on_log` as it comes; print its seconds (its log's tail when it failed)."""
    done = run_command(command, limit=clock.left(), on_stderr=on_log)
    ran = Ran(done.status == 0, done.seconds, done.stdout, done.stderr)
    state = "ok" if ran.ok else ("killed at the limit" if done.status is None else "FAILED")
    print(f"{title}: {state} in {ran.seconds:.1f} s (wall {clock.elapsed():.0f} s)", flush=True)
    if not ran.ok:
        print("\n".join(f"   {line}" for line in ran.stderr[-15:]), flush=True)
    return ran


def write_rehearsal_corpus(folder: Path) -> Path:
    """A tiny corpus in Multi30k's layout, German -> English, from the embedded toy pairs."""
    folder.mkdir(parents=True, exist_ok=True)
    sizes = {"train": 2000, "valid": 40, "test": 40}
    pairs = iter(toy_pairs(sum(sizes.values()), seed=3, max_words=12))
    for split, size in sizes.items():
        part = [next(pairs) for _ in range(size)]
        (folder / f"{SPLITS[split]}.en").write_text("".join(en + "\n" for en, _ in part))
        (folder / f"{SPLITS[split]}.de").write_text("".join(de + "\n" for _, de in part))
    return folder


def train_command(settings: Settings, data: Path, work: Path, run: str, *extra: str) -> list[str]:
    return tmt(
        "train", "--config-name", "multi30k_gpu", "data=multi30k_files_de_en",
        f"data.dir={data}", f"data.prepared_dir={work / 'prepared'}", f"run_dir={work / run}",
        f"trainer.device={settings.device}", "trainer.progress_bar=false", *settings.train,
        *extra,
    )  # fmt: skip


LOGGED = ("model:", "epoch 0:", "the first update", "stopped:", "wrote ", "valid loss", "ERROR")


def show_log(line: str) -> None:
    """A training log line that says what the run did, printed as it comes (not the
    per-window throughput lines)."""
    if any(key in line for key in LOGGED):
        print(f"   {strip_prefix(line)}", flush=True)


def strip_prefix(line: str) -> str:
    """'[2026-12-04 17:40:28,573][transformer_mt.x][INFO] - text' -> '17:40:28 text'."""
    if line.startswith("[") and "] - " in line:
        stamp, _, text = line.partition("] - ")
        return f"{stamp[12:20]} {text}"
    return line


def recipe(settings: Settings, data: Path, work: Path, clock: Clock) -> float | None:
    """The README's three commands from a fresh run folder; the test BLEU (None: not reached)."""
    started = clock.elapsed()
    run = work / "run"
    trained = run_step(
        "tmt-train --config-name multi30k_gpu",
        train_command(settings, data, work, "run"),
        clock,
        show_log,
    )
    if not trained.ok:
        return None
    choose = (f"valid_sentences={settings.valid_sentences}", f"device={settings.device}")
    averaged = run_step(
        "tmt-average last=auto",
        tmt("average", f"run_dir={run}", "last=auto", *choose, *settings.decode),
        clock,
    )
    if not averaged.ok:
        return None
    evaluated = run_step(
        "tmt-eval checkpoint=averaged.pt decode.length_penalty=auto",
        tmt(
            "eval", f"run_dir={run}", "checkpoint=averaged.pt", "decode.length_penalty=auto",
            *choose, *settings.decode,
        ),
        clock,
    )  # fmt: skip
    for line in evaluated.stdout[:2]:
        print(f"   {line}", flush=True)
    bleu = scored_bleu(evaluated.stdout) if evaluated.ok else None
    seconds = clock.elapsed() - started
    if bleu is not None:
        met = bleu >= TARGET_BLEU and seconds <= TARGET_SECONDS
        print(
            f"recipe: test BLEU {bleu:.2f} in {seconds:.0f} s of wall time, preparation, "
            f"averaging and the alpha choice included (target: >= {TARGET_BLEU} in <= "
            f"{TARGET_SECONDS:.0f} s on one H200: {'met' if met else 'not met'})",
            flush=True,
        )
    return bleu


TEST_LINE = re.compile(r"^test: BLEU ([\d.]+) ")
VALID_LINE = re.compile(r"update (\d+): valid loss .*, BLEU ([\d.]+)")


def scored_bleu(stdout: list[str]) -> float | None:
    found = [TEST_LINE.match(line) for line in stdout]
    return next((float(m.group(1)) for m in found if m), None)


def sweep(settings: Settings, data: Path, work: Path, clock: Clock) -> int:
    """The preset and one change at a time, each for settings.sweep_minutes: valid BLEU (the
    trainer's last validation), printed as each ends; how many were measured."""
    measured = 0
    minutes = f"trainer.max_time_minutes={settings.sweep_minutes}"
    print(f"sweep: {settings.sweep_minutes:g} min of training each, valid BLEU", flush=True)
    for number, changes in enumerate(settings.sweep):
        name = " ".join(changes) or "the preset"
        command = train_command(settings, data, work, f"sweep_{number}", *changes, minutes)
        ran = run_step(f"sweep {number}: {name}", command, clock)
        found = [VALID_LINE.search(line) for line in ran.stderr]
        last = next((m for m in reversed(found) if m), None)
        if last:
            measured += 1
            print(
                f"sweep {number}: {name}: {int(last.group(1)):,} updates, valid BLEU "
                f"{float(last.group(2)):.2f}",
                flush=True,
            )
    return measured


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", help="Multi30k's raw text: {train,val,test_2016_flickr}.{de,en}")
    parser.add_argument("--limit", type=float, default=900.0, help="seconds for all it runs")
    parser.add_argument("--sweep", action="store_true", help="then the sweep on valid BLEU")
    parser.add_argument("--sweep-only", action="store_true", help="the sweep alone")
    parser.add_argument("--workdir", help="run and prepared folders (default: a new temp dir)")
    parser.add_argument("--rehearse-on-cpu", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    settings = REHEARSAL if args.rehearse_on_cpu else GPU
    work = Path(args.workdir or tempfile.mkdtemp(prefix="gpu_recipe_"))
    print(*report_header("the Multi30k recipe for one GPU (multi30k_gpu)"), sep="\n")
    if args.data:
        data = Path(args.data).resolve()
    elif args.rehearse_on_cpu:
        data = write_rehearsal_corpus(work / "multi30k")
    else:
        print("gpu_recipe: --data is needed: a folder of Multi30k's raw text", flush=True)
        return 2
    missing = [f"{name}.{lang}" for name in SPLITS.values() for lang in ("de", "en")]
    missing = [name for name in missing if not (data / name).is_file()]
    if missing:
        print(f"gpu_recipe: {data} lacks {', '.join(missing)} (Multi30k's raw text)", flush=True)
        return 2
    print(f"# data: {data}; work folder: {work}", flush=True)
    clock = Clock(args.limit)
    if not args.sweep_only and recipe(settings, data, work, clock) is None:
        return 1
    if (args.sweep or args.sweep_only) and not sweep(settings, data, work, clock):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
