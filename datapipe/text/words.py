"""A fast regex word splitter close to spaCy's English tokenizer, which the published
Gopher/C4/FineWeb filters were tuned with (datatrove runs `spacy.blank("en")`).

One compiled regex does what spaCy's prefix/suffix/infix loop does for >99% of web
tokens: URLs and e-mails stay whole, "U.S."/"e.g."/"Mr." stay whole, numbers keep
their inner "." and ",", "..." is one token, hyphens between words and every other
punctuation mark are tokens of their own, and "don't" / "it's" split into "do"
"n't" / "it" "'s". It runs ~30x faster than spaCy's tokenizer; bench/filters.py
counts how often the keep/drop decisions of the filters still differ.
"""
from __future__ import annotations

import re
import unicodedata
from functools import lru_cache
from itertools import chain

PUNCT = r",:;!?¿؟¡()\[\]{}<>_#*&。？！，、；：～·।،۔؛٪"
QUOTES = r"'\"”“`‘´’‚„»«「」『』（）〔〕【】《》〈〉"
CURRENCY = r"$£€¥฿₽₹₩₪₫₴₺"
UNITS = r"km|m|cm|mm|kg|g|mg|lb|lbs|oz|ft|mi|mph|kph|km/h|ml|l|gb|GB|mb|MB|kb|KB|tb|TB|hz|Hz|kHz|MHz|GHz|K|%"


def letters(category: str) -> str:
    """A regex class body of the Latin, Greek and Cyrillic letters of one case ("Ll", "Lu"): spaCy's
    ALPHA_LOWER/ALPHA_UPPER, so "Year.Â Julia" splits at the period as spaCy does (2 sentences, not 1)."""
    found = (chr(code) for code in range(0x41, 0x530) if unicodedata.category(chr(code)) == category)
    return "".join(found)


