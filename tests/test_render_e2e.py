"""End to end on real Ray: a folder of SVGs and a webpage (some hostile) plus generated programs
are rendered, gated, de-duplicated, turned into training samples, tokenized and sharded."""
import json
import os
import threading
import time

import pytest
import yaml

from datapipe import cli, stream
from datapipe.pipeline.inspect import read_rejects
from datapipe.schema import MEDIA_PLACEHOLDER
from renderers.sandbox import UID_BASE, processes_of
from tests.test_render_svg import SVG, billion_laughs

pytestmark = pytest.mark.slow  # a Ray run with a browser and a sandboxed worker: about a minute

GOOD = [
    f'<svg {SVG} width="64" height="64"><rect x="8" y="8" width="30" height="40" fill="#c00"/></svg>',
    f'<svg {SVG} width="64" height="64"><circle cx="32" cy="32" r="20" fill="#00a"/></svg>',
    f'<svg {SVG} width="64" height="32"><path d="M2 30 L32 2 L62 30 Z" fill="#070"/></svg>',
]
HOSTILE = {
    "bomb.svg": (billion_laughs(), "render.entity_bomb"),
    "leak.svg": (f'<svg {SVG}><image href="file:///etc/hostname" width="9" height="9"/></svg>', "render.external_reference"),
    "empty.svg": (f'<svg {SVG} width="64" height="64"></svg>', "render.blank"),
    "broken.svg": ("<svg><g></svg>", "render.invalid"),
    "twin.svg": (GOOD[0].replace('fill="#c00"', 'fill="#c00" '), "render_dedup.duplicate"),
}
PAGE = '<html><head><link rel="stylesheet" href="css/site.css"></head><body><h1>Hello</h1><p>pairs</p></body></html>'


