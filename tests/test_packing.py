from collections import Counter

import numpy as np

from datapipe.packing import Packer

SEQ_LEN = 128


def make_docs(seed: int, n: int) -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(3.5, 1.0, n).astype(int), 1, 600)
    return [(f"d{i}", rng.integers(10, 5000, size=length, dtype=np.uint32)) for i, length in enumerate(lengths)]


def pack(docs, window=50):
    packer = Packer("s", SEQ_LEN, window, pad_id=2)
    samples = [s for doc_id, tokens in docs for s in packer.add(doc_id, tokens)]
    return samples + list(packer.flush()), packer


def test_every_sample_is_seq_len_and_lengths_add_up():
    samples, _ = pack(make_docs(0, 400))
    for sample in samples:
        assert sample["tokens"].shape == (SEQ_LEN,) and sample["tokens"].dtype == np.uint32
        assert int(sample["doc_lens"].sum()) == SEQ_LEN - sample["num_pad"]
        assert (sample["tokens"][SEQ_LEN - sample["num_pad"]:] == 2).all()
        assert len(sample["doc_ids"]) == len(sample["doc_lens"])


def test_no_token_lost_or_duplicated():
    docs = make_docs(1, 400)
    samples, _ = pack(docs)
    out = Counter(np.concatenate([s["tokens"][: SEQ_LEN - s["num_pad"]] for s in samples]).tolist())
    assert out == Counter(np.concatenate([t for _, t in docs]).tolist())


def test_each_document_comes_back_whole_and_in_order():
    docs = make_docs(2, 300)
    samples, _ = pack(docs)
    pieces: dict[str, list[np.ndarray]] = {}
    for sample in samples:
        start = 0
        for doc_id, length in zip(sample["doc_ids"], sample["doc_lens"]):
            pieces.setdefault(doc_id, []).append(sample["tokens"][start : start + length])
            start += length
    for doc_id, tokens in docs:
        assert np.array_equal(np.concatenate(pieces[doc_id]), tokens)


def test_only_documents_longer_than_seq_len_are_split():
    docs = make_docs(3, 300)
    samples, packer = pack(docs)
    appearances = Counter(doc_id for s in samples for doc_id in s["doc_ids"])
    lengths = dict(docs)
    for doc_id, count in appearances.items():
        if len(lengths[doc_id]) <= SEQ_LEN:
            assert count == 1
    assert packer.split_docs == sum(len(t) > SEQ_LEN for _, t in docs) > 0


def test_packing_is_deterministic_and_fills_well():
    docs = make_docs(4, 2000)
    first, _ = pack(docs, window=2000)
    second, _ = pack(docs, window=2000)
    assert [s["doc_ids"] for s in first] == [s["doc_ids"] for s in second]
    fill = sum(SEQ_LEN - s["num_pad"] for s in first) / (len(first) * SEQ_LEN)
    assert fill > 0.98
