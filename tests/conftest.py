"""Shared fixtures: one real local Ray for the whole suite, a real S3 server (moto) whose address
the Ray workers inherit, and a tiny tokenizer trained in-process."""
from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

WORDS = ("packing shards tokens stream resume rank epoch recipe stage record reject source sample "
         "render image browser curriculum sequence document boundary manifest").split()


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server, its address and credentials in the environment (tests/s3server.py); or, when
    it cannot start, why: the S3 tests skip with that reason, the others run."""
    try:
        from tests.s3server import S3Server

        server = S3Server()
    except (ImportError, OSError) as err:
        yield f"no S3 server for the tests (moto[server] from the dev extra): {type(err).__name__}: {err}"
        return
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server) -> str:
    """A new, empty bucket on the test S3 server: its s3:// URL."""
    if isinstance(s3_server, str):
        pytest.skip(s3_server)
    return s3_server.new_bucket()


@pytest.fixture(scope="session")
def ray_session(s3_server):  # the S3 server first: Ray's workers inherit its address from the environment
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, object_store_memory=256 << 20, include_dashboard=False,
                 logging_level=logging.ERROR, log_to_driver=True)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory) -> Path:
    """A 512-token byte-level BPE trained on generated English and code: tokenizer.json + tokenizer.tiktoken."""
    from tokenizer.bpe import save_tokenizer, train_tokenizer

    texts = [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(40)) for i in range(200)]
    texts += ["def f(x):\n    return x * 2\n", "数据管道 测试 文本", "café naïve déjà vu"]
    return save_tokenizer(train_tokenizer(texts, vocab_size=512), tmp_path_factory.mktemp("tok"))


def write_jsonl(path: Path, rows: list, raw_lines: list[bytes] = ()) -> Path:
    """Rows as JSON lines, then raw (possibly broken) lines appended as given."""
    lines = [json.dumps(row, ensure_ascii=False).encode() for row in rows] + list(raw_lines)
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def tiny_recipe(tmp_path: Path, tokenizer: Path, sources: list[dict], **extra) -> Path:
    """A recipe file in tmp_path: normalize + tokenize, one 64-token curriculum phase."""
    import yaml

    recipe = {
        "name": "tiny",
        "description": "test recipe",
        "sources": sources,
        "stages": [{"stage": "normalize"}, {"stage": "tokenize", "tokenizer": str(tokenizer)}],
        "phases": [{"name": "main", "seq_len": 64}],
        "shards": {"samples_per_shard": 8},
        "ray": {"object_store_mb": 256},
        **extra,
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def rgb(png: bytes, mode: str = "RGB") -> np.ndarray:
    """A PNG's pixels as an array (height, width, channels of `mode`)."""
    return np.asarray(Image.open(io.BytesIO(png)).convert(mode))
