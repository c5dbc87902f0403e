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

TOY_VERSION = 1
"""Bump when the generator's output changes, so prepared caches are rebuilt."""

# ---------------------------------------------------------------------------------------
# Lexicon.  Nouns: "english[/plural] gender Singular Plural [w]" (w: weak masculine noun,
# whose accusative and dative singular equal its plural: den Jungen, dem Löwen).
# ---------------------------------------------------------------------------------------

_ANIMATE_NOUNS = """
man m Mann Männer | woman f Frau Frauen | child/children n Kind Kinder | boy m Junge Jungen w
girl n Mädchen Mädchen | teacher m Lehrer Lehrer | student m Student Studenten w
doctor m Arzt Ärzte | nurse f Krankenschwester Krankenschwestern | farmer m Bauer Bauern w
king m König Könige | queen f Königin Königinnen | friend m Freund Freunde
neighbor m Nachbar Nachbarn w | baker m Bäcker Bäcker | cook m Koch Köche
driver m Fahrer Fahrer | singer m Sänger Sänger | painter m Maler Maler
writer m Schriftsteller Schriftsteller | soldier m Soldat Soldaten w | pilot m Pilot Piloten w
lawyer m Anwalt Anwälte | judge m Richter Richter | policeman m Polizist Polizisten w
thief/thieves m Dieb Diebe | guest m Gast Gäste | brother m Bruder Brüder
sister f Schwester Schwestern | mother f Mutter Mütter | father m Vater Väter
son m Sohn Söhne | daughter f Tochter Töchter
uncle m Onkel Onkel | aunt f Tante Tanten | grandmother f Großmutter Großmütter
grandfather m Großvater Großväter | baby n Baby Babys | prince m Prinz Prinzen w
princess f Prinzessin Prinzessinnen | customer m Kunde Kunden w | tourist m Tourist Touristen w
musician m Musiker Musiker | hunter m Jäger Jäger | fisherman m Fischer Fischer
dog m Hund Hunde | cat f Katze Katzen | horse n Pferd Pferde | cow f Kuh Kühe
pig n Schwein Schweine | bird m Vogel Vögel | mouse/mice f Maus Mäuse
rabbit n Kaninchen Kaninchen | bear m Bär Bären w | lion m Löwe Löwen w | tiger m Tiger Tiger
elephant m Elefant Elefanten w | monkey m Affe Affen w | wolf/wolves m Wolf Wölfe
fox m Fuchs Füchse | goat f Ziege Ziegen | duck f Ente Enten | chicken n Huhn Hühner
snake f Schlange Schlangen | frog m Frosch Frösche | donkey m Esel Esel | owl f Eule Eulen
bee f Biene Bienen | camel n Kamel Kamele | raven m Rabe Raben w
"""

