"""The toy corpus's lexicon: English and German words with what the grammar (toy.py) needs to
inflect them: plural forms, gender, weak masculine nouns, verb forms, separable particles,
cases governed by verbs and prepositions, adjective and determiner endings."""

from __future__ import annotations

from dataclasses import dataclass

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
CONTRACTIONS = {("von", "dem"): "vom", ("in", "dem"): "im"}

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
ARTICLE = {
    "nom": {"m": "der", "f": "die", "n": "das", "pl": "die"},
    "acc": {"m": "den", "f": "die", "n": "das", "pl": "die"},
    "dat": {"m": "dem", "f": "der", "n": "dem", "pl": "den"},
}
DER_WORD_END = {
    "nom": {"m": "er", "f": "e", "n": "es", "pl": "e"},
    "acc": {"m": "en", "f": "e", "n": "es", "pl": "e"},
    "dat": {"m": "em", "f": "er", "n": "em", "pl": "en"},
}
EIN_WORD_END = {
    "nom": {"m": "", "f": "e", "n": "", "pl": "e"},
    "acc": {"m": "en", "f": "e", "n": "", "pl": "e"},
    "dat": {"m": "em", "f": "er", "n": "em", "pl": "en"},
}
RELATIVE = {
    "nom": {"m": "der", "f": "die", "n": "das", "pl": "die"},
    "acc": {"m": "den", "f": "die", "n": "das", "pl": "die"},
    "dat": {"m": "dem", "f": "der", "n": "dem", "pl": "denen"},
}
ADJ_END = {  # weak: after der-words; mixed: after ein-words; strong: no determiner
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
PRONOUNS = (
    ("I", "ich", "1sg"),
    ("he", "er", "3sg"),
    ("she", "sie", "3sg"),
    ("we", "wir", "1pl"),
    ("they", "sie", "3pl"),
)
EN_BE = {"1sg": "am", "3sg": "is", "1pl": "are", "3pl": "are"}
DE_SEIN = {"1sg": "bin", "3sg": "ist", "1pl": "sind", "3pl": "sind"}
DE_HABEN = {"1sg": "habe", "3sg": "hat", "1pl": "haben", "3pl": "haben"}
MODALS = (
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
class Noun:
    en_sg: str
    en_pl: str
    gender: str
    de_sg: str
    de_pl: str
    weak: bool
    animate: bool


@dataclass(frozen=True)
class Verb:
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
class Adjective:
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


def _parse_nouns(table: str, animate: bool) -> tuple[Noun, ...]:
    nouns = []
    for entry in _entries(table):
        en, gender, de_sg, de_pl, *flags = entry.split()
        en_sg, _, en_pl = en.partition("/")
        en_pl = en_pl or _en_plural(en_sg)
        nouns.append(Noun(en_sg, en_pl, gender, de_sg, de_pl, "w" in flags, animate))
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


def _parse_verbs(table: str) -> tuple[Verb, ...]:
    verbs = []
    for entry in table.strip().splitlines():
        en, de = entry.split("|")
        en_base, en_part = (_words(w) for w in en.split())
        inf, de_3sg, de_part, *flags = de.split()
        particle, _, stem_inf = inf.rpartition("+")
        options = dict(f.split("=") for f in flags if "=" in f)
        verbs.append(
            Verb(
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


def _parse_adjectives(table: str) -> tuple[Adjective, ...]:
    adjectives = []
    for entry in _entries(table):
        en, de, *stem = entry.split()
        adjectives.append(Adjective(en, de, stem[0] if stem else de.removesuffix("e")))
    return tuple(adjectives)


def _parse_pairs(table: str) -> tuple[tuple[str, str], ...]:
    return tuple(tuple(_words(w) for w in e.split()) for e in _entries(table))


ANIMATE = _parse_nouns(_ANIMATE_NOUNS, animate=True)
NOUNS = ANIMATE + _parse_nouns(_THING_NOUNS, animate=False)
TRANSITIVE = _parse_verbs(_TRANSITIVE_VERBS)
THING_VERBS = tuple(v for v in TRANSITIVE if not v.animate_object)
INTRANSITIVE = _parse_verbs(_INTRANSITIVE_VERBS)
SPEECH = _parse_verbs(_SPEECH_VERBS)
ADJS = _parse_adjectives(_ADJECTIVES)
MID_ADVS = _parse_pairs(_MID_ADVERBS)
FRONT_ADVS = _parse_pairs(_FRONT_ADVERBS)
SUBORDS = _parse_pairs(_SUBORDINATORS)
POSS = _parse_pairs(_POSSESSIVES)
PREPS = tuple((_words(en), de, case) for en, de, case in map(str.split, _entries(_PREPOSITIONS)))
EN_UNITS, EN_TENS, DE_UNITS, DE_TENS = map(str.split, _NUMBER_WORDS.split("|"))
