import io

import numpy as np
import pytest
from PIL import Image

from datapipe.pipeline.runner import add_stage
from datapipe.schema import MEDIA_PLACEHOLDER, docs_from_table, docs_to_table, new_document
from tokenizer.bpe import special_token_ids
from tokenizer.fast import FastEncoder
from tokenizer.image import PATCH, BadImage, fit_grid, lay_out_image
from tokenizer.media import loss_mask, media_spans
from tokenizer.stage import Config, make_stage

BEGIN, END = 3, 5


def test_spans_and_mask_cover_media_and_padding():
    tokens = np.array([9, 3, 7, 4, 6, 6, 5, 9, 9, 3, 7, 4, 6, 5, 2, 2], dtype=np.uint32)
    assert media_spans(tokens, BEGIN, END) == [(1, 7), (9, 14)]
    assert loss_mask(len(tokens), media_spans(tokens, BEGIN, END), num_pad=2).tolist() == [1, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0]


def test_unbalanced_span_is_an_error():
    with pytest.raises(ValueError, match="unbalanced"):
        media_spans(np.array([3, 6, 6], dtype=np.uint32), BEGIN, END)


# --- image layout: whole 28x28 cells within the token budget -------------------------------

def png(width: int, height: int, mode: str = "RGB", fmt: str = "PNG") -> bytes:
    """A real image: a gradient, so resizing has something to resample."""
    image = Image.linear_gradient("L").resize((width, height)).convert(mode)
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


@pytest.mark.parametrize("width,height,budget", [(1920, 1080, 1024), (10, 10, 64), (5000, 20, 256), (28, 2800, 64),
                                                 (640, 480, 1), (896, 896, 1024), (897, 896, 1024)])
def test_grid_stays_within_budget_and_keeps_aspect(width, height, budget):
    cols, rows = fit_grid(width, height, budget)
    assert 1 <= cols * rows <= budget
    if cols > 1 and rows > 1:  # aspect within one cell of the source's
        assert abs(cols / rows - width / height) <= width / height * (1 / cols + 1 / rows)


