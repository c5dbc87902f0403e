"""The back-translation experiment on Multi30k de→en: does a tagged synthetic corpus pay?

    python -m benchmarks.backtranslation --data MULTI30K --workdir /tmp/bt \
        | tee -a benchmarks/backtranslation.txt
    python -m benchmarks.backtranslation --data MULTI30K --workdir /tmp/r --minutes 3  # rehearsal

MULTI30K is a folder of {train,val,test_2016_flickr}.{de,en} (raw text). The training pairs
are split in two halves, A and B, by a seeded permutation; only B's English is kept, as if it
were monolingual text. Each system is trained with the README's CPU recipe (`--config-name
multi30k`, its trainer.max_time_minutes set to --minutes for every run alike), its newest
checkpoints averaged (`tmt-average last=auto`) and scored on test_2016_flickr
(`tmt-eval checkpoint=averaged.pt decode.length_penalty=auto`):

  (i)   de→en on A alone;
  (ii)  en→de on A; its back-translation of B's English (`tmt-backtranslate`, beam search, or
        --sample); de→en on A plus the back-translation, tagged <BT> (or not, --no-tag;
        weight --bt-weight);
  (iii) de→en on A plus B's real German (the ceiling).

Runs go one at a time, through the real commands; every command is printed before it runs.
Each step leaves its run folder in --workdir, and a rerun skips the steps whose results are
there (a killed experiment continues). The report: each system's test BLEU, chrF and length
ratio, the back-translation's own time and sentences/s.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.measure import report_header

SPLITS = ("train", "val", "test_2016_flickr")
RECIPE = ["--config-name", "multi30k", "data=multi30k_files_de_en"]


def recipe_parser(description: str, seed_help: str) -> argparse.ArgumentParser:
    """The arguments of an experiment of CPU-recipe runs on Multi30k (this one, and
    benchmarks/both_directions.py): --data, --workdir, --minutes, --seed."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, required=True, help="the Multi30k raw text folder")
    parser.add_argument("--workdir", type=Path, required=True, help="runs go here")
    parser.add_argument("--minutes", type=float, default=25.0, help="each run's training time")
    parser.add_argument("--seed", type=int, default=1, help=seed_help)
    return parser


def parse_args() -> argparse.Namespace:
    parser = recipe_parser(__doc__, "the runs' seed (and the sampling's, with --sample)")
    parser.add_argument("--split-seed", type=int, default=1, help="the A/B split's seed")
    parser.add_argument("--bt-weight", type=float, default=1.0, help="the synthetic corpus's")
    parser.add_argument("--sample", action="store_true", help="back-translate by sampling")
    parser.add_argument("--no-tag", action="store_true", help="the synthetic corpus untagged")
    parser.add_argument(
        "--systems",
        default="i,ii,iii",
        help="the systems to train and report, of i, ii, iii (others: an earlier report's rows)",
    )
    parser.add_argument(
        "--limit", type=int, help="a rehearsal: only this many pairs of each half (and of val)"
    )
    return parser.parse_args()


