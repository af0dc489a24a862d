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
def test_rows_keep_their_own_sampling_greedy_rows_are_greedy_and_sampling_is_seeded():
    backend = local_backend()
    question = [{"role": "user", "content": "What is the capital of France?"}]
    batch = [Request(question, 10), ask("Write a word about the sea.", 8, 1.0), ask("Write a word about trees.", 8, 1.0)]
    first, again = backend.generate(batch), backend.generate(batch)
    assert [c.text for c in first] == [c.text for c in again]  # same batch, same seed, same text
    prompt = backend.tokenizer.apply_chat_template(question, tokenize=False, add_generation_prompt=True)
    encoded = backend.tokenizer([prompt], return_tensors="pt", add_special_tokens=False)
    greedy = backend.lm.generate(**encoded, max_new_tokens=10, do_sample=False, pad_token_id=backend.tokenizer.pad_token_id)
    assert first[0].text == backend.tokenizer.decode(greedy[0, encoded["input_ids"].shape[1]:], skip_special_tokens=True)


def test_token_counts_come_from_the_models_tokenizer():
    backend = local_backend()
    assert backend.count_tokens(["", "hello world", " ".join(["hello world"] * 10)]) == [0, 2, 20]
