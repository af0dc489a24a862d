"""Train and load byte-level BPE tokenizers with Hugging Face `tokenizers`.

Byte-level means every string encodes, whatever its script or bytes: the base
alphabet is the 256 byte values, so there is no unknown token. Special tokens take
the first ids, in SPECIAL_TOKENS order, so their ids are the same for every
vocabulary size.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

SPECIAL_TOKENS = [
    "<|bos|>",
    "<|eos|>",  # ends every document: the packer's document boundary
    "<|pad|>",
    "<|media_begin|>",
    "<|media_content|>",
    "<|media_end|>",
    "<|media_pad|>",
]
BUNDLED = {"demo": Path(__file__).parent / "assets" / "demo.json"}  # `datapipe tokenizer train recipes/demo.yaml --vocab-size 8192`


def train_tokenizer(texts: Iterable[str], vocab_size: int, min_frequency: int = 2):
    """A byte-level BPE trained on `texts` (an iterator is fine; it is read once)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def special_token_ids(name_or_path: str | Path) -> dict[str, int]:
    """The ids of SPECIAL_TOKENS in a tokenizer, for stages that must not hard-code them."""
    tokenizer = load_tokenizer(name_or_path)
    return {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}


def load_tokenizer(name_or_path: str | Path):
    """A bundled tokenizer by name ("demo") or a tokenizer.json path."""
    from tokenizers import Tokenizer

    path = BUNDLED.get(str(name_or_path), Path(name_or_path))
    if not path.is_file():
        raise FileNotFoundError(
            f"tokenizer {name_or_path!r} not found: give a tokenizer.json path, one of {sorted(BUNDLED)}, "
            "or train one with `datapipe tokenizer train FILES --vocab-size N --out DIR`"
        )
    return Tokenizer.from_file(str(path))
