"""The `web_archive` source: a small crawl the project makes itself, with the faults of a real one.

Each index is one fetched page (kind "html", for the extract stage), seeded by (seed, source
name, index) alone. Pages come in ten shapes, index % 10, so any 100 pages hold ten of each:
  0-3, 9  articles in English: a paragraph topic of generated prose inside a menu, a cookie
          banner and a footer (boilerplate the extractor must drop); some carry an e-mail
          address or a phone number (for the PII stage);
  4       boilerplate only: menus and link lists, a dozen words of text (the quality rules' case);
  5       the article of index - 5 again in another page (its paragraph breaks differ: an exact
          duplicate for dedup, which compares normalized words);
  6       the article of index - 6 with one sentence changed (a near duplicate);
  7       an article in German (even tens) or French (odd tens), for language ID;
  8       a broken record: a page cut off before its body, or script and no text (extract.empty).
The prose is built from topic words and sentence frames with enough variety to pass Gopher's
repetition rules: it is web text in shape, not in meaning.
"""
from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from datapipe.readers.generators import seeded_rngs
from datapipe.schema import Document, new_document

TOPICS = {
    "gardening": ["tomato seedlings", "compost heap", "raised bed", "watering can", "clay soil", "mulch layer"],
    "astronomy": ["small telescope", "lunar crater", "meteor shower", "star chart", "dark sky site", "eyepiece"],
    "baking": ["sourdough starter", "rye flour", "proofing basket", "oven stone", "crumb structure", "bread dough"],
    "cycling": ["chain ring", "gravel road", "inner tube", "rear derailleur", "hill climb", "saddle height"],
    "rivers": ["flood plain", "river delta", "water mill", "old bridge", "fish ladder", "gravel bank"],
    "libraries": ["reading room", "card catalogue", "rare manuscript", "lending desk", "map collection", "archive box"],
}
OPENERS = ["In practice,", "Most of the time,", "According to the old guides,", "On a quiet morning,",
           "For a beginner,", "After a few weeks,", "In our experience,", "Every spring,"]
FRAMES = [
    "{opener} the {a} matters more than the {b} that people usually talk about.",
    "We found that a careful look at the {a} saves a lot of time with the {b} later on.",
    "{opener} nobody agrees on how the {a} should be handled, and that is part of the fun.",
    "The {a} is easy to ignore until the {b} starts to show what went wrong.",
    "It is worth writing down what happens to the {a} each day, because memory is not reliable.",
    "A friend who has worked with the {a} for twenty years says the {b} is the real test.",
    "{opener} the simplest tools are enough to understand the {a} and the {b}.",
    "There is no single rule for the {a}; the weather, the season and patience all play a part.",
    "If the {a} looks different from the pictures in the book, that is usually not a problem.",
    "Small changes to the {b} can make the {a} behave in ways that surprise even experts.",
    "Many readers asked us to explain why the {a} and the {b} are so often mentioned together.",
    "{opener} it helps to compare the {a} with what you saw the year before.",
]
GERMAN = ["Der Garten braucht im Frühling viel Wasser und etwas Geduld.", "Wir haben die Brücke über den Fluss "
          "am Sonntag besucht.", "Die Bibliothek ist am Abend ruhig, und viele Studenten lesen dort.",
          "Das Brot wird mit Sauerteig gebacken und bleibt lange frisch.", "Im Herbst fahren wir mit dem Fahrrad "
          "durch die Hügel.", "Man sollte die Sterne in einer klaren Nacht fern von der Stadt beobachten."]
FRENCH = ["Le jardin a besoin de beaucoup d'eau au printemps et d'un peu de patience.", "Nous avons visité le "
          "vieux pont sur la rivière dimanche dernier.", "La bibliothèque est calme le soir, et beaucoup "
          "d'étudiants y travaillent.", "Le pain est fait avec du levain et reste frais longtemps.",
          "En automne, nous faisons du vélo dans les collines.", "Il faut observer les étoiles par une nuit "
          "claire, loin de la ville."]
