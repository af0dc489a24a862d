"""Image layout for media tokens: resize to whole 28x28-pixel patch groups within a token budget.

Kimi-VL / K2.5's vision tower (MoonViT) cuts an image into 14x14 patches and merges 2x2 of
them into one token, so one `<|media_pad|>` stands for a 28x28-pixel cell. An image of
W x H pixels is resized to cols*28 x rows*28, keeping its aspect ratio to within one cell
(of the floor/ceil grids around the exact scaled size, the closest in aspect), with
cols*rows <= the budget; a larger image is scaled down (never cropped), a smaller one
is only rounded to whole cells (a 10x10 icon becomes one 28x28 cell).

Images are untrusted input: the pixel count is read from the header and checked before
any pixel is decoded, so a decompression bomb is refused instead of filling memory.
"""
from __future__ import annotations

import io
import math
from dataclasses import dataclass

PATCH = 28  # pixels per side of one <|media_pad|> token: 14-px ViT patches merged 2x2


class BadImage(ValueError):
    """An image that cannot be laid out: it does not decode, or it is too large to decode."""


@dataclass
class LaidOutImage:
    png: bytes  # the resized image (the original bytes when no resize was needed)
    width: int  # pixels after resizing: cols * PATCH
    height: int  # rows * PATCH
    source_width: int
    source_height: int

    @property
    def num_pad_tokens(self) -> int:
        return (self.width // PATCH) * (self.height // PATCH)

    def meta(self) -> dict:
        return {"width": self.width, "height": self.height, "source_width": self.source_width,
                "source_height": self.source_height, "pad_tokens": self.num_pad_tokens}


def fit_grid(width: int, height: int, max_tokens: int) -> tuple[int, int]:
    """(cols, rows) of 28-px cells for a width x height image: cols*rows <= max_tokens, and of the
    whole-cell sizes next to the exact scaled size, the one closest in aspect ratio, then in area."""
    scale = min(1.0, math.sqrt(max_tokens * PATCH * PATCH / (width * height)))
    exact_cols, exact_rows = width * scale / PATCH, height * scale / PATCH
    rows = min(max(1, math.floor(exact_rows)), max_tokens)  # always fits: floor * floor <= budget
    candidates = [(max(1, min(math.floor(exact_cols), max_tokens // rows)), rows)]
    for cols in {math.floor(exact_cols), math.ceil(exact_cols)}:
        for rows in {math.floor(exact_rows), math.ceil(exact_rows)}:
            if 1 <= cols and 1 <= rows and cols * rows <= max_tokens:
                candidates.append((cols, rows))
    aspect, area = width / height, exact_cols * exact_rows
    return min(candidates, key=lambda grid: (abs(math.log(grid[0] / grid[1] / aspect)), abs(grid[0] * grid[1] - area)))


def lay_out_image(data: bytes, max_tokens: int, max_pixels: int) -> LaidOutImage:
    """Decode, resize to whole cells within max_tokens, re-encode as PNG; raise BadImage."""
    from PIL import Image

    try:
        image = Image.open(io.BytesIO(data))
        width, height = image.size
        if width * height > max_pixels:
            raise BadImage(f"{width}x{height} pixels is over max_image_pixels={max_pixels:,}")
        image.load()
    except BadImage:
        raise
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
        raise BadImage(f"does not decode: {type(err).__name__}: {err}") from None
    cols, rows = fit_grid(width, height, max_tokens)
    size = (cols * PATCH, rows * PATCH)
    if size == (width, height) and image.format == "PNG":
        return LaidOutImage(data, width, height, width, height)
    return LaidOutImage(encode_png(to_rgb(image).resize(size, Image.Resampling.BICUBIC)), *size, width, height)


def to_rgb(image):
    """RGB, with any transparency composited on white (what a browser shows)."""
    from PIL import Image

    if image.mode == "RGB":
        return image
    rgba = image.convert("RGBA")
    background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(background, rgba).convert("RGB")


def encode_png(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=3)  # level 3: ~3x faster than the default 6, ~5% larger
    return buffer.getvalue()
