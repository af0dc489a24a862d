"""Quality gates on every render, and the perceptual hash used for near-duplicate detection.

All measures run on a grayscale thumbnail (longer side 256 px), so a gate costs about 1 ms
whatever the render size. Thresholds are fractions of pixels, so they do not depend on size:
- blank: fewer than `min_foreground` (0.1%) of pixels differ from the dominant grey level by
  more than 8/255: an empty canvas, a solid fill, a page that failed to style;
- low_detail: fewer than `min_edges` (0.2%) of pixels sit on an edge (|dx| + |dy| > 24/255):
  a smooth gradient or a hairline that vanished. A 64 px square on a 512 px canvas has 3%.
- dHash: 64 bits, each "is this cell brighter than its right neighbour" on a 9x8 thumbnail;
  robust to scaling and small colour shifts, and Hamming distance measures similarity.
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


def grayscale(png: bytes, background: tuple[int, int, int] = (255, 255, 255)) -> np.ndarray:
    """The image as a float32 grey thumbnail, transparency composited on `background`."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        image.thumbnail((THUMB_SIDE, THUMB_SIDE))
        rgba = image.convert("RGBA")
    flat = Image.new("RGBA", rgba.size, (*background, 255))
    flat.alpha_composite(rgba)
    return np.asarray(flat.convert("L"), dtype=np.float32)


def foreground_fraction(gray: np.ndarray) -> float:
    """Share of pixels away from the most common grey level."""
    counts = np.bincount(gray.astype(np.uint8).ravel(), minlength=256)
    dominant = int(counts.argmax())
    return float(np.mean(np.abs(gray - dominant) > LEVEL_TOLERANCE))


def edge_fraction(gray: np.ndarray) -> float:
    dx = np.abs(np.diff(gray, axis=1))[:-1, :]
    dy = np.abs(np.diff(gray, axis=0))[:, :-1]
    return float(np.mean(dx + dy > EDGE_STEP)) if dx.size else 0.0


def check_image(png: bytes, gates: GateConfig) -> tuple[str, dict[str, float]]:
    """("", measures) when the image passes, else (reason, measures)."""
    gray = grayscale(png)
    measures = {"foreground": round(foreground_fraction(gray), 5), "edges": round(edge_fraction(gray), 5)}
    if measures["foreground"] < gates.min_foreground:
        return "blank", measures
    if measures["edges"] < gates.min_edges:
        return "low_detail", measures
    return "", measures


def dhash(png: bytes) -> int:
    """64-bit difference hash of the image composited on white."""
    from PIL import Image

    gray = Image.fromarray(grayscale(png).astype(np.uint8)).resize((9, 8), Image.Resampling.BOX)
    cells = np.asarray(gray, dtype=np.int16)
    bits = (cells[:, 1:] > cells[:, :-1]).ravel()
    return int(np.packbits(bits).view(">u8")[0])


def hamming(a: int, b: int) -> int:
    return (a ^ b).bit_count()
