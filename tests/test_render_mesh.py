"""The mesh renderer with real trimesh, pyrender and OSMesa: silhouettes, textures, determinism,
the code side, and every bad mesh the issue lists ending as its own reject."""
import contextlib
import io
import json
import math
import zipfile

import numpy as np
import pytest
import trimesh
from PIL import Image

from renderers.base import RenderError, RenderOptions
from renderers.mesh import MeshRenderer
from tests.conftest import rgb

pytestmark = pytest.mark.slow  # one sandboxed worker: ~10 s to start and compile its shaders

FRONT = {"angles": [[0, 0]], "shading": "flat", "lighting": "headlight"}


@pytest.fixture(scope="module")
def renderer():
    with contextlib.closing(MeshRenderer()) as mesh:
        yield mesh


def render(renderer, folder, name, **options):
    options = {"size": 128, "timeout_s": 60, **options}
    return renderer.render("", folder, RenderOptions(**options), name=name)


def reason(renderer, folder, name, **options) -> str:
    with pytest.raises(RenderError) as caught:
        render(renderer, folder, name, **options)
    return caught.value.reason


def silhouette(png: bytes) -> np.ndarray:
    return (rgb(png) < 240).any(axis=2)  # not the white background


def fill_ratio(mask: np.ndarray) -> float:
    rows, cols = np.where(mask)
    box = (rows.max() - rows.min() + 1) * (cols.max() - cols.min() + 1)
    return mask.sum() / box


def test_a_cube_seen_face_on_is_a_square_and_a_sphere_a_disc(renderer, tmp_path):
    trimesh.creation.box().export(tmp_path / "cube.obj")
    trimesh.creation.icosphere(4).export(tmp_path / "ball.stl")
    cube = silhouette(render(renderer, tmp_path, "cube.obj", views=FRONT).images[0])
    assert fill_ratio(cube) > 0.97  # a square fills its bounding box
    for image in render(renderer, tmp_path, "ball.stl").images:  # four views, all discs
        assert abs(fill_ratio(silhouette(image)) - math.pi / 4) < 0.03


def test_views_are_deterministic_and_a_sheet_tiles_them(renderer, tmp_path):
    trimesh.creation.torus(1, 0.3).export(tmp_path / "torus.ply")
    first, second = (render(renderer, tmp_path, "torus.ply") for _ in range(2))
    assert len(first.images) == 4 and first.images == second.images  # the same bytes, every view
    sheet = render(renderer, tmp_path, "torus.ply", views={"sheet": True}).images
    assert len(sheet) == 1 and Image.open(io.BytesIO(sheet[0])).size == (256, 256)  # 2 x 2 views of 128
    assert (rgb(sheet[0])[:128, :128] == rgb(first.images[0])).all()


def test_a_textured_gltf_shows_its_texture(renderer, tmp_path):
    box = trimesh.creation.box()
    red = Image.new("RGB", (8, 8), (230, 10, 10))
    box.visual = trimesh.visual.TextureVisuals(uv=np.full((len(box.vertices), 2), 0.5), image=red)
    box.export(tmp_path / "red.glb")
    pixels = rgb(render(renderer, tmp_path, "red.glb", views=FRONT).images[0])
    face = pixels[40:88, 40:88].reshape(-1, 3).astype(int)
    assert (face[:, 0] > 2 * face[:, 1]).mean() > 0.95  # red dominates where the cube is


def test_text_formats_are_the_code_and_binary_ones_have_none(renderer, tmp_path):
    trimesh.creation.box().export(tmp_path / "cube.obj")
    trimesh.creation.box().export(tmp_path / "cube.stl")  # binary STL
    obj = render(renderer, tmp_path, "cube.obj")
    assert obj.code.startswith("#") or "\nv " in obj.code
    assert obj.meta["has_code"] and obj.meta["language"] == ("Wavefront OBJ", "obj")
    stl = render(renderer, tmp_path, "cube.stl")
    assert stl.code == "" and not stl.meta["has_code"] and len(stl.images) == 4
    trimesh.creation.box().export(tmp_path / "cube.3mf")  # a zip: its names decode as cp437 in the worker
    assert render(renderer, tmp_path, "cube.3mf").meta["format"] == "3mf"
    long_obj = render(renderer, tmp_path, "cube.obj", mesh_code_chars=50)
    assert long_obj.code == "" and not long_obj.meta["has_code"]


