"""Plain beam search of this checkout against another checkout's, ABBA, on one model and file.

    python -m benchmarks.search_against --run RUN --source FILE --against OTHER_CHECKOUT \\
        | tee -a benchmarks/decode.txt

Each round translates FILE with `load_translator(RUN, CHECKPOINT).translate` (the run's decoding
settings: beam 4, alpha 0.6 unless the run says otherwise) once with this checkout's package and
once with OTHER_CHECKOUT's (its `transformer_mt` first on PYTHONPATH), each in a process of its
own, in ABBA order over --rounds rounds, after a warm-up of the first 50 lines in the same
process. Reported: each checkout's seconds of every round and their median, the ratio of the
medians (this / other), and whether the two wrote the same translations (md5 of the output).
Where a change was meant to leave plain beam search alone (a new search feature), the ratio
should be within the rounds' spread and the translations the same.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.measure import abba_order, report_header

HERE = Path(__file__).resolve().parents[1]

# Run in each checkout's process: load, warm up, time one translation of the whole file.
TIMED = """
import hashlib, json, sys, time
import transformer_mt
from transformer_mt.decode.loading import load_translator
run, checkpoint, source = sys.argv[1:4]
lines = open(source, encoding="utf-8").read().splitlines()
translator = load_translator(run, checkpoint, device="cpu")
translator.translate(lines[:50])
started = time.perf_counter()
outputs = translator.translate(lines)
seconds = time.perf_counter() - started
digest = hashlib.md5("\\n".join(outputs).encode("utf-8")).hexdigest()
print(json.dumps({"seconds": seconds, "md5": digest, "package": transformer_mt.__file__}))
"""


def timed(checkout: Path, args: argparse.Namespace) -> dict:
    """One translation of the file by `checkout`'s package, in a process of its own."""
    environment = {**os.environ, "PYTHONPATH": str(checkout)}
    run, source = str(Path(args.run).resolve()), str(args.source.resolve())
    command = [sys.executable, "-c", TIMED, run, args.checkpoint, source]
    # in the checkout: `python -c` puts the working folder first on sys.path
    done = subprocess.run(
        command, cwd=checkout, env=environment, capture_output=True, text=True, check=True
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    if not Path(found["package"]).resolve().is_relative_to(checkout):
        raise RuntimeError(f"{checkout}: the process imported {found['package']} instead")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--run", required=True, help="a run folder")
    parser.add_argument("--checkpoint", default="averaged.pt")
    parser.add_argument("--source", type=Path, required=True, help="a file of source sentences")
    parser.add_argument("--against", type=Path, required=True, help="another checkout's root")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    checkouts = {"this": HERE, "other": args.against.resolve()}
    print(
        *report_header(f"plain beam search: this checkout against {checkouts['other']}"), sep="\n"
    )
    found: dict[str, list[dict]] = {name: [] for name in checkouts}
    for turn in range(args.rounds):
        for name in abba_order(list(checkouts), turn):
            found[name].append(timed(checkouts[name], args))
    medians = {name: statistics.median(r["seconds"] for r in found[name]) for name in found}
    for name, checkout in checkouts.items():
        rounds = [round(r["seconds"], 2) for r in found[name]]
        print(f"{name:>5} ({checkout}): {medians[name]:.2f} s median of {rounds}")
    digests = {r["md5"] for results in found.values() for r in results}
    print(
        f"this / other: {medians['this'] / medians['other']:.3f}x; translations "
        f"{'the same' if len(digests) == 1 else 'DIFFER'} (md5 {', '.join(sorted(digests))})"
    )


if __name__ == "__main__":
    main()
