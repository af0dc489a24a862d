"""The checkable facts of a text: quantities, dates, names, negations, and who-did-what bindings.

Everything is extracted as whole tokens and normalized, so that a paraphrase that re-words a fact
keeps it and a rewrite that changes it does not:
- quantities: digits or number words with an optional scale ("2.5 million") and unit, converted
  to one base unit per dimension ("3 km" = "three kilometres" = "3,000 m" -> length:3000);
  the bare value is kept too, so "330" still matches "330 metres" when one side drops the unit;
- dates: "4 March" = "March 4th" = "the 4th of March" -> date:03-04; a month alone -> month:03;
- names: runs of capitalized words that do not merely start a sentence ("Henri Becquerel",
  "New Zealand"), lower-cased; "Henri" is not found in "Henrietta", nor "India" in "Indiana";
- negations: not, never, no, n't, without...: a flipped statement changes their count;
- bindings: within a clause (a sentence cut at , ; : and/but/while), each fact or distinctive
  word is bound to its nearest name, and a short apposition ("Tenzing, from Nepal") binds its name
  to the name before it. Swapping two laureates' prizes keeps every word and every name but
  changes two bindings; a rewrite whose words left the clause of their name is not checked.
The module is pure Python and regular expressions: ~0.2 ms for a 256-token chunk.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

MONTHS = {m: i + 1 for i, m in enumerate(["january", "february", "march", "april", "may", "june", "july", "august",
                                          "september", "october", "november", "december"])}
MONTHS.update({m[:3]: i for m, i in list(MONTHS.items())} | {"sept": 9})
WEEKDAYS = {"monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"}
SMALL = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve thirteen "
                                    "fourteen fifteen sixteen seventeen eighteen nineteen".split())}
TENS = {w: 10 * (i + 2) for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split())}
SCALES = {"hundred": 100, "thousand": 1e3, "million": 1e6, "billion": 1e9, "trillion": 1e12}
UNITS = {  # unit word -> (dimension, factor to the base unit)
    **dict.fromkeys(["mm", "millimetre", "millimeter"], ("length", 0.001)),
    **dict.fromkeys(["cm", "centimetre", "centimeter"], ("length", 0.01)),
    **dict.fromkeys(["m", "metre", "meter"], ("length", 1.0)),
    **dict.fromkeys(["km", "kilometre", "kilometer"], ("length", 1000.0)),
    **dict.fromkeys(["mile", "mi"], ("length", 1609.344)), **dict.fromkeys(["foot", "feet", "ft"], ("length", 0.3048)),
    **dict.fromkeys(["mg", "milligram"], ("mass", 0.001)), **dict.fromkeys(["g", "gram"], ("mass", 1.0)),
    **dict.fromkeys(["kg", "kilogram"], ("mass", 1000.0)), **dict.fromkeys(["tonne", "ton"], ("mass", 1e6)),
    **dict.fromkeys(["lb", "pound"], ("mass", 453.592)),
    **dict.fromkeys(["minute", "min"], ("time", 60.0)), **dict.fromkeys(["hour", "hr", "h"], ("time", 3600.0)),
    "day": ("time", 86400.0), "week": ("time", 604800.0),
    **dict.fromkeys(["%", "percent", "per cent"], ("percent", 1.0)),
    **dict.fromkeys(["degree", "°"], ("degree", 1.0)),
}
NUMBER_WORDS = "|".join([*SMALL, *TENS])
QUANTITY = re.compile(
    r"(?P<num>(?<![\w.])\d{1,3}(?:,\d{3})+(?:\.\d+)?|(?<![\w.,])\d+(?:\.\d+)?"
    rf"|\b(?:{NUMBER_WORDS})(?:[\s-]+(?:{NUMBER_WORDS}|hundred)\b)*)"
    r"(?:(?:st|nd|rd|th|s)\b)?"
    rf"(?:[\s-]*(?P<scale>{'|'.join(SCALES)})\b)?"
    r"(?:[\s-]*(?P<unit>%|°|" + "|".join(sorted((u for u in UNITS if u.isalpha()), key=len, reverse=True))
    + r"|per cent)(?:e?s)?(?!\w))?", re.IGNORECASE)
MONTH_NAMES = "|".join(sorted(MONTHS, key=len, reverse=True))
DATE = re.compile(rf"\b(?:(?P<day>[0-3]?\d)(?:st|nd|rd|th)?\s+(?:of\s+)?(?P<month>{MONTH_NAMES})\.?"
                  rf"|(?P<month2>{MONTH_NAMES})\.?\s+(?P<day2>[0-3]?\d)(?:st|nd|rd|th)?)\b", re.IGNORECASE)
MONTH_ALONE = re.compile(r"\b(" + "|".join(m for m in MONTHS if len(m) > 3) + r")\b", re.IGNORECASE)
SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z0-9])|\n+")
CLAUSE = re.compile(r",(?!\s*\d)|[;:()\u2014]|\s(?:and|but|while|whereas|or|which|who)\s")
TOKEN = re.compile(r"[^\W_][\w'’-]*|\d[\d,.]*")
NEGATION = re.compile(r"\b(?:not|no|never|none|nobody|nothing|neither|nor|cannot|without)\b|n['’]t\b", re.IGNORECASE)
ABBREVIATION = re.compile(r"(?:^|\s)(?:" + "|".join(m.title() for m in MONTHS if len(m) == 3) + "|Sept|Mr|Mrs|Ms|Dr|"
                          r"St|Jr|Sr|No|Vol|Gen|Sen|Rep|Gov|Inc|Co|Ltd|Mt|Ft|vs|etc|e\.g|i\.e|(?:[A-Z]\.)*[A-Z])\.$")
POSSESSIVE = re.compile(r"['’]s$")
STOPWORDS = frozenset("""the a an and or but of to in on at by for from with as is are was were be been being this that
these those it its their there they them he she his her him we our you your i who which what when where while whose into
than then so such also only more most many much some any each other over under after before about between during has
have had do does did not no can could would should will may might must very just like one two three""".split())
NOT_NAMES = frozenset({"i", *WEEKDAYS, *(m for m in MONTHS if len(m) > 3)})


@dataclass(frozen=True)
class Quantity:
    bare: str  # the number as written, normalized: "3" for "3 km", "2500" for "2,500"; "" for a date
    dim: str = ""  # "length:3000", "date:03-04", "month:03"; "" for a bare number

    @property
    def key(self) -> str:
        return self.dim or f"n:{self.bare}"


@dataclass
class Facts:
    quantities: set[Quantity] = field(default_factory=set)
    names: set[str] = field(default_factory=set)  # "henri becquerel", "new zealand"
    negations: int = 0
    bindings: set[tuple[str, str]] = field(default_factory=set)  # (fact key or word, the name it is bound to)
    together: set[tuple[str, str]] = field(default_factory=set)  # (fact key or word, a name in the same clause)
    words: set[str] = field(default_factory=set)  # every lower-cased word, for whole-word look-ups


def number_value(text: str) -> float:
    """'2,500' -> 2500; 'two thousand five hundred' -> 2500; 'twenty-one' -> 21."""
    text = text.lower().replace(",", "")
    if text[0].isdigit():
        return float(text)
    total, current = 0.0, 0.0
    for word in re.split(r"[\s-]+", text):
        if word in SMALL:
            current += SMALL[word]
        elif word in TENS:
            current += TENS[word]
        elif word == "hundred":
            current = max(current, 1) * 100
        elif word in SCALES:
            total, current = total + max(current, 1) * SCALES[word], 0.0
    return total + current


def canonical(value: float, digits: int = 15) -> str:
    """No trailing zeros: 3000.0 -> '3000'; unit conversions round to 6 significant figures, so
    float error (3 x 0.3048) does not tell equal lengths apart, while 7,799,401 != 7,799,402."""
    return f"{float(f'{value:.{digits}g}'):.15g}"


def unit_of(word: str | None) -> tuple[str, float] | None:
    if not word:
        return None
    word = word.lower()
    return UNITS.get(word) or UNITS.get(word.removesuffix("s")) or UNITS.get(word.removesuffix("es"))


def find_quantities(text: str) -> list[tuple[Quantity, int]]:
    """Every date, month and quantity with its character offset (see the module doc)."""
    found = []
    for match in DATE.finditer(text):
        day, month = int(match["day"] or match["day2"]), MONTHS[(match["month"] or match["month2"]).lower()]
        if 1 <= day <= 31:
            found.append((Quantity("", f"date:{month:02d}-{day:02d}"), match.start()))
    text = DATE.sub(lambda m: " " * len(m[0]), text)  # same length: offsets stay true
    for match in MONTH_ALONE.finditer(text):
        found.append((Quantity("", f"month:{MONTHS[match[0].lower()]:02d}"), match.start()))
    for match in QUANTITY.finditer(text):
        unit = unit_of(match["unit"])
        if match["num"].lower().split()[0] == "one" and not unit and not match["scale"]:
            continue  # "one of the", "no one": not a fact
        value = number_value(match["num"].rstrip(" -")) * SCALES.get((match["scale"] or "").lower(), 1)
        dim = f"{unit[0]}:{canonical(value * unit[1], 6)}" if unit else ""
        found.append((Quantity(canonical(value), dim), match.start()))
    return found


def matched(item: Quantity, other: set[Quantity]) -> bool:
    """Kept in `other`: the same dimensioned value ("3 km" = "3,000 m"), or the same number with the
    unit left out on one side ("330 metres" and "330"); "3 km" is not kept by "3 m"."""
    bare_only = {q.bare for q in other if not q.dim}
    if item.dim:
        return item.dim in {q.dim for q in other} or (bool(item.bare) and item.bare in bare_only)
    return item.bare in {q.bare for q in other} | {q.dim.split(":", 1)[1] for q in other if q.dim}


def unmatched(items: set[Quantity], other: set[Quantity]) -> list[str]:
    return sorted(q.key for q in items if not matched(q, other))


def sentences(text: str) -> list[str]:
    """Sentences; a break after an abbreviation ("Aug. 9", "Dr. Watson", "U.S. Army") is no break."""
    merged: list[str] = []
    for piece in SENTENCE.split(text):
        if merged and ABBREVIATION.search(merged[-1]):
            merged[-1] += " " + piece
        elif piece.strip():
            merged.append(piece)
    return merged


def names(text: str) -> set[str]:
    return {name for sentence in sentences(text) for name, _ in sentence_names(sentence)}


@lru_cache(maxsize=4096)  # a clause is looked at twice, a source chunk once per answer it gets
def sentence_names(sentence: str, initial: bool = True) -> list[tuple[str, int]]:
    """Runs of capitalized words with the index of their first word; a sentence's first word counts
    only when the next word is capitalized too ("Marie Curie won" but not "The tower"); a clause
    after the first (initial=False) has no sentence-initial word."""
    tokens = TOKEN.findall(sentence)
    found, run, start = [], [], 0
    for i, token in enumerate(tokens + [""]):
        word = POSSESSIVE.sub("", token)
        capital = bool(word) and word[0].isupper() and word.lower() not in NOT_NAMES and len(word) > 1
        if capital and (i > 0 or not initial or (len(tokens) > 1 and tokens[1][:1].isupper())):
            run, start = (run + [word.lower()], start if run else i)
            continue
        if run:
            found.append((" ".join(run), start))
        run = []
    return found


@lru_cache(maxsize=1024)  # the source chunk's facts, for each of its answers (styles, retries)
def extract(text: str) -> Facts:
    tokens = [t.lower() for t in TOKEN.findall(text)]
    facts = Facts(quantities={q for q, _ in find_quantities(text)}, negations=len(NEGATION.findall(text)),
                  words=set(tokens) | {POSSESSIVE.sub("", t) for t in tokens})
    for sentence in sentences(text):
        facts.names.update(name for name, _ in sentence_names(sentence))
        last_name = ""
        for clause, initial in clauses(sentence):
            last_name = bind_clause(clause, initial, last_name, facts)
    return facts


def clauses(sentence: str) -> list[tuple[str, bool]]:
    """The sentence's clauses, each with whether it starts the sentence; a clause with no name is
    joined to the next ("In 2016, Mourinho won" is one clause), so fronting a phrase moves nothing."""
    found, pending, initial = [], "", True
    for k, clause in enumerate(CLAUSE.split(sentence)):
        text = f"{pending} {clause}" if pending else clause
        if not sentence_names(clause, k == 0 and not pending) and k < len(CLAUSE.split(sentence)) - 1:
            pending, initial = text, initial if pending else k == 0
            continue
        found.append((text, initial if pending else k == 0))
        pending = ""
    return found


def bind_clause(clause: str, initial: bool, last_name: str, facts: Facts) -> str:
    """Bind every anchor of the clause to its nearest name in the clause; a short clause with one
    name ("from Nepal") is an apposition and binds that name to the name before it. A clause with
    no name binds nothing ("He won it" could mean anyone). Returns the last name seen."""
    named = sentence_names(clause, initial) if clause.strip() else []
    if not named:
        return last_name
    tokens = TOKEN.findall(clause)
    apposition = len(named) == 1 and len(tokens) <= 4 and tokens[0][0].islower()  # "from Nepal", not "and Tenzing"
    if apposition and last_name and last_name != named[0][0]:
        facts.bindings.add((named[0][0], last_name))
    for key, i in clause_anchors(clause) + named:
        others = [(abs(j - i), name) for name, j in named if name != key]
        if others:
            facts.bindings.add((key, min(others)[1]))
        facts.together.update((key, name) for name, _ in named if name != key)
    return named[-1][0]


def clause_anchors(clause: str) -> list[tuple[str, int]]:
    """The clause's quantities and distinctive lower-case words, with their token index."""
    anchors = [(q.key, len(TOKEN.findall(clause[:start]))) for q, start in find_quantities(clause)]
    for i, token in enumerate(TOKEN.findall(clause)):
        word = token.lower()
        if token[0].islower() and len(word) >= 4 and word not in STOPWORDS and not NEGATION.fullmatch(word):
            anchors.append((word, i))
    return anchors


def present(facts: Facts, key: str) -> bool:
    """A fact key, name or word present in the text ('new zealand' needs both words)."""
    if ":" in key:
        return key in {q.key for q in facts.quantities}
    return all(part in facts.words for part in key.split())


def broken_bindings(source: Facts, rewrite: Facts) -> list[str]:
    """Source bindings that the rewrite moved to another of the source's names: the rewrite keeps
    the fact and both names but says it of someone else (a swap). A fact left with no name in the
    rewrite's clause (a pronoun) is not counted: that is how paraphrases read."""
    said = source.bindings | source.together | {(b, a) for a, b in source.bindings | source.together}
    moved = []
    for key, name in sorted(source.bindings):
        if not (present(rewrite, key) and present(rewrite, name)):
            continue
        held = {(key, name), (name, key)} & (rewrite.bindings | rewrite.together)
        ends = {key, name} if key in source.names else {key}  # a name may move as well as a fact
        elsewhere = [b if a in ends else a for a, b in rewrite.bindings if (a in ends or b in ends and a in source.names)
                     and (a, b) not in said and (b if a in ends else a) in source.names]
        if not held and elsewhere:
            moved.append(f"{key}~{name}->{elsewhere[0]}")
    return moved