def gltf_with_nodes(nodes: list, buffer_uri: str | None = None) -> str:
    box = json.loads(trimesh.exchange.gltf.export_gltf(trimesh.Scene(trimesh.creation.box()),
                                                         embed_buffers=True)["model.gltf"])
    box["nodes"] = nodes + [{"mesh": 0}]
    box["scenes"] = [{"nodes": [0]}]
    if buffer_uri is not None:
        box["buffers"][0]["uri"] = buffer_uri
    return json.dumps(box)


def test_bad_meshes_end_as_their_own_rejects(renderer, tmp_path):
    (tmp_path / "huge.off").write_text("OFF\n1000000000000 1000000000000 0\n0 0 0\n")
    (tmp_path / "nan.obj").write_text("v 0 0 0\nv 1 0 nan\nv 0 inf 0\nf 1 2 3\n")
    (tmp_path / "empty.stl").write_bytes(b"")
    (tmp_path / "cycle.gltf").write_text(gltf_with_nodes([{"children": [1]}, {"children": [0]}]))
    (tmp_path / "nobin.gltf").write_text(gltf_with_nodes([{"children": [1]}], buffer_uri="missing.bin"))
    (tmp_path / "escape.gltf").write_text(gltf_with_nodes([{"children": [1]}], buffer_uri="../../etc/passwd"))
    bomb = io.BytesIO()
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("3D/3dmodel.model", b"\0" * (600 << 20))  # 600 MB of zeros in ~600 KB
    (tmp_path / "bomb.3mf").write_bytes(bomb.getvalue())
    found = {name: reason(renderer, tmp_path, name) for name in
             ("huge.off", "nan.obj", "empty.stl", "cycle.gltf", "nobin.gltf", "escape.gltf", "bomb.3mf")}
    assert found == {"huge.off": "invalid", "nan.obj": "invalid", "empty.stl": "invalid", "cycle.gltf": "invalid",
                     "nobin.gltf": "invalid", "escape.gltf": "invalid", "bomb.3mf": "too_large"}


def test_a_texture_that_is_a_decompression_bomb_is_too_large(renderer, tmp_path):
    box = trimesh.creation.box()
    box.visual = trimesh.visual.TextureVisuals(uv=np.full((len(box.vertices), 2), 0.5),
                                               image=Image.new("RGB", (4, 4)))
    box.export(tmp_path / "box.obj")  # box.obj + material.mtl + material_0.png
    textures = [p for p in tmp_path.iterdir() if p.suffix == ".png"]
    Image.new("1", (20000, 20000)).save(textures[0])  # 400 M pixels in ~60 KB of PNG
    assert reason(renderer, tmp_path, "box.obj") == "too_large"


def test_views_render_when_the_libraries_sit_in_a_private_folder(tmp_path, monkeypatch):
    """A checkout or venv inside a folder only root may enter (a home of mode 0700, `mktemp -d`):
    the worker drops to its own uid after it starts, so it must have read what the views need by
    then (pyrender read its shader sources at the first draw: every view was render.crashed)."""
    import pyrender

    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "pyrender").symlink_to(pyrender.__path__[0])  # the worker imports pyrender from here
    monkeypatch.syspath_prepend(str(private))
    trimesh.creation.box().export(tmp_path / "cube.obj")
    with contextlib.closing(MeshRenderer()) as mesh:
        cube = silhouette(render(mesh, tmp_path, "cube.obj", views=FRONT).images[0])
    assert fill_ratio(cube) > 0.97
