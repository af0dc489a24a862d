import numpy as np
import pytest

from tokenizer.media import loss_mask, media_spans

BEGIN, END = 3, 5


def test_spans_and_mask_cover_media_and_padding():
    tokens = np.array([9, 3, 7, 4, 6, 6, 5, 9, 9, 3, 7, 4, 6, 5, 2, 2], dtype=np.uint32)
    assert media_spans(tokens, BEGIN, END) == [(1, 7), (9, 14)]
    assert loss_mask(tokens, BEGIN, END, num_pad=2).tolist() == [1, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0]


def test_unbalanced_span_is_an_error():
    with pytest.raises(ValueError, match="unbalanced"):
        media_spans(np.array([3, 6, 6], dtype=np.uint32), BEGIN, END)