_THING_NOUNS = """
house n Haus Häuser | book n Buch Bücher | car n Auto Autos | table m Tisch Tische
chair m Stuhl Stühle | door f Tür Türen | window n Fenster Fenster | tree m Baum Bäume
flower f Blume Blumen | apple m Apfel Äpfel | letter m Brief Briefe | key m Schlüssel Schlüssel
ball m Ball Bälle | hat m Hut Hüte | shoe m Schuh Schuhe | coat m Mantel Mäntel
bag f Tasche Taschen | box f Kiste Kisten | bottle f Flasche Flaschen | cup f Tasse Tassen
glass n Glas Gläser | plate m Teller Teller | knife/knives n Messer Messer
spoon m Löffel Löffel | fork f Gabel Gabeln | bed n Bett Betten | lamp f Lampe Lampen
clock f Uhr Uhren | picture n Bild Bilder | wall f Wand Wände | roof n Dach Dächer
garden m Garten Gärten | street f Straße Straßen | city f Stadt Städte | village n Dorf Dörfer
bridge f Brücke Brücken | river m Fluss Flüsse | lake m See Seen | mountain m Berg Berge
forest m Wald Wälder | field n Feld Felder | boat n Boot Boote | ship n Schiff Schiffe
train m Zug Züge | bicycle n Fahrrad Fahrräder | bus m Bus Busse | ticket f Fahrkarte Fahrkarten
newspaper f Zeitung Zeitungen | pen m Stift Stifte | pencil m Bleistift Bleistifte
computer m Computer Computer | phone n Telefon Telefone | camera f Kamera Kameras
radio n Radio Radios | map f Landkarte Landkarten | card f Karte Karten | song n Lied Lieder
story f Geschichte Geschichten | question f Frage Fragen | answer f Antwort Antworten
idea f Idee Ideen | problem n Problem Probleme | cake m Kuchen Kuchen | bread n Brot Brote
egg n Ei Eier | cheese m Käse Käse | soup f Suppe Suppen | banana f Banane Bananen
orange f Orange Orangen | pear f Birne Birnen | potato/potatoes f Kartoffel Kartoffeln
tomato/tomatoes f Tomate Tomaten | carrot f Karotte Karotten | bone m Knochen Knochen
stone m Stein Steine | ring m Ring Ringe | coin f Münze Münzen | gift n Geschenk Geschenke
toy n Spielzeug Spielzeuge | doll f Puppe Puppen | game n Spiel Spiele | school f Schule Schulen
church f Kirche Kirchen | shop m Laden Läden | station m Bahnhof Bahnhöfe
hospital n Krankenhaus Krankenhäuser | castle n Schloss Schlösser | tower m Turm Türme
room n Zimmer Zimmer | kitchen f Küche Küchen | floor m Boden Böden | wheel n Rad Räder
rope n Seil Seile | net n Netz Netze | umbrella m Regenschirm Regenschirme | shirt n Hemd Hemden
dress n Kleid Kleider | sock f Socke Socken | glove m Handschuh Handschuhe
mirror m Spiegel Spiegel | candle f Kerze Kerzen | bucket m Eimer Eimer | basket m Korb Körbe
blanket f Decke Decken | pillow n Kissen Kissen | envelope m Umschlag Umschläge
nest n Nest Nester | leaf/leaves n Blatt Blätter | fence m Zaun Zäune | gate n Tor Tore
ladder f Leiter Leitern | hammer m Hammer Hämmer | nail m Nagel Nägel | tool n Werkzeug Werkzeuge
engine m Motor Motoren | plane n Flugzeug Flugzeuge | truck m Lastwagen Lastwagen
path m Weg Wege | island f Insel Inseln | star m Stern Sterne | cloud f Wolke Wolken
shell f Muschel Muscheln | feather f Feder Federn | drum f Trommel Trommeln
guitar f Gitarre Gitarren | violin f Geige Geigen | piano n Klavier Klaviere
poem n Gedicht Gedichte | film m Film Filme | photo n Foto Fotos | purse f Geldbörse Geldbörsen
tent n Zelt Zelte | towel n Handtuch Handtücher | brush f Bürste Bürsten
cupboard m Schrank Schränke | sofa n Sofa Sofas | carpet m Teppich Teppiche | vase f Vase Vasen
pot m Topf Töpfe | bowl f Schüssel Schüsseln | onion f Zwiebel Zwiebeln
lemon f Zitrone Zitronen | cherry f Kirsche Kirschen | nut f Nuss Nüsse
"""

