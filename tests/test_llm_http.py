"""The OpenAI-compatible backend against a real server process serving the real local model.

`python -m datapipe.llm.server` runs SmolLM2-135M on localhost; the backend speaks to it over
HTTP exactly as it would to vLLM. The failures are real too: a port with no server, a model
name the server does not serve, a server that breaks its replies, and one that dies mid-run.
"""
import json
import socket
import time

import pytest

from datapipe.llm.base import CONTEXT_OVERFLOW, BackendConfig, BackendError, Request
from datapipe.llm.openai_http import OpenAIBackend
from datapipe.schema import new_document
from datapipe.text.rephrase import Config, make_stage
from tests.llm_helpers import PLAIN_STYLES, embedder, start_server, stop_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server():
    process, url = start_server("--max-context", "256")
    yield url
    stop_server(process)


def client(url: str, **fields) -> OpenAIBackend:
    return OpenAIBackend(BackendConfig(type="openai", base_url=url, **fields))


def ask(text: str, max_new_tokens: int = 10) -> Request:
    return Request([{"role": "user", "content": text}], max_new_tokens)


def test_generates_through_the_server_and_maps_context_errors(server):
    out = client(server, concurrency=4).generate(
        [ask("What is the capital of France?"), ask("word " * 300), ask("Name a colour.", 4)])
    assert [c.error for c in out] == ["", CONTEXT_OVERFLOW, ""]
    assert "maximum context length" in out[1].detail
    assert out[0].text and 0 < out[0].output_tokens <= 10
    assert 0 < out[2].output_tokens <= 4


def test_wrong_model_name_says_what_is_served(server):
    with pytest.raises(BackendError, match=r"serves \['smollm2-135m-instruct'\], not 'gpt-4'; set backend.model"):
        client(server, model="gpt-4")


def test_server_down_says_how_to_start_it():
    with socket.socket() as probe:  # a port that nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(BackendError, match=rf"cannot reach .*127.0.0.1:{port}/v1.*datapipe.llm.server"):
        client(f"http://127.0.0.1:{port}/v1")


def test_malformed_replies_and_a_server_death_reject_with_reasons_and_the_stage_finishes():
    # Request 1 is served, 2 and 3 (a retry) get broken JSON, request 4 kills the server.
    process, url = start_server("--malformed-after", "1", "--die-after", "3")
    try:
        cfg = Config(stage="rephrase", styles=PLAIN_STYLES, rewrites=1, style_retries=0, max_new_tokens=24,
                     backend={"type": "openai", "base_url": url, "concurrency": 1, "max_retries": 1, "backoff_s": 0.05})
        docs = [new_document("web", str(i), f"Lake number {i} is {i + 2} kilometres long.") for i in range(3)]
        out = make_stage(cfg, embedder=embedder())(docs)
        assert process.wait(timeout=60) == 3  # it really died
    finally:
        stop_server(process)
    originals = {d["id"]: d for d in out if not d["derived_from"]}
    assert sorted(originals) == ["web/0", "web/1", "web/2"]  # every input comes back, kept: no rewrite of 1, 2 passed
    failed = {d["derived_from"]: d for d in out if d["derived_from"]}
    # Retries interleave (a coroutine per rewrite), so which of 1 and 2 saw the broken JSON and
    # which the dead server varies; the reasons and the tries do not.
    assert {failed[i]["reject"] for i in ("web/1", "web/2")} <= {"rephrase.malformed_response", "rephrase.backend_error"}
    assert all("after 2 tries" in failed[i]["notes"]["rephrase"]["attempts"][0]["detail"] for i in ("web/1", "web/2"))
    assert originals["web/2"]["notes"]["rephrase"]["no_rewrite_passed"][0] in ("backend_error", "malformed_response")
    assert not originals["web/2"]["reject"] and originals["web/2"]["text"] == docs[2]["text"]
    with pytest.raises(BackendError, match="cannot reach"):
        client(url)


def scripted(tmp_path, rules: list[dict], *args: str):
    path = tmp_path / "script.json"
    path.write_text(json.dumps(rules))
    return start_server("--script", str(path), *args)


EIFFEL = "The Eiffel Tower in Paris was completed in 1889. It is 330 metres tall and stands on the Champ de Mars."
GOOD = "Completed in 1889, the Eiffel Tower in Paris stands 330 metres tall on the Champ de Mars."
FAILURES = [  # (marker in the source, the scripted answer, the reject it must earn)
    ("Alpha", {"text": "Completed in 1889, the Eiffel", "finish_reason": "length"}, "truncated"),
    ("Bravo", {"text": GOOD + " It is tall." * 8}, "loop"),
    ("Charlie", {"text": "Der Eiffelturm in Paris wurde 1889 fertiggestellt und ist 330 Meter hoch auf dem Marsfeld."},
     "language_switch"),
    ("Delta", {"text": GOOD.replace("1889", "1898")}, "numbers_dropped"),
    ("Echo", {"text": GOOD.replace("Paris", "Lyon")}, "names_invented"),  # 2 of 3 names kept: recall passes
    ("Foxtrot", {"text": GOOD.replace("stands", "does not stand")}, "negation"),
    ("Golf", {"text": GOOD}, "judge"),  # the judge scores it 1
]


