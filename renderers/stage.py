"""The render stage: each document of a renderable kind gets its images, or a reject reason.

Runs as a Ray actor pool (Config.actor): each actor keeps one renderer per kind warm (a
sandboxed resvg worker with its font database, a Chromium page) and reserves `num_cpus`.
For every render, in order: the renderer's own checks and limits (render.too_large,
entity_bomb, external_reference, invalid, timeout, crashed, navigated_away, error_page), then
the quality gates on every image (render.blank, render.low_detail). A kept document has doc["media"] = the PNGs (one per
view) and notes["render"] = renderer, version, options, sizes, gate measures and a 64-bit
dHash per image; its text stays the code (or becomes the stripped markup that was actually
rendered); a reject's detail goes to doc["error"]. Local files come only from the folder
Document.asset_dir names, which only the files reader sets (with meta["page_path"], the page's
path inside it, when asset_root made it a folder above the page's own). Documents of other kinds pass
through untouched. Near-duplicates are the next stage's job (render_dedup), which sees
every render in order.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from pydantic import Field, field_validator

from datapipe.schema import Document
from datapipe.stage import StageConfig
from renderers import RENDERERS, make_renderer
from renderers.base import RenderError, RenderOptions
from renderers.gates import GateConfig, check_image, dhash, grayscale


class Config(StageConfig, RenderOptions, GateConfig):
    actor: ClassVar[bool] = True

    kinds: list[str] = Field(default_factory=lambda: list(RENDERERS))  # kinds to render; others pass through
    batch_size: int = Field(8, ge=1)  # renders take 5 ms (icon) to 1 s (page): small batches balance actors

    @field_validator("kinds")
    @classmethod
    def _renderable(cls, kinds: list[str]) -> list[str]:
        unknown = [kind for kind in kinds if kind not in RENDERERS]
        if unknown:
            raise ValueError(f"no renderer for {', '.join(map(repr, unknown))}; known kinds: {', '.join(sorted(RENDERERS))}")
        return kinds


def make_stage(cfg: Config) -> Callable[[list[Document]], list[Document]]:
    options = RenderOptions(**cfg.model_dump(include=set(RenderOptions.model_fields)))
    gates = GateConfig(**cfg.model_dump(include=set(GateConfig.model_fields)))
    renderers: dict[str, object] = {}  # kind -> warm renderer, made on first use

    def render(docs: list[Document]) -> list[Document]:
        for doc in docs:
            if doc["kind"] in cfg.kinds:
                renderer = renderers.get(doc["kind"]) or renderers.setdefault(doc["kind"], make_renderer(doc["kind"]))
                render_document(doc, renderer, options, gates)
        return docs

    return render


def render_document(doc: Document, renderer, options: RenderOptions, gates: GateConfig) -> None:
    asset_dir = Path(doc["asset_dir"]) if doc["asset_dir"] else None  # never a source column: see datapipe.schema
    # The files reader's page path for a webpage served from above its folder; renderers that read the
    # document's file themselves (a binary mesh) get its name inside asset_dir.
    page = {"name": doc["meta"]["page_path"]} if asset_dir and doc["meta"].get("page_path") else {}
    named = {"name": Path(doc["meta"].get("path", "")).name} if getattr(renderer, "reads_file", False) else page
    try:
        result = renderer.render(doc["text"], asset_dir, options, **named)
    except RenderError as err:
        doc["reject"] = f"render.{err.reason}"
        doc["error"] = err.detail[:500]
        return
    thumbnails = [grayscale(png) for png in result.images]
    checks = [check_image(gray, gates) for gray in thumbnails]
    doc["notes"]["render"] = {**result.meta, "gates": [measures for _, measures in checks],
                              "dhash": [f"{dhash(gray):064x}" for gray in thumbnails]}
    failed = next((reason for reason, _ in checks if reason), "")
    if failed:
        doc["reject"] = f"render.{failed}"
        return
    if result.code is not None:
        doc["text"] = result.code
    doc["media"] = result.images
