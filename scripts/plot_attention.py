"""Draw one sentence's cross-attention as a heat map (PNG): source pieces across, target pieces
down, as written by `tmt-translate attention=FILE` (one JSON line per input line).

    printf 'Ein Mann fährt Fahrrad.\\n' | make translate RUN=runs/x ARGS=attention=att.jsonl
    make plot-attention ATTENTION=att.jsonl LINE=0 PNG=attention.png

Needs matplotlib (the `serve` extra brings it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def read_record(path: Path, line: int) -> dict:
    with open(path, encoding="utf-8") as records:
        for record in map(json.loads, records):
            if record["line"] == line:
                if record["weights"] is None:
                    raise SystemExit(f"{path}: line {line} was empty: nothing to draw")
                return record
    raise SystemExit(f"{path}: no attention for line {line}")


def plot(record: dict, output: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    sources, targets = record["source_pieces"], record["target_pieces"]
    width = max(4.0, 0.45 * len(sources) + 1.5)
    height = max(3.0, 0.35 * len(targets) + 1.5)
    figure, axes = plt.subplots(figsize=(width, height))
    image = axes.imshow(record["weights"], cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto")
    axes.set_xticks(range(len(sources)), sources, rotation=60, ha="right")
    axes.set_yticks(range(len(targets)), targets)
    axes.set_xlabel("source pieces")
    axes.set_ylabel("target pieces")
    layer = record["layer"] + 1  # 1-based for people
    axes.set_title(f"line {record['line']}: cross-attention of decoder layer {layer}")
    figure.colorbar(image, ax=axes, fraction=0.04)
    figure.tight_layout()
    figure.savefig(output, dpi=120)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("attention", type=Path, help="file written by tmt-translate attention=")
    parser.add_argument("--line", type=int, default=0, help="input line number (from 0)")
    parser.add_argument("--output", type=Path, default=Path("attention.png"))
    args = parser.parse_args()
    plot(read_record(args.attention, args.line), args.output)
    print(f"wrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