# Verbs: "english participle | Infinitiv 3sg Partizip [flags]"; "_" joins English words,
# "+" marks a separable German particle (an+rufen: ruft ... an / anruft / angerufen).
# Flags: dat (object in the dative), anim (animate objects only), sein (perfect with
# "sein"), 1sg=FORM (irregular first person singular).
_TRANSITIVE_VERBS = """
see seen | sehen sieht gesehen
find found | finden findet gefunden
read read | lesen liest gelesen
buy bought | kaufen kauft gekauft
sell sold | verkaufen verkauft verkauft
carry carried | tragen trägt getragen
hold held | halten hält gehalten
take taken | nehmen nimmt genommen
bring brought | bringen bringt gebracht
paint painted | malen malt gemalt
draw drawn | zeichnen zeichnet gezeichnet
visit visited | besuchen besucht besucht
love loved | lieben liebt geliebt
hate hated | hassen hasst gehasst
need needed | brauchen braucht gebraucht
look_for looked_for | suchen sucht gesucht
wash washed | waschen wäscht gewaschen
clean cleaned | putzen putzt geputzt
open opened | öffnen öffnet geöffnet
close closed | schließen schließt geschlossen
build built | bauen baut gebaut
repair repaired | reparieren repariert repariert
cook cooked | kochen kocht gekocht
eat eaten | essen isst gegessen
drink drunk | trinken trinkt getrunken
catch caught | fangen fängt gefangen
throw thrown | werfen wirft geworfen
hear heard | hören hört gehört
watch watched | beobachten beobachtet beobachtet
count counted | zählen zählt gezählt
hide hidden | verstecken versteckt versteckt
lose lost | verlieren verliert verloren
forget forgotten | vergessen vergisst vergessen
show shown | zeigen zeigt gezeigt
write written | schreiben schreibt geschrieben
play played | spielen spielt gespielt
kiss kissed | küssen küsst geküsst anim
hug hugged | umarmen umarmt umarmt anim
feed fed | füttern füttert gefüttert anim
pay paid | bezahlen bezahlt bezahlt
order ordered | bestellen bestellt bestellt
describe described | beschreiben beschreibt beschrieben
greet greeted | begrüßen begrüßt begrüßt anim
meet met | treffen trifft getroffen anim
know known | kennen kennt gekannt
understand understood | verstehen versteht verstanden
ask asked | fragen fragt gefragt anim
wake woken | wecken weckt geweckt anim
push pushed | schieben schiebt geschoben
pull pulled | ziehen zieht gezogen
fill filled | füllen füllt gefüllt
cut cut | schneiden schneidet geschnitten
bite bitten | beißen beißt gebissen
chase chased | jagen jagt gejagt
steal stolen | stehlen stiehlt gestohlen
choose chosen | wählen wählt gewählt
send sent | schicken schickt geschickt
use used | benutzen benutzt benutzt
photograph photographed | fotografieren fotografiert fotografiert
touch touched | berühren berührt berührt
smell smelled | riechen riecht gerochen
check checked | prüfen prüft geprüft
pick_up picked_up | ab+holen holt abgeholt
call called | an+rufen ruft angerufen anim
invite invited | ein+laden lädt eingeladen anim
switch_on switched_on | ein+schalten schaltet eingeschaltet
switch_off switched_off | aus+schalten schaltet ausgeschaltet
look_at looked_at | an+sehen sieht angesehen
help helped | helfen hilft geholfen dat anim
thank thanked | danken dankt gedankt dat anim
trust trusted | vertrauen vertraut vertraut dat anim
answer answered | antworten antwortet geantwortet dat anim
follow followed | folgen folgt gefolgt dat anim sein
congratulate congratulated | gratulieren gratuliert gratuliert dat anim
obey obeyed | gehorchen gehorcht gehorcht dat anim
"""

_INTRANSITIVE_VERBS = """
sleep slept | schlafen schläft geschlafen
laugh laughed | lachen lacht gelacht
work worked | arbeiten arbeitet gearbeitet
wait waited | warten wartet gewartet
dance danced | tanzen tanzt getanzt
smile smiled | lächeln lächelt gelächelt
cry cried | weinen weint geweint
listen listened | zu+hören hört zugehört
dream dreamed | träumen träumt geträumt
whistle whistled | pfeifen pfeift gepfiffen
shout shouted | schreien schreit geschrien
cough coughed | husten hustet gehustet
swim swum | schwimmen schwimmt geschwommen sein
come come | kommen kommt gekommen sein
go gone | gehen geht gegangen sein
run run | laufen läuft gelaufen sein
fall fallen | fallen fällt gefallen sein
arrive arrived | an+kommen kommt angekommen sein
leave left | ab+fahren fährt abgefahren sein
wake_up woken_up | auf+wachen wacht aufgewacht sein
fly flown | fliegen fliegt geflogen sein
jump jumped | springen springt gesprungen sein
stay stayed | bleiben bleibt geblieben sein
climb climbed | klettern klettert geklettert sein
travel traveled | reisen reist gereist sein
"""

# Verbs that take a "that" clause (dass-Satz).
_SPEECH_VERBS = """
say said | sagen sagt gesagt
think thought | denken denkt gedacht
know known | wissen weiß gewusst 1sg=weiß
believe believed | glauben glaubt geglaubt
hope hoped | hoffen hofft gehofft
notice noticed | bemerken bemerkt bemerkt
explain explained | erklären erklärt erklärt
promise promised | versprechen verspricht versprochen
claim claimed | behaupten behauptet behauptet
"""

