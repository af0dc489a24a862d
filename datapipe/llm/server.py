"""A small OpenAI-compatible server for the local model: `python -m datapipe.llm.server`.

GET /v1/models and POST /v1/chat/completions, the subset that the openai backend (and most
clients) use, with the error shapes vLLM answers: 404 for an unknown model, 400 with
"maximum context length" for a prompt that does not fit. Each connection gets a thread; a
batcher thread collects the requests waiting at that moment (up to --max-batch, after a 20 ms
gather window) into one generate() call, so concurrent clients share batches as they would
on vLLM. It exists for tests, demos and machines without vLLM; --die-after and
--malformed-after make it fail on purpose, for failure tests. With --script FILE it loads no
model and answers as the file says (datapipe.llm.server.Script: a status, a text, a finish reason,
a Retry-After, per matching prompt), after --latency-ms: the failure tests and the client
benchmark (a server of fixed latency that never saturates) use it.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import threading
import time
from collections import Counter
from concurrent.futures import Future
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from datapipe.llm.base import CONTEXT_OVERFLOW, BackendConfig, Completion, Request

GATHER_S = 0.02  # how long the batcher waits for more requests after the first


class Batcher:
    """Turns concurrent single requests into batched generate() calls on one thread."""

    def __init__(self, backend, max_batch: int):
        self.backend, self.max_batch = backend, max_batch
        self.waiting: queue.Queue[tuple[Request, Future]] = queue.Queue()
        threading.Thread(target=self.loop, daemon=True, name="batcher").start()

    def submit(self, request: Request) -> Completion:
        future: Future = Future()
        self.waiting.put((request, future))
        return future.result()

    def loop(self) -> None:
        while True:
            batch = [self.waiting.get()]
            deadline = time.monotonic() + GATHER_S
            while len(batch) < self.max_batch and (left := deadline - time.monotonic()) > 0:
                try:
                    batch.append(self.waiting.get(timeout=left))
                except queue.Empty:
                    break
            self.run(batch)

    def run(self, batch: list[tuple[Request, Future]]) -> None:
        try:
            completions = self.backend.generate([request for request, _ in batch])
        except Exception as err:  # noqa: BLE001 - the clients get a 500 each, the server lives on
            for _, future in batch:
                future.set_exception(err)
            return
        for (_, future), completion in zip(batch, completions):
            future.set_result(completion)


class Script:
    """Scripted answers: a JSON list of rules, the first that matches a request answers it.

    A rule: {"match": "a substring of the last user message" ("" or absent: any request),
    "times": N (answer only the first N matches; absent: always), "status": 200, "text": "the
    answer; {echo} is the user message after its last 'Text:' line", "finish_reason": "stop",
    "retry_after": "1" (sent with the status)}. A request that no rule matches is echoed.
    """

    def __init__(self, rules: list[dict]):
        self.rules, self.used, self.lock = rules, Counter(), threading.Lock()

    def answer(self, request: Request) -> dict:
        prompt = next((m["content"] for m in reversed(request.messages) if m["role"] == "user"), "")
        with self.lock:
            for k, rule in enumerate(self.rules):
                if rule.get("match", "") in prompt and self.used[k] < rule.get("times", float("inf")):
                    self.used[k] += 1
                    break
            else:
                rule = {}
        echo = prompt.rsplit("Text:\n", 1)[-1].strip()
        return {"status": 200, "text": "{echo}", "finish_reason": "stop", **rule,
                "content": rule.get("text", "{echo}").replace("{echo}", echo)}


class Handler(BaseHTTPRequestHandler):
    server: ModelServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet: tests read stdout for the ready line
        pass

    def do_GET(self) -> None:
        if self.path.rstrip("/") != "/v1/models":
            return self.reply(404, error(f"no route {self.path}", "NotFoundError"))
        self.reply(200, {"object": "list", "data": [{"id": self.server.model_name, "object": "model",
                                                      "owned_by": "datapipe"}]})

    def do_POST(self) -> None:
        if self.path.rstrip("/") != "/v1/chat/completions":
            return self.reply(404, error(f"no route {self.path}", "NotFoundError"))
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            request = Request(body["messages"], int(body.get("max_tokens") or 256),
                              float(body.get("temperature", 0.0)), float(body.get("top_p", 1.0)))
        except (ValueError, KeyError, TypeError) as err:
            return self.reply(400, error(f"bad request: {err}", "BadRequestError"))
        if body.get("model") != self.server.model_name:
            return self.reply(404, error(f"The model `{body.get('model')}` does not exist.", "NotFoundError"))
        if self.server.count_request() == "malformed":
            return self.reply(200, b'{"id": "x", "choices": [{"message": ')
        time.sleep(self.server.latency_s)
        if self.server.script is not None:
            return self.scripted(self.server.script.answer(request))
        try:
            completion = self.server.batcher.submit(request)
        except Exception as err:  # noqa: BLE001 - reported to the client as a server error, which it retries
            return self.reply(500, error(f"generation failed: {type(err).__name__}: {err}", "InternalServerError"))
        self.answer(completion)

    def answer(self, completion: Completion) -> None:
        if completion.error == CONTEXT_OVERFLOW:
            return self.reply(400, error(f"This model's maximum context length is exceeded: {completion.detail}",
                                         "BadRequestError"))
        self.reply(200, chat_completion(self.server.model_name, completion))

    def scripted(self, rule: dict) -> None:
        if rule["status"] != 200:
            headers = {"Retry-After": str(rule["retry_after"])} if rule.get("retry_after") is not None else {}
            return self.reply(rule["status"], error(f"scripted HTTP {rule['status']}", "ScriptedError"), headers)
        text = rule["content"]
        self.answer(Completion(text=text, output_tokens=len(text.split()), finish_reason=rule["finish_reason"]))

    def reply(self, status: int, payload: dict | bytes, headers: dict[str, str] | None = None) -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class ModelServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # listen backlog: 64+ clients connect at once

    def __init__(self, address, batcher: Batcher | None, model_name: str, die_after: int = 0, malformed_after: int = 0):
        super().__init__(address, Handler)
        self.batcher, self.model_name = batcher, model_name
        self.die_after, self.malformed_after, self.served = die_after, malformed_after, 0
        self.lock = threading.Lock()
        self.script: Script | None = None
        self.latency_s = 0.0

    def count_request(self) -> str:
        """Failure tests: 'malformed' past --malformed-after; past --die-after the process exits
        at once, like a crash (the client sees its connection reset, then refused)."""
        with self.lock:
            self.served += 1
            if self.die_after and self.served > self.die_after:
                os._exit(3)
            return "malformed" if self.malformed_after and self.served > self.malformed_after else "ok"


def error(message: str, kind: str) -> dict:
    return {"object": "error", "message": message, "type": kind, "error": {"message": message, "type": kind}}


def chat_completion(model: str, completion: Completion) -> dict:
    return {
        "id": f"chatcmpl-{time.monotonic_ns()}", "object": "chat.completion", "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": completion.text},
                     "finish_reason": completion.finish_reason or "stop"}],
        "usage": {"completion_tokens": completion.output_tokens},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m datapipe.llm.server", description=__doc__.splitlines()[0],
                                     epilog="example:\n  python -m datapipe.llm.server --port 8000   # then a recipe's "
                                     "rephrase backend: {type: openai, base_url: http://127.0.0.1:8000/v1}",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed at start)")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="packaged model name or a model folder")
    parser.add_argument("--served-name", default=None, help="the name clients ask for (default: --model)")
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--max-context", type=int, default=None)
    parser.add_argument("--die-after", type=int, default=0, help="failure tests: exit at request N+1, like a crash")
    parser.add_argument("--malformed-after", type=int, default=0, help="failure tests: answer broken JSON from request N+1 on")
    parser.add_argument("--script", type=Path, help="answer as this JSON file of rules says; no model is loaded")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="wait this long before each answer")
    args = parser.parse_args(argv)
    batcher = None
    if args.script is None:
        from datapipe.llm.local import LocalBackend

        batcher = Batcher(LocalBackend(BackendConfig(model=args.model, max_batch=args.max_batch, threads=args.threads,
                                                     max_context=args.max_context)), args.max_batch)
    server = ModelServer((args.host, args.port), batcher, args.served_name or args.model,
                         args.die_after, args.malformed_after)
    server.script = Script(json.loads(args.script.read_text())) if args.script else None
    server.latency_s = args.latency_ms / 1000
    print(f"serving {server.model_name} on http://{args.host}:{server.server_address[1]}/v1", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
