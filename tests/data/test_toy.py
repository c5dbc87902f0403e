"""Tests for the embedded toy English -> German corpus."""

import re

import pytest

from transformer_mt.data.toy import toy_pairs, toy_splits

NUMBERS = """
one two three four five six seven eight nine
twenty thirty forty fifty sixty seventy eighty ninety
ein zwei drei vier fünf sechs sieben acht neun
zwanzig dreißig vierzig fünfzig sechzig siebzig achtzig neunzig
"""
EN_UNITS, EN_TENS, DE_UNITS, DE_TENS = map(str.split, NUMBERS.strip().splitlines())
GERMAN_DETERMINERS_AND_PRONOUNS = {
    "der",
    "die",
    "das",
    "den",
    "dem",
    "ein",
    "eine",
    "einen",
    "ich",
    "er",
    "sie",
    "wir",
    "mein",
    "meine",
    "dein",
    "deine",
    "sein",
    "seine",
    "ihr",
    "ihre",
    "unser",
    "unsere",
    "dieser",
    "diese",
    "dieses",
    "jeder",
    "jede",
    "jedes",
}


@pytest.fixture(scope="module")
def sample():
    return toy_pairs(20000, seed=11)


def words(sentence):
    return sentence.split()


def test_same_seed_same_output_different_seed_different_output():
    a = toy_pairs(300, seed=7)
    assert a == toy_pairs(300, seed=7)
    b = toy_pairs(300, seed=8)
    assert a != b
    assert len({en for en, _ in a} & {en for en, _ in b}) < 30


def test_translation_is_a_function_of_the_source():
    # Short sentences collide across seeds; the same English must get the same German.
    a = dict(toy_pairs(800, seed=1, max_words=4))
    b = dict(toy_pairs(800, seed=2, max_words=4))
    common = a.keys() & b.keys()
    assert len(common) > 10
    assert all(a[en] == b[en] for en in common)


def test_lengths_distinctness_and_format(sample):
    lengths = [len(words(en)) for en, _ in sample]
    assert min(lengths) >= 3 and max(lengths) <= 40
    assert min(lengths) <= 4 and max(lengths) >= 36  # the whole range is covered
    assert 10 <= sum(lengths) / len(lengths) <= 20
    assert len({en for en, _ in sample}) == len(sample)
    for en, de in sample[:3000]:
        for s in (en, de):
            assert s.endswith(".") and s[0].isupper()
            assert not any(bad in s for bad in ("  ", " ,", " .", ",,", ",."))
    narrow = toy_pairs(200, seed=3, min_words=10, max_words=12)
    assert {len(words(en)) for en, _ in narrow} == {10, 11, 12}


def test_splits_are_disjoint_and_test_has_longer_sentences():
    splits = toy_splits(seed=5, n_train=3000, n_valid=200, n_test=200)
    train, valid, test = splits["train"], splits["valid"], splits["test"]
    assert (len(train), len(valid), len(test)) == (3000, 200, 200)
    src = [{en for en, _ in part} for part in (train, valid, test)]
    assert not (src[0] & src[1]) and not (src[0] & src[2]) and not (src[1] & src[2])
    train_max = max(len(words(en)) for en, _ in train)
    assert train_max <= 32 and max(len(words(en)) for en, _ in valid) <= 32
    longer = [en for en, _ in test if len(words(en)) > train_max]
    assert len(longer) == 10
    assert all(33 <= len(words(en)) <= 40 for en in longer)
    assert sum(len(words(en)) > 32 for en, _ in test) == 10
    assert toy_splits(seed=5, n_train=3000, n_valid=200, n_test=200) == splits
    tiny = toy_splits(seed=1, n_train=5, n_valid=1, n_test=1)
    assert len(words(tiny["test"][0][0])) > 32


def test_lexicon_is_large(sample):
    def types(side):
        return {w.strip(",.").lower() for pair in sample for w in words(pair[side])}

    assert len(types(0)) >= 300
    assert len(types(1)) >= 300


SUBORDINATORS = {"because": "weil", "although": "obwohl", "when": "wenn"}
VERB_FORMS = {  # English 3sg form -> German verb-final form
    "sees": "sieht",
    "reads": "liest",
    "helps": "hilft",
    "calls": "anruft",
    "finds": "findet",
    "buys": "kauft",
    "eats": "isst",
    "picks up": "abholt",
    "has seen": "gesehen hat",
    "has found": "gefunden hat",
    "has eaten": "gegessen hat",
    "has come": "gekommen ist",
    "can see": "sehen kann",
    "will find": "finden wird",
}


def test_subordinate_clause_is_verb_final(sample):
    verbs = "|".join(VERB_FORMS)
    pattern = re.compile(rf", ({'|'.join(SUBORDINATORS)}) ((?:\w+ )*?)({verbs})\b[^,]*\.$")
    hits = 0
    for en, de in sample:
        m = pattern.search(en)
        if not m or " that " in m[0] or " who " in m[0]:
            continue
        assert f", {SUBORDINATORS[m[1]]} " in de, (en, de)
        assert de.endswith(f" {VERB_FORMS[m[3]]}."), (en, de)
        hits += 1 if m[1] == "because" else 0
    assert hits >= 3


def test_number_words_become_german_compounds(sample):
    found = 0
    for en, de in sample:
        for w in words(en):
            m = re.fullmatch(r"(\w+)-(\w+)", w.strip(",.").lower())
            if m:
                expected = DE_UNITS[EN_UNITS.index(m[2])] + "und" + DE_TENS[EN_TENS.index(m[1])]
                de_words = [x.strip(",.").lower() for x in words(de)]
                assert expected in de_words, (en, de)
                after = words(de)[de_words.index(expected) + 1]
                # a noun, or an adjective with a strong ending
                assert after[0].isupper() or after.endswith(("e", "en")), (en, de)
                found += 1
    assert found > 200
    assert any("twenty-one" in en.lower() and "einundzwanzig" in de.lower() for en, de in sample)


def test_fronted_adverb_inverts_subject_and_verb(sample):
    hits = [de for en, de in sample if en.startswith("Today ")]
    assert hits
    for de in hits:
        first, second = words(de)[:2]
        assert first == "Heute" and second not in GERMAN_DETERMINERS_AND_PRONOUNS, de


def test_case_and_adjective_agreement(sample):
    dative_plurals = 0
    for _, de in sample:
        ws = words(de)
        for i, w in enumerate(ws[:-1]):
            if w == "mit" and ws[i + 1] == "den":
                noun = next(x for x in ws[i + 2 :] if x[0].isupper()).strip(",.")
                assert noun.endswith(("n", "s")), de  # dative plural
                dative_plurals += 1
            if w == "ein" and ws[i + 1][0].islower() and ws[i + 1] not in ("und", "oder"):
                assert ws[i + 1].endswith(("er", "es")), de  # ein großer Hund / ein großes Haus
    assert dative_plurals > 10
    assert any(" mit dem " in de or " mit der " in de for _, de in sample)