# Adjectives: "english German [inflection stem]" (default stem: the word, minus a final e).
_ADJECTIVES = """
big groß | small klein | old alt | young jung | new neu | good gut | bad schlecht | red rot
blue blau | green grün | black schwarz | white weiß | yellow gelb | brown braun | gray grau
happy glücklich | sad traurig | tired müde | fast schnell | slow langsam | beautiful schön
ugly hässlich | rich reich | poor arm | long lang | short kurz | warm warm | cold kalt
hot heiß | clean sauber | dirty schmutzig | quiet ruhig | loud laut | strong stark
weak schwach | friendly freundlich | clever klug | stupid dumm | brave mutig | shy schüchtern
famous berühmt | strange seltsam | funny lustig | nice nett | angry wütend | hungry hungrig
thirsty durstig | heavy schwer | light leicht | cheap billig | expensive teuer teur
dark dunkel dunkl | empty leer | full voll | open offen | round rund | soft weich | hard hart
wet nass | dry trocken | fresh frisch | sweet süß | sour sauer saur | wild wild | proud stolz
lazy faul | polite höflich | curious neugierig | careful vorsichtig | dangerous gefährlich
important wichtig | boring langweilig | difficult schwierig | foreign fremd | wide breit
narrow schmal | thick dick | thin dünn | deep tief | sick krank | healthy gesund
lonely einsam | wise weise | bright hell | high hoch hoh | golden golden | modern modern
simple einfach | gentle sanft | busy beschäftigt
"""

# Adverbs in the middle of the clause ("the man often sees" -> "der Mann sieht oft").
_MID_ADVERBS = """
often oft | always immer | sometimes manchmal | usually normalerweise | rarely selten
never nie | already schon | still noch | also auch | really wirklich
probably wahrscheinlich | finally endlich | suddenly plötzlich | quickly schnell
slowly langsam | quietly leise | carefully vorsichtig | gladly gern | again wieder
secretly heimlich | proudly stolz
"""

# Adverbials that can open a main clause, which then inverts subject and verb.
_FRONT_ADVERBS = """
today heute | now jetzt | then dann | here hier | there dort | later später | soon bald
unfortunately leider | of_course natürlich | perhaps vielleicht | in_the_morning am_Morgen
in_the_evening am_Abend | at_night nachts | every_day jeden_Tag | in_winter im_Winter
in_summer im_Sommer | this_morning heute_Morgen | on_Monday am_Montag
on_Tuesday am_Dienstag | on_Wednesday am_Mittwoch | on_Thursday am_Donnerstag
on_Friday am_Freitag | on_Saturday am_Samstag | on_Sunday am_Sonntag
"""

# Prepositions inside noun phrases: "english German case".
_PREPOSITIONS = """
with mit dat | without ohne acc | for für acc | from von dat | in in dat | on auf dat
under unter dat | behind hinter dat | next_to neben dat | in_front_of vor dat
against gegen acc
"""
_CONTRACTIONS = {("von", "dem"): "vom", ("in", "dem"): "im"}

_SUBORDINATORS = """
because weil | when wenn | although obwohl | while während | before bevor | if falls
until bis | as_soon_as sobald
"""

_POSSESSIVES = """
my mein | your dein | his sein | her ihr | our unser | their ihr
"""

# Number words: English 1..19 | English tens | German 1..19 | German tens.
_NUMBER_WORDS = """
one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen
sixteen seventeen eighteen nineteen | twenty thirty forty fifty sixty seventy eighty ninety |
eins zwei drei vier fünf sechs sieben acht neun zehn elf zwölf dreizehn vierzehn fünfzehn
sechzehn siebzehn achtzehn neunzehn |
zwanzig dreißig vierzig fünfzig sechzig siebzig achtzig neunzig
"""

