"""Train and load byte-level BPE tokenizers laid out like Kimi K2's.

Training runs Hugging Face `tokenizers`' BpeTrainer over pieces cut by the K2
pre-tokenizer (tokenizer/pretokenize.py). The result is then re-laid-out so that it is
exactly a tiktoken vocabulary:
- ranks 0..255 are the 256 byte values, ranks 256.. the merged tokens in the order
  training created them; a token's id is its rank;
- the merge list is derived back from the ranks (every split of a token into two
  lower-ranked tokens, ordered by the merged token's rank), and `ignore_merges` is on, so
  HF's merge-pair BPE picks the same merges as tiktoken's rank-based BPE (tiktoken looks a
  whole piece up before merging; `ignore_merges` is the HF name for that);
- the special tokens come after the BPE ranks in a reserved block (K2: 163,584 BPE ranks +
  256 reserved = 163,840): SPECIAL_TOKENS first, then `<|reserved_special_token_N|>`.
  Their ids depend on the vocabulary size, so code asks special_token_ids(), never a literal.

`vocab_size` counts everything, special tokens included.
"""
from __future__ import annotations

from collections.abc import Iterable
from functools import cache
from pathlib import Path

from tokenizer.pretokenize import hf_pre_tokenizer

SPECIAL_TOKENS = [
    "<|bos|>",
    "<|eos|>",  # ends every document: the packer's document boundary
    "<|pad|>",
    "<|media_begin|>",  # opens a media span: <|media_begin|>image<|media_content|><|media_pad|>...<|media_end|>
    "<|media_content|>",
    "<|media_end|>",
    "<|media_pad|>",  # one per 28x28-pixel patch group; the vision tower's embeddings replace it
]
RESERVED_TOKEN = "<|reserved_special_token_{}|>"
K2_RESERVED = 256  # K2 reserves 256 ids after its 163,584 BPE ranks
BUNDLED = {"demo": Path(__file__).parent / "assets" / "demo.json"}  # `datapipe tokenizer train recipes/demo.yaml --vocab-size 8192`


def train_tokenizer(texts: Iterable[str], vocab_size: int, min_frequency: int = 2):
    """A K2-style byte-level BPE trained on `texts` (an iterator is fine; it is read once)."""
    num_reserved = reserved_block_size(vocab_size)
    if vocab_size - num_reserved <= 256:
        raise ValueError(f"vocab_size {vocab_size} with {num_reserved} reserved ids leaves no room for merges after "
                         f"the 256 byte tokens: use vocab_size 512 or more")
    trained = train_hf_bpe(texts, vocab_size - num_reserved, min_frequency)
    return build_tokenizer(ranks_from_trained(trained), num_reserved)


def reserved_block_size(vocab_size: int) -> int:
    """K2's 256 reserved ids, but at most 1/8 of a small test vocabulary (512 -> 64)."""
    return max(len(SPECIAL_TOKENS), min(K2_RESERVED, vocab_size // 8))


def train_hf_bpe(texts: Iterable[str], bpe_size: int, min_frequency: int):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = hf_pre_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=bpe_size,
        min_frequency=min_frequency,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes, so every string encodes
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def ranks_from_trained(trained) -> dict[bytes, int]:
    """tiktoken ranks: bytes first by value, then merged tokens in training order."""
    byte_of = {char: byte for byte, char in byte_level_chars().items()}
    by_id = sorted(trained.get_vocab().items(), key=lambda item: item[1])
    merged = [bytes(byte_of[c] for c in token) for token, _ in by_id if len(token) > 1]
    ranks = {bytes([b]): b for b in range(256)}
    for token in merged:
        ranks.setdefault(token, len(ranks))
    return ranks


def merges_from_ranks(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Every split of each token into two tokens, ordered by the merged token's rank, then by
    the parts' ranks (what tiktoken's rank-based BPE implies; transformers converts K2 alike)."""
    merges = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ranks and right in ranks:
                merges.append((rank, ranks[left], ranks[right], left, right))
    merges.sort()
    return [(left, right) for *_, left, right in merges]


def build_tokenizer(ranks: dict[bytes, int], num_reserved: int):
    """The HF tokenizer equivalent to tiktoken ranks + the K2 pattern, special tokens after the ranks."""
    from tokenizers import Tokenizer, decoders, models

    vocab = {as_byte_level(token): rank for token, rank in ranks.items()}
    merges = [(as_byte_level(left), as_byte_level(right)) for left, right in merges_from_ranks(ranks)]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True))
    tokenizer.pre_tokenizer = hf_pre_tokenizer()
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(special_token_names(num_reserved))
    return tokenizer


def special_token_names(num_reserved: int) -> list[str]:
    return SPECIAL_TOKENS + [RESERVED_TOKEN.format(i) for i in range(num_reserved - len(SPECIAL_TOKENS))]


def as_byte_level(token: bytes) -> str:
    chars = byte_level_chars()
    return "".join(chars[b] for b in token)


@cache
def byte_level_chars() -> dict[int, str]:
    """GPT-2's byte -> printable character map that byte-level tokenizer.json files use."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[byte] = chr(byte)
        else:
            chars[byte] = chr(256 + extra)
            extra += 1
    return chars


def save_tokenizer(tokenizer, out_dir: Path) -> Path:
    """Write DIR/tokenizer.json and its tiktoken ranks DIR/tokenizer.tiktoken; return the json path."""
    from tokenizer.fast import export_ranks

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "tokenizer.json"
    tokenizer.save(str(path))
    export_ranks(path)
    return path


def special_token_ids(name_or_path: str | Path) -> dict[str, int]:
    """The ids of SPECIAL_TOKENS in a tokenizer, for stages that must not hard-code them."""
    tokenizer = load_tokenizer(name_or_path)
    ids = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}
    missing = [token for token, id_ in ids.items() if id_ is None]
    if missing:
        raise ValueError(f"tokenizer {name_or_path!r} lacks the special tokens {missing}; "
                         "retrain it with `datapipe tokenizer train FILES --vocab-size N --out DIR`")
    return ids


def tokenizer_path(name_or_path: str | Path) -> Path:
    """The tokenizer.json behind a bundled name ("demo") or a path."""
    path = BUNDLED.get(str(name_or_path), Path(name_or_path))
    if not path.is_file():
        raise FileNotFoundError(
            f"tokenizer {name_or_path!r} not found: give a tokenizer.json path, one of {sorted(BUNDLED)}, "
            "or train one with `datapipe tokenizer train FILES --vocab-size N --out DIR`"
        )
    return path


def load_tokenizer(name_or_path: str | Path):
    """A bundled tokenizer by name ("demo") or a tokenizer.json path, as an HF `Tokenizer`."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tokenizer_path(name_or_path)))
