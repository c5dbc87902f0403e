"""The paper's tokenized BLEU: the Moses tokenizer on hard sentences, the compound split, and a
value worked out by hand."""

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

# What mosesdecoder's scripts/tokenizer/tokenizer.perl -l LANG prints (escaping on, no -a, as
# get_ende_bleu.sh runs it), by its rules in the order it applies them:
#   1. every character that is not alphanumeric, a space or one of . ' ` , - gets spaces around
#      it (quotes, „ “, $, %, €, –, ?, &, <, [, ], |), so hyphens stay inside words;
#   2. a comma is split off unless it stands between two digits (5,300 and 2,50 stay whole);
#   3. apostrophes: for en, split before the apostrophe of a contraction (it 's, didn 't) and
#      of a year's s (1990 's); for every other language, e.g. de, split on both sides;
#   4. a word-final period is split off when it ends the line, or when the word is not a
#      non-breaking prefix, holds no inner period (z.B. stays) and the next word is not
#      lower case;
#   5. & | < > ' " [ ] are escaped as &amp; &#124; &lt; &gt; &apos; &quot; &#91; &#93;.
MOSES = [
    # quotes, a contraction, a comma inside a closing quote, a hyphenated compound (en)
    (
        "en",
        "He said \"it's a well-known fact,\" didn't he?",
        "He said &quot; it &apos;s a well-known fact , &quot; didn &apos;t he ?",
    ),
    # numbers: $ and % split off, 5,300.50 whole (rule 2; the inner period is not final), a
    # year's 's (rule 3), lone dashes kept, 3-4 left to the compound split
    (
        "en",
        "The 1990's cost $5,300.50 - about 20% more - on 3-4 May.",
        "The 1990 &apos;s cost $ 5,300.50 - about 20 % more - on 3-4 May .",
    ),
    # German quotes and the en dash are "other" characters (rule 1); the comma after the
    # closing quote is split (rule 2); the final period too (rule 4)
    (
        "de",
        "„Das ist ein Test“, sagte sie – und ging.",
        "„ Das ist ein Test “ , sagte sie – und ging .",
    ),
    # German apostrophes: split on both sides (rule 3, not en's contraction rule)
    ("de", "Wie geht's? Das ist Peters' Auto.", "Wie geht &apos; s ? Das ist Peters &apos; Auto ."),
    # hyphens kept inside words (no -a); "z.B." has an inner period and stays (rule 4); a
    # decimal comma stays (rule 2); € split off, then the final period
    (
        "de",
        "Die E-Mail-Adresse kostet 2-3 Euro, z.B. 2,50 €.",
        "Die E-Mail-Adresse kostet 2-3 Euro , z.B. 2,50 € .",
    ),
    # every escaped character (rule 5) after rule 1 separated it
    ("en", "Tom & Jerry <3 [sic] |x|", "Tom &amp; Jerry &lt; 3 &#91; sic &#93; &#124; x &#124;"),
]


@pytest.mark.parametrize("lang,line,moses", MOSES)
def test_the_moses_tokenizer_as_tokenizer_perl_prints_it_then_the_compound_split(lang, line, moses):
    assert paper_tokenize(line, lang) == split_compounds(moses)
    assert "@-@" not in paper_tokenize(line, lang)  # -a is not used: see paper_tokenize


def test_compounds_are_split_as_in_the_papers_script():
    # perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g': non-overlapping, so "b-c" stays joined.
    assert split_compounds("rich-text format") == "rich ##AT##-##AT## text format"
    assert split_compounds("a-b-c - d") == "a ##AT##-##AT## b-c - d"
    assert paper_tokenize("Die E-Mail-Adresse kostet 2-3 Euro.") == (
        "Die E ##AT##-##AT## Mail ##AT##-##AT## Adresse kostet 2 ##AT##-##AT## 3 Euro ."
    )
    assert paper_tokenize("a well-known fact", "en") == "a well ##AT##-##AT## known fact"


def test_the_target_language_chooses_the_apostrophe_rule():
    assert paper_tokenize("didn't", "en") == "didn &apos;t"
    assert paper_tokenize("didn't", "de") == "didn &apos; t"


def test_tokenized_bleu_equals_the_value_worked_out_by_hand():
    # Tokens after paper_tokenize (@ stands for ##AT##-##AT##):
    #   hyp 1: Die 2 @ 3 Kinder spielen .            (7)
    #   ref 1: Die 2 @ 3 Kinder spielen im Park .    (9)
    #   hyp 2: Ein gut @ gelaunter Mann .            (6)
    #   ref 2: Ein gut @ gelaunter Mann lacht .      (7)
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
    assert signature.startswith("pre:moses-de+escape+compound-split|nrefs:1|case:mixed|")
    assert "tok:none" in signature and "smooth:none" in signature


def test_tokenized_bleu_is_reported_apart_from_sacrebleu():
    scores = tokenized_bleu_scores(HYPOTHESES, REFERENCES)
    assert scores.bleu_tokenized == 65.19
    note = scores.bleu_tokenized_note
    assert "by the recipe of the paper's get_ende_bleu.sh, not sacreBLEU's BLEU" in note
    assert "tokenizer.perl -l de, through its port sacremoses" in note
    assert "tokenizer.perl -l en" in tokenized_bleu_scores(["a"], ["a"], "en").bleu_tokenized_note
    # sacreBLEU's default 13a tokenization keeps "gut-gelaunter" whole: another number (57.85).
    assert sacrebleu_scores(HYPOTHESES, REFERENCES).bleu != scores.bleu_tokenized
