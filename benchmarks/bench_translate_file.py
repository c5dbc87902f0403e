"""Translating a file: the `tmt-translate` command against the library's Translator, same lines.

    make bench-decode RUN=runs/multi30k_de_en_small       # runs this after bench_decode.py
    .venv/bin/python -m benchmarks.bench_translate_file --run runs/x --lines 10000

The run's test sentences are repeated up to --lines lines and written to a file. Then, each in a
process of its own and one after the other:

  (cli) `tmt-translate run_dir=RUN input=FILE output=OUT`: reads the file in chunks, sorts each
        chunk by length, batches it by decode.batch_tokens, writes the translations in order;
  (lib) load_translator(RUN).translate(all lines) in Python, the file read into a list.

Both decode with the run's default settings (beam 4, length penalty 0.6) on --threads threads.
Reported: sentences/s of each (wall time of the whole process, Python's start and model
loading included, and of the translation alone for the library), the CLI's cost against the
library, peak resident memory of each process, and whether the two outputs are the same line
for line.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from transformer_mt.data.sources import read_pairs
from transformer_mt.run_dir import RunDir


def peak_rss_mib(usage: resource.struct_rusage) -> float:
    """ru_maxrss is in KiB on Linux and in bytes on macOS."""
    return usage.ru_maxrss / (2**20 if sys.platform == "darwin" else 2**10)


def time_cli(args, source: Path, output: Path) -> dict:
    """tmt-translate on the file, in a child process; its wall time and peak RSS."""
    command = [str(Path(sys.executable).with_name("tmt-translate")), f"run_dir={args.run}"]
    command += [f"input={source}", f"output={output}", f"checkpoint={args.checkpoint}"]
    command += ["device=cpu"]
    environment = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    started = time.perf_counter()
    subprocess.run(command, check=True, env=environment, stderr=subprocess.DEVNULL)
    seconds = time.perf_counter() - started
    rss = peak_rss_mib(resource.getrusage(resource.RUSAGE_CHILDREN))
    return {"seconds": seconds, "rss_mib": rss, "outputs": output.read_text().splitlines()}


def time_library(args, source: Path) -> None:
    """The library path, in this (child) process: JSON on stdout."""
    torch.set_num_threads(args.threads)
    from transformer_mt.decode.loading import load_translator

    translator = load_translator(args.run, args.checkpoint, device="cpu")
    lines = source.read_text(encoding="utf-8").splitlines()
    translating = time.perf_counter()
    outputs = translator.translate(lines)
    done = time.perf_counter()
    print(
        json.dumps(
            {
                "translate_seconds": done - translating,
                "rss_mib": peak_rss_mib(resource.getrusage(resource.RUSAGE_SELF)),
                "outputs": outputs,
            }
        )
    )


def measure_in_child(args, mode: str, source: Path, output: Path) -> dict:
    """Each measurement in a fresh process, so that peak RSS is that system's alone. The
    library's `seconds` is its process's wall time, as the CLI's is (Python's start included)."""
    command = [
        sys.executable,
        "-m",
        __spec__.name,
        "--run",
        args.run,
        "--checkpoint",
        args.checkpoint,
    ]
    command += ["--threads", str(args.threads), f"--{mode}", str(source), "--output", str(output)]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    seconds = time.perf_counter() - started
    result = json.loads(done.stdout)
    return {**result, "seconds": seconds} if mode == "measure-library" else result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--run", default="runs/multi30k_de_en_small", help="Multi30k run folder")
    parser.add_argument("--checkpoint", default="last.pt")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lines", type=int, default=10_000)
    parser.add_argument("--measure-cli", help=argparse.SUPPRESS)  # a measurement's own process
    parser.add_argument("--measure-library", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure_cli:
        print(json.dumps(time_cli(args, Path(args.measure_cli), Path(args.output))))
        return
    if args.measure_library:
        time_library(args, Path(args.measure_library))
        return

    data = RunDir(args.run).data_config()
    sources = [source for source, _ in read_pairs(data, "test")]
    lines = [sources[i % len(sources)] for i in range(args.lines)]
    print("# translating a file: tmt-translate vs the library's Translator")
    print(f"# command: {shlex.join([Path(sys.executable).name, *sys.argv])}")
    print(f"# date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}")
    print(
        f"# machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs "
        f"visible; torch {torch.__version__}; threads {args.threads}; load average at start "
        f"{os.getloadavg()[0]:.2f}"
    )
    print(
        f"# data: {data.dir}/{data.test_split}.{data.src_lang}, {len(sources)} sentences "
        f"repeated to {len(lines)} lines; model: {args.run}/checkpoints/{args.checkpoint}; "
        "decoding: the run's defaults (beam 4, length penalty 0.6)"
    )
    with tempfile.TemporaryDirectory(prefix="bench_translate_") as folder:
        source = Path(folder) / "input.txt"
        source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        cli = measure_in_child(args, "measure-cli", source, Path(folder) / "cli.txt")
        library = measure_in_child(args, "measure-library", source, Path(folder) / "unused")
    n = len(lines)
    print(f"\n{n} lines, one process each, one after the other:")
    print(
        f"  (cli) tmt-translate input=FILE     {cli['seconds']:8.1f} s {n / cli['seconds']:7.1f} "
        f"sent/s (process, model loading included)  peak RSS {cli['rss_mib']:7.0f} MiB"
    )
    print(
        f"  (lib) Translator.translate(lines)  {library['seconds']:8.1f} s "
        f"{n / library['seconds']:7.1f} sent/s (process, model loading included)  peak RSS "
        f"{library['rss_mib']:7.0f} MiB"
    )
    print(
        f"        of which translate() alone   {library['translate_seconds']:8.1f} s "
        f"{n / library['translate_seconds']:7.1f} sent/s"
    )
    ratio = library["seconds"] / cli["seconds"]
    met = "met" if ratio >= 0.9 else "NOT met"
    print(f"  cli sentences/s / library's: {ratio:.3f} (target >= 0.9: {met})")
    same = sum(a == b for a, b in zip(cli["outputs"], library["outputs"], strict=True))
    print(f"  the same translation on {same} of {n} lines")


if __name__ == "__main__":
    main()
