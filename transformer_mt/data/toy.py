"""An embedded, generated English -> German language pair for the demo and for tests.

The corpus is produced by a small synchronous grammar: every English sentence is built
together with its German translation, so each English sentence has exactly one correct
German translation (the mapping is a deterministic function) and a small Transformer can
learn it almost perfectly.  It is nevertheless not a word-for-word substitution; it needs
attention over the whole sentence:

* Word order.  German main clauses are verb-second, so a fronted adverb or a fronted
  subordinate clause inverts subject and verb ("today the man sees the dog" -> "heute
  sieht der Mann den Hund"; "because the dog sleeps, the man reads ..." -> "weil der Hund
  schläft, liest der Mann ...").  Subordinate clauses (that, because, when, although,
  while, before, if, until, as soon as -> dass, weil, wenn, obwohl, während, bevor,
  falls, bis, sobald) and relative clauses are verb-final.  Participles, infinitives
  after modals and separable particles go to the end of the clause ("the man has seen
  the dog" -> "der Mann hat den Hund gesehen"; "the woman calls the boy" -> "die Frau
  ruft den Jungen an"; "..., because the woman calls the boy" -> "..., weil die Frau den
  Jungen anruft"); "not" becomes "nicht" at the end of the middle field, or "kein".
* Agreement.  Three genders and plural, nominative / accusative / dative case (the verb
  or the preposition decides: "sees" takes the accusative, "helps" and "with" the
  dative), weak masculine nouns (den Jungen), dative plural -n (mit den Hunden),
  adjective endings after der-words, ein-words and bare numbers (der große Hund, einen
  großen Hund, ein großes Haus, zwei große Hunde), relative pronouns agreeing with their
  head noun in gender and number and taking their case from their own clause (der, den,
  dem, denen ...), and verbs agreeing with their subject (ich sehe, er sieht, sie sehen;
  bin / ist / sind; hat / ist gekommen).
* Numbers.  English number words 1..99 ("twenty-one dogs") become German units-before-tens
  compounds ("einundzwanzig Hunde").
* Lengths from 3 to about 40 words, mostly 6..20: clauses are combined by "and", "or",
  "but", by subordinate, complement ("says that ...") and relative clauses, and noun
  phrases carry adjectives and prepositional phrases.

Both sides use real words (about 170 nouns, 100 verbs, 75 adjectives, plus adverbs,
prepositions and conjunctions); German nouns are capitalised, every sentence starts with a
capital letter and ends with ".", and German puts a comma before every subordinate and
relative clause (English only before adverbial clauses and "but").  Tokens are separated
by single spaces; punctuation is attached to the preceding word.

Everything is a pure function of the seed (``random.Random(seed)``); only the standard
library is used.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from transformer_mt.data.toy_lexicon import (
    ADJ_END,
    ADJS,
    ANIMATE,
    ARTICLE,
    CONTRACTIONS,
    DE_HABEN,
    DE_SEIN,
    DE_TENS,
    DE_UNITS,
    DER_WORD_END,
    EIN_WORD_END,
    EN_BE,
    EN_TENS,
    EN_UNITS,
    FRONT_ADVS,
    INTRANSITIVE,
    MID_ADVS,
    MODALS,
    NOUNS,
    POSS,
    PREPS,
    PRONOUNS,
    RELATIVE,
    SPEECH,
    SUBORDS,
    THING_VERBS,
    TRANSITIVE,
    Adjective,
    Noun,
    Verb,
)

TOY_VERSION = 1
"""Bump when the generator's output changes, so prepared caches are rebuilt."""

# ---------------------------------------------------------------------------------------
# Grammar: noun phrases
# ---------------------------------------------------------------------------------------


@dataclass
class _NP:
    en: list[str]
    de: list[str]
    person: str = "3sg"


