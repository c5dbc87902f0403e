"""Word alignments against gold links of the toy corpus: the alignment error rate of each decoder
layer, read at the step that predicts a target word (ours, "Naive-Att" in Chen et al., 2020) and
at the step where it is the decoder's input (Shift-Att).

    python -m benchmarks.alignment --run runs/demo | tee -a benchmarks/alignment.txt

The run: a model of the toy corpus (English → German; `make demo` trains one). The pairs: its
test split, the references aligned teacher-forced (Translator.alignments).

Gold links. The toy corpus comes from a grammar whose lexicon fixes the German forms of each
English noun and adjective: a noun's singular, its plural and its dative plural; an adjective's
stem with one of the grammar's endings. In each pair, an English noun or adjective that occurs
once in the sentence is linked to the one German word that is one of its forms, where exactly
one is (punctuation stripped, case ignored), and where no other English word of the sentence
claims that German word. Articles, verbs, pronouns and numbers get no gold link: the grammar
moves and merges them (verb-second, separable particles, units-before-tens), and the lexicon
does not say which word they become.

The rate: with sure links only and one predicted link per German word, the alignment error
rate over the gold words, 1 - (|A ∩ S| + |A ∩ P|) / (|A| + |S|) with A the predicted links of
those words and P = S, is 1 - |A ∩ S| / |S|: the share of gold links missed.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import replace
from pathlib import Path

from benchmarks.measure import report_header
from transformer_mt.data.sources import read_pairs
from transformer_mt.data.toy_lexicon import ADJ_END, ADJS, NOUNS
from transformer_mt.decode.alignment import word_alignment
from transformer_mt.decode.loading import load_translator
from transformer_mt.decode.search import Hypothesis
from transformer_mt.run_dir import RunDir

PUNCTUATION = re.compile(r"[.,!?;:]+$")
ENDINGS = {
    "",
    *(end for table in ADJ_END.values() for case in table.values() for end in case.values()),
}


def bare(word: str) -> str:
    return PUNCTUATION.sub("", word).lower()


def german_forms() -> dict[str, set[str]]:
    """Each English noun or adjective form (lowercased) -> its German forms (lowercased)."""
    forms: dict[str, set[str]] = {}
    for noun in NOUNS:
        german = {noun.de_sg.lower(), noun.de_pl.lower(), noun.de_pl.lower() + "n"}
        for english in (noun.en_sg, noun.en_pl):
            forms.setdefault(english.lower(), set()).update(german)
    for adjective in ADJS:
        german = {adjective.stem.lower() + end for end in ENDINGS} | {adjective.de.lower()}
        forms.setdefault(adjective.en.lower(), set()).update(german)
    return forms


def gold_links(english: str, german: str, forms: dict[str, set[str]]) -> set[tuple[int, int]]:
    """The module's gold links (English word, German word) of one pair."""
    en_words, de_words = [bare(w) for w in english.split()], [bare(w) for w in german.split()]
    links: dict[int, list[int]] = {}  # German word -> the English words that claim it
    for i, word in enumerate(en_words):
        if word not in forms or en_words.count(word) != 1:
            continue
        matches = [j for j, candidate in enumerate(de_words) if candidate in forms[word]]
        if len(matches) == 1:
            links.setdefault(matches[0], []).append(i)
    return {(claims[0], j) for j, claims in links.items() if len(claims) == 1}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--run", type=Path, default=Path("runs/demo"))
    parser.add_argument("--checkpoint", default="last.pt")
    args = parser.parse_args()
    print(*report_header("word alignments against the toy corpus's gold links"), sep="\n")
    translator = load_translator(args.run, args.checkpoint, device="cpu")
    pairs = list(read_pairs(RunDir(args.run).data_config(), "test"))
    sources, references = [s for s, _ in pairs], [t for _, t in pairs]
    forms = german_forms()
    gold = [gold_links(s, t, forms) for s, t in pairs]
    total = sum(map(len, gold))
    print(f"# {len(pairs)} test pairs, {total} gold links (nouns and adjectives)")
    layers = translator.attention_reader().decoder_layers
    default = translator.alignment_layer(None)
    for layer in range(layers):
        maps_rule = {"predicting (ours)": translator.alignments(sources, references, layer)}
        maps_rule["Shift-Att"] = shifted_alignments(translator, sources, references, layer)
        for rule, found in maps_rule.items():
            hits = sum(
                len(links & set(predicted or []))
                for links, predicted in zip(gold, found, strict=True)
            )
            ours = layer == default and rule.startswith("predicting")
            chosen = " (the default layer)" if ours else ""
            print(
                f"layer {layer}, {rule:<17} AER {100 * (1 - hits / total):5.1f}%  "
                f"({hits} of {total} gold links){chosen}"
            )


def shifted_alignments(translator, sources, references, layer):
    """Translator.alignments, but each target piece read at the step where it is the decoder's
    input (the row after the one that predicts it)."""
    reader = translator.attention_reader()
    decode, policy = translator.prepared(None)
    ids = translator.encode(sources, decode)
    given = [[Hypothesis(t, 0.0)] for t in translator.encode_targets(references)]
    maps = translator.attention_maps(reader, ids, given, layer, decode, policy)
    shifted = [
        None if m is None else replace(m, weights=[*m.weights[1:], m.weights[-1]]) for m in maps
    ]
    return [None if m is None else word_alignment(m) for m in shifted]


if __name__ == "__main__":
    main()