def test_image_resized_to_whole_cells_and_reencoded():
    image = lay_out_image(png(1920, 1080), max_tokens=256, max_pixels=10**8)
    assert (image.width % PATCH, image.height % PATCH) == (0, 0)
    assert image.num_pad_tokens == (image.width // PATCH) * (image.height // PATCH) <= 256
    assert Image.open(io.BytesIO(image.png)).size == (image.width, image.height)
    assert (image.source_width, image.source_height) == (1920, 1080)


def test_image_already_in_cells_keeps_its_bytes_and_small_one_becomes_one_cell():
    exact = png(56, 84)
    assert lay_out_image(exact, 64, 10**8).png == exact
    icon = lay_out_image(png(10, 10, "RGBA"), 64, 10**8)
    assert (icon.width, icon.height, icon.num_pad_tokens) == (28, 28, 1)
    assert Image.open(io.BytesIO(icon.png)).mode == "RGB"


def test_undecodable_and_oversized_images_are_bad():
    with pytest.raises(BadImage, match="does not decode"):
        lay_out_image(b"\x89PNG\r\n\x1a\n not really", 64, 10**8)
    with pytest.raises(BadImage, match="does not decode"):
        lay_out_image(png(200, 200)[:300], 64, 10**8)  # truncated
    with pytest.raises(BadImage, match="max_image_pixels"):
        lay_out_image(png(400, 300), 64, max_pixels=100_000)  # refused from the header, before decoding


# --- the tokenize stage with media --------------------------------------------------------

def media_doc(text: str, images: list[bytes], name: str = "d") -> dict:
    doc = new_document("test", name, text, kind="image")
    doc["media"] = images
    return doc


def test_placeholders_become_media_spans_in_order(tiny_tokenizer):
    ids = special_token_ids(tiny_tokenizer)
    stage = make_stage(Config(stage="tokenize", tokenizer=str(tiny_tokenizer), max_image_tokens=64))
    text = f"{MEDIA_PLACEHOLDER}a chart of shards{MEDIA_PLACEHOLDER}\nand a sample{MEDIA_PLACEHOLDER}"
    [doc] = stage([media_doc(text, [png(280, 140), png(2000, 1000), png(30, 30)])])
    tokens = doc["tokens"]
    spans = media_spans(tokens, ids["<|media_begin|>"], ids["<|media_end|>"])
    pads = [int((tokens[start:stop] == ids["<|media_pad|>"]).sum()) for start, stop in spans]
    layouts = doc["notes"]["tokenize"]["media"]
    assert pads == [m["pad_tokens"] for m in layouts] == [50, 55, 1]  # 10x5 cells, 11x5 (budget 64), 1x1
    image_word = FastEncoder(tiny_tokenizer).encode_batch(["image"])[0].tolist()
    start = spans[0][0]
    assert tokens[start : start + len(image_word) + 2].tolist() == \
        [ids["<|media_begin|>"], *image_word, ids["<|media_content|>"]]
    assert spans[0][0] == 0 and spans[2][1] == len(tokens) - 1 and tokens[-1] == ids["<|eos|>"]
    assert doc["num_tokens"] == len(tokens)
    assert [Image.open(io.BytesIO(b)).size for b in doc["media"]] == [(280, 140), (308, 140), (28, 28)]


def test_text_between_images_encodes_as_without_images(tiny_tokenizer):
    ids = special_token_ids(tiny_tokenizer)
    encode = FastEncoder(tiny_tokenizer).encode_batch
    stage = make_stage(Config(stage="tokenize", tokenizer=str(tiny_tokenizer)))
    [with_image, plain] = stage([media_doc(f"packing {MEDIA_PLACEHOLDER} shards", [png(28, 28)], "a"),
                                 media_doc("packing  shards", [], "b")])
    [(start, stop)] = media_spans(with_image["tokens"], ids["<|media_begin|>"], ids["<|media_end|>"])
    assert stop - start == 4 + len(encode(["image"])[0])  # begin, "image", content, one pad, end
    outside = np.concatenate([with_image["tokens"][:start], with_image["tokens"][stop:]]).tolist()
    before, after = encode(["packing ", " shards"])
    assert outside == [*before.tolist(), *after.tolist(), ids["<|eos|>"]]  # each piece encoded alone: no merge across
    assert plain["tokens"].tolist() == [*encode(["packing  shards"])[0].tolist(), ids["<|eos|>"]]
    assert "tokenize" not in plain["notes"]


def test_mismatched_or_broken_media_are_rejected_with_a_reason(tiny_tokenizer):
    stage = make_stage(Config(stage="tokenize", tokenizer=str(tiny_tokenizer)))
    docs = stage([media_doc(f"two {MEDIA_PLACEHOLDER}{MEDIA_PLACEHOLDER}", [png(28, 28)], "missing"),
                  media_doc("none", [png(28, 28)], "extra"),
                  media_doc(f"bad {MEDIA_PLACEHOLDER}", [b"GIF89a broken"], "broken"),
                  media_doc(f"good {MEDIA_PLACEHOLDER}", [png(28, 28)], "good")])
    assert [d["reject"] for d in docs] == ["tokenize.media_count_mismatch", "tokenize.media_count_mismatch",
                                           "tokenize.bad_image", ""]
    assert "2 <|media|> placeholders" in docs[0]["error"] and "media[0]" in docs[2]["error"]
    assert len(docs[3]["tokens"]) > 0 and all(len(d["tokens"]) == 0 for d in docs[:3])


def test_media_survive_the_ray_actor_pool(tiny_tokenizer, ray_session):
    """The stage as the runner runs it: Arrow rows through a Ray actor, resized PNGs come back."""
    docs = [media_doc(f"page {i} {MEDIA_PLACEHOLDER}", [png(300 + i, 200)], f"r{i}") for i in range(6)]
    docs.append(media_doc(f"{MEDIA_PLACEHOLDER}", [b"junk"], "junk"))
    cfg = Config(stage="tokenize", tokenizer=str(tiny_tokenizer), batch_size=4)
    dataset = add_stage(ray_session.data.from_arrow(docs_to_table(docs)), cfg)
    out = {doc["id"]: doc for table in dataset.iter_batches(batch_format="pyarrow", batch_size=None)
           for doc in docs_from_table(table)}
    assert len(out) == 7 and out["test/junk"]["reject"] == "tokenize.bad_image"
    for i in range(6):
        doc = out[f"test/r{i}"]
        width = doc["notes"]["tokenize"]["media"][0]["width"]
        assert Image.open(io.BytesIO(doc["media"][0])).size == (width, 196)
        assert width % PATCH == 0 and width >= PATCH  # whole 28-px cells, at least one
        assert abs(width - (300 + i) * 196 / 200) < PATCH  # the source's aspect ratio, to within one cell
        assert doc["transforms"] == ["tokenize"] and doc["num_tokens"] == len(doc["tokens"])
