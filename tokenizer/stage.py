"""The tokenize stage: text and images to token ids, EOS appended as the document boundary.

Text encodes on the fast path (tiktoken over the exported ranks, ids identical to the HF
tokenizer; tokenizer/fast.py). Each `<|media|>` placeholder in the text is replaced by
media[i]'s span, `<|media_begin|>image<|media_content|>` + one `<|media_pad|>` per 28x28
cell + `<|media_end|>`, after resizing the image to whole cells within `max_image_tokens`
(tokenizer/image.py); the resized PNG stays in doc["media"] so it travels with the sample.
A document whose placeholders and images do not pair up, or whose image does not decode,
is rejected with a reason (the details in doc["error"]); notes["tokenize"]["media"] describes
each image's layout. Runs in a Ray actor pool (Config.actor), or inside a partition task
when the whole recipe allows it: either way each worker process loads the tokenizer once.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import numpy as np
from pydantic import Field

from datapipe.schema import MEDIA_PLACEHOLDER, Document
from datapipe.stage import StageConfig
from tokenizer.bpe import special_token_ids
from tokenizer.fast import make_encoder
from tokenizer.image import BadImage, lay_out_image
from tokenizer.media import image_span


class Config(StageConfig):
    actor: ClassVar[bool] = True
    in_partition_task: ClassVar[bool] = True  # the tokenizer is plain memory, loaded once per worker process
    path_fields: ClassVar[tuple[str, ...]] = ("tokenizer",)
    tokenizer: str = "demo"  # a tokenizer.json path (relative to the recipe) or a bundled name
    add_bos: bool = False  # BOS is redundant when every document already ends with EOS
    batch_size: int = 512  # documents per batch
    fast: bool = True  # tiktoken over the exported ranks (same ids, 5x+ faster); false = HF tokenizers
    max_image_tokens: int = Field(1024, ge=1)  # <|media_pad|> per image at most: 1024 = 896x896 px, 1/8 of an 8K sequence
    max_image_pixels: int = Field(50_000_000, ge=1)  # refuse to decode larger images (decompression bombs)


def make_stage(cfg: Config) -> Callable[[list[Document]], list[Document]]:
    encoder = make_encoder(cfg.tokenizer, cfg.fast)
    ids = special_token_ids(cfg.tokenizer)
    image_word = encoder.encode_batch(["image"])[0].tolist()
    prefix = np.array([ids["<|bos|>"]] if cfg.add_bos else [], dtype=np.uint32)
    suffix = np.array([ids["<|eos|>"]], dtype=np.uint32)

    def tokenize(docs: list[Document]) -> list[Document]:
        laid_out = [lay_out_document(doc, cfg) for doc in docs]
        alive = [(doc, images) for doc, images in zip(docs, laid_out) if not doc["reject"]]
        pieces = [doc["text"].split(MEDIA_PLACEHOLDER) for doc, _ in alive]
        encoded = iter(encoder.encode_batch([piece for doc_pieces in pieces for piece in doc_pieces]))
        for doc, images in alive:
            parts = [prefix, next(encoded)]
            for image in images:
                parts += [np.array(image_span(ids, image_word, image.num_pad_tokens), dtype=np.uint32), next(encoded)]
            doc["tokens"] = np.concatenate([*parts, suffix])
            doc["num_tokens"] = len(doc["tokens"])
        return docs

    return tokenize


def lay_out_document(doc: Document, cfg: Config) -> list:
    """The document's images resized to whole cells; rejects the document when they do not fit."""
    placeholders = doc["text"].count(MEDIA_PLACEHOLDER)
    if placeholders != len(doc["media"]):
        return reject(doc, "media_count_mismatch", f"{placeholders} {MEDIA_PLACEHOLDER} placeholders in the text "
                      f"but {len(doc['media'])} images in media; each placeholder needs exactly one image")
    images = []
    for i, data in enumerate(doc["media"]):
        try:
            images.append(lay_out_image(data, cfg.max_image_tokens, cfg.max_image_pixels))
        except BadImage as err:
            return reject(doc, "bad_image", f"media[{i}]: {err}")
    if images:
        doc["media"] = [image.png for image in images]
        doc["notes"]["tokenize"] = {"media": [image.meta() for image in images]}
    return images


def reject(doc: Document, reason: str, error: str) -> list:
    doc["reject"] = f"tokenize.{reason}"
    doc["error"] = error
    return []