def _number_words(n: int) -> tuple[str, str]:
    if n < 20:
        return EN_UNITS[n - 1], DE_UNITS[n - 1]
    tens, unit = divmod(n, 10)
    if unit == 0:
        return EN_TENS[tens - 2], DE_TENS[tens - 2]
    de_unit = "ein" if unit == 1 else DE_UNITS[unit - 1]
    return f"{EN_TENS[tens - 2]}-{EN_UNITS[unit - 1]}", f"{de_unit}und{DE_TENS[tens - 2]}"


def _pick_determiner(rng: random.Random, plural: bool, negated: bool) -> tuple[str, object]:
    """(kind, extra): extra is a possessive (en, de) pair, a number, or "".

    Negated objects avoid "every", "one" and numbers ("does not see a dog" -> "keinen Hund")."""
    r = rng.random()
    if plural:
        if negated:
            return ("the", "") if r < 0.7 else ("poss", rng.choice(POSS))
        if r < 0.35:
            return "the", ""
        if r < 0.83:
            number = rng.randint(2, 12) if rng.random() < 0.4 else rng.randint(13, 99)
            return ("num" if r < 0.75 else "the_num"), number
        return ("these", "") if r < 0.9 else ("poss", rng.choice(POSS))
    if r < 0.4:
        return "the", ""
    if r < 0.7:
        return "a", ""
    if r < 0.78:
        return "this", ""
    if r < 0.95 or negated:
        return "poss", rng.choice(POSS)
    return ("every", "") if r < 0.98 else ("one", "")


def _de_determiner(kind: str, extra, g: str, case: str, negated: bool) -> tuple[list[str], str]:
    """German determiner words and the adjective declension class they select."""
    if kind == "the":
        return [ARTICLE[case][g]], "weak"
    if kind in ("this", "these"):
        return ["dies" + DER_WORD_END[case][g]], "weak"
    if kind == "every":
        return ["jed" + DER_WORD_END[case][g]], "weak"
    if kind in ("a", "one"):
        return [("kein" if negated else "ein") + EIN_WORD_END[case][g]], "mixed"
    if kind == "poss":
        return [extra[1] + EIN_WORD_END[case][g]], "weak" if g == "pl" else "mixed"
    number = _number_words(extra)[1]
    return (["die", number], "weak") if kind == "the_num" else ([number], "strong")


def _en_determiner(kind: str, extra, next_word: str) -> list[str]:
    if kind == "a":
        return ["an" if next_word[0] in "aeiou" else "a"]
    if kind == "poss":
        return [extra[0]]
    if kind in ("num", "the_num"):
        return (["the"] if kind == "the_num" else []) + [_number_words(extra)[0]]
    return [kind]


def _de_noun(noun: Noun, plural: bool, case: str) -> str:
    if plural:
        if case == "dat" and not noun.de_pl.endswith(("n", "s")):
            return noun.de_pl + "n"
        return noun.de_pl
    return noun.de_pl if noun.weak and case != "nom" else noun.de_sg


def _noun_phrase(
    rng: random.Random,
    case: str,
    *,
    animate: bool = False,
    negated: bool = False,
    pp: float = 0.0,
    rel: float = 0.0,
) -> _NP:
    """A determiner, up to two adjectives, a noun, optionally a PP and a relative clause."""
    noun = rng.choice(ANIMATE if animate else NOUNS)
    plural = rng.random() < 0.35
    kind, extra = _pick_determiner(rng, plural, negated)
    g = "pl" if plural else noun.gender
    adjs = rng.sample(ADJS, rng.choices((0, 1, 2), (0.55, 0.35, 0.1))[0])
    de_det, adj_class = _de_determiner(kind, extra, g, case, negated)
    en_rest = [a.en for a in adjs] + [noun.en_pl if plural else noun.en_sg]
    en = _en_determiner(kind, extra, en_rest[0]) + en_rest
    de_adjs = [a.stem + ADJ_END[adj_class][case][g] for a in adjs]
    de = de_det + de_adjs + [_de_noun(noun, plural, case)]
    np = _NP(en, de, "3pl" if plural else "3sg")
    if rng.random() < pp:
        en_pp, de_pp = _prep_phrase(rng)
        np.en += en_pp
        np.de += de_pp
    if rng.random() < rel:
        en_rel, de_rel = _relative_clause(rng, noun.animate, np.person, g)
        np.en += en_rel
        np.de += de_rel
    return np


