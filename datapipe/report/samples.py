"""What the report reads from a run's shards: a few packed samples per phase, decoded.

The shards hold tokens, document boundaries and images, not documents, so a gallery entry
is a document piece cut back out of its sample: the text decoded around its media spans,
with the sample's images of those spans. Reading stops after MAX_SAMPLES samples or MAX_TOKENS
tokens a phase, and each stretch of text decodes MAX_DECODED tokens at most (the report samples
its galleries: a phase of 10K samples is not read whole, a 1M-token document not decoded whole).
"""
from __future__ import annotations

import base64
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datapipe.loader.reference import read_shards
from datapipe.shardformat import MANIFEST

MAX_SAMPLES = 64  # per phase: enough for galleries of a dozen pairs, cheap to decode
MAX_TOKENS = 1 << 21  # per phase as well: 2M tokens are 64 samples at 32K but 2 at 1M
MAX_DECODED = 1024  # tokens decoded per stretch of text: the page shows 2,500 characters of a piece at most


@dataclass
class Piece:
    doc_id: str
    sample: str
    text: str  # decoded, "[image N]" where a media span was
    offset: int = 0  # where the piece starts in its document: > 0 for the tail of a split one
    images: list[bytes] = field(default_factory=list)  # the PNGs of its media spans, in order


def phase_folders(out_dir: Path, order: list[str]) -> list[Path]:
    """The phase folders in curriculum order (`order`: the phase names of stats.json); others after."""
    folders = [p.parent for p in out_dir.glob(f"*/{MANIFEST}")]
    return sorted(folders, key=lambda p: (order.index(p.name) if p.name in order else len(order), p.name))


class ReportError(ValueError):
    """A run folder whose files the report cannot read; the message names the file and what to do."""


def read_samples(folder: Path) -> list[dict[str, Any]]:
    samples = []
    try:
        for sample in read_shards(folder):
            samples.append(sample)
            if len(samples) >= MAX_SAMPLES or len(samples) * len(sample["tokens"]) >= MAX_TOKENS:
                break
    except (OSError, ValueError, tarfile.TarError) as err:
        raise ReportError(f"{folder}: its shards do not read back ({err}); `datapipe inspect` shows which, and "
                          "`datapipe run RECIPE --restart` writes them again") from err
    return samples


def pieces_of(sample: dict[str, Any], decode) -> list[Piece]:
    """Every document piece of a sample, decoded, with the images of its media spans."""
    pieces, start = [], 0
    spans = [tuple(span) for span in sample["media_spans"]]
    for doc_id, length, offset in zip(sample["doc_ids"], sample["doc_lens"].tolist(), sample["doc_offsets"]):
        inside = [(i, a, b) for i, (a, b) in enumerate(spans) if start <= a < start + length]
        images = [sample["images"][i] for i, _, _ in inside if i < len(sample["images"])]
        text = decode_around(sample["tokens"], start, start + length, inside, decode)
        pieces.append(Piece(doc_id, sample["key"], text, int(offset), images))
        start += length
    return pieces


def decode_around(tokens, start: int, stop: int, spans: list[tuple[int, int, int]], decode) -> str:
    if decode is None:
        return "(no tokenizer to decode)"
    parts, at = [], start
    for i, a, b in spans:
        parts += [decode(tokens[at:min(a, at + MAX_DECODED)].tolist()), f"[image {i}]"]
        at = b
    parts.append(decode(tokens[at:min(stop, at + MAX_DECODED)].tolist()))
    return "".join(parts)


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk: bytes 16-24, big-endian; (0, 0) for anything else."""
    if data[:8] != b"\x89PNG\r\n\x1a\n" or len(data) < 24:
        return 0, 0
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def gate_measures(png: bytes, gates: dict[str, Any]) -> str:
    """The render gates' measures of an image, recomputed as the render stage did (shards keep the
    images, not the notes): foreground and edge shares of its grey thumbnail, and the verdict
    under the run's thresholds (`gates`: the render stage's options from recipe.json)."""
    from renderers.gates import GateConfig, check_image, grayscale

    config = GateConfig(**{key: value for key, value in gates.items() if key in GateConfig.model_fields})
    reason, measures = check_image(grayscale(png), config)
    return f"foreground {measures['foreground']:.1%}, edges {measures['edges']:.1%}: {reason or 'passes'}"


def png_uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")