# Inflection tables, indexed [case][gender]; gender "pl" stands for any plural.
_ARTICLE = {
    "nom": {"m": "der", "f": "die", "n": "das", "pl": "die"},
    "acc": {"m": "den", "f": "die", "n": "das", "pl": "die"},
    "dat": {"m": "dem", "f": "der", "n": "dem", "pl": "den"},
}
_DER_WORD_END = {
    "nom": {"m": "er", "f": "e", "n": "es", "pl": "e"},
    "acc": {"m": "en", "f": "e", "n": "es", "pl": "e"},
    "dat": {"m": "em", "f": "er", "n": "em", "pl": "en"},
}
_EIN_WORD_END = {
    "nom": {"m": "", "f": "e", "n": "", "pl": "e"},
    "acc": {"m": "en", "f": "e", "n": "", "pl": "e"},
    "dat": {"m": "em", "f": "er", "n": "em", "pl": "en"},
}
_RELATIVE = {
    "nom": {"m": "der", "f": "die", "n": "das", "pl": "die"},
    "acc": {"m": "den", "f": "die", "n": "das", "pl": "die"},
    "dat": {"m": "dem", "f": "der", "n": "dem", "pl": "denen"},
}
_ADJ_END = {  # weak: after der-words; mixed: after ein-words; strong: no determiner
    "weak": {
        "nom": {"m": "e", "f": "e", "n": "e", "pl": "en"},
        "acc": {"m": "en", "f": "e", "n": "e", "pl": "en"},
        "dat": {"m": "en", "f": "en", "n": "en", "pl": "en"},
    },
    "mixed": {
        "nom": {"m": "er", "f": "e", "n": "es", "pl": "en"},
        "acc": {"m": "en", "f": "e", "n": "es", "pl": "en"},
        "dat": {"m": "en", "f": "en", "n": "en", "pl": "en"},
    },
    "strong": {"nom": {"pl": "e"}, "acc": {"pl": "e"}, "dat": {"pl": "en"}},
}

# Persons: 1sg, 3sg, 1pl, 3pl.
_PRONOUNS = (
    ("I", "ich", "1sg"),
    ("he", "er", "3sg"),
    ("she", "sie", "3sg"),
    ("we", "wir", "1pl"),
    ("they", "sie", "3pl"),
)
_EN_BE = {"1sg": "am", "3sg": "is", "1pl": "are", "3pl": "are"}
_DE_SEIN = {"1sg": "bin", "3sg": "ist", "1pl": "sind", "3pl": "sind"}
_DE_HABEN = {"1sg": "habe", "3sg": "hat", "1pl": "haben", "3pl": "haben"}
_MODALS = (
    ("can", "kann", "können"),
    ("must", "muss", "müssen"),
    ("will", "wird", "werden"),
    ("should", "sollte", "sollten"),
    ("may", "darf", "dürfen"),
)


# ---------------------------------------------------------------------------------------
# Lexicon parsing
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Noun:
    en_sg: str
    en_pl: str
    gender: str
    de_sg: str
    de_pl: str
    weak: bool
    animate: bool


@dataclass(frozen=True)
class _Verb:
    en_base: str
    en_3sg: str
    en_part: str
    de_stem_inf: str  # infinitive without a separable particle
    de_1sg: str
    de_3sg: str
    de_part: str
    particle: str = ""
    case: str = "acc"
    animate_object: bool = False
    aux: str = "haben"


@dataclass(frozen=True)
class _Adjective:
    en: str
    de: str
    stem: str


def _entries(table: str) -> list[str]:
    return [e.strip() for line in table.strip().splitlines() for e in line.split("|") if e.strip()]


def _words(text: str) -> str:
    return text.replace("_", " ")


def _en_plural(word: str) -> str:
    if word.endswith("man"):
        return word[:-3] + "men"
    if word.endswith(("s", "sh", "ch", "x", "z")):
        return word + "es"
    if word.endswith("y") and word[-2] not in "aeiou":
        return word[:-1] + "ies"
    return word + "s"


def _parse_nouns(table: str, animate: bool) -> tuple[_Noun, ...]:
    nouns = []
    for entry in _entries(table):
        en, gender, de_sg, de_pl, *flags = entry.split()
        en_sg, _, en_pl = en.partition("/")
        en_pl = en_pl or _en_plural(en_sg)
        nouns.append(_Noun(en_sg, en_pl, gender, de_sg, de_pl, "w" in flags, animate))
    return tuple(nouns)


def _en_3sg(base: str) -> str:
    first, _, rest = base.partition(" ")
    if first.endswith(("s", "sh", "ch", "x", "z", "o")):
        first += "es"
    elif first.endswith("y") and first[-2] not in "aeiou":
        first = first[:-1] + "ies"
    else:
        first += "s"
    return f"{first} {rest}".strip()


