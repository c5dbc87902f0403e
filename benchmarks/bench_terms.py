"""The terminology test: target terms built from the test set by a stated rule, translated with
and without them, on Multi30k de→en with a model trained by the README's CPU recipe.

    python -m benchmarks.bench_terms --run RUN --data MULTI30K | tee -a benchmarks/terms.txt

The dictionary (from the training data alone): a source word's counterpart is the target word
of the highest Dice coefficient, 2 c(d, e) / (c(d) + c(e)), over the training pairs (words
lowercased, punctuation stripped, counted once a sentence), kept where the coefficient is at
least --dice and both words occur at least --min-count times. The languages: --src and --tgt,
de and en unless given.

The terms (the stated rule): for each test sentence, the words of its reference of at least
three letters that the unconstrained translation lacks and that are the dictionary's
counterpart of a word of its source, at most two a sentence, longest first: the sentence's
glossary, the pairs (source word, reference word). Each sentence is translated with its own
(Translator.translate_nbest's `terms`, as tmt-serve's per-line `constraints`); a glossary file
of every sentence's pairs, applied to the whole test set, would require a pair's reference word
in every other sentence with that source word too, where the reference may say it otherwise.
The pairs are written to --glossary, a line per sentence ("source\ttarget" pairs separated by
" ||| ").

Reported: the share of required terms present in the translations without and with the
glossary (present: as the glossary matches a source term, up to case and not inside a longer
word), and the lines translated without their terms; BLEU and its length ratio of each; and the
time of each, over the whole test set and over the sentences with terms alone (each of those
has one or two), --rounds rounds in ABBA order on the same loaded model (beam 4, alpha 0.6, the
translator's batches), with the ratios of the medians.
"""

from __future__ import annotations

import argparse
import collections
import re
import statistics
import time
from pathlib import Path

from benchmarks.measure import abba_order, report_header
from transformer_mt.config import DecodeConfig
from transformer_mt.decode.glossary import occurrences
from transformer_mt.decode.loading import load_translator
from transformer_mt.metrics import sacrebleu_scores

WORD = re.compile(r"\w+(?:[-']\w+)*")


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def dictionary(sources: list[str], targets: list[str], dice: float, min_count: int) -> dict:
    """German word -> its English counterpart (the module's rule)."""
    source_counts, target_counts, pair_counts = (collections.Counter() for _ in range(3))
    for source, target in zip(sources, targets, strict=True):
        source_words, target_words = set(words(source)), set(words(target))
        source_counts.update(source_words)
        target_counts.update(target_words)
        pair_counts.update((d, e) for d in source_words for e in target_words)
    best: dict[str, tuple[float, str]] = {}
    for (d, e), together in pair_counts.items():
        if source_counts[d] < min_count or target_counts[e] < min_count:
            continue
        score = 2 * together / (source_counts[d] + target_counts[e])
        if score >= dice and score > best.get(d, (0.0, ""))[0]:
            best[d] = (score, e)
    return {d: e for d, (_, e) in best.items()}


def sentence_terms(
    sources: list[str], references: list[str], outputs: list[str], counterpart: dict
) -> list[list[tuple[str, str]]]:
    """The module's rule: each sentence's (source word, reference word) pairs, at most two."""
    found_terms = []
    for source, reference, output in zip(sources, references, outputs, strict=True):
        lacking = {w for w in words(reference) if len(w) >= 3} - set(words(output))
        found = {counterpart[d]: d for d in words(source) if counterpart.get(d) in lacking}
        found_terms.append([(found[t], t) for t in sorted(found, key=len, reverse=True)[:2]])
    return found_terms


