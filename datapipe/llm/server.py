"""A small OpenAI-compatible server for the local model: `python -m datapipe.llm.server`.

GET /v1/models and POST /v1/chat/completions, the subset that the openai backend (and most
clients) use, with the error shapes vLLM answers: 404 for an unknown model, 400 with
"maximum context length" for a prompt that does not fit. The HTTP side is one asyncio loop
(aiohttp.web: a waiting request costs no thread; ~0.3 ms of CPU a request, so a 300 ms latency
holds thousands in flight on one core; http.server's thread per connection added ~50 ms to each
answer at 64 in flight on the shared 2-core machine, this ~20 ms); a batcher thread collects
the requests waiting at that moment (up to --max-batch, after a 20 ms gather window) into one
generate() call, so concurrent clients share batches as they would on vLLM. It exists for tests, demos and machines without vLLM; --die-after and
--malformed-after make it fail on purpose, for failure tests. With --script FILE it loads no
model and answers as the file says (datapipe.llm.server.Script: a status, a text, a finish reason,
a Retry-After, per matching prompt), after --latency-ms: the failure tests and the client
benchmark (a server of fixed latency that never saturates) use it.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import sys
import threading
import time
from collections import Counter
from concurrent.futures import Future
from pathlib import Path

from datapipe.llm.base import CONTEXT_OVERFLOW, BackendConfig, Completion, Request

GATHER_S = 0.02  # how long the batcher waits for more requests after the first


class Batcher:
    """Turns concurrent single requests into batched generate() calls on one thread."""

    def __init__(self, backend, max_batch: int):
        self.backend, self.max_batch = backend, max_batch
        self.waiting: queue.Queue[tuple[Request, Future]] = queue.Queue()
        threading.Thread(target=self.loop, daemon=True, name="batcher").start()

    def submit(self, request: Request) -> Future:
        future: Future = Future()
        self.waiting.put((request, future))
        return future

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


class ModelServer:
    """The HTTP side on one asyncio loop (aiohttp.web): a request waits for its latency with
    asyncio.sleep and for the model on the batcher's thread, never holding a thread of its own."""

    def __init__(self, batcher: Batcher | None, model_name: str, die_after: int = 0, malformed_after: int = 0):
        self.batcher, self.model_name = batcher, model_name
        self.die_after, self.malformed_after, self.served = die_after, malformed_after, 0
        self.script: Script | None = None
        self.latency_s = 0.0

    def app(self):
        from aiohttp import web

        app = web.Application(client_max_size=64 << 20)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_route("*", "/{tail:.*}", self.no_route)
        return app

    async def no_route(self, http_request):
        return reply(404, error(f"no route {http_request.path}", "NotFoundError"))

    async def models(self, http_request):
        return reply(200, {"object": "list", "data": [{"id": self.model_name, "object": "model", "owned_by": "datapipe"}]})

    async def chat(self, http_request):
        try:
            body = json.loads(await http_request.read())
            request = Request(body["messages"], int(body.get("max_tokens") or 256),
                              float(body.get("temperature", 0.0)), float(body.get("top_p", 1.0)))
        except (ValueError, KeyError, TypeError) as err:
            return reply(400, error(f"bad request: {err}", "BadRequestError"))
        if body.get("model") != self.model_name:
            return reply(404, error(f"The model `{body.get('model')}` does not exist.", "NotFoundError"))
        if self.count_request() == "malformed":
            return reply(200, b'{"id": "x", "choices": [{"message": ')
        await asyncio.sleep(self.latency_s)
        if self.script is not None:
            return self.scripted(self.script.answer(request))
        try:
            completion = await asyncio.wrap_future(self.batcher.submit(request))
        except Exception as err:  # noqa: BLE001 - reported to the client as a server error, which it retries
            return reply(500, error(f"generation failed: {type(err).__name__}: {err}", "InternalServerError"))
        return self.answer(completion)

    def answer(self, completion: Completion):
        if completion.error == CONTEXT_OVERFLOW:
            return reply(400, error(f"This model's maximum context length is exceeded: {completion.detail}",
                                    "BadRequestError"))
        return reply(200, chat_completion(self.model_name, completion))

    def scripted(self, rule: dict):
        if rule["status"] != 200:
            headers = {"Retry-After": str(rule["retry_after"])} if rule.get("retry_after") is not None else {}
            return reply(rule["status"], error(f"scripted HTTP {rule['status']}", "ScriptedError"), headers)
        text = rule["content"]
        return self.answer(Completion(text=text, output_tokens=len(text.split()), finish_reason=rule["finish_reason"]))

    def count_request(self) -> str:
        """Failure tests: 'malformed' past --malformed-after; past --die-after the process exits
        at once, like a crash (the client sees its connection reset, then refused)."""
        self.served += 1
        if self.die_after and self.served > self.die_after:
            os._exit(3)
        return "malformed" if self.malformed_after and self.served > self.malformed_after else "ok"


def reply(status: int, payload: dict | bytes, headers: dict[str, str] | None = None):
    from aiohttp import web

    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return web.Response(status=status, body=data, headers=headers, content_type="application/json")


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
    server = ModelServer(batcher, args.served_name or args.model, args.die_after, args.malformed_after)
    server.script = Script(json.loads(args.script.read_text())) if args.script else None
    server.latency_s = args.latency_ms / 1000
    asyncio.run(serve(server, args.host, args.port))


async def serve(server: ModelServer, host: str, port: int) -> None:
    from aiohttp import web

    runner = web.AppRunner(server.app(), access_log=None)  # quiet: tests read stdout for the ready line
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024)  # 64+ clients connect at once
    await site.start()
    port = runner.addresses[0][1]  # the free port the OS picked for --port 0
    print(f"serving {server.model_name} on http://{host}:{port}/v1", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    sys.exit(main())
