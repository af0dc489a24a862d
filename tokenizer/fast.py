"""The fast encoder: tiktoken over ranks exported from our tokenizer.json, same ids.

HF `tokenizers` encodes at well under 1 MB/s per core on this machine; tiktoken runs the
same byte-level BPE several times faster (bench/tokenize_speed.py measures it). They agree
because tokenizer/bpe.py lays the tokenizer out as a tiktoken vocabulary (id = rank,
merges derived from ranks, whole-piece lookup first) and both engines split with the
same K2 pattern.

The ranks file sits next to the tokenizer: DIR/tokenizer.json -> DIR/tokenizer.tiktoken,
one `base64(token_bytes) rank` line per BPE token (tiktoken's own format, also what K2
ships as tiktoken.model). It is read from local disk only; tiktoken's loader is not used
because it caches files by path in /tmp, which would serve a stale file after a retrain.
Loading checks the ranks against tokenizer.json's vocabulary, so the two cannot drift; a
tokenizer.json without its ranks file gets the same ranks derived in memory.
"""
from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np

from tokenizer.bpe import byte_level_chars, tokenizer_path


def ranks_path(tokenizer_json: Path) -> Path:
    return tokenizer_json.with_suffix(".tiktoken")


def export_ranks(tokenizer_json: Path) -> Path:
    """Write the tiktoken ranks file beside a byte-level BPE tokenizer.json."""
    ranks = ranks_from_json(json.loads(Path(tokenizer_json).read_text(encoding="utf-8")))
    out = ranks_path(Path(tokenizer_json))
    lines = [f"{base64.b64encode(token).decode()} {rank}\n" for token, rank in sorted(ranks.items(), key=lambda kv: kv[1])]
    out.write_text("".join(lines), encoding="ascii")
    return out


def read_ranks(path: Path) -> dict[bytes, int]:
    ranks = {}
    for line in path.read_text(encoding="ascii").splitlines():
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    return ranks


def ranks_from_json(spec: dict) -> dict[bytes, int]:
    """tokenizer.json's BPE vocabulary as bytes -> rank; raises for a non-byte-level model."""
    byte_of = {char: byte for byte, char in byte_level_chars().items()}
    vocab = spec["model"].get("vocab") or {}
    try:
        return {bytes(byte_of[c] for c in token): rank for token, rank in vocab.items()}
    except KeyError:
        raise ValueError("tokenizer.json is not a byte-level BPE: the fast path needs one trained by "
                         "`datapipe tokenizer train`") from None


def split_pattern(spec: dict) -> str:
    pre = spec.get("pre_tokenizer") or {}
    for step in pre.get("pretokenizers", [pre]):
        if step.get("type") == "Split" and "Regex" in step["pattern"]:
            return step["pattern"]["Regex"]
    raise ValueError("tokenizer.json has no Split pre-tokenizer: retrain it with `datapipe tokenizer train`")


class FastEncoder:
    """Plain text -> ids with tiktoken; special-token strings in the text stay plain text."""

    def __init__(self, name_or_path: str | Path):
        import tiktoken

        path = tokenizer_path(name_or_path)
        spec = json.loads(path.read_text(encoding="utf-8"))
        ranks = load_checked_ranks(path, spec)
        specials = {added["content"]: added["id"] for added in spec["added_tokens"]}
        self.encoding = tiktoken.Encoding(path.stem, pat_str=split_pattern(spec), mergeable_ranks=ranks,
                                          special_tokens=specials)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """uint32 ids per text. One thread: a Ray actor reserves one CPU."""
        return [self.encode(text) for text in texts]

    def encode(self, text: str) -> np.ndarray:
        # encode_to_numpy with no allowed specials is encode_ordinary straight into an array
        # (~10% faster than building a list); it raises on lone surrogates, which are rare.
        try:
            return self.encoding.encode_to_numpy(text, allowed_special=set(), disallowed_special=())
        except UnicodeEncodeError:
            return self.encode(replace_surrogates(text))


class HFEncoder:
    """The reference: HF `tokenizers` on the same tokenizer.json (what the fast path must equal)."""

    def __init__(self, name_or_path: str | Path):
        from tokenizer.bpe import load_tokenizer

        self.tokenizer = load_tokenizer(name_or_path)
        self.tokenizer.encode_special_tokens = True  # "<|eos|>" typed in a document is text, not EOS

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        clean = [replace_surrogates(text) for text in texts]
        encodings = self.tokenizer.encode_batch(clean, add_special_tokens=False)
        return [np.array(encoding.ids, dtype=np.uint32) for encoding in encodings]


def replace_surrogates(text: str) -> str:
    """Lone surrogates (legal in JSON, not in UTF-8) -> U+FFFD, as tiktoken's encode() does; HF raises on them."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def make_encoder(name_or_path: str | Path, fast: bool = True) -> FastEncoder | HFEncoder:
    return FastEncoder(name_or_path) if fast else HFEncoder(name_or_path)


def load_checked_ranks(path: Path, spec: dict) -> dict[bytes, int]:
    """The ranks file, checked against tokenizer.json; derived from tokenizer.json when absent."""
    if not spec["model"].get("ignore_merges"):
        raise ValueError(f"{path} was not laid out for tiktoken (ignore_merges is off): retrain it with "
                         "`datapipe tokenizer train`, or set `fast: false` on the tokenize stage to use HF tokenizers")
    expected = ranks_from_json(spec)
    ranks_file = ranks_path(path)
    if not ranks_file.is_file():
        return expected  # the same ranks `datapipe tokenizer export` would write
    ranks = read_ranks(ranks_file)
    if ranks != expected:
        raise ValueError(f"{ranks_file} does not match {path} (retrained since?): "
                         f"rewrite it with `datapipe tokenizer export {path}`")
    return ranks
