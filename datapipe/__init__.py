"""datapipe: pre-training data for multimodal LLMs, from sources to packed WebDataset shards.

    datapipe/
      schema.py       the record types every step reads and writes
      stage.py        what a stage is (StageConfig, make_stage)
      shardformat.py  the shard format: the contract between the writer and the loader
      pipeline/       recipes, their checks, the registry of stages and sources, the Ray runner, run stats
      readers/        every source type: JSONL, Parquet, HF datasets, WARC/HTML, files, generators
      text/ llm/      text stages: extract, normalize, langid, quality, pii, dedup, rephrase (and its LLM clients)
      packing/        the curriculum's phases, best-fit packing, the corpus, the shard writer
      loader/         datapipe.stream: shards to a trainer, resumable; the PyTorch adapter

Importing the package loads no heavy dependency: `datapipe.stream` imports the loader on
first use, and Ray loads only in datapipe.pipeline.runner.
"""
from typing import Any

__version__ = "0.1.0"
__all__ = ["Stream", "stream", "read_shard", "read_shards", "__version__"]
LAZY = {"Stream": "datapipe.loader.stream", "stream": "datapipe.loader.stream",
        "read_shard": "datapipe.loader.reference", "read_shards": "datapipe.loader.reference"}


def __getattr__(name: str) -> Any:
    if name not in LAZY:
        raise AttributeError(f"module 'datapipe' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(LAZY[name]), name)
