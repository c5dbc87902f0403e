"""The CPU recipe's levers on Multi30k de→en, each alone and together, seeds in alternation.

    python -m benchmarks.recipe_levers --data MULTI30K --workdir /tmp/levers \\
        --levers base,ema,sampled --seeds 1,2 | tee -a benchmarks/multi30k_recipe.txt
    python -m benchmarks.recipe_levers --data MULTI30K --workdir /tmp/r --minutes 0.5  # rehearsal

MULTI30K is a folder of {train,val,test_2016_flickr}.{de,en} (raw text). Each run is the README's
CPU recipe (`--config-name multi30k`, trainer.max_time_minutes=--minutes for every run alike)
with a lever's settings (LEVERS), one run at a time, seed by seed and lever by lever in turn
(base, ema, ..., base, ema, ...), so that a drift of the machine's speed falls on every lever
alike. Each run is scored twice on test_2016_flickr:

  recipe  its newest checkpoints averaged (`tmt-average last=auto`) and scored with the length
          penalty chosen on valid (`tmt-eval checkpoint=averaged.pt decode.length_penalty=auto`);
  last    its last checkpoint alone at the paper's alpha 0.6 (`tmt-translate`, then sacreBLEU):
          what a user who runs only `make train` and `make eval` gets.

A rerun skips what is there. The report: each run's updates, both scores with their length
ratios, and each lever's mean over the seeds.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import sacrebleu

from benchmarks.backtranslation import bin_path, recipe_parser, run, trained_and_scored
from benchmarks.measure import report_header

SAMPLED = ["data.src_subword_alpha=0.1", "data.tgt_subword_alpha=0.1"]
LEVERS = {
    "base": [],
    "ema": ["trainer.ema_decay=0.999"],
    "sampled": SAMPLED,
    "sampled_src": SAMPLED[:1],
    "sampled_tgt": SAMPLED[1:],
    "ema+sampled": ["trainer.ema_decay=0.999", *SAMPLED],
}


def parse_args() -> argparse.Namespace:
    parser = recipe_parser(__doc__, "unused: see --seeds")
    parser.add_argument("--levers", default="base,ema,sampled", help=f"of {', '.join(LEVERS)}")
    parser.add_argument("--seeds", default="1,2", help="trainer.seed of each lever's runs")
    return parser.parse_args()


def last_checkpoint_scores(run_dir: Path, data: Path) -> dict:
    """The last checkpoint's test_2016_flickr BLEU at beam 4, alpha 0.6 (the run's decode
    settings), written beside the run's other scores as scores.test.last.json."""
    scores_file = run_dir / "scores.test.last.json"
    if scores_file.is_file():
        return json.loads(scores_file.read_text())
    hypotheses = run_dir / "hypotheses.test.last.txt"
    source = data / "test_2016_flickr.de"
    run(
        [bin_path("tmt-translate"), f"run_dir={run_dir}", f"input={source}", f"output={hypotheses}"]
    )
    references = (data / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()
    outputs = hypotheses.read_text(encoding="utf-8").splitlines()
    bleu = sacrebleu.corpus_bleu(outputs, [references])
    chrf = sacrebleu.corpus_chrf(outputs, [references])
    scores = {"bleu": bleu.score, "chrf": chrf.score, "bleu_detail": str(bleu)}
    scores_file.write_text(json.dumps(scores) + "\n")
    return scores


def updates(run_dir: Path) -> int:
    """The run's last update, from its history's end record."""
    ends = [
        json.loads(line)
        for line in (run_dir / "history.jsonl").read_text().splitlines()
        if '"event": "end"' in line
    ]
    return int(ends[-1]["step"]) if ends else -1


def ratio(scores: dict) -> str:
    detail = scores["bleu_detail"]
    return detail.split("ratio = ")[1].split()[0] if "ratio = " in detail else "?"


def main() -> None:
    args = parse_args()
    work = args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    data = args.data.resolve()
    levers = args.levers.split(",")
    unknown = set(levers) - set(LEVERS)
    if unknown:
        raise SystemExit(f"--levers: {', '.join(sorted(unknown))} not of {', '.join(LEVERS)}")
    print(*report_header("the CPU recipe's levers on Multi30k de→en"), sep="\n", flush=True)
    rows = []
    for seed in map(int, args.seeds.split(",")):
        for lever in levers:
            name = f"{lever}_s{seed}"
            seeded = argparse.Namespace(**{**vars(args), "seed": seed})
            recipe = trained_and_scored(name, work, seeded, f"data.dir={data}", *LEVERS[lever])
            last = last_checkpoint_scores(work / name, data)
            rows.append((lever, seed, updates(work / name), recipe, last))
    print(
        f"{'run':<22} {'updates':>7}  {'recipe BLEU':>11} {'ratio':>6}  "
        f"{'last, a 0.6':>11} {'ratio':>6}"
    )
    for lever, seed, steps, recipe, last in rows:
        print(
            f"{lever + ' seed ' + str(seed):<22} {steps:>7,}  {recipe['bleu']:>11.2f} "
            f"{ratio(recipe):>6}  {last['bleu']:>11.2f} {ratio(last):>6}"
        )
    for lever in levers:
        mine = [row for row in rows if row[0] == lever]
        print(
            f"{lever:<22} mean of {len(mine)}: recipe "
            f"{statistics.mean(r[3]['bleu'] for r in mine):.2f}, last at a 0.6 "
            f"{statistics.mean(r[4]['bleu'] for r in mine):.2f}"
        )


if __name__ == "__main__":
    main()
