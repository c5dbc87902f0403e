"""WMT's first hour on one GPU, rehearsed on generated data in WMT's shapes (`make gpu-check
ARGS="--parts wmt-hour"`, an optional run, benchmarks/gpu_check.py; the lent machine has no
network, so no hub download): what `make train` (WMT14 en-de, model=base, 25,000 target tokens
an update) meets first, and how long the paper's 100k updates would take.

    python -m benchmarks.wmt_first_hour                      # 1,000,000 pairs, 1,000 updates
    python -m benchmarks.wmt_first_hour --pairs 4500000      # WMT14's whole size

1. Data: --pairs generated pairs of WMT-like lengths (benchmarks/bench_data.py's corpus, 3,000
   valid pairs as newstest2013), prepared by tmt-prepare (clean, SentencePiece, binarize) with
   --vocab pieces; its seconds, pairs/s and, for a fraction of 4.5M pairs, the time projected
   to 4.5M (linear in pairs: benchmarks/data_prep.txt measured 22,222 pairs/s at 1M and 20,911
   at 4.5M).
2. Training: tmt-train of the paper's preset (model=base, trainer.global_batch_tokens=25,000)
   for --steps updates from a fresh run folder, trainer.compile as --compile (auto: what make
   train does): the distinct batch shapes of the epoch, the first update's seconds (the compile
   warm-up, if it compiles), target tokens/s every --log-every updates (speed over time), and
   the write time of the one checkpoint it writes (the end's).
3. Validation: the trainer's final validation, the loss on the valid split and greedy BLEU on
   --valid-sentences (3,000) of it, timed from the log's "stopped" line to its result.
4. One rank's share at NPROC=8: tmt-train with updates of --rank-share target tokens (25,000 /
   8 = 3,125) for --rank-share-steps updates: its seconds per update.
5. The projection of 100,000 updates (the paper's base run) on one GPU: the seconds per update
   of the second half of the measured updates x 100,000, plus the preset's validations (every
   1,000 updates: 100 of the measured pass, whose 3,000 sentences are more than the preset's
   500: an upper bound) and checkpoints (every 1,000 updates and every 10 minutes, at the
   measured write time). On 8 GPUs: each update is one rank's share plus an all-reduce of the
   float32 gradients, modelled (not measured) as a ring all-reduce, 2 (n - 1) / n x 4 bytes x
   parameters at --allreduce-gbps of bus bandwidth (NVLink within one machine; nccl-tests'
   busbw is the figure to put here), shown not overlapped with the backward (an upper bound) and
   fully overlapped (a lower bound).
6. Compiled (on a GPU, after the rest, unless --compile true): the first 300 updates again with
   trainer.compile=true: the compile warm-up (the first update), graphs and recompiles over the
   epoch's shapes, the speed beside step 2's. Not in the CPU rehearsal (compiling takes minutes
   on 2 cores): step 2 runs the same code with another setting.

--rehearse-on-cpu: every step on the CPU at toy scale (a tiny model, 20,000 pairs, a few
updates): the code path, checked before a GPU runs it.
"""

from __future__ import annotations

import argparse
import datetime
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.bench_data import write_corpus
from benchmarks.gpu_recipe import Clock, Ran, run_step, strip_prefix, tmt
from benchmarks.measure import report_header

PAPER_UPDATES = 100_000
WMT_PAIRS = 4_500_000
VALID_EVERY = CHECKPOINT_EVERY = 1000  # the paper preset's (configs/trainer/paper.yaml)
CHECKPOINT_MINUTES = 10.0
RANKS = 8


@dataclass(frozen=True)
class Settings:
    device: str
    pairs: int
    vocab: int
    model: str
    update_tokens: int
    steps: int
    log_every: int
    valid_sentences: int
    rank_share_steps: int
    compiled_steps: int = 0  # step 6 (0: not run)
    extra: tuple[str, ...] = ()  # tmt-train's overrides beyond these


GPU = Settings(
    device="cuda", pairs=1_000_000, vocab=37_000, model="base", update_tokens=25_000,
    steps=1000, log_every=50, valid_sentences=3000, rank_share_steps=300, compiled_steps=300,
)  # fmt: skip
REHEARSAL = Settings(
    device="cpu", pairs=20_000, vocab=1000, model="tiny", update_tokens=2000, steps=12,
    log_every=3, valid_sentences=40, rank_share_steps=6,
    extra=("decode.max_len_a=0", "decode.max_len_b=8", "trainer.loader_workers=0"),
)  # fmt: skip


# ---- the training log ----------------------------------------------------------------------------
WINDOW = re.compile(r"update (\d+) epoch \d+ .*tok/s=(\d+)")
PARAMETERS = re.compile(r"model: ([\d,]+) parameters")
WROTE = re.compile(r"wrote (\S+) \(([\d,]+) MB\) in ([\d.]+) s")


def stamp(line: str) -> datetime.datetime | None:
    """The time of a log line '[2026-12-04 17:40:28,573][...' (None for other lines)."""
    try:
        return datetime.datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f")
    except ValueError:
        return None


def first(pattern: re.Pattern, lines: list[str]) -> re.Match | None:
    return next((m for m in map(pattern.search, lines) if m), None)


