"""Packing invariants on generated documents, some holding media spans and their images."""
import bisect
import io
from collections import Counter

import numpy as np
import pytest
from PIL import Image

from datapipe.loader.reference import read_shards
from datapipe.packing.bfd import (
    SpecialIds,
    best_fit_decreasing,
    media_safe_cuts,
    media_safe_prefix,
    pack_pieces,
    split_pieces,
)
from datapipe.packing.corpus import (
    corpus_from_documents,
    corpus_from_tables,
    pack_reasons,
    piece_table,
    read_piece,
    write_piece,
)
from datapipe.packing.curriculum import CurriculumPhase, pack_phase
from datapipe.packing.writer import ShardWriter
from datapipe.schema import new_document
from datapipe.storage import Store
from tokenizer.bpe import special_token_ids

SPECIAL = special_token_ids("demo")  # the bundled tokenizer's ids: tests do not hard-code them either
IDS = SpecialIds.from_tokenizer("demo")
FIRST_PLAIN = 16  # generated text tokens start above every special id
SEQ_LEN = 128


def png(index: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (2, 2), (index % 256, index // 256 % 256, 7)).save(buffer, "PNG")
    return buffer.getvalue()


def media_span(size: int) -> list[int]:
    """<|media_begin|> <|media_content|> <|media_pad|>... <|media_end|>: `size` tokens in all (>= 3)."""
    return [IDS.media_begin, SPECIAL["<|media_content|>"], *[SPECIAL["<|media_pad|>"]] * (size - 3), IDS.media_end]


def make_docs(seed: int, n: int, media_every: int = 7, max_len: int = 600, source: str = "web",
              log_median: float = 3.5) -> list[dict]:
    """Lognormal lengths (median e^3.5 = 33 tokens) with a tail past SEQ_LEN; every media_every-th holds 1-3 images."""
    rng = np.random.default_rng(seed)
    docs = []
    for i, length in enumerate(np.clip(rng.lognormal(log_median, 1.0, n).astype(int), 1, max_len).tolist()):
        doc = new_document(source, f"{seed}-{i}", f"document {i}")
        tokens = rng.integers(FIRST_PLAIN, 5000, size=length).tolist()
        if media_every and i % media_every == 0:
            cuts = sorted(rng.integers(0, length + 1, size=int(rng.integers(1, 4))).tolist())
            parts = [tokens[a:b] for a, b in zip([0, *cuts], [*cuts, length])]
            spans = [media_span(int(rng.integers(3, 40))) for _ in cuts]
            tokens = [t for part, span in zip(parts, [*spans, []]) for t in part + span]
            doc["media"] = [png(i * 10 + k) for k in range(len(cuts))]  # image k belongs to span k
        doc["tokens"] = np.array(tokens, dtype=np.uint32)
        docs.append(doc)
    return docs


def make_corpus(seed: int, n: int, **kwargs):
    return corpus_from_documents(make_docs(seed, n, **kwargs), IDS)


def pack(docs, seq_len=SEQ_LEN, seed=0, **phase):
    corpus = corpus_from_documents(docs, IDS)
    selection, _, samples = pack_phase(CurriculumPhase(seq_len=seq_len, **phase), corpus, seed, IDS)
    return list(samples), selection, corpus


def pieces_by_doc(samples) -> dict[str, list[tuple[int, np.ndarray]]]:
    pieces: dict[str, list] = {}
    for sample in samples:
        start = 0
        for doc_id, offset, length in zip(sample["doc_ids"], sample["doc_offsets"], sample["doc_lens"]):
            pieces.setdefault(doc_id, []).append((offset, sample["tokens"][start : start + length]))
            start += length
    return pieces


def test_every_sample_is_seq_len_with_consistent_fields():
    samples, _, _ = pack(make_docs(0, 400))
    for sample in samples:
        used = SEQ_LEN - sample["num_pad"]
        assert sample["tokens"].shape == (SEQ_LEN,) and sample["tokens"].dtype == np.uint32
        assert int(sample["doc_lens"].sum()) == used and sample["doc_lens"].dtype == np.int32
        assert (sample["tokens"][used:] == IDS.pad).all()
        assert len(sample["doc_ids"]) == len(sample["doc_lens"]) == len(sample["doc_offsets"])
        assert sample["loss_mask"].dtype == np.uint8 and not sample["loss_mask"][used:].any()
        assert "position_ids" not in sample  # derived on read (datapipe.shards), not packed


def test_non_pad_tokens_out_equal_tokens_in():
    docs = make_docs(1, 400)
    samples, _, _ = pack(docs)
    out = Counter(np.concatenate([s["tokens"][: SEQ_LEN - s["num_pad"]] for s in samples]).tolist())
    assert out == Counter(np.concatenate([d["tokens"] for d in docs]).tolist())


def test_each_document_comes_back_whole_from_its_pieces():
    docs = make_docs(2, 300)
    pieces = pieces_by_doc(pack(docs)[0])
    for doc in docs:
        ordered = sorted(pieces[doc["id"]], key=lambda piece: piece[0])
        assert np.array_equal(np.concatenate([tokens for _, tokens in ordered]), doc["tokens"])
        assert [offset for offset, _ in ordered] == np.cumsum([0] + [len(t) for _, t in ordered[:-1]]).tolist()


def test_only_documents_longer_than_seq_len_are_split():
    docs = make_docs(3, 300)
    samples, selection, _ = pack(docs)
    appearances = Counter(doc_id for s in samples for doc_id in s["doc_ids"])
    long_docs = {d["id"] for d in docs if len(d["tokens"]) > SEQ_LEN}
    assert long_docs and all(appearances[d["id"]] == 1 for d in docs if d["id"] not in long_docs)
    assert all(appearances[doc_id] >= 2 for doc_id in long_docs)
    assert int((selection.lengths > SEQ_LEN).sum()) == len(long_docs)


def test_media_spans_are_whole_masked_and_carry_their_images():
    docs = make_docs(4, 400, media_every=3)
    images_of = {d["id"]: d["media"] for d in docs}
    samples, _, _ = pack(docs)
    seen = []
    for sample in samples:
        assert len(sample["images"]) == len(sample["media_spans"])
        for (start, stop), image in zip(sample["media_spans"], sample["images"]):
            assert sample["tokens"][start] == IDS.media_begin and sample["tokens"][stop - 1] == IDS.media_end
            assert not sample["loss_mask"][start:stop].any()
            seen.append(image)
        inside = np.isin(sample["tokens"], [IDS.media_begin, IDS.media_end]).sum()
        assert inside == 2 * len(sample["media_spans"])  # no begin or end left without its partner
        assert sample["loss_mask"].sum() == SEQ_LEN - sample["num_pad"] - sum(b - a for a, b in sample["media_spans"])
    assert Counter(seen) == Counter(image for images in images_of.values() for image in images)


def test_images_follow_their_span_to_the_right_document():
    docs = make_docs(5, 200, media_every=2)
    by_id = {d["id"]: d for d in docs}
    checked = 0
    for sample in pack(docs)[0]:
        bounds = np.cumsum([0, *sample["doc_lens"]])
        for (start, _), image in zip(sample["media_spans"], sample["images"]):
            piece = int(np.searchsorted(bounds, start, side="right")) - 1
            doc = by_id[sample["doc_ids"][piece]]
            in_doc = start - bounds[piece] + sample["doc_offsets"][piece]
            k = int((doc["tokens"][:in_doc] == IDS.media_begin).sum())
            assert doc["media"][k] == image
            checked += 1
    assert checked == sum(len(d["media"]) for d in docs) > 0  # every image was checked, none lost


def test_same_seed_same_packing_other_seed_other_order():
    docs = make_docs(6, 500)
    first, again, other = pack(docs, seed=1)[0], pack(docs, seed=1)[0], pack(docs, seed=2)[0]
    assert [s["doc_ids"] for s in first] == [s["doc_ids"] for s in again]
    assert all(np.array_equal(a["tokens"], b["tokens"]) for a, b in zip(first, again))
    assert [s["doc_ids"] for s in first] != [s["doc_ids"] for s in other]


def test_best_fit_fills_and_never_overflows():
    docs = make_docs(7, 3000, media_every=0, max_len=SEQ_LEN)
    samples = pack(docs)[0]
    assert all(int(s["doc_lens"].sum()) <= SEQ_LEN for s in samples)
    fill = sum(SEQ_LEN - s["num_pad"] for s in samples) / (len(samples) * SEQ_LEN)
    assert fill > 0.995


def reference_best_fit_decreasing(lengths: list[int], capacity: int) -> list[int]:
    """Textbook BFD with a sorted list of (room, stack of sequences): slow, obviously right."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    rooms, stacks, bins, count = [], {}, [0] * len(lengths), 0
    for i in order:
        at = bisect.bisect_left(rooms, lengths[i])
        if at == len(rooms):
            b, room, count = count, capacity, count + 1
        else:
            room = rooms[at]
            b = stacks[room].pop()
            if not stacks[room]:
                rooms.pop(at)
        bins[i], left = b, room - lengths[i]
        if left > 0:
            if not stacks.get(left):
                stacks[left] = []
                bisect.insort(rooms, left)
            stacks[left].append(b)
    return bins


@pytest.mark.parametrize("capacity", [16, 100, 4096, 70_000])
def test_compiled_best_fit_equals_the_textbook_one(capacity):
    rng = np.random.default_rng(capacity)
    lengths = rng.integers(1, capacity + 1, 3000)
    lengths[::3] = rng.integers(1, min(30, capacity) + 1, len(lengths[::3]))
    bins, count = best_fit_decreasing(lengths, capacity)
    assert bins.tolist() == reference_best_fit_decreasing(lengths.tolist(), capacity)
    assert count == bins.max() + 1
    assert np.bincount(bins, weights=lengths).max() <= capacity


def test_best_fit_rejects_pieces_longer_than_the_sequence():
    with pytest.raises(ValueError, match="split longer documents first"):
        best_fit_decreasing(np.array([5, 200]), 100)


def test_windows_pack_each_window_alone():
    pieces = split_pieces(np.arange(1000), np.full(1000, 30), 100)
    whole, windowed = pack_pieces(pieces, 100), pack_pieces(pieces, 100, window=7)
    assert whole.num_sequences == 334  # three 30s per sequence, one left over
    assert windowed.num_sequences == 142 * 3 + 2  # 142 windows of seven (3 sequences each), one of six (2)


def test_cuts_move_back_to_the_start_of_a_media_span():
    spans = np.array([[90, 120], [150, 160]])
    assert media_safe_cuts(300, 100, spans).tolist() == [0, 90, 190, 290]  # not 100: it is inside 90..120
    assert media_safe_prefix(300, 100, spans) == 90
    assert media_safe_prefix(300, 155, spans) == 150
    assert media_safe_prefix(80, 100, spans) == 80
    with pytest.raises(ValueError, match="does not fit"):
        media_safe_cuts(300, 20, spans)


def test_a_long_document_is_cut_before_a_span_that_crosses_seq_len():
    doc = new_document("web", "crossing", "x")
    doc["tokens"] = np.array([FIRST_PLAIN] * 100 + media_span(40) + [FIRST_PLAIN + 1] * 100, dtype=np.uint32)
    doc["media"] = [png(3)]
    samples = pack([doc, *make_docs(13, 40, media_every=0)])[0]
    pieces = sorted(pieces_by_doc(samples)["web/crossing"], key=lambda piece: piece[0])
    assert [(offset, len(tokens)) for offset, tokens in pieces] == [(0, 100), (100, 128), (228, 12)]
    holder = next(s for s in samples if s["images"])
    assert holder["images"] == [png(3)] and len(holder["media_spans"]) == 1


def test_committed_pieces_pack_like_the_in_memory_corpus_and_round_trip_through_shards(tmp_path):
    """Pieces written out of order (as workers commit blocks) read back in run order."""
    docs = make_docs(8, 300, media_every=4)
    for position, doc in enumerate(docs):
        doc["partition"], doc["position"] = position // 100, position % 100 << 12
    store = Store(tmp_path / "parts")
    for k, start in enumerate((200, 0, 100)):
        chunk = docs[start : start + 100]
        write_piece(store, f"piece-{k}.arrow", piece_table(chunk, pack_reasons(chunk, IDS)))
    reopened = corpus_from_tables([read_piece(store, f"piece-{k}.arrow") for k in range(3)], ["web"])
    assert reopened.ids == [doc["id"] for doc in docs]
    samples = list(pack_phase(CurriculumPhase(seq_len=SEQ_LEN), reopened, 0, IDS)[2])
    in_memory = pack(docs)[0]
    assert [s["doc_ids"] for s in samples] == [s["doc_ids"] for s in in_memory]
    with ShardWriter(tmp_path / "main", 16, {"stage": "main", "seq_len": SEQ_LEN}) as writer:
        for sample in samples:
            writer.write(sample)
    back = list(read_shards(tmp_path / "main"))
    assert len(back) == len(samples) and sum(len(s["images"]) for s in back) > 0
    for a, b in zip(samples, back):
        for field in ("tokens", "doc_lens", "loss_mask"):
            assert np.array_equal(a[field], b[field]) and a[field].dtype == b[field].dtype, field
        pieces = [*a["doc_lens"].tolist(), a["num_pad"]]  # positions restart at each piece and at the padding
        assert np.array_equal(b["position_ids"], np.concatenate([np.arange(n) for n in pieces]))
        for field in ("doc_ids", "doc_offsets", "media_spans", "images", "num_pad", "seq_len"):
            assert a[field] == b[field], field


def test_plain_webdataset_sees_images_as_numbered_png_members(tmp_path):
    import webdataset as wds

    samples = [s for s in pack(make_docs(9, 200, media_every=2))[0] if s["images"]]
    with ShardWriter(tmp_path / "main", 1000, {"stage": "main"}) as writer:
        for sample in samples:
            writer.write(sample)
    back = list(wds.WebDataset([str(tmp_path / "main" / "shard-000000.tar")], shardshuffle=False))
    assert back[0]["0.png"] == samples[0]["images"][0]
    assert Image.open(io.BytesIO(back[0]["0.png"])).size == (2, 2)


def test_unbalanced_or_mismatched_media_is_a_reject_reason():
    doc = new_document("web", "1", "x")
    doc["tokens"] = np.array([FIRST_PLAIN, IDS.media_begin, FIRST_PLAIN], dtype=np.uint32)
    assert pack_reasons([doc], IDS) == ["pack.unbalanced_media"]
    doc["tokens"] = np.array([IDS.media_begin, FIRST_PLAIN, IDS.media_end], dtype=np.uint32)
    assert pack_reasons([doc], IDS) == ["pack.media_mismatch"]  # a span without its image
    doc["media"] = [png(1)]
    assert pack_reasons([doc], IDS)[0].tolist() == [[0, 3]]
    doc["tokens"], doc["media"] = np.zeros(0, np.uint32), []
    assert pack_reasons([doc], IDS) == ["pack.no_tokens"]