def test_each_scripted_failure_ends_as_its_named_reject_with_the_answer_kept(tmp_path):
    rules = [{"match": f"REWRITE:\n{GOOD}\n\nScore", "text": "1", "times": 1}, {"match": "Score (1-5)", "text": "5"}]
    rules += [{"match": f"{marker}:", **answer} for marker, answer, _ in FAILURES] + [{"text": GOOD}]
    process, url = scripted(tmp_path, rules)
    docs = [new_document("web", marker, f"{marker}: {EIFFEL}") for marker, _, _ in FAILURES]
    try:
        cfg = Config(stage="rephrase", styles=PLAIN_STYLES, rewrites=1, style_retries=0,
                     fidelity={"min_cosine": None, "judge": {}},
                     backend={"type": "openai", "base_url": url, "concurrency": 4})
        out = make_stage(cfg)(docs)
    finally:
        stop_server(process)
    rejects = {d["derived_from"]: d for d in out if d["derived_from"]}
    for marker, answer, reason in FAILURES:
        reject = rejects[f"web/{marker}"]
        assert reject["reject"] == f"rephrase.{reason}", (marker, reject["notes"]["rephrase"]["attempts"])
        attempt = reject["notes"]["rephrase"]["attempts"][0]
        assert attempt["answer"] == answer["text"] == reject["text"]  # the refused rewrite, in full
        assert reason in attempt["scores"] and attempt["reason"] == reason
    kept = [d for d in out if not d["derived_from"]]
    assert [d["text"] for d in kept] == [d["text"] for d in docs] and not any(d["reject"] for d in kept)


def test_an_answer_that_repeats_its_context_is_rejected(tmp_path):
    first, second = "Alpha: the first part has 12 rooms.", "Bravo: the second part has 30 doors."
    rules = [{"match": "Text:\nAlpha", "text": "The first part holds 12 rooms."},
             {"match": "Text:\nBravo", "text": "The first part holds 12 rooms. The second part holds 30 doors."}]
    process, url = scripted(tmp_path, rules)
    try:
        cfg = Config(stage="rephrase", styles=PLAIN_STYLES, rewrites=1, style_retries=0, chunk_tokens=16,
                     fidelity={"min_cosine": None, "max_context_overlap": 0.5},
                     backend={"type": "openai", "base_url": url, "tokenizer": None})
        out = make_stage(cfg)([new_document("web", "0", f"{first}\n\n{second}")])
    finally:
        stop_server(process)
    assert out[1]["reject"] == "rephrase.repeats_context" and out[1]["notes"]["rephrase"]["attempts"][0]["chunk"] == 1


def test_the_circuit_breaker_stops_a_run_against_a_failing_server(tmp_path):
    process, url = scripted(tmp_path, [{"status": 500}])
    try:
        cfg = Config(stage="rephrase", styles=PLAIN_STYLES, rewrites=1,
                     backend={"type": "openai", "base_url": url, "max_retries": 1, "backoff_s": 0.01})
        docs = [new_document("web", str(i), f"Lake {i} is {i} km long.") for i in range(30)]
        with pytest.raises(BackendError, match=r"circuit breaker open: \d+ of the last \d+ requests"):
            make_stage(cfg)(docs)
    finally:
        stop_server(process)


def test_retry_after_is_honoured(tmp_path):
    process, url = scripted(tmp_path, [{"status": 429, "retry_after": "1", "times": 1}])
    try:
        backend = client(url, max_retries=2, backoff_s=0.0)  # no backoff of its own: only the server's pause
        started = time.monotonic()
        out = backend.generate([ask("Text:\nhello there")])
        waited = time.monotonic() - started
    finally:
        stop_server(process)
    assert out[0].error == "" and out[0].text == "hello there"
    assert 0.9 <= waited < 10  # loose: the pause the server asked for, not the 0 s backoff


def test_waiting_requests_are_admitted_lowest_priority_first():
    import asyncio

    from datapipe.llm.client import Limit

    async def admitted_order() -> list[int]:
        limit, order = Limit(1), []
        await limit.acquire(0)  # the one slot is taken: the others wait

        async def wait(priority: int) -> None:
            await limit.acquire(priority)
            order.append(priority)
            limit.release()
        waiters = [asyncio.create_task(wait(p)) for p in (5, 1, 3, 1)]
        cancelled = asyncio.create_task(wait(0))
        await asyncio.sleep(0)
        cancelled.cancel()  # a cancelled waiter gives its turn on
        await asyncio.sleep(0)
        limit.release()
        await asyncio.gather(*waiters)
        return order + [limit.free]
    assert asyncio.run(admitted_order()) == [1, 1, 3, 5, 1]  # then the slot is free again