LOWER, UPPER = letters("Ll"), letters("Lu")
# spaCy's English rules in short: split on whitespace, then peel prefixes and suffixes
# off each chunk, then split inside it at a few infixes; exceptions keep abbreviations
# whole and split contractions.
PREFIX = re.compile(rf"^(?:[§%=—–]|\+(?![0-9])|\.\.+|…|[{PUNCT}]|[{QUOTES}]|US\$|C\$|A\$|[{CURRENCY}])")
SUFFIX = re.compile(
    rf"(?:\.\.+|…|[{PUNCT}]|[{QUOTES}]|['’][sS]|—|–|(?<=[0-9])\+|(?<=[0-9])(?:[{CURRENCY}]|{UNITS})"
    rf"|(?<=[0-9{LOWER}{PUNCT}{QUOTES}])\.|(?<=[{UPPER}][{UPPER}])\.)$"
)
INFIX = re.compile(
    rf"\.\.+|…|(?<=[0-9])[+\-*^](?=[0-9-])|(?<=[{LOWER}'\"”“’])\.(?=[{UPPER}'\"”“’])|(?<=[^\W\d_]),(?=[^\W\d_])"
    r"|(?<=[^\W_])(?:---|--|——|-|–|—|~)(?=[^\W\d_])|(?<=[^\W_])[:<>=/](?=[^\W\d_])"
)
URL = re.compile(
    r"^(?:https?://|www\.)\S*[\w/=#-]$"  # a URL, trailing punctuation peeled as suffixes
    r"|^[\w.+-]+@[\w-]+(?:\.[\w-]+)+$"  # an e-mail address
    r"|^[\w-]+(?:\.[\w-]+)*\.(?:com|org|net|edu|gov|io|de|uk|fr)$"  # a bare domain
)
CONTRACTION = re.compile(
    r"^((?i:do|does|did|is|are|was|were|has|have|had|could|would|should|must|need|might|ca|wo|ai|sha|dare))(n['’]t)$"
    r"|^((?i:i|you|he|she|it|we|they|that|there|who|what|where|how|here|this))(['’](?i:re|m|ve|ll|d))$"
)
# English abbreviations that keep their period, and contractions written without an apostrophe
# (spaCy's English exception tables, lower-cased forms match any capitalization).
ABBREVIATIONS = frozenset([
    "Adm.", "Ak.", "Ala.", "Apr.", "Ariz.", "Ark.", "Aug.", "Bros.", "Calif.", "Co.", "Colo.", "Conn.", "Corp.",
    "D.C.", "Dec.", "Del.", "Dr.", "E.G.", "E.g.", "Feb.", "Fla.", "Ga.", "Gen.", "Gov.", "I.E.", "I.e.", "Ia.",
    "Id.", "Ill.", "Inc.", "Ind.", "Jan.", "Jr.", "Jul.", "Jun.", "Kan.", "Kans.", "Ky.", "La.", "Ltd.", "Mar.",
    "Mass.", "Md.", "Messrs.", "Mich.", "Minn.", "Miss.", "Mo.", "Mont.", "Mr.", "Mrs.", "Ms.", "Mt.", "N.C.",
    "N.D.", "N.H.", "N.J.", "N.M.", "N.Y.", "Neb.", "Nebr.", "Nev.", "Nov.", "Oct.", "Okla.", "Ore.", "Pa.",
    "Ph.D.", "Prof.", "Rep.", "Rev.", "S.C.", "Sen.", "Sep.", "Sept.", "St.", "Tenn.", "Va.", "Wash.", "Wis.", "a.",
    "a.m.", "b.", "c.", "co.", "d.", "e.", "e.g.", "f.", "g.", "h.", "i.", "i.e.", "j.", "k.", "l.", "m.", "n.",
    "o.", "p.", "p.m.", "q.", "r.", "s.", "t.", "u.", "v.", "v.s.", "vs.", "w.", "x.", "y.", "z.", "ä.", "ö.", "ü.",
])
BARE_CONTRACTIONS = dict(item.split(":") for item in [
    "aint:ai nt", "arent:are nt", "cannot:can not", "cant:ca nt", "cantve:ca nt ve", "couldnt:could nt",
    "couldntve:couldnt ve", "couldve:could ve", "darent:dare nt", "didnt:did nt", "didntve:did nt ve",
    "doesnt:does nt", "doesntve:does ntve", "dont:do nt", "dontve:do nt ve", "gonna:gon na", "gotta:got ta",
    "hadnt:had nt", "hadntve:had nt ve", "hasnt:hasnt", "havent:have nt", "hed:he d", "hedve:he d ve",
    "hellve:he ll ve", "hes:he s", "howd:how d", "howdve:how dve", "howll:how ll", "howllve:how ll ve",
    "howre:how re", "hows:how s", "howve:how ve", "id:i d", "idve:i d ve", "illve:i llve", "im:i m", "ima:i m a",
    "isnt:is nt", "itd:it d", "itdve:it d ve", "itll:it ll", "itllve:it ll ve", "ive:i ve", "maynt:maynt",
    "mayntve:may nt ve", "mightnt:might nt", "mightntve:might nt ve", "mightve:might ve", "mustnt:mustnt",
    "mustntve:must nt ve", "mustve:must ve", "neednt:need nt", "needntve:need nt ve", "notve:not ve",
    "oughtnt:oughtnt", "oughtntve:ought nt ve", "shant:sha nt", "shantve:sha nt ve", "shedve:she d ve",
    "shellve:she ll ve", "shes:shes", "shouldnt:should nt", "shouldntve:should nt ve", "shouldve:should ve",
    "thatd:that d", "thatdve:that dve", "thatll:that ll", "thatllve:that ll ve", "thats:that s", "thered:there d",
    "theredve:there d ve", "therell:therell", "therellve:there ll ve", "therere:there re", "theres:there s",
    "thereve:there ve", "thesed:thesed", "thesedve:these d ve", "thesell:these ll", "thesellve:these ll ve",
    "thesere:these re", "theseve:theseve", "theyd:they d", "theydve:they d ve", "theyll:they ll",
    "theyllve:they ll ve", "theyre:they re", "theyve:theyve", "thisd:this d", "thisdve:this d ve", "thisll:this ll",
    "thisllve:this ll ve", "thiss:this s", "thosed:thosed", "thosedve:those d ve", "thosell:those ll",
    "thosellve:those ll ve", "thosere:those re", "thoseve:thoseve", "wasnt:was nt", "wed:we d", "wedve:we d ve",
    "wellve:we ll ve", "werent:were nt", "weve:we ve", "whatd:whatd", "whatdve:what d ve", "whatll:what ll",
    "whatllve:what ll ve", "whatre:what re", "whats:what s", "whatve:whatve", "whend:when d", "whendve:when d ve",
    "whenll:when ll", "whenllve:when ll ve", "whenre:when re", "whens:whens", "whenve:when ve", "whered:where d",
    "wheredve:where d ve", "wherell:where ll", "wherellve:where llve", "wherere:where re", "wheres:where s",
    "whereve:where ve", "whod:who d", "whodve:who d ve", "wholl:wholl", "whollve:who ll ve", "whos:who s",
    "whove:who ve", "whyd:why d", "whydve:why d ve", "whyll:why ll", "whyllve:why llve", "whyre:why re",
    "whys:why s", "whyve:why ve", "wont:wo nt", "wontve:wo nt ve", "wouldnt:would nt", "wouldntve:wouldnt ve",
    "wouldve:would ve", "yall:y all", "youd:you d", "youdve:you d ve", "youll:you ll", "youllve:you llve",
    "youre:you re", "youve:you ve",
])
TIME = re.compile(r"^(1[0-2]|[1-9])(am|pm|a\.m\.|p\.m\.)$", re.IGNORECASE)


