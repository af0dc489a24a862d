"""The renderer interface: code or markup (plus the folder of its local assets) and options
in; PNG images and metadata out, or a typed RenderError.

A renderer is a class because it keeps a warm resource (a sandboxed worker process with its
font cache, a browser and its page) across renders; the render stage holds one per kind per
Ray actor. Renders are deterministic: the same input and options give the same pixels.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

from renderers.views import ViewOptions


class RenderOptions(BaseModel):
    """What every renderer accepts; each one reads the fields that apply to its kind."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    svg_backend: Literal["resvg", "cairosvg"] = "resvg"  # resvg: ~2.2x cairosvg's speed, closer to Chromium
    size: int = Field(512, ge=16, le=4096)  # SVG: the longer side in px; 512 keeps 24-px icon strokes ~40 px wide
    viewports: list[tuple[int, int]] = [(1280, 720)]  # webpages: one screenshot per (width, height)
    full_page: bool = False  # webpages: capture the whole scroll height (capped by max_height)
    max_height: int = Field(4096, ge=64)  # webpages: full-page captures stop here; a 100k-px page is not one image
    background: str = "#ffffff"  # a CSS colour, or "transparent"; icons are black strokes on nothing
    javascript: bool = True  # webpages: run scripts (within timeout_s) or render the static markup
    timeout_s: float = Field(10.0, gt=0)  # wall time per render; real offline pages take 0.45-1.1 CPU-s
    memory_mb: int = Field(1024, ge=128)  # address-space cap of a sandboxed worker (SVG) / V8 heap (web)
    external_refs: Literal["reject", "strip"] = "reject"  # non-local, non-data: references: the pair must match
    max_input_bytes: int = Field(4 << 20, ge=1024)  # larger inputs are rejected as render.too_large
    views: ViewOptions = ViewOptions()  # meshes, 3D scene programs, CAD: the views, shading, edges (renderers.views)
    libraries: list[str] = []  # CAD: library folders (OPENSCADPATH, sys.path), read-only in the sandbox
    mesh_code_chars: int = Field(100_000, ge=0)  # a longer mesh text is rendered without code (has_code false)
    font_dirs: list[str] = []  # SVG: folders of extra fonts (world-readable), beside the system's

    @field_validator("font_dirs")
    @classmethod
    def _folders(cls, font_dirs: list[str]) -> list[str]:
        missing = [folder for folder in font_dirs if not Path(folder).is_dir()]
        if missing:
            raise ValueError(f"font_dirs: {', '.join(missing)} is not a folder; give folders of .ttf/.otf files")
        return [str(Path(folder).resolve()) for folder in font_dirs]


@dataclass
class Render:
    images: list[bytes]  # PNG, one per view
    meta: dict[str, Any] = field(default_factory=dict)  # renderer, version, sizes, stripped references...
    code: str | None = None  # the markup actually rendered when it differs from the input (stripped refs)


class RenderError(Exception):
    """A render that failed for a reason worth counting; `reason` becomes "render.<reason>"."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


# The reasons a renderer raises; the quality gates add blank, low_detail and duplicate.
REASONS = {
    "timeout": "the render ran past timeout_s; its worker (or browser context) was killed and replaced",
    "crashed": "the worker or browser died (segfault, panic, out of memory); it was replaced",
    "external_reference": "the input refers to a file, URL or entity outside its folder (external_refs: reject)",
    "entity_bomb": "a DTD whose entities nest or expand past the limit (billion laughs)",
    "too_large": "input bytes, nesting depth or <use> expansion past the limits",
    "invalid": "not parseable as the kind it claims (malformed XML, no <svg> root, a <use> cycle; a mesh with no "
               "triangles, NaN coordinates, a missing glTF buffer, a cyclic scene graph)",
    "navigated_away": "a page that left itself during the render (meta refresh, location.href, a form submitting)",
    "error_page": "the main frame showed Chromium's error page or a document of another origin, not the page",
    "no_shape": "a 3D or CAD program ran but made nothing to draw (no show_object, result or shape in scope)",
    "script_error": "a 3D or CAD program raised (its exception is the detail); an OpenSCAD error or recursion",
    "forbidden": "a program tried what its sandbox forbids: a process, a socket, a file outside its folder",
    "out_of_memory": "a program passed its memory cap (a memory bomb); its process was killed",
}


def file_inside(root: Path, relative: str) -> Path | None:
    """The existing file `relative` names under `root` (already resolved), symlinks followed, or None
    when it is missing, not a file, or resolves outside root (../, an absolute path, a symlink out)."""
    try:
        candidate = (root / relative).resolve()
        return candidate if candidate.is_relative_to(root) and candidate.is_file() else None
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte: no such file
        return None


class Renderer(Protocol):
    name: str  # "resvg", "cairosvg", "chromium": recorded in notes["render"]

    def render(self, code: str, asset_dir: Path | None, options: RenderOptions) -> Render: ...

    def close(self) -> None: ...
