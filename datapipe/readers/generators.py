"""Sources that need no files: data every Python install carries, and seeded programs.

Each generator yields the documents for indices [start, stop) and derives all
randomness from (seed, index), so any split of the range into Ray tasks gives the
same records.
"""
from __future__ import annotations

import random
from typing import Any, Iterator

from datapipe.schema import Document, new_document


def pydoc_topics(cfg: Any, seed: int, start: int, stop: int) -> Iterator[Document]:
    """The help() topics of the running Python: about 80 documents, 460 KB of English prose and code."""
    from pydoc_data.topics import topics

    names = sorted(topics)
    for index in range(start, min(stop, len(names))):
        yield new_document(cfg.name, names[index], topics[names[index]], kind="text", meta={"topic": names[index]})


def seeded_rngs(source: str, seed: int, start: int, stop: int) -> Iterator[tuple[int, random.Random]]:
    """(index, rng) for each index in [start, stop), the rng seeded by (seed, source name, index)
    alone, so any split of the range gives the same documents."""
    for index in range(start, stop):
        yield index, random.Random(f"{seed}:{source}:{index}")


def python_programs(cfg: Any, seed: int, start: int, stop: int) -> Iterator[Document]:
    """Small, valid Python modules: functions with loops, branches, arithmetic and docstrings."""
    for index, rng in seeded_rngs(cfg.name, seed, start, stop):
        source = "\n\n".join(make_function(rng) for _ in range(rng.randint(1, 4))) + "\n"
        yield new_document(cfg.name, str(index), source, kind="code", meta={"programming_language": "python"})


NOUNS = ["total", "count", "value", "price", "score", "weight", "index", "limit", "offset", "ratio"]
VERBS = ["compute", "update", "scale", "merge", "clamp", "collect", "measure", "estimate"]
OPERATORS = ["+", "-", "*", "//", "%"]


def make_function(rng: random.Random) -> str:
    name = f"{rng.choice(VERBS)}_{rng.choice(NOUNS)}"
    params = rng.sample(NOUNS, rng.randint(1, 3))
    body = [f'    """{name.replace("_", " ").capitalize()} from {", ".join(params)}."""']
    body.append(f"    result = {rng.randint(0, 9)}")
    for _ in range(rng.randint(1, 3)):
        body.extend(make_statement(rng, params))
    body.append("    return result")
    return f"def {name}({', '.join(params)}):\n" + "\n".join(body)


def make_statement(rng: random.Random, params: list[str]) -> list[str]:
    a, b = rng.choice(params), rng.choice(params)
    op = rng.choice(OPERATORS)
    divisor_safe = f"({b} or 1)" if op in ("//", "%") else b
    choice = rng.randrange(3)
    if choice == 0:
        return [f"    for step in range({rng.randint(2, 9)}):", f"        result += {a} {op} {divisor_safe} + step"]
    if choice == 1:
        return [f"    if {a} > {rng.randint(0, 99)}:", f"        result -= {a}", "    else:", f"        result += {b}"]
    return [f"    result = result {op} ({a} if {a} else 1)" if op in ("//", "%") else f"    result = result {op} {a}"]
