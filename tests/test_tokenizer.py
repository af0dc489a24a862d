"""Training and laying out the K2-style tokenizer, its ranks file, and the CLI that writes both."""
import base64
import json

import pytest

from datapipe import cli
from tests.conftest import write_jsonl
from tokenizer.bpe import SPECIAL_TOKENS, load_tokenizer, special_token_ids, train_tokenizer
from tokenizer.fast import FastEncoder, HFEncoder, export_ranks, load_checked_ranks, ranks_path, read_ranks
from tokenizer.pretokenize import hf_pre_tokenizer


def pieces(text: str) -> list[str]:
    """The K2 pre-tokenizer's pieces, as text (the byte-level mapping undone)."""
    pre = hf_pre_tokenizer()
    spans = pre.pre_tokenize_str(text)
    return [text[start:stop] for _, (start, stop) in spans]


def test_han_runs_split_from_other_letters():
    assert pieces("数据管道test流水线") == ["数据管道", "test", "流水线"]
    assert pieces("ひらがな漢字カタカナ") == ["ひらがな", "漢字", "カタカナ"]


def test_digits_group_by_at_most_three():
    assert pieces("1234567") == ["123", "456", "7"]
    assert pieces("v2024") == ["v", "202", "4"]


def test_contractions_and_case_runs_stay_with_their_word():
    assert pieces("they're HTTPResponse DON'T") == ["they're", " HTTPResponse", " DON'T"]


def test_punctuation_runs_and_newlines():
    # one leading punctuation mark joins a word ("(a"); a run stays whole with the newlines after it
    assert pieces("x = f(a);\n\n    return") == ["x", " =", " f", "(a", ");\n\n", "   ", " return"]


def test_special_tokens_follow_the_bpe_ranks(tiny_tokenizer):
    ids = special_token_ids(tiny_tokenizer)
    ranks = read_ranks(ranks_path(tiny_tokenizer))
    assert set(ids) == set(SPECIAL_TOKENS)
    assert sorted(ids.values()) == list(range(len(ranks), len(ranks) + len(SPECIAL_TOKENS)))
    # 512 // 8 = 64 reserved ids; the tiny corpus runs out of merges before 512 - 64 BPE tokens
    assert load_tokenizer(tiny_tokenizer).get_vocab_size() == len(ranks) + 64


def test_ranks_are_bytes_then_merges_and_ids_equal_ranks(tiny_tokenizer):
    ranks = read_ranks(ranks_path(tiny_tokenizer))
    assert [ranks[bytes([b])] for b in range(256)] == list(range(256))
    assert sorted(ranks.values()) == list(range(len(ranks)))
    vocab = load_tokenizer(tiny_tokenizer).get_vocab()
    assert all(vocab[token] < len(ranks) for token in vocab if not token.startswith("<|"))


def same_on_both_paths(tokenizer, text: str) -> bool:
    return FastEncoder(tokenizer).encode_batch([text])[0].tolist() == HFEncoder(tokenizer).encode_batch([text])[0].tolist()


def test_encode_decode_round_trip(tiny_tokenizer):
    text = "packing shards\n\n  def f(x):\n\treturn 数据 café 👍🏽 <|eos|>"
    ids = FastEncoder(tiny_tokenizer).encode_batch([text])[0].tolist()
    assert load_tokenizer(tiny_tokenizer).decode(ids) == text
    assert special_token_ids(tiny_tokenizer)["<|eos|>"] not in ids  # special strings in text stay text


def test_vocab_too_small_for_the_reserved_block_is_an_error():
    with pytest.raises(ValueError, match="no room for merges"):
        train_tokenizer(["abc"], vocab_size=260)


def test_stale_ranks_file_is_refused(tmp_path, tiny_tokenizer):
    path = tmp_path / "tokenizer.json"
    path.write_text(tiny_tokenizer.read_text())
    lines = ranks_path(tiny_tokenizer).read_text().splitlines()
    swapped = lines[300].split()[0] + " 301\n" + lines[301].split()[0] + " 300\n"
    ranks_path(path).write_text("\n".join(lines[:300]) + "\n" + swapped + "\n".join(lines[302:]) + "\n")
    with pytest.raises(ValueError, match="does not match"):
        FastEncoder(path)
    export_ranks(path)
    assert same_on_both_paths(path, "packing")


def test_missing_ranks_file_is_derived_from_tokenizer_json(tmp_path, tiny_tokenizer):
    path = tmp_path / "tokenizer.json"
    path.write_text(tiny_tokenizer.read_text())
    derived = load_checked_ranks(path, json.loads(path.read_text()))
    assert derived == read_ranks(ranks_path(tiny_tokenizer))  # the ranks `datapipe tokenizer export` writes
    FastEncoder(path)
    assert not ranks_path(path).exists()  # in memory: loading writes nothing
    assert same_on_both_paths(path, "recipe stage")


def test_tokenizer_json_not_laid_out_for_tiktoken_is_refused(tmp_path, tiny_tokenizer):
    spec = json.loads(tiny_tokenizer.read_text())
    spec["model"]["ignore_merges"] = False
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec))
    with pytest.raises(ValueError, match="fast: false"):
        FastEncoder(path)


def test_cli_trains_from_jsonl_and_writes_both_files(tmp_path):
    rows = [{"text": f"line {i}: tokens 数据 {i * 7919} packed<|media|>into shards"} for i in range(300)]
    data = write_jsonl(tmp_path / "train.jsonl", rows)
    out = tmp_path / "tok"
    assert cli.main(["tokenizer", "train", str(data), "--vocab-size", "400", "--out", str(out)]) == 0
    ranks = (out / "tokenizer.tiktoken").read_text().splitlines()
    assert base64.b64decode(ranks[65].split()[0]) == b"A" and ranks[65].split()[1] == "65"
    assert "<|media|>" not in load_tokenizer(out / "tokenizer.json").get_vocab()
    assert cli.main(["tokenizer", "export", str(out / "tokenizer.json")]) == 0
    assert (out / "tokenizer.tiktoken").read_text().splitlines() == ranks


def test_bundled_demo_tokenizer_loads_on_both_paths():
    text = "def main():\n    print('hello, world')  # 1234\n"
    assert same_on_both_paths("demo", text)
    assert set(special_token_ids("demo")) == set(SPECIAL_TOKENS)
