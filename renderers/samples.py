"""The code_image_samples stage: a rendered (code, images) pair becomes one training document.

Two orders, mixed by `image_to_code` (the fraction of pairs in the first order):
- image to code: the image(s), then an instruction, then the code in a fenced block: the
  model learns to write the program that draws a picture;
- code to image: the code, then a line saying what it renders as, then the image(s): the
  model learns what a program looks like when drawn.
Each image stands as one MEDIA_PLACEHOLDER in the text, in the order of doc["media"] (the
tokenize stage turns each into its media-token span); a page rendered at several viewports
names each size before its image. The order and the wording (a few phrasings per order, so
the model does not learn one sentence) are drawn from hash(seed, document id): the same
document always gets the same sample, whatever the batching. notes["code_image_samples"] records
both; provenance stays where it was (the source file in meta, the render in notes["render"]).
"""
from __future__ import annotations

import random
from collections.abc import Callable

from pydantic import Field

from datapipe.schema import MEDIA_PLACEHOLDER, Document
from datapipe.stage import StageConfig

# kind -> (name in prose, code-fence tag); a renderer that knows better (OBJ or glTF, CadQuery or
# OpenSCAD) names it in notes["render"]["language"]
LANGUAGES = {"svg": ("SVG", "svg"), "html": ("HTML", "html"), "mesh": ("mesh", "text"), "cad": ("CAD", "python"),
             "scene3d": ("3D scene", "python")}
IMAGE_TO_CODE = [
    "{images}\nWrite the {name} code that renders this image.\n```{fence}\n{code}\n```",
    "{images}\nReproduce this picture in {name}.\n```{fence}\n{code}\n```",
    "Here is a rendering:\n{images}\nThe {name} source that produces it:\n```{fence}\n{code}\n```",
]
CODE_TO_IMAGE = [
    "```{fence}\n{code}\n```\nThis {name} renders as:\n{images}",
    "The following {name}:\n```{fence}\n{code}\n```\nlooks like this when rendered:\n{images}",
    "Render this {name}.\n```{fence}\n{code}\n```\n{images}",
]


class Config(StageConfig):
    image_to_code: float = Field(0.5, ge=0, le=1)  # share of pairs in image-to-code order; the rest code-to-image
    seed: int = 0  # with the document id, picks each pair's order and wording
    kinds: list[str] = Field(default_factory=lambda: list(LANGUAGES))  # kinds turned into samples; others pass through
    num_cpus: float | None = Field(0.25, gt=0)  # string formatting only; leaves cores to the renderers
    max_code_chars: int = Field(200_000, ge=1)  # longer code is rejected (~60K tokens: beyond most curricula)


def make_stage(cfg: Config) -> Callable[[list[Document]], list[Document]]:
    def make_samples(docs: list[Document]) -> list[Document]:
        for doc in docs:
            if doc["kind"] in cfg.kinds:
                make_sample(doc, cfg)
        return docs

    return make_samples


def make_sample(doc: Document, cfg: Config) -> None:
    code = doc["text"]
    if not doc["media"]:
        doc["reject"] = "code_image_samples.no_images"  # no render stage ran before this one
    elif not code.strip():
        doc["reject"] = "code_image_samples.no_code"  # a binary mesh: rendered, but nothing to pair it with
    elif MEDIA_PLACEHOLDER in code:
        doc["reject"] = "code_image_samples.placeholder_in_code"  # it would misplace every image after it
    elif len(code) > cfg.max_code_chars:
        doc["reject"] = "code_image_samples.too_long"
    if doc["reject"]:
        return
    rng = random.Random(f"{cfg.seed}:{doc['id']}")
    order = "image_to_code" if rng.random() < cfg.image_to_code else "code_to_image"
    templates = IMAGE_TO_CODE if order == "image_to_code" else CODE_TO_IMAGE
    wording = rng.randrange(len(templates))
    name, fence = doc["notes"].get("render", {}).get("language") or LANGUAGES.get(doc["kind"], (doc["kind"].upper(), doc["kind"]))
    images = image_lines(len(doc["media"]), doc["notes"].get("render", {}).get("sizes", []))
    doc["text"] = templates[wording].format(images=images, name=name, fence=fence, code=code.strip("\n"))
    doc["notes"]["code_image_samples"] = {"order": order, "wording": wording}


def image_lines(count: int, sizes: list) -> str:
    """One placeholder per image; with several, each is labelled with its size."""
    if count == 1:
        return MEDIA_PLACEHOLDER
    labels = [f"{w}x{h}" for w, h in sizes] if len(sizes) == count else [f"view {i + 1}" for i in range(count)]
    return "\n".join(f"{label}: {MEDIA_PLACEHOLDER}" for label in labels)