def _de_1sg(inf: str) -> str:
    if inf.endswith("eln"):
        return inf[:-3] + "le"  # lächeln -> lächle
    return inf[:-1] if inf.endswith("en") else inf[:-1] + "e"  # sehen -> sehe, füttern -> füttere


def _parse_verbs(table: str) -> tuple[_Verb, ...]:
    verbs = []
    for entry in table.strip().splitlines():
        en, de = entry.split("|")
        en_base, en_part = (_words(w) for w in en.split())
        inf, de_3sg, de_part, *flags = de.split()
        particle, _, stem_inf = inf.rpartition("+")
        options = dict(f.split("=") for f in flags if "=" in f)
        verbs.append(
            _Verb(
                en_base,
                _en_3sg(en_base),
                en_part,
                stem_inf,
                options.get("1sg", _de_1sg(stem_inf)),
                de_3sg,
                de_part,
                particle,
                "dat" if "dat" in flags else "acc",
                "anim" in flags,
                "sein" if "sein" in flags else "haben",
            )
        )
    return tuple(verbs)


def _parse_adjectives(table: str) -> tuple[_Adjective, ...]:
    adjectives = []
    for entry in _entries(table):
        en, de, *stem = entry.split()
        adjectives.append(_Adjective(en, de, stem[0] if stem else de.removesuffix("e")))
    return tuple(adjectives)


def _parse_pairs(table: str) -> tuple[tuple[str, str], ...]:
    return tuple(tuple(_words(w) for w in e.split()) for e in _entries(table))


_ANIMATE = _parse_nouns(_ANIMATE_NOUNS, animate=True)
_NOUNS = _ANIMATE + _parse_nouns(_THING_NOUNS, animate=False)
_TRANSITIVE = _parse_verbs(_TRANSITIVE_VERBS)
_THING_VERBS = tuple(v for v in _TRANSITIVE if not v.animate_object)
_INTRANSITIVE = _parse_verbs(_INTRANSITIVE_VERBS)
_SPEECH = _parse_verbs(_SPEECH_VERBS)
_ADJS = _parse_adjectives(_ADJECTIVES)
_MID_ADVS = _parse_pairs(_MID_ADVERBS)
_FRONT_ADVS = _parse_pairs(_FRONT_ADVERBS)
_SUBORDS = _parse_pairs(_SUBORDINATORS)
_POSS = _parse_pairs(_POSSESSIVES)
_PREPS = tuple((_words(en), de, case) for en, de, case in map(str.split, _entries(_PREPOSITIONS)))
_EN_UNITS, _EN_TENS, _DE_UNITS, _DE_TENS = map(str.split, _NUMBER_WORDS.split("|"))


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
        return _EN_UNITS[n - 1], _DE_UNITS[n - 1]
    tens, unit = divmod(n, 10)
    if unit == 0:
        return _EN_TENS[tens - 2], _DE_TENS[tens - 2]
    de_unit = "ein" if unit == 1 else _DE_UNITS[unit - 1]
    return f"{_EN_TENS[tens - 2]}-{_EN_UNITS[unit - 1]}", f"{de_unit}und{_DE_TENS[tens - 2]}"


def _pick_determiner(rng: random.Random, plural: bool, negated: bool) -> tuple[str, object]:
    """(kind, extra): extra is a possessive (en, de) pair, a number, or "".

    Negated objects avoid "every", "one" and numbers ("does not see a dog" -> "keinen Hund")."""
    r = rng.random()
    if plural:
        if negated:
            return ("the", "") if r < 0.7 else ("poss", rng.choice(_POSS))
        if r < 0.35:
            return "the", ""
        if r < 0.83:
            number = rng.randint(2, 12) if rng.random() < 0.4 else rng.randint(13, 99)
            return ("num" if r < 0.75 else "the_num"), number
        return ("these", "") if r < 0.9 else ("poss", rng.choice(_POSS))
    if r < 0.4:
        return "the", ""
    if r < 0.7:
        return "a", ""
    if r < 0.78:
        return "this", ""
    if r < 0.95 or negated:
        return "poss", rng.choice(_POSS)
    return ("every", "") if r < 0.98 else ("one", "")


