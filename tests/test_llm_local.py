"""The local backend with the real SmolLM2-135M-Instruct on CPU: batches, limits, seeds."""
import pytest

from datapipe.llm.base import CONTEXT_OVERFLOW, Request
from tests.llm_helpers import local_backend


def ask(text: str, max_new_tokens: int = 12, temperature: float = 0.0) -> Request:
    return Request([{"role": "user", "content": text}], max_new_tokens, temperature)


@pytest.mark.slow
def test_batch_answers_each_request_in_order_and_refuses_what_cannot_fit():
    backend = local_backend()
    too_long = ask("word " * 8300)  # 8,300 tokens + 12 new > the 8,192-token context
    out = backend.generate([ask("What is the capital of France?"), too_long, ask("Name a colour.", 5)])
    assert [c.error for c in out] == ["", CONTEXT_OVERFLOW, ""]
    assert "8192-token context" in out[1].detail
    assert out[0].text and 0 < out[0].output_tokens <= 12 and out[0].finish_reason in ("stop", "length")
    assert 0 < out[2].output_tokens <= 5  # each request keeps its own limit inside a shared batch
    assert backend.model == "SmolLM2-135M-Instruct" and backend.context == 8192


@pytest.mark.slow
def test_sampling_is_seeded():
    backend = local_backend()
    batch = [ask("Write a word about the sea.", 8, temperature=1.0), ask("Write a word about trees.", 8, 1.0)]
    assert [c.text for c in backend.generate(batch)] == [c.text for c in backend.generate(batch)]


def test_token_counts_come_from_the_models_tokenizer():
    backend = local_backend()
    assert backend.count_tokens(["", "hello world", " ".join(["hello world"] * 10)]) == [0, 2, 20]