def _prep_phrase(rng: random.Random) -> tuple[list[str], list[str]]:
    en_prep, de_prep, case = rng.choice(PREPS)
    inner = _noun_phrase(rng, case)
    if (de_prep, inner.de[0]) in CONTRACTIONS:
        return en_prep.split() + inner.en, [CONTRACTIONS[de_prep, inner.de[0]]] + inner.de[1:]
    return en_prep.split() + inner.en, [de_prep] + inner.de


def _relative_clause(rng: random.Random, animate_head: bool, person: str, g: str):
    """'who sees the cat' / 'that the cat sees' with German comma-enclosed verb-final clause."""
    if animate_head and rng.random() < 0.55:
        clause = _clause(rng, subject=None, person=person, kinds=("trans", "intr", "cop"))
        rel_pronoun = RELATIVE["nom"][g]
        return ["who"] + _en_clause(clause), [",", rel_pronoun] + _de_clause(clause, "sub") + [","]
    clause = _clause(rng, gap_object=True, animate_gap=animate_head, kinds=("trans",))
    rel_pronoun = RELATIVE[clause.verb.case][g]
    return ["that"] + _en_clause(clause), [",", rel_pronoun] + _de_clause(clause, "sub") + [","]


def _subject(rng: random.Random, rel: float, pp: float) -> _NP:
    if rng.random() < 0.2:
        en, de, person = rng.choice(PRONOUNS)
        return _NP([en], [de], person)
    return _noun_phrase(rng, "nom", animate=True, pp=pp, rel=rel)


# ---------------------------------------------------------------------------------------
# Grammar: clauses
# ---------------------------------------------------------------------------------------


@dataclass
class _Clause:
    subject: _NP | None
    person: str
    kind: str  # trans, intr, cop, say
    verb: Verb | None = None
    adjective: Adjective | None = None
    obj: _NP | None = None
    tense: str = "pres"  # pres, perf, or an English modal
    negated: bool = False
    kein: bool = False  # negation expressed by "kein" on the object
    adverb: tuple[str, str] | None = None
    complement: _Clause | None = None


def _clause(
    rng: random.Random,
    *,
    subject: _NP | None | bool = True,
    person: str = "3sg",
    kinds=("trans", "intr", "cop"),
    gap_object: bool = False,
    animate_gap: bool = False,
    rel: float = 0.0,
    depth: int = 0,
) -> _Clause:
    kind = rng.choices(kinds, (0.6, 0.15, 0.12, 0.13)[: len(kinds)])[0]
    if subject is True:
        subject = _subject(rng, rel=rel, pp=0.1 if depth == 0 else 0.05)
    if subject is not None:
        person = subject.person
    tense = rng.choices(("pres", "perf", "modal"), (0.5, 0.25, 0.25))[0]
    if tense == "modal":
        tense = rng.choice(MODALS)[0]
    c = _Clause(subject, person, kind, tense=tense)
    c.negated = rng.random() < 0.15
    if not c.negated and rng.random() < 0.18:
        c.adverb = rng.choice(MID_ADVS)
    if kind == "trans":
        c.verb = rng.choice(TRANSITIVE if animate_gap or not gap_object else THING_VERBS)
        if not gap_object:
            c.obj = _noun_phrase(
                rng,
                c.verb.case,
                animate=c.verb.animate_object,
                negated=c.negated,
                pp=0.12,
                rel=0.0 if c.negated else rel,
            )
            c.kein = c.negated and c.obj.de[0].startswith("kein")
    elif kind == "intr":
        c.verb = rng.choice(INTRANSITIVE)
    elif kind == "cop":
        c.adjective = rng.choice(ADJS)
        c.tense = "pres" if tense == "perf" and rng.random() < 0.5 else c.tense
    else:
        c.verb = rng.choice(SPEECH)
        c.complement = _clause(rng, kinds=_kinds(depth + 1), rel=rel / 2, depth=depth + 1)
    return c


