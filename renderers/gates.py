"""Quality gates on every render, and the perceptual hash used for near-duplicate detection.

All measures run on one grey thumbnail per image (longer side 256-511 px), so the gates and
the hash cost a few ms whatever the render size, most of it the PNG decode. Thresholds are fractions of pixels, so they do not depend on size:
- blank: fewer than `min_foreground` (0.1%) of pixels differ from the dominant grey level by
  more than 8/255: an empty canvas, a solid fill, a page that failed to style;
- low_detail: fewer than `min_edges` (0.2%) of pixels sit on an edge (|dx| + |dy| > 24/255):
  a smooth gradient or a hairline that vanished. A 64 px square on a 512 px canvas has 3%.
- dHash: 256 bits, each "is this cell brighter than its right neighbour" on a 17x16 thumbnail;
  robust to scaling and small colour shifts, and Hamming distance measures similarity. 64 bits
  (9x8) are too coarse for line icons: on 2,000 feather/lucide icons they put "code" within 3
  bits of "omega"; at 256 bits, 2 bits apart are the same icon drawn twice (126 exact copies,
  22 more within 2 bits).
"""
from __future__ import annotations

import io

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

THUMB_SIDE = 256
LEVEL_TOLERANCE = 8  # grey levels that count as "the same colour" (JPEG-free PNGs, anti-aliasing)
EDGE_STEP = 24  # |dx| + |dy| in grey levels that makes an edge pixel


class GateConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    min_foreground: float = Field(0.001, ge=0, le=1)  # below: render.blank
    min_edges: float = Field(0.002, ge=0, le=1)  # below: render.low_detail


def grayscale(png: bytes) -> np.ndarray:
    """The image as a float32 grey thumbnail (longer side <= 2 x THUMB_SIDE), composited on white.

    Decoded once per image for every gate and the hash; Image.reduce is an integer box filter,
    ~10x cheaper than a resampling thumbnail on a 512-px render."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        small = image.reduce(max(1, max(image.size) // THUMB_SIDE))
        rgba = np.asarray(small.convert("RGBA"), dtype=np.int32)
    luma = (299 * rgba[..., 0] + 587 * rgba[..., 1] + 114 * rgba[..., 2]) // 1000  # integers: the same
    alpha = rgba[..., 3]  # bits on every machine, so the hash (and dedup) is reproducible anywhere
    return ((luma * alpha + 255 * (255 - alpha)) // 255).astype(np.float32)


def foreground_fraction(gray: np.ndarray) -> float:
    """Share of pixels away from the most common grey level."""
    counts = np.bincount(gray.astype(np.uint8).ravel(), minlength=256)
    dominant = int(counts.argmax())
    return float(np.mean(np.abs(gray - dominant) > LEVEL_TOLERANCE))


def edge_fraction(gray: np.ndarray) -> float:
    dx = np.abs(np.diff(gray, axis=1))[:-1, :]
    dy = np.abs(np.diff(gray, axis=0))[:, :-1]
    return float(np.mean(dx + dy > EDGE_STEP)) if dx.size else 0.0


def check_image(gray: np.ndarray, gates: GateConfig) -> tuple[str, dict[str, float]]:
    """("", measures) when the grey thumbnail passes, else (reason, measures)."""
    measures = {"foreground": round(foreground_fraction(gray), 5), "edges": round(edge_fraction(gray), 5)}
    if measures["foreground"] < gates.min_foreground:
        return "blank", measures
    if measures["edges"] < gates.min_edges:
        return "low_detail", measures
    return "", measures


HASH_SIDE = 16  # 16 x 16 = 256 bits


def dhash(gray: np.ndarray) -> int:
    """256-bit difference hash of a grey thumbnail."""
    from PIL import Image

    gray = Image.fromarray(gray.astype(np.uint8)).resize((HASH_SIDE + 1, HASH_SIDE), Image.Resampling.BOX)
    cells = np.asarray(gray, dtype=np.int16)
    return int.from_bytes(np.packbits(cells[:, 1:] > cells[:, :-1]).tobytes(), "big")


def hamming(a: int, b: int) -> int:
    return (a ^ b).bit_count()
