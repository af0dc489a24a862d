"""The pieces around the renderers: gates, perceptual-hash dedup, training samples, the files
source and the procedural generators (no Ray here; test_render_e2e runs them together)."""
import io
import json
import random
import re

import pytest
from PIL import Image, ImageDraw

from datapipe.pipeline.recipe import FilesSource, RecipeError, validate_recipe
from datapipe.readers.files import read_files
from datapipe.schema import MEDIA_PLACEHOLDER, new_document
from renderers.base import RenderOptions
from renderers.dedup import Config as DedupConfig
from renderers.dedup import HashIndex
from renderers.dedup import make_stage as make_dedup
from renderers.gates import GateConfig, check_image, dhash, grayscale, hamming
from renderers.procedural_html import make_page
from renderers.procedural_svg import make_svg
from renderers.samples import Config as SamplesConfig
from renderers.samples import make_stage as make_samples
from renderers.svg_safety import check_svg


def png(draw=None, size=(256, 256), color=(255, 255, 255)) -> bytes:
    image = Image.new("RGB", size, color)
    if draw:
        draw(ImageDraw.Draw(image))
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def shapes(offset: int = 0):
    def draw(canvas):
        canvas.rectangle([20 + offset, 30, 120 + offset, 200], fill=(200, 0, 0))
        canvas.ellipse([140, 40, 230, 130], fill=(0, 0, 160))
    return draw


def test_gates_reject_blank_and_low_detail_and_keep_drawings():
    gates = GateConfig()
    assert check_image(grayscale(png()), gates)[0] == "blank"
    assert check_image(grayscale(png(lambda c: c.point([(5, 5)], fill=(0, 0, 0)))), gates)[0] == "blank"
    gradient = Image.linear_gradient("L").resize((256, 256)).convert("RGB")
    buffer = io.BytesIO()
    gradient.save(buffer, "PNG")
    assert check_image(grayscale(buffer.getvalue()), gates)[0] == "low_detail"  # every pixel differs, no edge anywhere
    assert check_image(grayscale(png(shapes())), gates)[0] == ""


def test_dhash_is_close_for_near_copies_and_far_for_different_pictures():
    base, shifted = (dhash(grayscale(png(shapes(offset)))) for offset in (0, 2))
    other = dhash(grayscale(png(lambda c: c.polygon([(10, 240), (128, 10), (246, 240)], fill=(0, 120, 0)))))
    larger = io.BytesIO()
    Image.open(io.BytesIO(png(shapes()))).resize((512, 512), Image.Resampling.BICUBIC).save(larger, "PNG")
    assert hamming(base, dhash(grayscale(larger.getvalue()))) <= 2  # the same picture at another size
    assert hamming(base, shifted) <= 12 and hamming(base, other) > 60


@pytest.mark.parametrize("distance", [0, 2, 7])
def test_hash_index_finds_everything_within_the_distance_and_nothing_beyond(distance):
    rng = random.Random(distance)
    index, kept = HashIndex(distance), [rng.getrandbits(256) for _ in range(500)]
    for i, value in enumerate(kept):
        index.add(value, str(i))
    for value in kept[:50]:
        flipped = value
        for bit in rng.sample(range(256), distance):
            flipped ^= 1 << bit
        assert index.find(flipped) is not None
        far = value ^ ((1 << (distance + 9)) - 1)  # distance + 9 bits flipped
        assert index.find(far) in (None, *[str(j) for j, v in enumerate(kept) if hamming(v, far) <= distance])


def rendered(doc_id: str, image: bytes, kind: str = "svg", code: str = "<svg/>") -> dict:
    doc = new_document("s", doc_id, code, kind=kind)
    doc["media"] = [image]
    doc["notes"]["render"] = {"dhash": [f"{dhash(grayscale(image)):064x}"], "sizes": [[256, 256]]}
    return doc


def test_dedup_keeps_the_first_copy_in_stream_order_whatever_the_batching():
    images = [png(shapes()), png(shapes(offset=1)), png(lambda c: c.ellipse([10, 10, 240, 240], fill=(0, 0, 0)))]
    docs = [rendered(str(i), images[i % 3]) for i in range(9)]
    outcomes = []
    for batch_size in (1, 4, 9):
        stage = make_dedup(DedupConfig(stage="render_dedup"))
        fresh = [json.loads(json.dumps({**d, "media": []})) | {"media": d["media"]} for d in docs]
        out = [doc for start in range(0, 9, batch_size) for doc in stage(fresh[start : start + batch_size])]
        outcomes.append([(d["id"], d["reject"], d["notes"].get("render_dedup", {}).get("duplicate_of")) for d in out])
    assert outcomes[0] == outcomes[1] == outcomes[2]
    kept = [doc_id for doc_id, reject, _ in outcomes[0] if not reject]
    assert kept == ["s/0", "s/2"]  # s/1 is a near-copy of s/0 (shifted 1 px)
    assert dict((i, o) for i, _, o in outcomes[0])["s/4"] == "s/0"


def test_dedup_refuses_more_than_one_actor():
    with pytest.raises(RecipeError, match="one actor"):
        validate_recipe({"name": "x", "sources": [{"name": "a", "type": "svg_programs"}],
                         "stages": [{"stage": "render_dedup", "concurrency": 2}, {"stage": "tokenize"}]})