@pytest.fixture(scope="module")
def rendered_run(tmp_path_factory, tiny_tokenizer, ray_session):
    tmp = tmp_path_factory.mktemp("render")
    site = tmp / "site"
    (site / "css").mkdir(parents=True)
    for i, svg in enumerate(GOOD):
        (site / f"good{i}.svg").write_text(svg)
    for name, (code, _) in HOSTILE.items():
        (site / name).write_text(code)
    (site / "page.html").write_text(PAGE)
    (site / "css" / "site.css").write_text("body { background: #ffeeaa; font: 24px serif } h1 { color: #a00 }")
    recipe = {
        "name": "render_e2e", "seed": 1,
        "sources": [{"name": "site", "type": "files", "paths": ["site/*.svg", "site/*.html"]},
                    {"name": "gen", "type": "svg_programs", "count": 6}],
        "stages": [{"stage": "render", "size": 128, "viewports": [[320, 240]], "num_cpus": 0.25, "timeout_s": 30},
                   {"stage": "render_dedup"},
                   {"stage": "code_image_samples", "image_to_code": 0.5},
                   {"stage": "tokenize", "tokenizer": str(tiny_tokenizer), "num_cpus": 0.5}],
        "phases": [{"name": "main", "seq_len": 1024}],
        "shards": {"samples_per_shard": 16},
    }
    (tmp / "render.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    stop, uids = threading.Event(), set()
    watcher = threading.Thread(target=watch_sandbox_uids, args=(stop, uids), daemon=True)
    watcher.start()
    try:
        assert cli.main(["run", str(tmp / "render.yaml"), "--out", str(tmp / "out")]) == 0
    finally:
        stop.set()
        watcher.join()
    return tmp / "out", uids


def watch_sandbox_uids(stop: threading.Event, uids: set[int]) -> None:
    """Collect the sandbox uids among this process's descendants (Ray workers, their resvg workers
    and browsers) until `stop`: the uids of this run alone, whatever else runs on the machine."""
    while True:
        uids.update(uid for pid, uid in descendants(os.getpid()) if uid >= UID_BASE)
        if stop.wait(0.2):
            return


def descendants(root: int) -> list[tuple[int, int]]:
    """(pid, uid) of every live process below `root`."""
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as stat_file:
                    stat = stat_file.read()
                uid = entry.stat().st_uid
            except OSError:
                continue  # exited while we looked
            parent = int(stat[stat.rindex(")") + 2 :].split()[1])
            children.setdefault(parent, []).append((int(entry.name), uid))
    found, todo = [], [root]
    while todo:
        for pid, uid in children.get(todo.pop(), []):
            found.append((pid, uid))
            todo.append(pid)
    return found


def test_every_record_is_written_or_rejected_with_the_right_reason(rendered_run):
    out, _ = rendered_run
    stats = json.loads((out / "stats.json").read_text())
    assert stats["balanced"] is True
    assert stats["records_in"] == {"site": len(GOOD) + len(HOSTILE) + 1, "gen": 6}
    assert stats["written"] == {"site": len(GOOD) + 1, "gen": 6}
    rejects = {line["source_id"].rsplit("/", 1)[-1]: line for line in read_rejects(out)}
    assert {name: r["reject"] for name, r in rejects.items()} == {n: reason for n, (_, reason) in HOSTILE.items()}
    assert rejects["twin.svg"]["notes"]["render_dedup"]["duplicate_of"].endswith("good0.svg")
    assert "entity" in rejects["bomb.svg"]["error"]


def test_shards_hold_the_samples(rendered_run):
    out, _ = rendered_run
    samples = list(stream(out / "main"))
    doc_ids = {doc_id for sample in samples for doc_id in sample["doc_ids"]}
    assert len(doc_ids) == len(GOOD) + 1 + 6
    assert all(sample["tokens"].shape == (1024,) for sample in samples)


def test_written_documents_carry_images_placeholders_and_provenance(rendered_run, ray_session):
    """Shards hold only tokens: run the recipe's plan again and look at the documents themselves."""
    out, _ = rendered_run
    recipe = json.loads((out / "recipe.json").read_text())
    assert [s["stage"] for s in recipe["stages"]] == ["render", "render_dedup", "code_image_samples", "tokenize"]
    from datapipe.pipeline.recipe import load_recipe
    from datapipe.pipeline.runner import build_plan
    from datapipe.schema import docs_from_table

    plan = build_plan(load_recipe(out.parent / "render.yaml"))
    docs = [d for table in plan.iter_batches(batch_format="pyarrow", batch_size=None) for d in docs_from_table(table)]
    page = next(d for d in docs if d["id"].endswith("page.html"))
    assert page["kind"] == "html" and page["notes"]["render"]["renderer"] == "chromium"
    assert page["meta"]["path"].endswith("page.html") and page["notes"]["render"]["sizes"] == [[320, 240]]
    written = [doc for doc in docs if not doc["reject"]]
    assert len(written) == len(GOOD) + 1 + 6  # the good SVGs, the page, the generated SVGs
    for doc in written:
        assert doc["text"].count(MEDIA_PLACEHOLDER) == len(doc["media"]) == 1
        assert doc["media"][0].startswith(b"\x89PNG")
        assert doc["transforms"] == ["render", "render_dedup", "code_image_samples", "tokenize"]
        assert len(doc["notes"]["render"]["dhash"][0]) == 64


@pytest.mark.skipif(os.geteuid() != 0, reason="sandboxes run under uids of their own only when started as root")
def test_no_sandboxed_process_outlives_the_run(rendered_run):
    _, uids = rendered_run
    assert len(uids) >= 2  # at least a resvg worker and a Chromium, each under a uid of its own
    deadline = time.monotonic() + 60  # Ray tears the actors down after the run; their children follow
    while time.monotonic() < deadline and survivors(uids):
        time.sleep(1)
    assert survivors(uids) == {}


def survivors(uids: set[int]) -> dict[int, list[int]]:
    return {uid: pids for uid in sorted(uids) if (pids := processes_of(uid))}
