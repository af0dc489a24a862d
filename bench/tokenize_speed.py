"""Tokenize benchmark: our tokenize stage's encode path vs HF `tokenizers` encode_batch, per core.

Both run in this process on the same real text (../shared/data/web_text/: web pages, the UDHR
in 532 languages, LaTeX math), one thread each (TOKENIZERS_PARALLELISM=false while encoding),
so MB/s is per core. Rounds alternate ours/HF over different slices of the text; medians
are reported, and every round checks that the ids are identical (the stage's tokens minus
the trailing EOS against HF's ids). The tokenizer encoded with is the 32K vocabulary this
benchmark trains first, on the shared text repeated to --train-mb MB (timed, all cores).

    .venv/bin/python bench/tokenize_speed.py [--train-mb 100] [--encode-mb 4] [--rounds 3]
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from datapipe.schema import new_document
from tokenizer.bpe import save_tokenizer, train_tokenizer
from tokenizer.fast import HFEncoder
from tokenizer.stage import Config, make_stage

WEB_TEXT = Path(__file__).resolve().parents[2] / "shared" / "data" / "web_text"
FILES = ("web_docs.jsonl.gz", "udhr.jsonl.gz", "math_docs.jsonl.gz")


def read_texts() -> list[str]:
    if not WEB_TEXT.is_dir():
        sys.exit(f"shared web text not found at {WEB_TEXT}; see shared/data/README.md")
    texts = []
    for name in FILES:
        with gzip.open(WEB_TEXT / name, "rt", encoding="utf-8") as lines:
            texts += [json.loads(line)["text"] for line in lines]
    return texts


def megabytes(texts: list[str]) -> float:
    return sum(len(text.encode("utf-8", "replace")) for text in texts) / 1e6


def repeat_to(texts: list[str], target_mb: float) -> list[str]:
    copies = max(1, round(target_mb / megabytes(texts)))
    return texts * copies


def time_training(texts: list[str], vocab_size: int, out: Path) -> tuple[Path, float]:
    os.environ["TOKENIZERS_PARALLELISM"] = "true"  # training uses every core, as a user would run it
    start = time.perf_counter()
    path = save_tokenizer(train_tokenizer(texts, vocab_size), out)
    return path, time.perf_counter() - start


def slices(texts: list[str], mb_each: float, count: int) -> list[list[str]]:
    """`count` disjoint runs of consecutive documents of about mb_each MB, spread over the text."""
    stride = len(texts) // count
    out = []
    for i in range(count):
        chunk, size = [], 0.0
        for text in texts[i * stride : (i + 1) * stride]:
            if size >= mb_each:
                break
            chunk.append(text)
            size += len(text.encode("utf-8", "replace")) / 1e6
        out.append(chunk)
    return out


def time_ours(stage, texts: list[str]) -> tuple[float, list[np.ndarray]]:
    docs = [new_document("bench", str(i), text) for i, text in enumerate(texts)]
    start = time.perf_counter()
    docs = stage(docs)
    seconds = time.perf_counter() - start
    return seconds, [doc["tokens"][:-1] for doc in docs]  # the stage appends EOS


def time_hf(encoder: HFEncoder, texts: list[str]) -> tuple[float, list[np.ndarray]]:
    start = time.perf_counter()
    ids = encoder.encode_batch(texts)
    return time.perf_counter() - start, ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-mb", type=float, default=100.0, help="training text size (shared text repeated)")
    parser.add_argument("--vocab-size", type=int, default=32768)
    parser.add_argument("--encode-mb", type=float, default=4.0, help="text per timed round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    texts = read_texts()
    train_texts = repeat_to(texts, args.train_mb)
    train_mb = megabytes(train_texts)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer, train_s = time_training(train_texts, args.vocab_size, Path(tmp))
        print(f"trained {args.vocab_size:,} vocab on {train_mb:.0f} MB ({len(texts):,} docs x "
              f"{len(train_texts) // len(texts)}) in {train_s:.0f} s", flush=True)
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core each from here on
        stage = make_stage(Config(stage="tokenize", tokenizer=str(tokenizer), batch_size=len(texts)))
        reference = HFEncoder(tokenizer)
        ours, hf, identical, tokens = [], [], True, 0
        for i, chunk in enumerate(slices(texts, args.encode_mb, args.rounds)):
            mb = megabytes(chunk)
            ours_s, ours_ids = time_ours(stage, chunk)
            hf_s, hf_ids = time_hf(reference, chunk)
            same = len(ours_ids) == len(hf_ids) and all(map(np.array_equal, ours_ids, hf_ids))
            identical &= same
            tokens += sum(map(len, hf_ids))
            ours.append(mb / ours_s)
            hf.append(mb / hf_s)
            print(f"round {i}: {mb:.1f} MB, {len(chunk):,} docs: ours {ours[-1]:.2f} MB/s, hf {hf[-1]:.2f} MB/s, "
                  f"ids identical: {same}", flush=True)
    ours_median, hf_median = statistics.median(ours), statistics.median(hf)
    print(f"bench tokenize: ours_mb_s_per_core={ours_median:.2f} hf_mb_s_per_core={hf_median:.2f} "
          f"x_vs_hf={ours_median / hf_median:.2f} identical_ids={str(identical).lower()} tokens={tokens} "
          f"train_vocab={args.vocab_size} train_mb={train_mb:.0f} train_s={train_s:.0f}")


if __name__ == "__main__":
    main()