def split_words(text: str) -> list[str]:
    """Word tokens in order; whitespace is never a token."""
    return list(chain.from_iterable(map(split_chunk, text.split())))


@lru_cache(maxsize=1 << 18)  # web text reuses its chunks: ~90% of the lookups hit
def split_chunk(chunk: str) -> tuple[str, ...]:
    if (chunk.isalpha() and chunk.lower() not in BARE_CONTRACTIONS) or chunk.isdigit():
        return (chunk,)
    head, last = chunk[:-1], chunk[-1]
    simple = head.isdigit() or (head.isalpha() and head.lower() not in BARE_CONTRACTIONS)
    if simple and (last in ",;:!?)]}\"" or (last == "." and head[-1].islower() | head[-1].isdigit()
                                            and chunk not in ABBREVIATIONS)):
        return head, last  # "word," "word." "2019." (~60% of the other chunks)
    prefixes: list[str] = []
    suffixes: list[str] = []
    while chunk and not is_whole(chunk):
        size = len(chunk)
        if (found := PREFIX.search(chunk)) and found.end() < len(chunk):
            prefixes.append(found.group())
            chunk = chunk[found.end() :]
        if chunk and not is_whole(chunk) and (found := SUFFIX.search(chunk)) and found.start() > 0:
            suffixes.append(found.group())
            chunk = chunk[: found.start()]
        if len(chunk) == size:
            break
    return (*prefixes, *split_middle(chunk), *reversed(suffixes))


def is_whole(chunk: str) -> bool:
    return bool(chunk in ABBREVIATIONS or chunk.lower() in BARE_CONTRACTIONS or URL.match(chunk)
                or CONTRACTION.match(chunk) or TIME.match(chunk))


def split_middle(chunk: str) -> list[str]:
    if not chunk:
        return []
    if found := CONTRACTION.match(chunk) or TIME.match(chunk):
        return [part for part in found.groups() if part]
    if (parts := BARE_CONTRACTIONS.get(chunk.lower())) is not None:
        return cut(chunk, parts.split())
    if URL.match(chunk) or chunk in ABBREVIATIONS:
        return [chunk]
    pieces, start = [], 0
    for infix in INFIX.finditer(chunk):
        if infix.start() > start:
            pieces.append(chunk[start : infix.start()])
        if infix.end() > infix.start():
            pieces.append(infix.group())
        start = infix.end()
    pieces.append(chunk[start:]) if start < len(chunk) else None
    return pieces