def test_samples_place_one_placeholder_per_image_in_both_orders():
    stage = make_samples(SamplesConfig(stage="code_image_samples", image_to_code=0.5, seed=1))
    docs = stage([rendered(str(i), png(shapes()), code=f'<svg id="{i}"/>') for i in range(200)])
    orders = [doc["notes"]["code_image_samples"]["order"] for doc in docs]
    assert 70 < orders.count("image_to_code") < 130
    for doc in docs:
        assert doc["text"].count(MEDIA_PLACEHOLDER) == len(doc["media"]) == 1
        assert re.search(r"```svg\n<svg id=\"\d+\"/>\n```", doc["text"])
        first = doc["text"].index(MEDIA_PLACEHOLDER) < doc["text"].index("```")
        assert first == (doc["notes"]["code_image_samples"]["order"] == "image_to_code")
    again = stage([rendered(str(i), png(shapes()), code=f'<svg id="{i}"/>') for i in range(200)])
    assert [d["text"] for d in again] == [d["text"] for d in docs]


def test_samples_label_several_views_and_reject_what_cannot_be_a_sample():
    stage = make_samples(SamplesConfig(stage="code_image_samples", image_to_code=1.0))
    page = rendered("p", png(shapes()), kind="html", code="<p>hi</p>")
    page["media"].append(png(shapes(offset=3)))
    page["notes"]["render"]["sizes"] = [[1280, 720], [390, 844]]
    text = stage([page])[0]["text"]
    assert text.startswith(f"1280x720: {MEDIA_PLACEHOLDER}\n390x844: {MEDIA_PLACEHOLDER}\n") and "```html" in text
    bare = new_document("s", "bare", "<svg/>", kind="svg")
    sneaky = rendered("sneaky", png(shapes()), code=f"<svg><text>{MEDIA_PLACEHOLDER}</text></svg>")
    plain = new_document("s", "plain", "just text")
    out = stage([bare, sneaky, plain])
    assert [d["reject"] for d in out] == ["code_image_samples.no_images", "code_image_samples.placeholder_in_code", ""]


def files_source(**fields) -> FilesSource:
    return FilesSource(name="files", type="files", paths=["unused"], **fields)


def test_files_source_reads_kinds_folders_and_encodings(tmp_path):
    (tmp_path / "a.svg").write_text("<svg/>")
    (tmp_path / "page.html").write_bytes('<meta charset="shift_jis"><p>日本語</p>'.encode("shift_jis"))
    (tmp_path / "blob.bin").write_bytes(b"\x00\x01binary")
    svg = next(read_files(files_source(), str(tmp_path / "a.svg")))
    assert svg["kind"] == "svg" and svg["asset_dir"] == str(tmp_path) and svg["meta"]["path"].endswith("a.svg")
    page = next(read_files(files_source(), str(tmp_path / "page.html")))
    assert page["kind"] == "html" and "日本語" in page["text"] and page["meta"]["encoding"] == "shift_jis"
    assert next(read_files(files_source(), str(tmp_path / "blob.bin")))["reject"] == "read.binary_file"
    assert next(read_files(files_source(), str(tmp_path / "gone.svg")))["reject"] == "read.missing_file"


def test_files_source_reads_a_manifest(tmp_path):
    (tmp_path / "icons").mkdir()
    (tmp_path / "icons" / "x.svg").write_text("<svg/>")
    rows = [{"file": "icons/x.svg", "license": "MIT"}, {"file": "icons/missing.svg"}, {"nofile": 1}]
    (tmp_path / "manifest.jsonl").write_text("\n".join(map(json.dumps, rows)) + "\n")
    docs = list(read_files(files_source(), str(tmp_path / "manifest.jsonl")))
    assert [d["reject"] for d in docs] == ["", "read.missing_file", "read.missing_text"]
    assert docs[0]["source_id"] == "icons/x.svg" and docs[0]["meta"]["manifest"] == {"license": "MIT"}
    assert docs[0]["asset_dir"] == str(tmp_path / "icons")


def test_generators_are_seeded_valid_and_varied():
    svgs = [make_svg(random.Random(f"0:g:{i}")) for i in range(50)]
    assert svgs == [make_svg(random.Random(f"0:g:{i}")) for i in range(50)] and len(set(svgs)) == 50
    for svg in svgs:
        check_svg(svg, None, RenderOptions())  # parses, no external reference, within every limit
    features = "".join(svgs)
    for feature in ("<path", "<text", "Gradient", "transform=", "<circle", "<polygon", "stroke-dasharray"):
        assert feature in features
    pages = [make_page(random.Random(f"0:p:{i}")) for i in range(30)]
    assert len(set(pages)) == 30 and all(p.startswith("<!DOCTYPE html>") for p in pages)
    for feature in ("<table", "<form", "<select", "display: grid", "display: flex", "<ul", "font-family"):
        assert feature in "".join(pages)
    assert not any("<script" in p or "http" in p.replace("http://www.w3.org", "") for p in pages)


def test_render_kinds_without_a_renderer_are_refused_when_the_recipe_loads():
    from renderers import make_renderer

    with pytest.raises(RecipeError, match=r"stages\[0\]\.kinds: no renderer for 'pdf'; known kinds: .*html, mesh.*svg"):
        validate_recipe({"name": "x", "sources": [{"name": "a", "type": "svg_programs"}],
                         "stages": [{"stage": "render", "kinds": ["svg", "pdf"]}, {"stage": "tokenize"}]})
    with pytest.raises(KeyError, match="known kinds: .*html, mesh.*svg"):
        make_renderer("image")


def test_a_files_source_asset_root_starts_at_the_recipe_folder(tmp_path):
    (tmp_path / "site").mkdir()
    raw = {"name": "x", "base_dir": str(tmp_path), "sources": [{"name": "a", "type": "files", "paths": ["site"],
                                                               "asset_root": "site"}],
           "stages": [{"stage": "tokenize"}]}
    assert validate_recipe(raw).sources[0].asset_root == str(tmp_path / "site")
    raw["sources"][0]["asset_root"] = "absent"
    with pytest.raises(RecipeError, match=r"sources\.a\.asset_root: .*absent is not a folder"):
        validate_recipe(raw)