def line_with(text: str, lines: list[str]) -> str | None:
    return next((line for line in lines if text in line), None)


def seconds_per_update(lines: list[str], update_tokens: int, after: int) -> float | None:
    """The mean seconds of an update over the log windows that end after update `after` (target
    tokens an update / the window's target tokens per second of training)."""
    rates = [(int(m.group(1)), int(m.group(2))) for m in map(WINDOW.search, lines) if m]
    late = [update_tokens / rate for update, rate in rates if update > after and rate > 0]
    return statistics.mean(late) if late else None


def validation_seconds(lines: list[str]) -> float | None:
    """From the 'stopped:' line to the final validation's result (loss and BLEU)."""
    stopped, result = line_with("stopped:", lines), line_with("valid loss", lines)
    if stopped is None or result is None or not (stamp(stopped) and stamp(result)):
        return None
    return (stamp(result) - stamp(stopped)).total_seconds()


# ---- the steps -----------------------------------------------------------------------------------
def data_overrides(settings: Settings, corpus: Path, work: Path) -> list[str]:
    return [
        "data=files", f"data.dir={corpus}", "data.src_lang=en", "data.tgt_lang=de",
        f"data.vocab_size={settings.vocab}", f"data.prepared_dir={work / 'prepared'}",
    ]  # fmt: skip


def prepare_data(settings: Settings, work: Path, clock: Clock) -> Path | None:
    """Generate the corpus (timed apart: a user's corpus exists), then tmt-prepare it."""
    corpus = work / "corpus"
    started = time.perf_counter()
    write_corpus(corpus, settings.pairs, valid=settings.valid_sentences)
    print(
        f"1. data: generated {settings.pairs:,} WMT-like pairs in "
        f"{time.perf_counter() - started:.0f} s (not part of a user's time)",
        flush=True,
    )
    command = tmt("prepare", *data_overrides(settings, corpus, work), f"run_dir={work / 'prep'}")
    ran = run_step("   tmt-prepare", command, clock)
    if not ran.ok:
        return None
    rate = settings.pairs / ran.seconds
    projected = WMT_PAIRS / rate
    print(
        f"   preparation: {settings.pairs:,} pairs in {ran.seconds:.0f} s = {rate:,.0f} pairs/s "
        f"(the command's whole time, SentencePiece training and start-up included); 4.5M pairs "
        f"projected at this rate: {projected:.0f} s ({projected / 60:.1f} min)",
        flush=True,
    )
    return corpus


def train(settings: Settings, corpus: Path, work: Path, run: str, clock: Clock, *extra) -> Ran:
    command = tmt(
        "train", *data_overrides(settings, corpus, work), f"run_dir={work / run}",
        f"model={settings.model}", f"trainer.device={settings.device}",
        f"trainer.global_batch_tokens={settings.update_tokens}",
        f"trainer.batch_tokens={settings.update_tokens}", f"trainer.max_steps={settings.steps}",
        "trainer.max_time_minutes=0", "trainer.valid_every=0", "trainer.checkpoint_every=0",
        "trainer.checkpoint_every_minutes=0", f"trainer.log_every={settings.log_every}",
        "trainer.progress_bar=false", *settings.extra, *extra,
    )  # fmt: skip
    return run_step(f"   tmt-train {run}", command, clock)


def first_updates(settings: Settings, corpus: Path, work: Path, clock: Clock, compiling: str):
    """Step 2 and 3: the first updates, the final validation, the end's checkpoint."""
    print(
        f"2. training: model={settings.model}, updates of {settings.update_tokens:,} target "
        f"tokens, {settings.steps:,} updates, trainer.compile={compiling}",
        flush=True,
    )
    ran = train(
        settings, corpus, work, "run", clock, f"trainer.compile={compiling}",
        f"trainer.valid_bleu_sentences={settings.valid_sentences}",
    )  # fmt: skip
    show_training(ran)
    wrote = first(WROTE, ran.stderr)
    if wrote:
        print(f"   one checkpoint: {wrote.group(1)}, {wrote.group(2)} MB, written in "
              f"{wrote.group(3)} s", flush=True)  # fmt: skip
    seconds = validation_seconds(ran.stderr)
    result = line_with("valid loss", ran.stderr)
    if seconds is not None:
        print(
            f"3. validation: {seconds:.1f} s for the loss on the valid split and greedy BLEU on "
            f"{settings.valid_sentences:,} sentences ({strip_prefix(result).split(' ', 1)[1]})",
            flush=True,
        )
    return ran


SHOWN = ("model:", "epoch 0:", "the first update", "trainer.compile", "torch.compile", "stopped:")


def show_training(ran: Ran) -> None:
    """The log lines of a training run that say what it met: the model and plan, the epoch's
    distinct shapes, the first update, the compiler's decision and counts, every window's
    speed."""
    for line in ran.stderr:
        if any(key in line for key in SHOWN) or WINDOW.search(line):
            print(f"   {strip_prefix(line)}", flush=True)