def _de_determiner(kind: str, extra, g: str, case: str, negated: bool) -> tuple[list[str], str]:
    """German determiner words and the adjective declension class they select."""
    if kind == "the":
        return [_ARTICLE[case][g]], "weak"
    if kind in ("this", "these"):
        return ["dies" + _DER_WORD_END[case][g]], "weak"
    if kind == "every":
        return ["jed" + _DER_WORD_END[case][g]], "weak"
    if kind in ("a", "one"):
        return [("kein" if negated else "ein") + _EIN_WORD_END[case][g]], "mixed"
    if kind == "poss":
        return [extra[1] + _EIN_WORD_END[case][g]], "weak" if g == "pl" else "mixed"
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


def _de_noun(noun: _Noun, plural: bool, case: str) -> str:
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
    noun = rng.choice(_ANIMATE if animate else _NOUNS)
    plural = rng.random() < 0.35
    kind, extra = _pick_determiner(rng, plural, negated)
    g = "pl" if plural else noun.gender
    adjs = rng.sample(_ADJS, rng.choices((0, 1, 2), (0.55, 0.35, 0.1))[0])
    de_det, adj_class = _de_determiner(kind, extra, g, case, negated)
    en_rest = [a.en for a in adjs] + [noun.en_pl if plural else noun.en_sg]
    en = _en_determiner(kind, extra, en_rest[0]) + en_rest
    de_adjs = [a.stem + _ADJ_END[adj_class][case][g] for a in adjs]
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
    en_prep, de_prep, case = rng.choice(_PREPS)
    inner = _noun_phrase(rng, case)
    if (de_prep, inner.de[0]) in _CONTRACTIONS:
        return en_prep.split() + inner.en, [_CONTRACTIONS[de_prep, inner.de[0]]] + inner.de[1:]
    return en_prep.split() + inner.en, [de_prep] + inner.de


def _relative_clause(rng: random.Random, animate_head: bool, person: str, g: str):
    """'who sees the cat' / 'that the cat sees' with German comma-enclosed verb-final clause."""
    if animate_head and rng.random() < 0.55:
        clause = _clause(rng, subject=None, person=person, kinds=("trans", "intr", "cop"))
        rel_pronoun = _RELATIVE["nom"][g]
        return ["who"] + _en_clause(clause), [",", rel_pronoun] + _de_clause(clause, "sub") + [","]
    clause = _clause(rng, gap_object=True, animate_gap=animate_head, kinds=("trans",))
    rel_pronoun = _RELATIVE[clause.verb.case][g]
    return ["that"] + _en_clause(clause), [",", rel_pronoun] + _de_clause(clause, "sub") + [","]


def _subject(rng: random.Random, rel: float, pp: float) -> _NP:
    if rng.random() < 0.2:
        en, de, person = rng.choice(_PRONOUNS)
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
    verb: _Verb | None = None
    adjective: _Adjective | None = None
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
        tense = rng.choice(_MODALS)[0]
    c = _Clause(subject, person, kind, tense=tense)
    c.negated = rng.random() < 0.15
    if not c.negated and rng.random() < 0.18:
        c.adverb = rng.choice(_MID_ADVS)
    if kind == "trans":
        c.verb = rng.choice(_TRANSITIVE if animate_gap or not gap_object else _THING_VERBS)
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
        c.verb = rng.choice(_INTRANSITIVE)
    elif kind == "cop":
        c.adjective = rng.choice(_ADJS)
        c.tense = "pres" if tense == "perf" and rng.random() < 0.5 else c.tense
    else:
        c.verb = rng.choice(_SPEECH)
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
        return [_EN_BE[p]] + middle
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
        modal = next(m for m in _MODALS if m[0] == c.tense)
        finite = modal[1] if p in ("1sg", "3sg") else modal[2]
        main = "sein" if c.kind == "cop" else c.verb.particle + c.verb.de_stem_inf
        return finite, ([c.adjective.de] if c.adjective else []) + [main]
    if c.kind == "cop":
        return _DE_SEIN[p], [c.adjective.de] + (["gewesen"] if c.tense == "perf" else [])
    v = c.verb
    if c.tense == "perf":
        return (_DE_SEIN if v.aux == "sein" else _DE_HABEN)[p], [v.de_part]
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
    en_conj, de_conj = rng.choice(_SUBORDS)
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
        en_adv, de_adv = rng.choice(_FRONT_ADVS)
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
