"""3D scene programs: trimesh programs in the code sandbox, three.js in Chromium with software
WebGL and `three` from the venv; and the seeded scene and CAD generators."""
import ast
import contextlib
import os
from types import SimpleNamespace

import pytest

from renderers.base import RenderError, RenderOptions
from renderers.procedural_3d import cad_programs, scene_programs
from renderers.scene3d import Scene3dRenderer
from tests.conftest import rgb

PROGRAM = """import trimesh
plate = trimesh.creation.box((3, 3, 0.5)).difference(trimesh.creation.cylinder(0.8, 2))
plate.visual.face_colors = [220, 30, 30, 255]
show_object(plate)
"""
THREE = """import * as THREE from 'three';
const renderer = new THREE.WebGLRenderer();
renderer.setSize(window.innerWidth, window.innerHeight);
document.body.appendChild(renderer.domElement);
const scene = new THREE.Scene();
scene.background = new THREE.Color(0xffffff);
const camera = new THREE.PerspectiveCamera(45, 1, 0.1, 100);
camera.position.set(0, 0, 5);
scene.add(new THREE.Mesh(new THREE.BoxGeometry(2, 2, 2), new THREE.MeshBasicMaterial({ color: 0x0000ff })));
renderer.render(scene, camera);
"""


@pytest.fixture(scope="module")
def renderer():
    with contextlib.closing(Scene3dRenderer()) as scene3d:
        yield scene3d


def reddish(png: bytes) -> float:
    pixels = rgb(png).astype(int)
    return float(((pixels[..., 0] > 120) & (pixels[..., 0] > 2 * pixels[..., 1])).mean())


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the code sandbox needs root (own uid, mount namespace)")
def test_a_trimesh_program_with_a_boolean_renders_its_coloured_part(renderer):
    result = renderer.render(PROGRAM, None, RenderOptions(size=128, timeout_s=30))
    assert result.meta["language"][0] == "Python (trimesh)" and result.meta["program"]["shapes"] == 1
    assert all(reddish(image) > 0.05 for image in result.images)  # the plate, red, from every side
    with pytest.raises(RenderError) as caught:
        renderer.render("import trimesh\nx = 1\n", None, RenderOptions(size=128, timeout_s=30))
    assert caught.value.reason == "no_shape"


@pytest.mark.slow
def test_a_threejs_scene_renders_with_software_webgl_and_local_three(renderer):
    result = renderer.render(THREE, None, RenderOptions(size=128, timeout_s=30), name="cube.js")
    pixels = rgb(result.images[0])
    assert pixels.shape == (128, 128, 3) and (pixels[64, 64] == [0, 0, 255]).all()  # the cube, face on
    assert (pixels[2, 2] == [255, 255, 255]).all() and result.meta["language"] == ("three.js", "javascript")
    assert not result.meta.get("blocked_requests")  # three came inline from the venv, not from a CDN


def test_the_generators_are_seeded_and_emit_valid_programs():
    source = SimpleNamespace(name="gen")
    scenes = [doc["text"] for doc in scene_programs(source, 7, 0, 40)]
    parts = [doc["text"] for doc in cad_programs(source, 7, 0, 40)]
    assert scenes == [doc["text"] for doc in scene_programs(source, 7, 0, 40)]  # same seed, same programs
    assert len(set(scenes)) == 40 and len(set(parts)) == 40
    for code in scenes + [part for part in parts if part.startswith("import cadquery")]:
        ast.parse(code)
    openscad = [part for part in parts if part.startswith("// OpenSCAD")]
    assert 5 < len(openscad) < 25 and all(part.count("{") == part.count("}") for part in openscad)
    features = " ".join(parts)
    for feature in (".fillet(", ".chamfer(", ".revolve(", ".rarray(", ".polarArray(", "rotate_extrude", "for ("):
        assert feature in features
