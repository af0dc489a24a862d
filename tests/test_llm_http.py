"""The OpenAI-compatible backend against a real server process serving the real local model.

`python -m datapipe.llm.server` runs SmolLM2-135M on localhost; the backend speaks to it over
HTTP exactly as it would to vLLM. The failures are real too: a port with no server, a model
name the server does not serve, a server that breaks its replies, and one that dies mid-run.
"""
import socket

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
    assert [d["id"] for d in out] == ["web/0", "web/1", "web/2"]  # every input comes back
    assert out[0]["reject"] in ("", "rephrase.fidelity_low")
    assert out[0]["notes"]["rephrase"]["output_tokens"] > 0
    assert out[1]["reject"] == "rephrase.malformed_response"
    assert out[2]["reject"] == "rephrase.backend_error"
    assert "after 2 tries" in out[2]["notes"]["rephrase"]["attempts"][0]["detail"]
    with pytest.raises(BackendError, match="cannot reach"):
        client(url)
