"""End to end on real Ray: a small mixed folder of meshes, 3D scene programs and CAD scripts (some
broken) is rendered, gated, de-duplicated, paired, tokenized and sharded; every record is written
or rejected with its reason, in + created = written + rejected."""
import json

import pytest
import trimesh

from datapipe import cli, stream
from datapipe.pipeline.inspect import read_rejects
from tests.conftest import tiny_recipe

pytestmark = pytest.mark.slow  # a Ray run with two sandboxed workers: about a minute

SCENE = """import trimesh
ball = trimesh.creation.icosphere(2, radius=0.6)
ball.apply_translation([1.2, 0, 0])
scene = trimesh.Scene([trimesh.creation.box((1, 1, 2)), ball])
"""
OPENSCAD = "difference() { cube([20, 20, 10], center=true); cylinder(h=30, r=6, center=true, $fn=48); }\n"


def write_folder(folder):
    folder.mkdir()
    trimesh.creation.box().export(folder / "cube.obj")  # text: a pair
    trimesh.creation.icosphere(3).export(folder / "ball.stl")  # binary: rendered, no code
    trimesh.creation.torus(1, 0.3).export(folder / "ring.ply", encoding="ascii")
    (folder / "nan.obj").write_text("v 0 0 0\nv 1 0 nan\nv 0 inf 0\nf 1 2 3\n")
    (folder / "empty.stl").write_bytes(b"")
    (folder / "block.scad").write_text(OPENSCAD)
    (folder / "loop.scad").write_text("module f(n) { f(n + 1); }\nf(0);\n")
    folder.chmod(0o755)  # programs run as an unprivileged uid: their folder must be world-readable
    for parent in folder.parents[:3]:
        parent.chmod(0o755)
    return {"block.scad": "", "loop.scad": "render.script_error","cube.obj": "", "ring.ply": "", "ball.stl": "code_image_samples.no_code",
            "nan.obj": "render.invalid", "empty.stl": "render.invalid"}


@pytest.fixture(scope="module")
def rendered_run(tmp_path_factory, tiny_tokenizer, ray_session):
    tmp = tmp_path_factory.mktemp("render3d")
    expected = write_folder(tmp / "things")
    (tmp / "scenes").mkdir(mode=0o755)
    (tmp / "scenes" / "pair.py").write_text(SCENE)
    (tmp / "scenes" / "nothing.py").write_text("import trimesh\nx = 1\n")
    stages = [{"stage": "render", "kinds": ["mesh", "cad", "scene3d"], "size": 96, "num_cpus": 0.25, "timeout_s": 60},
              {"stage": "render_dedup"}, {"stage": "code_image_samples"},
              {"stage": "tokenize", "tokenizer": str(tiny_tokenizer), "num_cpus": 0.5}]
    sources = [{"name": "things", "type": "files", "paths": ["things/*"]},
               {"name": "scenes", "type": "files", "paths": ["scenes/*.py"], "kind": "scene3d"},
               {"name": "gen", "type": "cad_programs", "count": 2}, {"name": "gen3d", "type": "scene_programs", "count": 2}]
    recipe = tiny_recipe(tmp, tiny_tokenizer, sources,
                         stages=stages, phases=[{"name": "main", "seq_len": 4096}])
    assert cli.main(["run", str(recipe), "--out", str(tmp / "out")]) == 0
    return tmp / "out", expected


def test_every_record_is_written_or_rejected_with_its_reason(rendered_run):
    out, expected = rendered_run
    stats = json.loads((out / "stats.json").read_text())
    assert stats["balanced"] is True
    written = {name for name, why in expected.items() if not why}
    assert stats["records_in"] == {"things": len(expected), "scenes": 2, "gen": 2, "gen3d": 2}
    assert stats["written"] == {"things": len(written), "scenes": 1, "gen": 2, "gen3d": 2}  # generated programs run
    rejects = {line["source_id"].rsplit("/", 1)[-1]: line["reject"] for line in read_rejects(out)}
    assert rejects == {**{name: why for name, why in expected.items() if why}, "nothing.py": "render.no_shape"}


def test_shards_hold_the_written_pairs(rendered_run):
    out, expected = rendered_run
    samples = list(stream(out / "main"))
    doc_ids = {doc_id for sample in samples for doc_id in sample["doc_ids"]}
    assert len(doc_ids) == sum(not why for why in expected.values()) + 1 + 2 + 2
