"""One model of both directions against a model of each, on Multi30k, for the same wall time.

    python -m benchmarks.both_directions --data MULTI30K --workdir /tmp/both --minutes 10 \\
        | tee -a benchmarks/both_directions.txt

MULTI30K is a folder of {train,val,test_2016_flickr}.{de,en} (raw text). Three runs of the
README's CPU recipe (`--config-name multi30k`, trainer.max_time_minutes=--minutes for each
alike), one at a time, each averaged (`tmt-average last=auto`) and scored on test_2016_flickr
(`tmt-eval checkpoint=averaged.pt decode.length_penalty=auto`):

  de_en   de→en on the training pairs;
  en_de   en→de on the same pairs;
  both    one model of both directions: the same files as two corpora, de→en and en→de, each
          source tagged with its target language (<2en>, <2de>); tmt-eval scores each pair.

A rerun skips the runs whose scores are there. The report: each direction's test BLEU, chrF and
length ratio, from its own model and from the model of both.
"""

from __future__ import annotations

import argparse

from benchmarks.backtranslation import line, recipe_parser, trained_and_scored
from benchmarks.measure import report_header


def parse_args() -> argparse.Namespace:
    return recipe_parser(__doc__, "the runs' seed").parse_args()


def main() -> None:
    args = parse_args()
    work = args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    print(*report_header("one model of de↔en against one of each direction"), sep="\n", flush=True)
    data = f"data.dir={args.data.resolve()}"
    de_en = trained_and_scored("de_en", work, args, data)
    en_de = trained_and_scored("en_de", work, args, data, "data.src_lang=en", "data.tgt_lang=de")
    reverse = "+data.corpora.en_de={src_lang:en,tgt_lang:de}"
    both = trained_and_scored("both", work, args, data, reverse, pairs=("de-en", "en-de"))
    print(line("de→en, a model of de→en", de_en))
    print(line("de→en, the model of both", both["de-en"]))
    print(line("en→de, a model of en→de", en_de))
    print(line("en→de, the model of both", both["en-de"]))


if __name__ == "__main__":
    main()
