"""Chunking and stitching with the real SmolLM2 tokenizer: nothing lost, nothing over the limit."""
import pytest

from datapipe.llm.chunking import split_chunks, split_many, stitch

PARAGRAPH = ("The Eiffel Tower was completed in 1889. It is 330 metres tall. Gustave Eiffel's company built it "
             "for the World's Fair, and it was the tallest structure in the world for 41 years.")


@pytest.fixture(scope="module")
def count():
    from tokenizers import Tokenizer

    from datapipe.llm.packaged import SMOLLM2, model_dir

    tokenizer = Tokenizer.from_file(str(model_dir(SMOLLM2) / "tokenizer.json"))
    return lambda texts: [len(e.ids) for e in tokenizer.encode_batch(texts, add_special_tokens=False)]


def test_short_document_is_one_chunk(count):
    assert split_chunks(PARAGRAPH, 256, count) == [PARAGRAPH]
    assert split_chunks("", 256, count) == []


def test_chunks_cover_the_text_exactly_and_fit_the_limit(count):
    text = "\n\n".join(f"Part {i}. " + PARAGRAPH for i in range(12)) + "\n" + "word " * 300
    for limit in (16, 64, 256):
        chunks = split_chunks(text, limit, count)
        assert "".join(chunks) == text
        assert max(count(chunks)) <= limit
        assert len(chunks) >= sum(count([text])) // limit


def test_paragraph_boundaries_come_first(count):
    text = "\n\n".join(f"Section {i}. " + PARAGRAPH for i in range(4))
    size = count([f"Section 0. {PARAGRAPH}\n\n"])[0]
    chunks = split_chunks(text, size + 2, count)
    assert len(chunks) == 4
    assert all(chunk.startswith("Section") for chunk in chunks)


def test_sentences_split_before_words(count):
    chunks = split_chunks(PARAGRAPH, 20, count)
    assert chunks[0] == "The Eiffel Tower was completed in 1889. "  # a whole sentence, not 20 tokens of words
    assert all(chunk.endswith((". ", " ")) or chunk == chunks[-1] for chunk in chunks)
    long_sentence = "Gustave Eiffel's company built it for the World's Fair, and it was the tallest structure in the world"
    assert count([long_sentence])[0] > 20  # so that sentence had to go at word boundaries


def test_run_without_spaces_is_halved_until_it_fits(count):
    blob = "QUJDRA" * 400  # base64-like: no boundary anywhere
    chunks = split_chunks(blob, 50, count)
    assert "".join(chunks) == blob
    assert max(count(chunks)) <= 50


def test_split_many_gives_each_text_the_chunks_of_split_chunks(count):
    texts = ["", PARAGRAPH, "QUJDRA" * 400, "\n\n".join(f"Part {i}. " + PARAGRAPH for i in range(5)) + " word" * 90]
    for limit in (20, 64, 256):
        assert split_many(texts, limit, count) == [split_chunks(text, limit, count) for text in texts]
    assert split_many([], 64, count) == []


def test_the_http_backend_sizes_chunks_with_the_served_models_own_tokenizer(count):
    from datapipe.llm.base import BackendError
    from datapipe.llm.openai_http import load_tokenizer
    from datapipe.llm.packaged import SMOLLM2, model_dir

    texts = [PARAGRAPH, "La Torre Eiffel se terminó en 1889 y mide 330 metros de altura."]

    def sizes(tokenizer):
        return [len(e.ids) for e in tokenizer.encode_batch(texts, add_special_tokens=False)]
    assert sizes(load_tokenizer(None, SMOLLM2)) == count(texts)  # the served model is the packaged one
    assert sizes(load_tokenizer(str(model_dir(SMOLLM2) / "tokenizer.json"), "served-elsewhere")) == count(texts)
    assert load_tokenizer(None, "Qwen/Qwen2.5-7B-Instruct") is None  # unknown here: 4 characters a token
    with pytest.raises(BackendError, match="local files only, never a hub"):
        load_tokenizer("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B-Instruct")  # named, so it must load


def test_stitch_reuses_each_chunks_break():
    sources = ["First para.\n\n", "Second line.\n", "Third sentence. ", "Last."]
    rewrites = ["One.", " Two. ", "Three.", "Four."]
    assert stitch(rewrites, sources) == "One.\n\nTwo.\nThree. Four."
