"""Does the rephrase stage keep an OpenAI-compatible server full? Requests in flight and requests/s.

The project's own server (`python -m datapipe.llm.server --script`) answers every request after a
fixed --latency-ms (300) with the chunk it was sent, so the server is never the bottleneck and
an ideal client holds `concurrency` requests in flight: concurrency / latency requests/s. The
whole stage runs (chunking, context, the gate's text checks in their worker process, retries,
records; no Ray; the MiniLM cosine with --cosine) on real web documents (../shared/data/web_text;
else the recipe's sample facts) in --chunk-tokens (64) chunks with --concurrency (64), after a
warm-up batch of 8 documents (as an actor's later batches find its gate worker and imports warm).
The peer, in the same run on the same documents, is the client before issue 21: rounds, each
sending every document's next chunk at once and waiting for the slowest, with no gate work.
Target (issue 21): mean in flight >= 0.9 x concurrency, requests/s >= 0.9 x concurrency / latency.
Beside them: CPU milliseconds per request of the client (this process, its gate worker included)
and of the server, which do not depend on how loaded the machine is.

A 256-document batch (1,126 requests) is ~5.3 s at the ideal rate, so its ramp (the first
documents being chunked) and its drain (the last ~300 ms) weigh; --docs 497 (every English web
document of 300-1500 characters in the shared set: 2,200 requests) is a steadier run.

    .venv/bin/python bench/rephrase_client.py [--docs 256] [--concurrency 64] [--latency-ms 300]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.rephrase import SHARED, load_texts  # noqa: E402
from tests.llm_helpers import start_server, stop_server  # noqa: E402

STYLE = {"name": "plain", "system": "Rewrite the text.", "prompt": "Text:\n{text}", "temperature": 0.0}


def run_stage(url: str, server, texts: list[str], args) -> dict:
    from datapipe.schema import new_document
    from datapipe.text.rephrase import Config, make_stage

    cfg = Config(stage="rephrase", styles=[STYLE], rewrites=1, chunk_tokens=args.chunk_tokens,
                 fidelity={"max_overlap": 1.0, **({} if args.cosine else {"min_cosine": None})},
                 backend={"type": "openai", "base_url": url, "concurrency": args.concurrency})
    stage = make_stage(cfg)
    stage([new_document("warm", str(i), text) for i, text in enumerate(texts[:8])])  # as an actor's 2nd batch
    docs = [new_document("bench", str(i), text) for i, text in enumerate(texts)]
    started, cpu = time.perf_counter(), cpu_seconds(server)
    out = stage(docs)
    seconds = time.perf_counter() - started
    cpu = {side: round(now - cpu[side], 2) for side, now in cpu_seconds(server).items()}
    flight = stage.rewriter.stats
    return {"requests": flight["requests"], "seconds": round(seconds, 2), "mean_in_flight": flight["mean_in_flight"],
            "peak_in_flight": flight["peak_in_flight"], "requests_per_s": round(flight["requests"] / seconds, 1),
            "written": sum(not d["reject"] for d in out), "cpu_s": cpu, "flight": flight,
            **{f"{side}_cpu_ms_per_request": round(1000 * c / flight["requests"], 2) for side, c in cpu.items()
               if side != "client_gate"}}


def cpu_seconds(server) -> dict[str, float]:
    """CPU seconds (user + system, all threads) so far of the client (this process and its gate
    workers) and of the server: figures that do not depend on how loaded the shared machine is."""
    children = {int(pid) for tasks in Path(f"/proc/{os.getpid()}/task").glob("*/children")
                for pid in tasks.read_text().split()} - {server.pid}
    mine, workers = os.times(), sum(map(process_cpu, children))
    return {"client": mine.user + mine.system + workers, "client_gate": workers, "server": process_cpu(server.pid)}


def process_cpu(pid: int) -> float:
    try:
        utime, stime = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[11:13]
    except FileNotFoundError:  # a child that has exited
        return 0.0
    return (int(utime) + int(stime)) / os.sysconf("SC_CLK_TCK")


def run_rounds(url: str, texts: list[str], args) -> dict:
    """The peer: every document's chunk k in one round, the round waits for its slowest request."""
    from datapipe.llm.base import BackendConfig, Request
    from datapipe.llm.chunking import split_chunks
    from datapipe.llm.openai_http import OpenAIBackend

    backend = OpenAIBackend(BackendConfig(type="openai", base_url=url, concurrency=args.concurrency))
    chunks = [split_chunks(text, args.chunk_tokens, backend.count_tokens) for text in texts]
    started, requests, k = time.perf_counter(), 0, 0
    while batch := [doc[k] for doc in chunks if k < len(doc)]:
        for start in range(0, len(batch), args.concurrency):  # concurrency threads, as the old pool had
            backend.generate([Request([{"role": "user", "content": f"Text:\n{c}"}], 64)
                              for c in batch[start : start + args.concurrency]])
        requests, k = requests + len(batch), k + 1
    seconds = time.perf_counter() - started
    return {"requests": requests, "seconds": round(seconds, 2), "requests_per_s": round(requests / seconds, 1),
            "mean_in_flight": round(requests / seconds * args.latency_ms / 1000, 2)}  # Little's law


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--latency-ms", type=float, default=300.0)
    parser.add_argument("--chunk-tokens", type=int, default=64)
    parser.add_argument("--cosine", action="store_true", help="the gate with the MiniLM embedder (on CPU: its bound)")
    parser.add_argument("--no-compare", action="store_true", help="skip the round-based peer")
    args = parser.parse_args()
    texts, origin = load_texts(args.docs, SHARED)
    if SHARED.is_file() and origin != "web_docs":  # load_texts fell back to the sample facts: another input
        parser.error(f"--docs {args.docs}: {SHARED.name} holds fewer English documents of 300-1500 characters "
                     f"(497 when this was written); ask for fewer, or the run would measure the sample facts")
    with tempfile.NamedTemporaryFile("w", suffix=".json") as script:
        script.write("[]")  # no rules: every request is answered with its own chunk
        script.flush()
        process, url = start_server("--script", script.name, "--latency-ms", str(args.latency_ms))
        try:
            ours = run_stage(url, process, texts, args)
            peer = None if args.no_compare else run_rounds(url, texts, args)
        finally:
            stop_server(process)
    ideal = args.concurrency / (args.latency_ms / 1000)
    result = {"data": origin, "docs": len(texts), "concurrency": args.concurrency, "latency_ms": args.latency_ms,
              "ideal_requests_per_s": round(ideal, 1), "stage": ours, "rounds": peer}
    print(json.dumps(result, indent=1))
    line = {"docs": len(texts), "concurrency": args.concurrency, "latency_ms": args.latency_ms, "requests": ours["requests"],
            "mean_in_flight": ours["mean_in_flight"], "in_flight_share": round(ours["mean_in_flight"] / args.concurrency, 3),
            "requests_per_s": ours["requests_per_s"], "x_ideal": round(ours["requests_per_s"] / ideal, 3),
            "mean_latency_s": ours["flight"]["mean_latency_s"], "client_cpu_ms_per_request": ours["client_cpu_ms_per_request"],
            "server_cpu_ms_per_request": ours["server_cpu_ms_per_request"]}
    if peer:
        line["rounds_requests_per_s"] = peer["requests_per_s"]
        line["x_vs_rounds"] = round(ours["requests_per_s"] / peer["requests_per_s"], 2)
    print("bench rephrase_client: " + " ".join(f"{k}={v}" for k, v in line.items()))


if __name__ == "__main__":
    main()
