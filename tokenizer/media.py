"""Media spans in token sequences: `<|media_begin|> ... <|media_end|>`, inclusive.

A span holds the modality word, `<|media_content|>` and one `<|media_pad|>` per patch
group; the model never predicts inside it, and a packer never splits it.
"""
from __future__ import annotations

import numpy as np


def media_spans(tokens: np.ndarray, begin_id: int, end_id: int) -> list[tuple[int, int]]:
    """(start, stop) of each media span, stop exclusive; raises on an unclosed span."""
    begins = np.flatnonzero(tokens == begin_id)
    ends = np.flatnonzero(tokens == end_id)
    if len(begins) != len(ends) or np.any(ends < begins):
        raise ValueError(f"unbalanced media tokens: {len(begins)} begins, {len(ends)} ends")
    return [(int(b), int(e) + 1) for b, e in zip(begins, ends)]


def loss_mask(length: int, spans: list, num_pad: int = 0) -> np.ndarray:
    """uint8 [length], 1 where the next-token loss applies: 0 on the media spans ((start, stop),
    stop exclusive) and on the trailing num_pad padding tokens."""
    mask = np.ones(length, dtype=np.uint8)
    for start, stop in spans:
        mask[start:stop] = 0
    if num_pad:
        mask[length - num_pad :] = 0
    return mask


def image_span(special_ids: dict[str, int], modality_ids: list[int], num_pad: int) -> list[int]:
    """`<|media_begin|>image<|media_content|>`, num_pad `<|media_pad|>`, `<|media_end|>` as ids;
    modality_ids are the BPE ids of the word "image" (as in Kimi-VL / K2.5)."""
    return [special_ids["<|media_begin|>"], *modality_ids, special_ids["<|media_content|>"],
            *[special_ids["<|media_pad|>"]] * num_pad, special_ids["<|media_end|>"]]
