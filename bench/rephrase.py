"""Rephrasing throughput: output tokens/s of the local backend, batched vs one request at a time.

Same documents, same prompts, same process: the first ~128-token chunk of each of N real English
web documents (../shared/data/web_text, else the recipe's sample facts), in the K2
`textbook_section` style, greedy, up to --max-new-tokens each. "unbatched" sends them one
generate() call each, as a naive client loop would; "batched" sends them all at once and the
backend runs --batch of them per generate() call. Repeated --repeats times, alternating; medians.
With --stage-docs N it also runs the whole rephrase stage (no Ray) on N documents with the K2
style library and reports the stage's output tokens/s and how many rewrites passed the gate.

On CPU the summary line also carries the H200 figures recorded in bench/results/rephrase_h200.json
(written by this script with --device cuda --save on the GPU machine), marked h200_*.

    .venv/bin/python bench/rephrase.py [--docs 8] [--max-new-tokens 48] [--repeats 3]
"""
from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
SHARED = REPO.parent / "shared" / "data" / "web_text" / "web_docs.jsonl.gz"
SAMPLE = REPO / "recipes" / "data" / "rephrase_facts.jsonl"
H200 = REPO / "bench" / "results" / "rephrase_h200.json"


def load_texts(count: int, path: Path) -> tuple[list[str], str]:
    """English web documents of 300-1500 characters; the shipped sample facts when shared/ is absent."""
    if path.is_file():
        texts = []
        with gzip.open(path, "rt", encoding="utf-8") as lines:
            for line in lines:
                row = json.loads(line)
                if row.get("lang_detected") == "en" and 300 <= len(row["text"]) <= 1500:
                    texts.append(row["text"])
                if len(texts) == count:
                    return texts, "web_docs"
    facts = [json.loads(line)["text"] for line in SAMPLE.open()]
    return [facts[i % len(facts)] for i in range(count)], "recipes/data/rephrase_facts"


def make_requests(backend, texts: list[str], max_new_tokens: int):
    from datapipe.llm.base import Request
    from datapipe.llm.chunking import split_chunks
    from datapipe.llm.styles import load_styles

    style = next(s for s in load_styles([], str(REPO / "recipes" / "styles" / "k2.yaml")) if s.name == "textbook_section")
    chunks = [split_chunks(text, 128, backend.count_tokens)[0] for text in texts]
    return [Request([{"role": "system", "content": style.system},
                     {"role": "user", "content": style.prompt.format(text=chunk)}], max_new_tokens, 0.0)
            for chunk in chunks]


def tokens_per_s(backend, requests, batched: bool) -> float:
    started = time.perf_counter()
    out = backend.generate(requests) if batched else [c for r in requests for c in backend.generate([r])]
    seconds = time.perf_counter() - started
    return sum(c.output_tokens for c in out) / seconds


def run_stage(backend, texts: list[str], max_new_tokens: int) -> dict:
    """The whole stage (chunking, context, gate, retries) on the backend; the embedder only on CPU runs
    where its package is installed."""
    from datapipe.schema import new_document
    from datapipe.text.rephrase import Config, make_stage

    try:
        from datapipe.llm.packaged import minilm_dir
        gate = {} if minilm_dir().is_dir() else {"min_cosine": None}
    except FileNotFoundError:
        gate = {"min_cosine": None}
    cfg = Config(stage="rephrase", styles_file=str(REPO / "recipes" / "styles" / "k2.yaml"), rewrites=2,
                 max_new_tokens=max_new_tokens, fidelity=gate)
    docs = [new_document("bench", str(i), text) for i, text in enumerate(texts)]
    started = time.perf_counter()
    out = make_stage(cfg, backend=backend)(docs)
    seconds = time.perf_counter() - started
    tokens = sum(d["notes"]["rephrase"].get("output_tokens", 0) for d in out if "rephrase" in d["notes"])
    return {"stage_docs": len(docs), "stage_tok_s": round(tokens / seconds, 1), "stage_s": round(seconds, 1),
            "stage_written": sum(1 for d in out if not d["reject"]),
            "stage_rejected": dict(Counter(d["reject"] for d in out if d["reject"])),
            "stage_cosine_gate": gate.get("min_cosine", "on")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--batch", type=int, default=8, help="requests per generate() call when batched")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads; 1 because on a shared, oversubscribed machine 2 threads spin-wait")
    parser.add_argument("--unbatched-docs", type=int, default=None, help="time one-at-a-time on the first N only")
    parser.add_argument("--stage-docs", type=int, default=0, help="also run the whole stage on N documents")
    parser.add_argument("--save", type=Path, help="write the results as JSON here")
    parser.add_argument("--model", default="smollm2-135m-instruct",
                        help="the packaged SmolLM2 or a transformers model folder (e.g. a larger model on a GPU)")
    parser.add_argument("--data", type=Path, default=SHARED, help="web_docs.jsonl.gz (default: ../shared/data)")
    args = parser.parse_args()

    from datapipe.llm.base import BackendConfig
    from datapipe.llm.local import LocalBackend

    texts, origin = load_texts(max(args.docs, args.stage_docs), args.data)
    backend = LocalBackend(BackendConfig(model=args.model, device=args.device, max_batch=args.batch, threads=args.threads))
    requests = make_requests(backend, texts[: args.docs], args.max_new_tokens)
    single = requests[: args.unbatched_docs or len(requests)]
    backend.generate(requests[:1])  # warm-up: first-call allocations, kernel selection on GPU
    batched, unbatched = [], []
    for repeat in range(args.repeats):
        for mode in ((True, False) if repeat % 2 == 0 else (False, True)):
            (batched if mode else unbatched).append(tokens_per_s(backend, requests if mode else single, mode))
    result = {"model": backend.model, "device": backend.device, "threads": args.threads if backend.device == "cpu" else None, "data": origin, "docs": len(requests), "unbatched_docs": len(single),
              "max_new_tokens": args.max_new_tokens, "batch": args.batch, "repeats": args.repeats,
              "batched_tok_s": round(statistics.median(batched), 1),
              "unbatched_tok_s": round(statistics.median(unbatched), 1)}
    result["x_vs_unbatched"] = round(result["batched_tok_s"] / result["unbatched_tok_s"], 2)
    if args.stage_docs:
        result.update(run_stage(backend, texts[: args.stage_docs], 256))
    print(json.dumps(result, indent=1))
    if args.save:
        args.save.write_text(json.dumps(result, indent=1) + "\n")
    print("bench rephrase: " + " ".join(f"{k}={v}" for k, v in summary(result).items()))


def summary(result: dict) -> dict:
    keys = ("device", "docs", "max_new_tokens", "batch", "batched_tok_s", "unbatched_tok_s", "x_vs_unbatched",
            "stage_tok_s", "stage_written")
    line = {k: result[k] for k in keys if k in result}
    if result["device"] == "cpu" and H200.is_file():
        h200 = json.loads(H200.read_text())
        line.update({f"h200_{k}": h200[k] for k in ("batch", "batched_tok_s", "unbatched_tok_s", "x_vs_unbatched")})
        line["h200_x_vs_cpu_batched"] = round(h200["batched_tok_s"] / result["batched_tok_s"], 1)
    return line


if __name__ == "__main__":
    main()