def compiled(settings: Settings, corpus: Path, work: Path, clock: Clock) -> Ran:
    """Step 6: the first updates again with trainer.compile=true (the layers compiled one by
    one): the compile warm-up, graphs and recompiles over the epoch's shapes, the speed."""
    steps = settings.compiled_steps
    print(f"6. compiled: the first {steps:,} updates with trainer.compile=true", flush=True)
    ran = train(
        settings, corpus, work, "compiled", clock, "trainer.compile=true",
        f"trainer.max_steps={steps}", "trainer.valid_bleu_sentences=0",
    )  # fmt: skip
    show_training(ran)
    return ran


def rank_share(settings: Settings, corpus: Path, work: Path, clock: Clock) -> float | None:
    """Step 4: seconds per update of one rank's share of an update over RANKS GPUs."""
    share = settings.update_tokens // RANKS
    print(f"4. one rank's share at NPROC={RANKS}: updates of {share:,} target tokens", flush=True)
    steps = settings.rank_share_steps
    ran = train(
        settings, corpus, work, "share", clock, f"trainer.global_batch_tokens={share}",
        f"trainer.max_steps={steps}", "trainer.valid_bleu_sentences=0",
    )  # fmt: skip
    seconds = seconds_per_update(ran.stderr, share, after=steps // 2)
    if seconds is not None:
        print(f"   {seconds * 1e3:.1f} ms an update (the second half of {steps})", flush=True)
    return seconds


def projection(settings: Settings, trained: Ran, share: float | None, gbps: float) -> None:
    """Step 5: 100k updates on one GPU and on RANKS."""
    lines = trained.stderr
    update = seconds_per_update(lines, settings.update_tokens, after=settings.steps // 2)
    valid, wrote = validation_seconds(lines), first(WROTE, lines)
    parameters = first(PARAMETERS, lines)
    if update is None or valid is None or wrote is None or parameters is None:
        print("5. projection: not made (a figure above is missing)", flush=True)
        return
    write = float(wrote.group(3))
    validations = PAPER_UPDATES // VALID_EVERY * valid

    def total(per_update: float) -> tuple[float, float]:
        training = PAPER_UPDATES * per_update
        checkpoints = (
            PAPER_UPDATES // CHECKPOINT_EVERY + training / 60 / CHECKPOINT_MINUTES
        ) * write
        return training, training + validations + checkpoints

    training, whole = total(update)
    print(
        f"5. projection of {PAPER_UPDATES:,} updates of model={settings.model} on one "
        f"{settings.device} device: {update:.3f} s an update (the second half of the "
        f"{settings.steps:,} measured) = {training / 3600:.1f} h of updates; with "
        f"{PAPER_UPDATES // VALID_EVERY} validations ({valid:.0f} s each, an upper bound) and "
        f"the checkpoints ({write:.2f} s each): {whole / 3600:.1f} h",
        flush=True,
    )
    if share is None:
        return
    count = int(parameters.group(1).replace(",", ""))
    allreduce = 2 * (RANKS - 1) / RANKS * 4 * count / (gbps * 1e9)
    serial, overlapped = total(share + allreduce)[1], total(max(share, allreduce))[1]
    print(
        f"   on {RANKS}: one rank's share {share * 1e3:.1f} ms + the all-reduce of "
        f"{count:,} float32 gradients, modelled as a ring at {gbps:g} GB/s of bus bandwidth "
        f"(assumed, not measured): {allreduce * 1e3:.1f} ms; {PAPER_UPDATES:,} updates "
        f"{serial / 3600:.1f} h not overlapped, {overlapped / 3600:.1f} h fully overlapped "
        f"(validations and checkpoints as on one)",
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, help="generated pairs (default 1,000,000)")
    parser.add_argument("--steps", type=int, help="updates measured (default 1,000)")
    parser.add_argument("--compile", default="auto", help="trainer.compile (auto, true, false)")
    parser.add_argument("--allreduce-gbps", type=float, default=360.0, help="bus bandwidth")
    parser.add_argument("--limit", type=float, default=540.0, help="seconds for every step")
    parser.add_argument("--workdir", help="corpus, prepared and run folders (default: temp)")
    parser.add_argument("--rehearse-on-cpu", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    settings = REHEARSAL if args.rehearse_on_cpu else GPU
    if args.pairs or args.steps:
        settings = Settings(
            **{**vars(settings), "pairs": args.pairs or settings.pairs,
               "steps": args.steps or settings.steps},
        )  # fmt: skip
    work = Path(args.workdir or tempfile.mkdtemp(prefix="wmt_first_hour_"))
    print(*report_header("WMT's first hour, rehearsed on generated data"), sep="\n")
    print(f"# work folder: {work}", flush=True)
    clock = Clock(args.limit)
    corpus = prepare_data(settings, work, clock)
    if corpus is None:
        return 1
    trained = first_updates(settings, corpus, work, clock, args.compile)
    share = rank_share(settings, corpus, work, clock) if trained.ok else None
    projection(settings, trained, share, args.allreduce_gbps)
    if settings.compiled_steps and args.compile != "true":
        compiled(settings, corpus, work, clock)
    return 0 if trained.ok and share is not None else 1


if __name__ == "__main__":
    sys.exit(main())