def _kinds(depth: int) -> tuple[str, ...]:
    return ("trans", "intr", "cop", "say") if depth < 2 else ("trans", "intr", "cop")


def _en_verb_group(c: _Clause) -> list[str]:
    p, third = c.person, c.person == "3sg"
    middle = ["not"] if c.negated else ([c.adverb[0]] if c.adverb else [])
    if c.tense == "perf":
        aux = "has" if third else "have"
        main = "been" if c.kind == "cop" else c.verb.en_part
        return [aux] + middle + main.split()
    if c.tense != "pres":
        modal = "cannot" if c.tense == "can" and c.negated else c.tense
        modal_words = [modal] + (middle if modal != "cannot" else [])
        main = "be" if c.kind == "cop" else c.verb.en_base
        return modal_words + main.split()
    if c.kind == "cop":
        return [EN_BE[p]] + middle
    if c.negated:
        return ["does" if third else "do", "not"] + c.verb.en_base.split()
    return middle + (c.verb.en_3sg if third else c.verb.en_base).split()


def _en_clause(c: _Clause) -> list[str]:
    words = (c.subject.en if c.subject else []) + _en_verb_group(c)
    if c.obj:
        words += c.obj.en
    if c.adjective:
        words.append(c.adjective.en)
    if c.complement:
        words += ["that"] + _en_clause(c.complement)
    return words


def _de_finite_and_end(c: _Clause, sub: bool) -> tuple[str, list[str]]:
    """The finite verb and the words of the clause-final verbal bracket."""
    p = c.person
    if c.tense not in ("pres", "perf"):
        modal = next(m for m in MODALS if m[0] == c.tense)
        finite = modal[1] if p in ("1sg", "3sg") else modal[2]
        main = "sein" if c.kind == "cop" else c.verb.particle + c.verb.de_stem_inf
        return finite, ([c.adjective.de] if c.adjective else []) + [main]
    if c.kind == "cop":
        return DE_SEIN[p], [c.adjective.de] + (["gewesen"] if c.tense == "perf" else [])
    v = c.verb
    if c.tense == "perf":
        return (DE_SEIN if v.aux == "sein" else DE_HABEN)[p], [v.de_part]
    form = {"1sg": v.de_1sg, "3sg": v.de_3sg}.get(p, v.de_stem_inf)
    if not v.particle:
        return form, []
    return (v.particle + form, []) if sub else (form, [v.particle])


def _de_clause(c: _Clause, mode: str, front: list[str] | None = None) -> list[str]:
    """German clause in 'main' (verb-second) or 'sub' (verb-final) order."""
    finite, end = _de_finite_and_end(c, sub=mode == "sub")
    middle = ([c.adverb[1]] if c.adverb else []) + (c.obj.de if c.obj else [])
    if c.negated and not c.kein:
        middle.append("nicht")
    subject = c.subject.de if c.subject else []
    if mode == "sub":
        words = subject + middle + end + [finite]
    elif front:
        words = front + [finite] + subject + middle + end
    else:
        words = subject + [finite] + middle + end
    if c.complement:
        words += [",", "dass"] + _de_clause(c.complement, "sub")
    return words


# ---------------------------------------------------------------------------------------
# Grammar: sentences
# ---------------------------------------------------------------------------------------


def _subordinate(rng: random.Random, rel: float) -> tuple[list[str], list[str]]:
    en_conj, de_conj = rng.choice(SUBORDS)
    c = _clause(rng, kinds=_kinds(1), rel=rel, depth=1)
    return en_conj.split() + _en_clause(c), [de_conj] + _de_clause(c, "sub")