REAL, LETTER = 1, 2  # word_flags bits: not only punctuation/symbols; holds a letter
FLAG_CACHE: dict[str, int] = {}  # a plain dict: ~10x cheaper a lookup than lru_cache
FLAG_CACHE_LIMIT = 1 << 20  # distinct words remembered (~100 MB) before the cache starts over


def word_flags(words: list[str]) -> list[int]:
    """REAL | LETTER bits for each word, memoized across documents."""
    flags = list(map(FLAG_CACHE.get, words))
    if None in flags:
        if len(FLAG_CACHE) > FLAG_CACHE_LIMIT:
            FLAG_CACHE.clear()
        for i, word in enumerate(words):
            if flags[i] is None:
                flags[i] = FLAG_CACHE[word] = compute_flags(word)
    return flags


def compute_flags(word: str) -> int:
    if word.isalnum():  # letters and digits only: a letter unless every character is numeric
        return REAL | (0 if word.isnumeric() else LETTER)
    return (0 if is_symbol(word) else REAL) | (LETTER if has_letter(word) else 0)


def cut(chunk: str, parts: list[str]) -> list[str]:
    """`chunk` cut at the lengths of `parts`, keeping its own capitalization."""
    pieces, start = [], 0
    for part in parts:
        pieces.append(chunk[start : start + len(part)])
        start += len(part)
    return pieces


def is_symbol(word: str) -> bool:
    """True for a token made only of punctuation, symbols and control characters ("...", "—", "$")."""
    return all(symbol_char(ch) for ch in word)


def symbol_char(ch: str) -> bool:
    if ch.isalnum():
        return False
    if ch < "\x80":
        return True
    return unicodedata.category(ch)[0] in "PC"


def has_letter(word: str) -> bool:
    return any(ch.isalpha() for ch in word)


def count_sentences(words: list[str]) -> int:
    """Sentences as spaCy's rule-based sentencizer counts them: a new one starts at the
    first non-punctuation token after a sentence-final mark."""
    if not words:
        return 0
    sentences, seen_final = 1, False
    for word in words:
        final = word in SENTENCE_FINAL
        if seen_final and not final and not is_punct(word):
            sentences, seen_final = sentences + 1, False
        elif final:
            seen_final = True
    return sentences


def is_punct(word: str) -> bool:
    return all(unicodedata.category(ch)[0] == "P" for ch in word)


# Single-character sentence ends (Latin, Arabic, Devanagari, CJK, Ethiopic, Armenian...).
SENTENCE_FINAL = frozenset(
    "!.?։؟۔܀܁܂߹।॥၊။።፧፨᙮᜵᜶᠃᠉᥄᥅᪨᪩᪪᪫᭚᭛᭞᭟᰻᰼"
    "᱾᱿‼‽⁇⁈⁉⸮⸼꓿꘎꘏꛳꛷꡶꡷꣎꣏꤯꧈꧉꩝꩞꩟꫰꫱꯫﹒﹖﹗！．？｡。"
)


def terminal_punctuation() -> frozenset[str]:
    """Characters that end a sentence in any script: the Unicode Sentence_Terminal property,
    approximated from character names (Python's unicodedata has no property lookup)."""
    names = ("FULL STOP", "QUESTION MARK", "EXCLAMATION MARK", "DANDA", "SENTENCE", "PUNCTUATION END")
    found = set()
    for code in range(0x21, 0x20000):
        ch = chr(code)
        if unicodedata.category(ch)[0] == "P" and any(n in unicodedata.name(ch, "") for n in names):
            found.add(ch)
    inverted = {"¡", "¿", "⸘"}  # open a sentence, they do not end one
    return frozenset(found - inverted)
