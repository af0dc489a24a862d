"""The K2-style pre-tokenizer: the regex that cuts text into pieces before BPE.

BPE never merges across a piece boundary, so the pattern decides what a token can be:
- `[\\p{Han}]+`: a run of Han characters is its own piece, split from Latin/kana/Hangul
  next to it ("数据test" -> "数据", "test"), so CJK merges stay CJK.
- words: an optional leading space or punctuation mark, then letters (case runs such as
  "HTTPResponse" stay one piece), then an optional English contraction ('s 't 're 've 'm
  'll 'd, any case) glued on.
- `\\p{N}{1,3}`: digits in groups of at most 3, so numbers tokenize by place value and the
  vocabulary does not fill up with years and prices.
- ` ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*`: punctuation runs ("```", "->", "});") with the newlines after.
- `\\s*[\\r\\n]+`: newline runs with the indentation before them; `\\s+(?!\\S)` leaves the last
  space of an indent to the next word, so " return" is one token.

The same pattern string runs in two engines: Oniguruma inside Hugging Face `tokenizers`
(training, tokenizer.json) and fancy-regex inside tiktoken (the fast encoder,
tokenizer/fast.py). Both accept the `&&` class intersection; tests/test_tokenizer_fast.py
checks that they cut real multilingual text identically.
"""
from __future__ import annotations

# Kimi K2's pattern (tokenization_kimi.py), piece by piece as described above.
K2_PATTERN = "|".join([
    r"[\p{Han}]+",
    (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
     r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"),
    (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
     r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"),
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])


def hf_pre_tokenizer():
    """`tokenizers` pre-tokenizer: split by K2_PATTERN, then map each piece's bytes to
    byte-level characters (GPT-2's printable stand-ins for the 256 byte values)."""
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(K2_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])