def bin_path(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def run(command: list[str]) -> None:
    print("$", shlex.join(command), flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def split_halves(data: Path, work: Path, seed: int, limit: int | None) -> dict[str, Path]:
    """Folders A and B (each the half's train.{de,en} with the whole val and test files; with
    `limit`, that many pairs of each half and of val) and B's English alone, mono.en."""
    folders = {name: work / name for name in ("A", "B")}
    if all((folder / "train.en").is_file() for folder in folders.values()):
        return folders | {"mono": work / "mono.en"}
    lines = {
        lang: (data / f"train.{lang}").read_text(encoding="utf-8").splitlines()
        for lang in ("de", "en")
    }
    order = np.random.default_rng(seed).permutation(len(lines["de"]))
    half = len(order) // 2
    for name, rows in (("A", order[:half][:limit]), ("B", order[half:][:limit])):
        folder = folders[name]
        folder.mkdir(parents=True, exist_ok=True)
        for lang in ("de", "en"):
            text = "".join(lines[lang][i] + "\n" for i in sorted(rows))
            (folder / f"train.{lang}").write_text(text, encoding="utf-8")
            for split in SPLITS[1:]:
                kept = (data / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()
                if split == "val" and limit:
                    kept = kept[:limit]
                (folder / f"{split}.{lang}").write_text("".join(k + "\n" for k in kept), "utf-8")
    (work / "mono.en").write_bytes((folders["B"] / "train.en").read_bytes())
    return folders | {"mono": work / "mono.en"}


def trained_and_scored(
    name: str, work: Path, args: argparse.Namespace, *overrides: str, pairs: tuple[str, ...] = ()
) -> dict:
    """The recipe's run `name` (skipped when its scores are there), averaged and evaluated: its
    scores.test.json, or, of a model of several target languages, each of `pairs`' scores
    (scores.test.PAIR.json, by pair)."""
    run_dir = work / name
    suffixes = [f".{pair}" for pair in pairs] or [""]
    files = [run_dir / f"scores.test{suffix}.json" for suffix in suffixes]
    if not all(file.is_file() for file in files):
        started = time.perf_counter()
        run(
            [
                bin_path("tmt-train"),
                *RECIPE,
                f"run_dir={run_dir}",
                f"data.prepared_dir={work / 'prepared'}",
                f"trainer.max_time_minutes={args.minutes}",
                f"trainer.seed={args.seed}",
                "trainer.keep_checkpoints=30",
                "trainer.progress_bar=false",
                *overrides,
            ]
        )
        run([bin_path("tmt-average"), f"run_dir={run_dir}", "last=auto"])
        run(
            [
                bin_path("tmt-eval"),
                f"run_dir={run_dir}",
                "checkpoint=averaged.pt",
                "decode.length_penalty=auto",
            ]
        )
        print(f"# {name}: {time.perf_counter() - started:.0f} s in all", flush=True)
    scores = [json.loads(file.read_text()) for file in files]
    return dict(zip(pairs, scores, strict=True)) if pairs else scores[0]


def backtranslated(work: Path, mono: Path, args: argparse.Namespace) -> tuple[Path, float]:
    """B's English back-translated by the en→de run's averaged model; its seconds."""
    output = work / "bt"
    started = time.perf_counter()
    sample = ["decode=sample", f"decode.seed={args.seed}"] if args.sample else []
    run(
        [
            bin_path("tmt-backtranslate"),
            f"run_dir={work / 'ii_en_de'}",
            "checkpoint=averaged.pt",
            f"input={mono}",
            f"output={output}",
            *sample,
        ]
    )
    return output, time.perf_counter() - started


def line(name: str, scores: dict) -> str:
    """A system's test BLEU, chrF and length ratio (from sacreBLEU's detail line)."""
    ratio = re.search(r"ratio = ([0-9.]+)", scores["bleu_detail"])
    return (
        f"{name:<48} BLEU {scores['bleu']:6.2f}  chrF {scores['chrf']:6.2f}  "
        f"ratio {ratio.group(1) if ratio else '?'}  ({scores['bleu_detail']})"
    )


def main() -> None:
    args = parse_args()
    work = args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    print(
        *report_header("back-translation on Multi30k de→en: (i) A, (ii) A + BT(B), (iii) A + B"),
        sep="\n",
        flush=True,
    )
    halves = split_halves(args.data.resolve(), work, args.split_seed, args.limit)
    a, b = halves["A"], halves["B"]
    systems = set(args.systems.split(","))
    if not systems or systems - {"i", "ii", "iii"}:
        raise SystemExit(f"--systems: a list of i, ii, iii, not {args.systems!r}")
    results = {}
    if "i" in systems:
        results["(i) de-en, A"] = trained_and_scored("i_de_en_A", work, args, f"data.dir={a}")
    if "ii" in systems:
        results |= second_system(work, halves, args)
    if "iii" in systems:
        real = f'+data.corpora.real={{dir:"{b}"}}'
        results["(iii) de-en, A + B (real)"] = trained_and_scored(
            "iii_de_en_A_B", work, args, f"data.dir={a}", real
        )
    for name, scores in results.items():
        print(line(name, scores))


def second_system(work: Path, halves: dict[str, Path], args: argparse.Namespace) -> dict:
    """(ii): the en→de run on A, its back-translation of B's English, and de→en on A plus it;
    prints the back-translation's time and rate."""
    a = halves["A"]
    trained_and_scored(
        "ii_en_de", work, args, f"data.dir={a}", "data.src_lang=en", "data.tgt_lang=de"
    )
    earlier = (work / "bt" / "backtranslation.json").is_file()
    bt_folder, seconds = backtranslated(work, halves["mono"], args)
    with open(halves["mono"], "rb") as mono:
        lines = sum(1 for _ in mono)
    tag = "" if args.no_tag else ',tag:"<BT>"'
    corpus = f'+data.corpora.bt={{dir:"{bt_folder}"{tag},weight:{args.bt_weight}}}'
    system = f"(ii) de-en, A + BT(B){'' if args.no_tag else ' <BT>'}"
    system += ", sampled" if args.sample else ""
    system += f", weight {args.bt_weight:g}" if args.bt_weight != 1 else ""
    scores = trained_and_scored("ii_de_en_A_bt", work, args, f"data.dir={a}", corpus)
    if earlier:
        print(f"# back-translation of {lines} sentences: made by an earlier run (see its log)")
    else:
        rate = lines / seconds
        print(f"# back-translation of {lines} sentences: {seconds:.0f} s, {rate:.1f} sentences/s")
    return {system: scores}


if __name__ == "__main__":
    main()
