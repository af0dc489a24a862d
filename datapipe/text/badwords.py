"""C4's bad-words rule: a page that contains a word or phrase of the LDNOOBW lists is dropped.

C4 (Raffel et al. 2020) dropped every English page holding an entry of the "List of
Dirty, Naughty, Obscene or Otherwise Bad Words", matched on the lowercased text between
non-word characters; datatrove's C4BadWordsFilter extends it to the lists' other
languages and matches Chinese, Japanese and Thai entries anywhere (no spaces between
words there). We do the same, choosing the list by Document.language (langid's), or
`default_language` when no stage set one; a language without a list is not checked.

The lists (CC-BY-4.0) are not part of this project: `make install` fetches the LDNOOBW
project's npm package (naughty-words 1.2.0, sha256-pinned) into the virtualenv's
share/datapipe/ldnoobw; `python -m datapipe.text.badwords [DIR]` does the same anywhere
(a Ray cluster's nodes, a folder named by `bad_words_dir`).

Matching: single-word entries by set lookup over the page's words, the others (phrases,
"g-spot") by substring search with a non-word character or the text's edge on each side,
tried only when the page has the entry's first word. The same decisions as C4's regex
(3,000 pages of ../shared/data/web_text) in 0.4 ms a 4 KB page, where the regex takes 1.2.
"""
from __future__ import annotations

import io
import json
import re
import sys
import tarfile
from functools import lru_cache
from pathlib import Path

PACKAGE_URL = "https://registry.npmjs.org/naughty-words/-/naughty-words-1.2.0.tgz"
PACKAGE_SHA256 = "c34b05e10a97ec7b9e0c3dd91d09888187c0f08d0812eaea79679795585b217e"
INSTALLED = Path(sys.prefix) / "share" / "datapipe" / "ldnoobw"
UNSPACED = ("ja", "th", "zh")  # languages written without spaces: entries match anywhere
WORD = re.compile(r"\w+")


def lists_dir(configured: str | None) -> Path:
    """The folder of `<language>.json` lists: the configured one, else the installed one."""
    return Path(configured) if configured else INSTALLED


def missing_lists_error(folder: Path) -> str:
    return (f"quality.c4.bad_words needs the LDNOOBW word lists in {folder} (<language>.json files), "
            "which are not there: run `make install`, or `python -m datapipe.text.badwords DIR` and set "
            "quality.c4.bad_words_dir to DIR, or set quality.c4.bad_words to false")


class BadWords:
    """One language's list, ready to match."""

    def __init__(self, entries: list[str], unspaced: bool):
        entries = [entry.lower() for entry in entries if entry.strip()]
        self.unspaced = unspaced
        self.words = frozenset() if unspaced else frozenset(e for e in entries if WORD.fullmatch(e))
        # The others with the first run of word characters that any bounded match of them makes a
        # whole word of the page ("" for an entry without one): searched for only when it is there.
        self.others = tuple((e, first_word(e)) for e in entries if unspaced or e not in self.words)

    def first_match(self, text: str) -> str | None:
        """The first entry found in `text` (any case), or None."""
        lowered = text.lower()
        if self.unspaced:
            return next((entry for entry, _ in self.others if entry in lowered), None)
        words = set(WORD.findall(lowered))
        found = words & self.words
        if found:
            return min(found)
        for entry, word in self.others:
            if (not word or word in words) and bounded_find(lowered, entry):
                return entry
        return None


def first_word(entry: str) -> str:
    match = WORD.search(entry)
    return match.group() if match else ""


def bounded_find(text: str, entry: str) -> bool:
    """Whether `entry` occurs with a non-word character or the text's edge on each side (C4's
    `(?:\\W|^)entry(?:\\W|$)`)."""
    start = text.find(entry)
    while start != -1:
        end = start + len(entry)
        if (start == 0 or not WORD.match(text, start - 1)) and (end == len(text) or not WORD.match(text, end)):
            return True
        start = text.find(entry, start + 1)
    return False


@lru_cache(maxsize=64)
def load(folder: str, language: str) -> BadWords | None:
    """The list for `language` in `folder`, or None when it has none."""
    path = Path(folder) / f"{language}.json"
    if not path.is_file():
        return None
    return BadWords(json.loads(path.read_text(encoding="utf-8")), language in UNSPACED)


def has_lists(folder: Path) -> bool:
    return folder.is_dir() and any(folder.glob("*.json"))


def install(folder: Path = INSTALLED) -> Path:
    """Fetch the LDNOOBW npm package, check its sha256, and write its lists and licence into `folder`."""
    from datapipe.storage import fetch_pinned

    data = fetch_pinned(PACKAGE_URL, PACKAGE_SHA256, f"copy the LDNOOBW <language>.json lists into {folder} by hand, "
                        "or leave quality.c4.bad_words off")
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        for member in archive.getmembers():
            name = member.name.removeprefix("package/")
            is_list = name.endswith(".json") and "/" not in name and not name.startswith(("package", "bower"))
            if member.isfile() and (is_list or name == "LICENSE"):
                (folder / name).write_bytes(archive.extractfile(member).read())
    return folder


if __name__ == "__main__":
    folders = [arg for arg in sys.argv[1:] if not arg.startswith("--")]
    target = Path(folders[0]) if folders else INSTALLED
    if has_lists(target) and "--force" not in sys.argv:
        print(f"LDNOOBW lists already in {target}")
    else:
        print(f"LDNOOBW lists written to {install(target)}")
