"""Byte-level BPE tokenizers: training, loading and the tokenize stage."""
from tokenizer.bpe import SPECIAL_TOKENS, load_tokenizer, train_tokenizer

__all__ = ["SPECIAL_TOKENS", "load_tokenizer", "train_tokenizer"]
