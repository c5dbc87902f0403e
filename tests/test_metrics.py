"""The tokenized BLEU that approximates the paper's, checked against a value worked out by hand."""

import math

import pytest

from transformer_mt.metrics import (
    paper_tokenize,
    sacrebleu_scores,
    split_compounds,
    tokenized_bleu,
    tokenized_bleu_scores,
)

HYPOTHESES = ["Die 2-3 Kinder spielen.", "Ein gut-gelaunter Mann."]
REFERENCES = ["Die 2-3 Kinder spielen im Park.", "Ein gut-gelaunter Mann lacht."]


def test_compounds_are_split_as_in_the_papers_script():
    # perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g': non-overlapping, so "b-c" stays joined.
    assert split_compounds("rich-text format") == "rich ##AT##-##AT## text format"
    assert split_compounds("a-b-c - d") == "a ##AT##-##AT## b-c - d"
    # 'intl' splits a hyphen between letters itself; one between digits is left to the script.
    assert paper_tokenize("Ein gut-gelaunter Mann.") == "Ein gut - gelaunter Mann ."
    assert paper_tokenize("Die 2-3 Kinder spielen.") == "Die 2 ##AT##-##AT## 3 Kinder spielen ."


def test_tokenized_bleu_equals_the_value_worked_out_by_hand():
    # Tokens after paper_tokenize (@ stands for ##AT##-##AT##):
    #   hyp 1: Die 2 @ 3 Kinder spielen .            (7)
    #   ref 1: Die 2 @ 3 Kinder spielen im Park .    (9)
    #   hyp 2: Ein gut - gelaunter Mann .            (6)
    #   ref 2: Ein gut - gelaunter Mann lacht .      (7)
    # Clipped n-gram matches / hypothesis n-grams, sentence 1 + sentence 2:
    #   1-grams: 7/7 + 6/6 = 13/13   (every token occurs in its reference)
    #   2-grams: 5/6 + 4/5 =  9/11   (only "spielen ." and "Mann ." are missing)
    #   3-grams: 4/5 + 3/4 =  7/9    (only those ending in "spielen ." / "Mann ." are missing)
    #   4-grams: 3/4 + 2/3 =  5/7
    # Brevity penalty: hypotheses 13 tokens, references 16: BP = exp(1 - 16/13) = exp(-3/13).
    # BLEU = BP * (13/13 * 9/11 * 7/9 * 5/7) ** (1/4) = exp(-3/13) * (5/11) ** (1/4) = 0.651887
    by_hand = 100 * math.exp(-3 / 13) * (5 / 11) ** 0.25
    score, signature = tokenized_bleu(HYPOTHESES, REFERENCES)
    assert score.score == pytest.approx(by_hand, abs=1e-6)
    assert (score.sys_len, score.ref_len) == (13, 16)
    assert score.counts == [13, 9, 7, 5] and score.totals == [13, 11, 9, 7]
    assert signature.startswith("pre:intl+compound-split|nrefs:1|case:mixed|")
    assert "tok:none" in signature and "smooth:none" in signature


def test_tokenized_bleu_is_reported_apart_from_sacrebleu():
    scores = tokenized_bleu_scores(HYPOTHESES, REFERENCES)
    assert scores.bleu_tokenized == 65.19
    note = scores.bleu_tokenized_note
    assert "an approximation of the paper's metric, not sacreBLEU's default" in note
    assert "Moses" in note
    # sacreBLEU's default 13a tokenization keeps "gut-gelaunter" whole: another number (57.85).
    assert sacrebleu_scores(HYPOTHESES, REFERENCES).bleu != scores.bleu_tokenized
