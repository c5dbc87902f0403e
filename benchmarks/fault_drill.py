"""Fault drill: kill a training run with SIGKILL again and again, and prove it resumes exactly.

    python -m benchmarks.fault_drill               # 8 kills and 2 more, seed 0, a temporary folder
    python -m benchmarks.fault_drill --kills 12 --seed 3 --workdir /tmp/drill
    python -m benchmarks.fault_drill | tee benchmarks/fault_drill.txt
    python -m benchmarks.fault_drill --compile               # the same with trainer.compile=true
    python -m benchmarks.fault_drill --two-corpora   # on two corpora, one weighted and tagged
    python -m benchmarks.fault_drill --ema 0.99      # with a moving average of the weights

Every run goes through the real command line (`tmt-prepare`, `tmt-train`, each in its own
process group) on the embedded toy corpus with the tiny model:

1. prepare the corpus once, into a prepared folder both runs share;
2. a reference run trains to --steps updates without interruption, timing its start-up and its
   updates so that the kills below can be placed;
3. the drill run trains the same configuration in another run folder, and is killed --kills
   times with SIGKILL sent to its whole process group (trainer and DataLoader workers). Each
   kill moment is one of: start-up (imports, data preparation, model construction, resume), a
   random moment mid-training (seeded), or the instant a checkpoint's temporary file appears
   (mid-write). After each kill, every *.pt file in run_dir/checkpoints must load with
   load_checkpoint; hidden temporary files left by an interrupted write are listed, not
   counted. The run is then restarted with the same command, and its log must say
   "resumed from ... at update N" with N the step of last.pt (or of the newest readable
   checkpoint) seen before the restart;
4. then two interruptions after the last update (--steps is no multiple of --checkpoint-every or
   --valid-every, so the final validation and checkpoint come after the loop): a SIGKILL during
   the final validation (the run must resume from the last checkpoint: no update lost beyond
   it), and a SIGTERM during it, which must still write the final step_N.pt, followed by a
   SIGKILL the instant step_N.pt appears, before (or while) last.pt is linked to it: the
   restart must resume step_N.pt and point last.pt at it, though it has no update left to do.
   A run that ends (exit 0) must leave last.pt at its newest checkpoint;
5. after the last kill the drill run trains to the end, and its final last.pt must equal the
   reference's bitwise: every model parameter, every optimizer state tensor, the schedule, the
   step and data position, the RNG state (wall-clock fields excepted), and best.pt where the
   trainer keeps one. The training losses both runs logged to TensorBoard are compared too.

The exit status is 0 only when every check passes. Seconds, not updates, decide when a kill
lands, so the kill table differs between machines and runs; the verdict must not.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from benchmarks.measure import report_header, signal_group, start_group
from transformer_mt.checkpoint import (
    CheckpointFolder,
    is_training_checkpoint,
    load_checkpoint,
    step_checkpoints,
)
from transformer_mt.checkpoint.folder import STEP_FILE
from transformer_mt.errors import CheckpointError
from transformer_mt.files import PARTIAL_SUFFIX, target_of
from transformer_mt.run_dir import RunDir

PREPARE = "from transformer_mt.cli import prepare_main; prepare_main()"
TRAIN = "from transformer_mt.cli import train_main; train_main()"
RESUMED = re.compile(r"resumed from (\S+) at update (\d+)")
# Checkpoint fields that measure wall-clock time, which no two runs share.
WALL_CLOCK = re.compile(r"second|time|minute")
KILL_MOMENTS = ("mid-training", "checkpoint write", "mid-training", "start-up")
# After the last update, in this order, before the run goes to the end.
FINAL_MOMENTS = ("final validation", "SIGTERM, last.pt")
STOPPED = "stopped: reached trainer.max_steps"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kills", type=int, default=8, help="SIGKILLs before the final stretch")
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill moments")
    parser.add_argument(
        "--steps",
        type=int,
        default=610,
        help="updates of each run (no multiple of --checkpoint-every or --valid-every)",
    )
    parser.add_argument("--checkpoint-every", type=int, default=20, help="updates")
    parser.add_argument("--valid-every", type=int, default=100, help="updates")
    parser.add_argument("--workdir", type=Path, help="where runs go (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="both runs with trainer.compile=true (the model and its loss compiled; every "
        "restart compiles again)",
    )
    parser.add_argument(
        "--ema",
        type=float,
        default=0.0,
        help="both runs with trainer.ema_decay=EMA (a moving average of the weights, in every "
        "checkpoint: the drill compares it too)",
    )
    parser.add_argument(
        "--two-corpora",
        action="store_true",
        help="both runs on two corpora: the toy corpus and a second one (another seed), weight "
        "0.5 (another random half each epoch) and tagged <BT> (data.corpora)",
    )
    args = parser.parse_args()
    if args.kills < 1 or args.steps < 2 * args.checkpoint_every:
        parser.error("need --kills >= 1 and --steps >= 2 x --checkpoint-every")
    if not (args.steps % args.checkpoint_every and args.steps % args.valid_every):
        parser.error("--steps must be no multiple of --checkpoint-every or --valid-every")
    return args


def train_overrides(args: argparse.Namespace, run_dir: Path, prepared_dir: Path) -> list[str]:
    """Hydra overrides for one toy run: single-threaded, one loader worker, a checkpoint every
    few updates, and the training loss logged at every update (so runs compare update by
    update). Two micro-batches of 872 tokens make each update (accumulation)."""
    trainer = {
        "max_steps": args.steps,
        "checkpoint_every": args.checkpoint_every,
        "checkpoint_every_minutes": 0,
        "checkpoint_min_seconds": 0,  # toy updates are fast: every checkpoint_every is written
        "valid_every": args.valid_every,
        "batch_tokens": 1500,
        "global_batch_tokens": 1500,
        "log_every": 1,
        "num_threads": 1,
        "loader_workers": 1,
        "progress_bar": "false",
        "compile": "true" if args.compile else "false",
        "ema_decay": args.ema,
    }
    return [
        "data=toy",
        "data.toy_sizes=[3000,100,100]",
        "data.vocab_size=500",
        "model=tiny",
        "optim.warmup_steps=100",
        *(f"trainer.{key}={value}" for key, value in trainer.items()),
        f"run_dir={run_dir}",
        f"data.prepared_dir={prepared_dir}",
        *([SECOND_CORPUS] if args.two_corpora else []),
    ]


SECOND_CORPUS = '+data.corpora.bt={toy_seed:2,toy_sizes:[3000,1,1],weight:0.5,tag:"<BT>"}'


# ---- checkpoints on disk ----------------------------------------------------------------------
@dataclass
class Census:
    """What a checkpoint folder holds while no process writes to it."""

    steps: dict[str, int] = field(default_factory=dict)
    """Readable checkpoint file name -> its step."""
    last_step: int | None = None
    """The step of last.pt, where it is readable."""
    unreadable: list[str] = field(default_factory=list)
    """'name: reason' for every checkpoint file load_checkpoint refuses."""
    temporaries: list[str] = field(default_factory=list)
    """Hidden temporary files of interrupted checkpoint writes (not checkpoints)."""

    @property
    def newest_step(self) -> int | None:
        return max(self.steps.values(), default=None)


def take_census(folder: CheckpointFolder) -> Census:
    census = Census()
    for path in folder.checkpoint_files():
        try:
            census.steps[path.name] = int(load_checkpoint(path)["step"])
        except CheckpointError as error:
            census.unreadable.append(f"{path.name}: {error}")
    census.last_step = census.steps.get(folder.last.name)
    census.temporaries = sorted(path.name for path in partial_checkpoints(folder))
    return census


def partial_checkpoints(folder: CheckpointFolder) -> list[Path]:
    """The temporary files of checkpoint writes not yet renamed into place (files.replacing's)."""
    partial = folder.path.glob(f".*{PARTIAL_SUFFIX}")  # none where the folder is not (yet)
    return [path for path in partial if is_training_checkpoint(target_of(path))]


def temporary_files(folder: CheckpointFolder) -> set[tuple[str, int, int]]:
    """(name, inode, mtime) of the checkpoint writes under way: a new write changes one."""
    found = set()
    for path in partial_checkpoints(folder):
        try:
            stat = path.stat()
        except FileNotFoundError:  # renamed into place between the listing and the stat
            continue
        found.add((path.name, stat.st_ino, stat.st_mtime_ns))
    return found


# ---- processes -------------------------------------------------------------------------------
def start(code: str, overrides: list[str], log_path: Path, cwd: Path) -> subprocess.Popen:
    """The command in its own process group (so a kill reaches its DataLoader workers too)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-c", code, *overrides]
    with log_path.open("w") as log:
        return start_group(command, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, env=env)


def kill_group(process: subprocess.Popen) -> None:
    signal_group(process, signal.SIGKILL)
    process.wait()


def tail(path: Path, lines: int = 15) -> str:
    text = path.read_text(errors="replace").splitlines()[-lines:]
    return "\n".join(f"    | {line}" for line in text)


@dataclass
class Timing:
    """How long the reference run took to start and to do one update."""

    startup: float
    per_update: float
    total: float


def run_reference(args, workdir: Path, prepared_dir: Path) -> Timing:
    """Train to the end without interruption, noting when each step checkpoint appears."""
    run_dir = workdir / "reference"
    folder = RunDir(run_dir).checkpoints.path
    log_path = workdir / "logs" / "reference.log"
    began = time.monotonic()
    process = start(TRAIN, train_overrides(args, run_dir, prepared_dir), log_path, workdir)
    seen: dict[int, float] = {}
    while process.poll() is None:
        for path in step_checkpoints(folder):
            step = int(STEP_FILE.fullmatch(path.name).group(1))
            seen.setdefault(step, time.monotonic() - began)
        time.sleep(0.02)
    total = time.monotonic() - began
    if process.returncode != 0:
        sys.exit(f"reference run failed (exit {process.returncode}):\n{tail(log_path)}")
    first, last = min(seen), max(seen)
    per_update = (seen[last] - seen[first]) / max(last - first, 1)
    return Timing(max(seen[first] - first * per_update, 0.5), per_update, total)


# ---- the drill -------------------------------------------------------------------------------
@dataclass
class Attempt:
    """One start of the drill run, killed or run to the end."""

    number: int
    moment: str
    before: Census
    seconds: float = math.nan
    returncode: int | None = None
    resumed_at: int | None = None
    after: Census = field(default_factory=Census)
    problems: list[str] = field(default_factory=list)


def kill_delay(moment: str, timing: Timing, steps_left: int, timed_left: int, rng) -> float:
    """Seconds after the start at which to kill ('checkpoint write' waits for a write instead)."""
    if moment == "start-up":
        return rng.uniform(0.0, timing.startup)
    train_left = steps_left * timing.per_update
    # Spread the mid-training kills over what remains, and never past 80 % of it.
    window = min(2.0 * train_left / (timed_left + 1), 0.8 * train_left)
    return timing.startup + rng.uniform(0.0, window)


def wait_for_write(process, folder: CheckpointFolder, deadline: float) -> bool:
    """Poll until a checkpoint's temporary file appears (True), or the process ends (False)."""
    stale = temporary_files(folder)
    while process.poll() is None and time.monotonic() < deadline:
        if temporary_files(folder) - stale:
            return True
        time.sleep(0.0005)
    return False


def drill_attempt(
    number: int, moment: str, delay: float | None, args, paths: dict, timing: Timing
) -> Attempt:
    """Start the drill run; kill it at `moment` (None: let it finish); check what is left."""
    folder = RunDir(paths["drill"]).checkpoints
    attempt = Attempt(number, moment, take_census(folder))
    log_path = paths["logs"] / f"drill_{number:02d}.log"
    began = time.monotonic()
    process = start(
        TRAIN, train_overrides(args, paths["drill"], paths["prepared"]), log_path, paths["work"]
    )
    ceiling = began + 3 * timing.total + 120  # a hung run fails the drill instead of hanging it
    if moment == "checkpoint write":
        wrote = wait_for_write(process, folder, ceiling)
        killed = wrote and process.poll() is None
    elif moment in FINAL_MOMENTS:
        killed = stop_after_the_last_update(attempt, process, log_path, folder, args, ceiling)
    elif delay is not None:
        while process.poll() is None and time.monotonic() - began < delay:
            time.sleep(0.005)
        killed = process.poll() is None
    else:
        killed = False
    if killed:
        kill_group(process)
        attempt.seconds = time.monotonic() - began
    else:
        try:
            process.wait(timeout=max(ceiling - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            kill_group(process)
            attempt.problems.append("did not finish in time (hung?)")
        attempt.seconds = time.monotonic() - began
        attempt.returncode = process.returncode
        # After its SIGTERM a run may end on its own, cleanly, before the SIGKILL reaches it.
        ended_by_sigterm = moment == FINAL_MOMENTS[-1] and process.returncode == 0
        if moment != "to the end" and not ended_by_sigterm:
            attempt.problems.append("finished before it could be killed")
        if process.returncode != 0:
            attempt.problems.append(f"exited with status {process.returncode}:\n{tail(log_path)}")
    attempt.after = take_census(folder)
    check_attempt(attempt, log_path.read_text(errors="replace"))
    return attempt


def stop_after_the_last_update(
    attempt: Attempt, process, log_path: Path, folder: CheckpointFolder, args, deadline: float
) -> bool:
    """Wait for the run's "stopped: reached trainer.max_steps" (its final validation starts);
    then leave the SIGKILL to the caller ("final validation"), or send SIGTERM and wait for the
    final step_N.pt, whose appearance is the moment for the SIGKILL ("SIGTERM, last.pt": between
    the step file and the link of last.pt). Whether the caller is to kill now."""
    while STOPPED not in log_path.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    if attempt.moment == "final validation":
        return True
    signal_group(process, signal.SIGTERM)
    final = folder.step_file(args.steps)
    while not final.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            attempt.problems.append(
                f"SIGTERM during the final validation: the run ended (exit {process.poll()}) "
                f"without writing {final.name}"
            )
            return False
        time.sleep(0.0002)
    return process.poll() is None


def check_attempt(attempt: Attempt, log_text: str) -> None:
    """Readable checkpoints, resume from the right update, last.pt never going backwards."""
    before, after = attempt.before, attempt.after
    if after.unreadable:
        attempt.problems.append("unreadable checkpoint(s): " + "; ".join(after.unreadable))
    if match := RESUMED.search(log_text):
        attempt.resumed_at = int(match.group(2))
        allowed = {before.last_step, before.newest_step} - {None}
        if attempt.resumed_at not in allowed:
            attempt.problems.append(
                f"resumed at update {attempt.resumed_at}, but last.pt was at "
                f"{before.last_step} and the newest readable checkpoint at {before.newest_step}"
            )
    elif before.last_step is not None and attempt.returncode == 0:
        attempt.problems.append(f"finished without resuming from last.pt ({before.last_step})")
    if before.last_step is not None and (after.last_step or -1) < before.last_step:
        attempt.problems.append(f"last.pt went back from {before.last_step} to {after.last_step}")
    if attempt.returncode == 0 and after.last_step != after.newest_step:
        attempt.problems.append(
            f"the run ended with last.pt at update {after.last_step}, not at its newest "
            f"checkpoint ({after.newest_step})"
        )


def run_drill(args, paths: dict, timing: Timing) -> list[Attempt]:
    rng = random.Random(args.seed)
    moments = [KILL_MOMENTS[i % len(KILL_MOMENTS)] for i in range(args.kills)]
    rng.shuffle(moments)
    attempts: list[Attempt] = []
    for number, moment in enumerate([*moments, *FINAL_MOMENTS, "to the end"], start=1):
        done = take_census(RunDir(paths["drill"]).checkpoints).last_step or 0
        timed_left = sum(m == "mid-training" for m in moments[number - 1 :])
        delay = (
            kill_delay(moment, timing, args.steps - done, timed_left, rng)
            if moment in ("start-up", "mid-training")
            else None
        )
        attempt = drill_attempt(number, moment, delay, args, paths, timing)
        attempts.append(attempt)
        print_row(attempt)
        if moment == FINAL_MOMENTS[-1] and attempt.after.newest_step == args.steps:
            where = "before" if attempt.after.last_step != args.steps else "after"
            print(f"      the SIGKILL came {where} last.pt was linked to step_{args.steps}.pt")
        if attempt.returncode is not None and moment != "to the end":
            break  # it finished (or failed): there is nothing left to kill
    return attempts


# ---- comparing the two final checkpoints -----------------------------------------------------
@dataclass
class Comparison:
    tensors: dict[str, int] = field(default_factory=dict)
    """Top-level key -> number of tensors compared under it."""
    differences: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    max_abs_diff: float = 0.0


def compare(ours, theirs, where: str, top: str, result: Comparison) -> None:
    """Walk two checkpoint values together: tensors with torch.equal, the rest with ==."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        for key in sorted(ours.keys() | theirs.keys(), key=str):
            name = f"{where}.{key}" if where else str(key)
            if isinstance(key, str) and WALL_CLOCK.search(key):
                result.ignored.append(name)
            elif key not in ours or key not in theirs:
                result.differences.append(f"{name}: only in one checkpoint")
            else:
                compare(ours[key], theirs[key], name, top or str(key), result)
    elif isinstance(ours, list | tuple) and isinstance(theirs, list | tuple):
        if len(ours) != len(theirs):
            result.differences.append(f"{where}: lengths {len(ours)} vs {len(theirs)}")
        for index, (a, b) in enumerate(zip(ours, theirs, strict=False)):
            compare(a, b, f"{where}[{index}]", top, result)
    elif isinstance(ours, torch.Tensor) and isinstance(theirs, torch.Tensor):
        result.tensors[top] = result.tensors.get(top, 0) + 1
        if ours.shape != theirs.shape or ours.dtype != theirs.dtype:
            result.differences.append(
                f"{where}: {ours.dtype}{list(ours.shape)} vs {theirs.dtype}{list(theirs.shape)}"
            )
        elif not torch.equal(ours, theirs):
            diff = (ours.double() - theirs.double()).abs().max().item()
            result.max_abs_diff = max(result.max_abs_diff, diff)
            result.differences.append(f"{where}: max abs diff {diff:.3g}")
    elif ours != theirs:
        result.differences.append(f"{where}: {ours!r} vs {theirs!r}")


def logged_losses(run_dir: Path) -> dict[int, float]:
    """train/loss by update from the run's TensorBoard files; where a restarted run logged an
    update again, its later value counts. A killed process's file may end mid-record."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    def written_at(path: Path) -> tuple[int, str]:
        parts = path.name.split(".")  # events.out.tfevents.<unix time>.<host>.<pid>.<n>
        return (int(parts[3]) if len(parts) > 3 and parts[3].isdigit() else 0, path.name)

    losses: dict[int, float] = {}
    for path in sorted(RunDir(run_dir).tensorboard.glob("events.out.tfevents.*"), key=written_at):
        try:
            for event in EventFileLoader(str(path)).Load():
                for value in event.summary.value:
                    if value.tag == "train/loss":
                        tensor = value.tensor.float_val
                        losses[event.step] = tensor[0] if tensor else value.simple_value
        except Exception:  # a truncated record at the end of a killed run's file
            continue
    return losses


# ---- report ----------------------------------------------------------------------------------
HEADER = (
    f"{'':4}  {'':16} {'killed':>7}  {'resumed':>7}  -- checkpoints after the kill --\n"
    f"{'kill':>4}  {'moment':<16} {'after s':>7}  {'at upd.':>7}  {'last.pt':>7}  {'newest':>6}  "
    f"{'readable':<13}  temporary files left"
)


def print_row(attempt: Attempt) -> None:
    after = attempt.after
    number = "end" if attempt.moment == "to the end" else str(attempt.number)

    def show(value) -> str:
        return "-" if value is None else str(value)

    readable = f"{'yes' if not after.unreadable else 'NO'} ({len(after.steps)} files)"
    print(
        f"{number:>4}  {attempt.moment:<16} {attempt.seconds:7.2f}  {show(attempt.resumed_at):>7}  "
        f"{show(after.last_step):>7}  {show(after.newest_step):>6}  {readable:<13}  "
        f"{', '.join(after.temporaries) or '-'}",
        flush=True,
    )
    for problem in attempt.problems:
        print(f"      PROBLEM: {problem}", flush=True)


def final_comparison(paths: dict) -> tuple[Comparison, list[str]]:
    drill, reference = (RunDir(paths[run]).checkpoints for run in ("drill", "reference"))
    ours, theirs = load_checkpoint(drill.last), load_checkpoint(reference.last)
    result = Comparison()
    compare(ours, theirs, "", "", result)
    best, name = [drill.best, reference.best], drill.best.name
    if all(path.is_file() for path in best):  # trainers that keep the best-scoring checkpoint
        ours, theirs = (load_checkpoint(path) for path in best)
        best_result = Comparison()
        compare(ours["model"], theirs["model"], f"{name} model", name, best_result)
        if ours["step"] != theirs["step"]:
            best_result.differences.append(f"{name} step: {ours['step']} vs {theirs['step']}")
        result.differences += best_result.differences
        result.tensors[name] = best_result.tensors.get(name, 0)
    reference_losses = logged_losses(paths["reference"])
    drill_losses = logged_losses(paths["drill"])
    common = sorted(reference_losses.keys() & drill_losses.keys())
    loss_diff = max((abs(reference_losses[s] - drill_losses[s]) for s in common), default=0.0)
    unequal = sum(reference_losses[s] != drill_losses[s] for s in common)
    notes = [
        f"logged training loss: {len(common)} updates logged by both runs, {unequal} differ "
        f"(max abs diff {loss_diff:.3g})"
    ]
    return result, notes


def report(attempts: list[Attempt], comparison: Comparison, notes: list[str], kills: int) -> bool:
    done = sum(not math.isnan(a.seconds) and a.returncode is None for a in attempts)
    problems = [p for a in attempts for p in a.problems]
    if done < kills:
        problems.append(f"only {done} of {kills} kills happened")
    counts = comparison.tensors
    print("\nfinal last.pt, drill run vs reference run:")
    print(f"  model parameters: {counts.get('model', 0)} tensors compared")
    print(f"  optimizer state:  {counts.get('optimizer', 0)} tensors compared")
    other = {k: v for k, v in counts.items() if k not in ("model", "optimizer")}
    print(f"  other tensors:    {other or 'none'}")
    print("  everything else (schedule, step, data position, progress): compared with ==")
    print(f"  not compared (wall-clock): {', '.join(comparison.ignored) or 'nothing'}")
    print(f"  max abs difference over all tensors: {comparison.max_abs_diff:.3g}")
    for line in [*comparison.differences[:20], *notes]:
        print(f"  {line}")
    if comparison.differences:
        problems.append(f"{len(comparison.differences)} difference(s) from the reference")
    temporaries = sorted({t for a in attempts for t in a.after.temporaries})
    print(f"  temporary files of interrupted writes seen: {', '.join(temporaries) or 'none'}")
    if problems:
        print(f"\nVERDICT: FAIL ({len(problems)} problem(s))")
        for problem in problems:
            print(f"  - {problem.splitlines()[0]}")
        return False
    print(
        f"\nVERDICT: PASS: {done} SIGKILLs, every checkpoint readable after each, every restart "
        f"resumed from the last checkpoint, a SIGTERM during the final validation wrote the final "
        f"checkpoint, last.pt at the newest checkpoint wherever a run ended, final state bitwise "
        f"equal to the uninterrupted run ({counts.get('model', 0)} parameter tensors, max abs "
        f"diff {comparison.max_abs_diff:g})"
    )
    return True


def main() -> None:
    args = parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="fault_drill_"))
    paths = {
        "work": workdir.resolve(),
        "prepared": workdir.resolve() / "prepared",
        "reference": workdir.resolve() / "reference",
        "drill": workdir.resolve() / "drill",
        "logs": workdir.resolve() / "logs",
    }
    if paths["reference"].exists() or paths["drill"].exists():
        sys.exit(f"{workdir} already holds runs: give an empty or new --workdir")
    paths["logs"].mkdir(parents=True, exist_ok=True)
    print(*report_header("make fault-drill: SIGKILLs of a toy training run"), sep="\n")
    print(
        f"fault drill: {args.kills} kills and {len(FINAL_MOMENTS)} after the last update, seed "
        f"{args.seed}, {args.steps} updates, checkpoint "
        f"every {args.checkpoint_every}; work folder {workdir}"
    )
    began = time.monotonic()
    log_path = paths["logs"] / "prepare.log"
    prepare = start(
        PREPARE,
        train_overrides(args, paths["reference"], paths["prepared"]),
        log_path,
        paths["work"],
    )
    if prepare.wait() != 0:
        sys.exit(f"tmt-prepare failed:\n{tail(log_path)}")
    print(f"prepared the toy corpus in {time.monotonic() - began:.1f} s")
    timing = run_reference(args, paths["work"], paths["prepared"])
    print(
        f"reference run: {args.steps} updates in {timing.total:.1f} s (start-up about "
        f"{timing.startup:.1f} s, {1000 * timing.per_update:.0f} ms per update)\n"
    )
    print(HEADER)
    attempts = run_drill(args, paths, timing)
    try:
        comparison, notes = final_comparison(paths)
    except CheckpointError as error:
        comparison, notes = Comparison(differences=[f"no final checkpoint to compare: {error}"]), []
    passed = report(attempts, comparison, notes, args.kills + len(FINAL_MOMENTS))
    print(f"drill took {time.monotonic() - began:.0f} s in all")
    if args.workdir is None and not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    main()