CONTACTS = ["Questions? Write to {name}@example.org and we answer within a week.",
            "Call our office on +1 415 555 01{n:02d} between nine and five."]


def web_archive(cfg: Any, seed: int, start: int, stop: int) -> Iterator[Document]:
    for index, rng in seeded_rngs(cfg.name, seed, start, stop):
        shape = index % 10
        yield new_document(cfg.name, f"page-{index:05d}", make_page(cfg.name, seed, index, rng), kind="html",
                           meta={"url": f"https://example.org/{cfg.name}/{index}", "shape": SHAPES[shape]})


SHAPES = ["article"] * 4 + ["boilerplate", "duplicate", "near_duplicate", "other_language", "broken", "article"]


def make_page(source: str, seed: int, index: int, rng: random.Random) -> str:
    shape = SHAPES[index % 10]
    if shape == "broken":
        return broken_page(rng)
    if shape == "boilerplate":
        return wrap_page(rng, "Welcome", "<p>Sign in to continue.</p>" + link_lists(rng, 6))
    if shape == "other_language":
        sentences = GERMAN if (index // 10) % 2 == 0 else FRENCH
        return wrap_page(rng, sentences[0][:20], paragraphs(rng.sample(sentences, len(sentences)), rng))
    original = index - 5 if shape == "duplicate" else index - 6 if shape == "near_duplicate" else index
    title, sentences = article(random.Random(f"{seed}:{source}:{original}"))
    if shape == "near_duplicate":
        sentences[len(sentences) // 2] = "This paragraph was updated after readers sent us their own notes."
    return wrap_page(rng, title, paragraphs(sentences, rng))


def article(rng: random.Random) -> tuple[str, list[str]]:
    topic = rng.choice(sorted(TOPICS))
    nouns = TOPICS[topic]
    frames = rng.sample(FRAMES, len(FRAMES))
    sentences = [frame.format(opener=rng.choice(OPENERS), a=rng.choice(nouns), b=rng.choice(nouns)) for frame in frames]
    if rng.random() < 0.4:
        sentences.append(rng.choice(CONTACTS).format(name=rng.choice(["ana", "li", "sam", "joe"]), n=rng.randrange(100)))
    return f"Notes on {topic}", sentences


def paragraphs(sentences: list[str], rng: random.Random) -> str:
    cut = [0, *sorted(rng.sample(range(1, len(sentences)), 2)), len(sentences)]
    return "".join(f"<p>{' '.join(sentences[a:b])}</p>" for a, b in zip(cut, cut[1:]))


def wrap_page(rng: random.Random, title: str, body: str) -> str:
    """The article inside the boilerplate every crawled page carries: menu, cookie banner, footer."""
    menu = "".join(f'<li><a href="/{w}">{w.title()}</a></li>' for w in rng.sample(MENU, 5))
    return (f"<!DOCTYPE html><html><head><title>{title}</title></head><body>"
            f'<div class="cookie">We use cookies. <a href="/privacy">Accept all</a></div>'
            f"<nav><ul>{menu}</ul></nav><main><article><h1>{title}</h1>{body}</article></main>"
            f"<footer>{link_lists(rng, 2)}<p>Copyright 2024 Example Media. All rights reserved.</p></footer>"
            "</body></html>")


MENU = ["home", "news", "about", "shop", "contact", "blog", "events", "help", "login", "archive"]


def link_lists(rng: random.Random, count: int) -> str:
    return "".join("<ul>" + "".join(f'<li><a href="/{w}">{w.title()}</a></li>' for w in rng.sample(MENU, 4)) + "</ul>"
                   for _ in range(count))


def broken_page(rng: random.Random) -> str:
    """What a crawl also fetches: a page cut off mid-head, or a script shell with no text at all."""
    if rng.random() < 0.5:
        return '<!DOCTYPE html><html><head><meta charset="utf-8"><title'
    return "<html><head><script>window.location='/app';</script></head><body><div id='root'></div></body></html>"
