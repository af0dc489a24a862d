"""The tokenize stage: text to token ids, EOS appended as the document boundary.

Runs in a Ray actor pool (Config.actor) so that each worker loads the tokenizer
once; `encode_batch` spreads a batch over the tokenizer's own threads.
"""
from __future__ import annotations

from typing import Callable, ClassVar

import numpy as np

from datapipe.config import StageConfig
from datapipe.schema import Document
from tokenizer.bpe import SPECIAL_TOKENS, load_tokenizer


class Config(StageConfig):
    actor: ClassVar[bool] = True
    path_fields: ClassVar[tuple[str, ...]] = ("tokenizer",)
    tokenizer: str = "demo"  # a tokenizer.json path (relative to the recipe) or a bundled name
    add_bos: bool = False  # BOS is redundant when every document already ends with EOS
    batch_size: int = 512  # texts per encode_batch call


def make_stage(cfg: Config) -> Callable[[list[Document]], list[Document]]:
    tokenizer = load_tokenizer(cfg.tokenizer)
    eos = tokenizer.token_to_id("<|eos|>")
    bos = tokenizer.token_to_id("<|bos|>")
    if eos is None or bos is None:
        raise ValueError(f"tokenizer {cfg.tokenizer!r} lacks the special tokens {SPECIAL_TOKENS[:2]}")
    prefix, suffix = ([bos] if cfg.add_bos else []), [eos]

    def tokenize(docs: list[Document]) -> list[Document]:
        encodings = tokenizer.encode_batch([doc["text"] for doc in docs], add_special_tokens=False)
        for doc, encoding in zip(docs, encodings):
            doc["tokens"] = np.array(prefix + encoding.ids + suffix, dtype=np.uint32)
            doc["meta"]["num_tokens"] = len(doc["tokens"])
        return docs

    return tokenize
