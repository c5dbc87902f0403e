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
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.measure import in_fresh_process, peak_rss_mib, report_header, run_command
from transformer_mt.data.sources import read_pairs
from transformer_mt.run_dir import RunDir


def time_cli(args, source: Path, output: Path) -> dict:
    """tmt-translate on the file, in a child process; its wall time and peak RSS."""
    command = [str(Path(sys.executable).with_name("tmt-translate")), f"run_dir={args.run}"]
    command += [f"input={source}", f"output={output}", f"checkpoint={args.checkpoint}"]
    command += ["device=cpu"]
    environment = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    done = run_command(command, env=environment)
    if done.status != 0:
        raise SystemExit(
            f"{' '.join(command)} failed (exit {done.status}):\n" + "\n".join(done.stderr[-12:])
        )
    return {
        "seconds": done.seconds,
        "rss_mib": done.peak_rss_mib,
        "outputs": output.read_text().splitlines(),
    }


def time_library(args, source: Path) -> dict:
    """The library path, in a process of its own (`in_fresh_process`)."""
    torch.set_num_threads(args.threads)
    from transformer_mt.decode.loading import load_translator

    translator = load_translator(args.run, args.checkpoint, device="cpu")
    lines = source.read_text(encoding="utf-8").splitlines()
    translating = time.perf_counter()
    outputs = translator.translate(lines)
    done = time.perf_counter()
    return {"translate_seconds": done - translating, "rss_mib": peak_rss_mib(), "outputs": outputs}


def time_library_process(args, source: Path) -> dict:
    """time_library, with the wall time of its whole process (Python's start included), as the
    CLI's is measured."""
    started = time.perf_counter()
    result = in_fresh_process(time_library, args, source)
    return {**result, "seconds": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--run", default="runs/multi30k_de_en_small", help="Multi30k run folder")
    parser.add_argument("--checkpoint", default="last.pt")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lines", type=int, default=10_000)
    args = parser.parse_args()

    data = RunDir(args.run).data_config()
    sources = [source for source, _ in read_pairs(data, "test")]
    lines = [sources[i % len(sources)] for i in range(args.lines)]
    print(*report_header("translating a file: tmt-translate vs the library's Translator"), sep="\n")
    print(
        f"# threads {args.threads}; data: {data.dir}/{data.test_split}.{data.src_lang}, "
        f"{len(sources)} sentences repeated to {len(lines)} lines; model: "
        f"{args.run}/checkpoints/{args.checkpoint}; decoding: the run's defaults (beam 4, "
        "length penalty 0.6)"
    )
    with tempfile.TemporaryDirectory(prefix="bench_translate_") as folder:
        source = Path(folder) / "input.txt"
        source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        cli = time_cli(args, source, Path(folder) / "cli.txt")
        library = time_library_process(args, source)
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
