"""Plain dicts from a recipe name to the code that implements it.

Values are "module:attribute" strings, imported only when a run needs them, so that
importing datapipe stays fast and a stage's heavy dependencies load in its worker.
"""
from __future__ import annotations

from typing import Any

from datapipe.stage import load

# Readers of files: read(source_config, path) -> Iterator[Document]; one Ray task per file.
FILE_READERS: dict[str, str] = {
    "jsonl": "datapipe.readers.tabular:read_jsonl",  # .jsonl, .jsonl.gz, .jsonl.zst
    "parquet": "datapipe.readers.tabular:read_parquet",
    "hf_disk": "datapipe.readers.tabular:read_hf_disk",  # a folder written by datasets' save_to_disk
    "warc": "datapipe.readers.warc:read_warc",  # WARC/ARC/WET, plain, gzip or lz4; HTML responses as kind "html"
    "html": "datapipe.readers.warc:read_html",  # saved pages (.html, .html.gz), one document each
    "files": "datapipe.readers.files:read_files",  # one document per file (or per row of a JSONL manifest of files)
}

# Generators: generate(source_config, seed, start, stop) -> Iterator[Document]; one task per range.
GENERATORS: dict[str, str] = {
    "pydoc_topics": "datapipe.readers.generators:pydoc_topics",  # the docs every Python install carries
    "python_programs": "datapipe.readers.generators:python_programs",  # seeded, procedurally generated code
    "svg_programs": "renderers.procedural_svg:svg_programs",  # seeded SVGs: shapes, paths, gradients, text
    "html_pages": "renderers.procedural_html:html_pages",  # seeded pages: layouts, tables, forms, type
    "scene_programs": "renderers.procedural_3d:scene_programs",  # seeded trimesh programs: primitives, booleans
    "cad_programs": "renderers.procedural_3d:cad_programs",  # seeded CadQuery/OpenSCAD parts: holes, fillets...
    "web_archive": "datapipe.readers.web_archive:web_archive",  # a generated crawl: boilerplate, duplicates, languages
}

SOURCES: dict[str, str] = {**FILE_READERS, **GENERATORS}

# Stages: each module defines `Config` (a config.StageConfig) and `make_stage(config)`, which
# returns a callable from a list of documents to a list of documents.
STAGES: dict[str, str] = {
    "normalize": "datapipe.text.normalize",
    "extract": "datapipe.text.extract",  # HTML -> main text (resiliparse / trafilatura)
    "langid": "datapipe.text.langid",  # fastText lid.176: Document.language + score, filter
    "quality": "datapipe.text.quality",  # Gopher quality + repetition, C4, FineWeb rules
    "pii": "datapipe.text.pii",  # e-mails, IPs, phone numbers -> typed placeholders
    "dedup": "datapipe.text.dedup",  # exact + MinHash-LSH, global (transform_dataset)
    "rephrase": "datapipe.text.rephrase",  # K rewrites per document with an LLM (local, OpenAI HTTP, vLLM)
    "tokenize": "tokenizer.stage",
    "render": "renderers.stage",  # svg/html documents -> images (actor pool, sandboxed, quality-gated)
    "render_dedup": "renderers.dedup",  # near-duplicate renders by perceptual hash, global (one actor)
    "code_image_samples": "renderers.samples",  # (code, images) -> image-to-code / code-to-image documents
}


def stage_module(name: str) -> Any:
    if name not in STAGES:
        raise KeyError(f"unknown stage {name!r}; known stages: {', '.join(sorted(STAGES))}")
    return load(STAGES[name])


def is_global(name: str) -> bool:
    """A global stage sees the whole dataset (its module defines transform_dataset: datapipe.stage)."""
    return hasattr(stage_module(name), "transform_dataset")


def stage_config_class(name: str) -> type:
    return stage_module(name).Config