def _conjunct(rng: random.Random, first: bool, last: bool, rich: bool):
    """One main clause, possibly with a fronted adverbial or subordinate clause and,
    when it is the last conjunct, trailing subordinate clauses."""
    rel = 0.25 if rich else 0.1
    c = _clause(rng, kinds=_kinds(0) if last else _kinds(2), rel=rel)
    en_front: list[str] = []
    de_front: list[str] = []
    r = rng.random()
    if first and r < (0.25 if rich else 0.12):
        en_front, de_front = _subordinate(rng, rel)
        en_front.append(",")
        de_front.append(",")
    elif r < 0.3:
        en_adv, de_adv = rng.choice(FRONT_ADVS)
        en_front, de_front = en_adv.split(), de_adv.split()
    en = en_front + _en_clause(c)
    de = _de_clause(c, "main", de_front)
    p_trail = 0.5 if rich else 0.25
    while last and rng.random() < p_trail:
        en_sub, de_sub = _subordinate(rng, rel)
        en += [","] + en_sub
        de += [","] + de_sub
        p_trail /= 3
    return en, de


def _join(words: list[str]) -> str:
    """Attach punctuation, drop commas that collide with other punctuation, end with '.'."""
    out: list[str] = []
    for w in words + ["."]:
        if w in (",", "."):
            if out and out[-1].endswith(","):
                out[-1] = out[-1][:-1]
            out[-1] += w
        else:
            out.append(w)
    out[0] = out[0][0].upper() + out[0][1:]
    return " ".join(out)


def _sentence(rng: random.Random, rich: bool = False) -> tuple[str, str]:
    n = rng.choices((1, 2, 3), (0.45, 0.4, 0.15) if rich else (0.75, 0.2, 0.05))[0]
    en: list[str] = []
    de: list[str] = []
    for i in range(n):
        if i:
            en_coord, de_coord = rng.choice(
                ((["and"], ["und"]), ([",", "but"], [",", "aber"]), (["or"], ["oder"]))
            )
            en += en_coord
            de += de_coord
        en_c, de_c = _conjunct(rng, first=i == 0, last=i == n - 1, rich=rich)
        en += en_c
        de += de_c
    return _join(en), _join(de)


def _generate(rng: random.Random, n: int, min_words: int, max_words: int, seen: set[str]):
    if not 1 <= min_words <= max_words:
        raise ValueError(f"need 1 <= min_words <= max_words, got {min_words}, {max_words}")
    pairs: list[tuple[str, str]] = []
    rich = min_words > 16  # long sentences only: use a grammar with more clauses
    budget = 1000 * n + 100000
    while len(pairs) < n:
        budget -= 1
        if budget < 0:
            raise ValueError(
                f"cannot generate {n} distinct pairs of {min_words}..{max_words} words"
            )
        en, de = _sentence(rng, rich)
        if min_words <= en.count(" ") + 1 <= max_words and en not in seen:
            seen.add(en)
            pairs.append((en, de))
    return pairs


# ---------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------


def toy_pairs(
    n: int, *, seed: int, min_words: int = 3, max_words: int = 40
) -> list[tuple[str, str]]:
    """n distinct (english, german) sentence pairs; english length in words within
    [min_words, max_words]."""
    return _generate(random.Random(seed), n, min_words, max_words, set())


def toy_splits(
    *, seed: int, n_train: int, n_valid: int, n_test: int, max_train_words: int = 32
) -> dict[str, list[tuple[str, str]]]:
    """{'train': [...], 'valid': [...], 'test': [...]}; no source sentence appears in two splits.

    Train and valid have english length <= max_train_words; about 5% of test (at least 1 pair
    when n_test >= 1) is LONGER than any train sentence (between max_train_words+1 and
    max_train_words+8 words), the rest <= max_train_words."""
    rng = random.Random(seed)
    n_long = max(1, round(0.05 * n_test)) if n_test >= 1 else 0
    seen: set[str] = set()
    short = _generate(rng, n_train + n_valid + n_test - n_long, 3, max_train_words, seen)
    long = _generate(rng, n_long, max_train_words + 1, max_train_words + 8, seen)
    test = short[n_train + n_valid :] + long
    rng.shuffle(test)
    return {"train": short[:n_train], "valid": short[n_train : n_train + n_valid], "test": test}