def present_share(terms: list[list[tuple[str, str]]], outputs: list[str]) -> tuple[int, int]:
    """(required terms present in their output, required terms): a term is present where it
    occurs as the glossary matches a source term (decode/glossary.py: up to case, not inside a
    longer word, that is, no letter or digit right before or after it)."""
    required = sum(map(len, terms))
    present = sum(
        bool(occurrences(output.casefold(), target.casefold()))
        for pairs, output in zip(terms, outputs, strict=True)
        for _, target in pairs
    )
    return present, required


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--run", required=True, help="a de→en run folder (the README's recipe)")
    parser.add_argument("--src", default="de", help="the run's source language")
    parser.add_argument("--tgt", default="en", help="the run's target language")
    parser.add_argument("--checkpoint", default="averaged.pt")
    parser.add_argument("--data", type=Path, required=True, help="the Multi30k raw text folder")
    parser.add_argument("--glossary", type=Path, default=Path("/tmp/terms_multi30k.tsv"))
    parser.add_argument("--dice", type=float, default=0.5)
    parser.add_argument("--min-count", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    print(*report_header("terminology: a glossary from the test set, with and without"), sep="\n")

    def read(split: str, lang: str) -> list[str]:
        return (args.data / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()

    counterpart = dictionary(
        read("train", args.src), read("train", args.tgt), args.dice, args.min_count
    )
    sources, references = read("test_2016_flickr", args.src), read("test_2016_flickr", args.tgt)
    plain = DecodeConfig()
    translator = load_translator(args.run, args.checkpoint, decode=plain, device="cpu")
    outputs = translator.translate(sources)
    terms = sentence_terms(sources, references, outputs, counterpart)
    args.glossary.write_text(
        "".join(" ||| ".join(f"{d}\t{e}" for d, e in pairs) + "\n" for pairs in terms),
        encoding="utf-8",
    )
    per_line = [[target for _, target in pairs] for pairs in terms]
    with_terms = sum(1 for pairs in terms if pairs)
    print(
        f"# dictionary: {len(counterpart)} source words (Dice >= {args.dice}, >= "
        f"{args.min_count} occurrences); terms: {sum(map(len, terms))} in {with_terms} of "
        f"{len(sources)} sentences ({args.glossary})"
    )
    termed = [i for i, pairs in enumerate(terms) if pairs]  # the sentences with terms alone
    termed_sources, termed_terms = [sources[i] for i in termed], [per_line[i] for i in termed]
    calls = {
        "without": lambda: translator.translate_nbest(sources),
        "with": lambda: translator.translate_nbest(sources, terms=per_line),
        "without, termed": lambda: translator.translate_nbest(termed_sources),
        "with, termed": lambda: translator.translate_nbest(termed_sources, terms=termed_terms),
    }
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    results: dict[str, list] = {}
    for turn in range(args.rounds):
        for name in abba_order(list(calls), turn):
            started = time.perf_counter()
            results[name] = calls[name]()
            seconds[name].append(time.perf_counter() - started)
    for name in ("without", "with"):
        texts = [nbest[0].text for nbest in results[name]]
        present, required = present_share(terms, texts)
        unmet = sum(nbest[0].unmet_terms for nbest in results[name])
        bleu = sacrebleu_scores(texts, references)
        ratio = re.search(r"ratio = ([0-9.]+)", bleu.bleu_detail)
        median = statistics.median(seconds[name])
        print(
            f"{name:>7} the terms: present {present}/{required} "
            f"({100 * present / max(required, 1):.1f}%), {unmet} lines translated without "
            f"theirs; BLEU {bleu.bleu:.2f} (ratio {ratio.group(1) if ratio else '?'}); "
            f"{median:.1f} s median of {[round(s, 1) for s in seconds[name]]} "
            f"({len(sources) / median:.1f} sentences/s)"
        )
    for suffix, count in (("", len(sources)), (", termed", len(termed))):
        with_median = statistics.median(seconds["with" + suffix])
        without_median = statistics.median(seconds["without" + suffix])
        print(
            f"time with the terms / without, {count} sentences{suffix and ' (those with terms)'}"
            f": {with_median / without_median:.2f}x ({with_median:.1f} s / "
            f"{without_median:.1f} s; target <= 1.5x)"
        )


if __name__ == "__main__":
    main()
