"""CAD programs with real CadQuery, build123d and OpenSCAD in the code sandbox (bubblewrap, a forked
child per script): parts end to end, and every hostile script ending as its own reject."""
import contextlib
import os
import socket
import threading

import pytest

from renderers.base import RenderError, RenderOptions
from renderers.cad import NPROC, CadRenderer, canonical_stl
from renderers.sandbox import processes_of
from tests.conftest import rgb

pytestmark = [pytest.mark.slow,  # three warm workers: CadQuery's import alone is ~5 s
              pytest.mark.skipif(os.geteuid() != 0, reason="the code sandbox needs root (own uid, mount namespace)")]

CADQUERY = ("import cadquery as cq\nresult = cq.Workplane('XY').box(30, 20, 10).faces('>Z').hole(8)\n"
            "print('volume', result.val().Volume())\n")  # real scripts print: it must not reach the reply pipe
BUILD123D = """from build123d import *
with BuildPart() as part:
    Cylinder(10, 20)
    fillet(part.edges(), radius=2)
show_object(part)
"""
OPENSCAD = "difference() { cube([20, 20, 10], center=true); cylinder(h=30, r=6, center=true, $fn=48); }\n"


@pytest.fixture(scope="module")
def renderer():
    with contextlib.closing(CadRenderer()) as cad:
        yield cad


@pytest.fixture(autouse=True)
def readable_tmp(tmp_path):
    """Scripts run as an unprivileged uid: their folder must be world-readable (pytest makes it 0700)."""
    for folder in [tmp_path, *tmp_path.parents[:2]]:
        folder.chmod(0o755)


def render(renderer, code, folder, name, **options):
    return renderer.render(code, folder, RenderOptions(**{"size": 128, "timeout_s": 30, **options}), name=name)


def rejected(renderer, code, folder, name="hostile.py", **options) -> RenderError:
    with pytest.raises(RenderError) as caught:
        render(renderer, code, folder, name, **options)
    return caught.value


@pytest.mark.parametrize("code,name,language", [(CADQUERY, "plate.py", "CadQuery"), (BUILD123D, "pin.py", "build123d"),
                                                 (OPENSCAD, "block.scad", "OpenSCAD")])
def test_a_part_in_each_dialect_renders_as_edged_views(renderer, tmp_path, code, name, language):
    (tmp_path / name).write_text(code)
    result = render(renderer, code, tmp_path, name)
    assert len(result.images) == 4 and result.meta["language"][0] == language
    assert result.meta["geometry"]["faces"] > 20
    pixels = rgb(result.images[0])
    assert (pixels < 240).any(axis=2).mean() > 0.1  # the part fills a good share of the view
    assert (pixels.max(axis=2) < 100).any()  # its edges are drawn dark (~60; shaded faces stay above ~150)


def test_an_openscad_file_includes_a_library_and_imports_a_neighbour(renderer, tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "shapes.scad").write_text("module peg(h) { cylinder(h=h, r=2, $fn=24); }\n")
    (tmp_path / "part").mkdir()
    (tmp_path / "part" / "base.scad").write_text("cube([10, 10, 2]);\n")
    code = "use <shapes.scad>\ninclude <base.scad>\ntranslate([5, 5, 2]) peg(8);\n"
    (tmp_path / "part" / "main.scad").write_text(code)
    result = render(renderer, code, tmp_path / "part", "main.scad", libraries=[str(tmp_path / "lib")])
    assert result.meta["program"]["dialect"] == "openscad" and len(result.images) == 4


def test_processes_sockets_and_outside_files_are_forbidden(renderer, tmp_path):
    (tmp_path / "secret.txt").write_text("s3cret")
    scripts = tmp_path / "scripts"
    scripts.mkdir(mode=0o755)
    for code in ["import os\nos.system('true')", "import subprocess\nsubprocess.run(['true'])",
                 f"open({str(tmp_path / 'secret.txt')!r}).read()", "open('/etc/hostname').read()",
                 "import socket\nsocket.create_connection(('127.0.0.1', 9))"]:
        error = rejected(renderer, code + "\nresult = None\n", scripts)
        assert error.reason == "forbidden", (code, error)


def test_the_os_layers_hold_where_the_audit_hook_is_bypassed(renderer, tmp_path):
    """ctypes calls libc directly, past the hook: the mount and network namespaces still hold."""
    (tmp_path / "secret.txt").write_text("s3cret")
    server = socket.create_server(("127.0.0.1", 0))
    port, seen = server.getsockname()[1], []
    threading.Thread(target=lambda: seen.append(server.accept()), daemon=True).start()
    code = f"""import ctypes, struct
libc = ctypes.CDLL(None, use_errno=True)
fds = [libc.open(p.encode(), 0) for p in ({str(tmp_path / 'secret.txt')!r}, '/etc/hostname', '/root/.bashrc')]
sock = libc.socket(2, 1, 0)
address = struct.pack('<HH4s8x', 2, ({port} >> 8) | (({port} & 255) << 8), bytes([127, 0, 0, 1]))
raise RuntimeError(f"fds={{fds}} connect={{libc.connect(sock, address, 16)}}")
"""
    scripts = tmp_path / "scripts"
    scripts.mkdir(mode=0o755)
    error = rejected(renderer, code, scripts)
    server.close()
    assert error.reason == "script_error" and "fds=[-1, -1, -1] connect=-1" in error.detail
    assert seen == []  # the server saw nothing


def test_loops_memory_bombs_and_fork_storms_stop_at_their_caps(renderer, tmp_path):
    assert rejected(renderer, "while True:\n    pass\n", tmp_path, timeout_s=3).reason == "timeout"
    assert rejected(renderer, "x = bytearray(64 << 30)\n", tmp_path).reason == "out_of_memory"
    storm = """import ctypes, time
libc = ctypes.CDLL(None, use_errno=True)
forks = 0
for _ in range(500):
    pid = libc.fork()
    if pid == 0:
        time.sleep(60)
    if pid > 0:
        forks += 1
raise RuntimeError(f"forks={forks}")
"""
    error = rejected(renderer, storm, tmp_path)
    forks = int(error.detail.split("forks=")[1])
    assert 0 < forks < NPROC  # the uid's process cap held, as root
    assert processes_of(renderer.sandboxes["cadquery"].uid) == []  # every orphan killed
    assert render(renderer, CADQUERY, tmp_path, "after.py").images  # and the worker goes on


def test_scripts_that_show_nothing_raise_or_recurse_are_rejected(renderer, tmp_path):
    assert rejected(renderer, "import cadquery as cq\nx = 1\n", tmp_path).reason == "no_shape"
    assert rejected(renderer, "import cadquery as cq\nraise ValueError('bad')\n", tmp_path).reason == "script_error"
    recursion = rejected(renderer, "module f(n) { f(n + 1); }\nf(0);\n", tmp_path, name="loop.scad")
    assert recursion.reason == "script_error" and "ecursion" in recursion.detail


def test_the_same_triangles_in_any_order_give_the_same_stl():
    """OpenSCAD writes a shape's triangles in a different order from run to run: canonical_stl makes
    the bytes (and so the render) depend on the triangles alone, winding kept."""
    import numpy as np
    import trimesh

    stl = trimesh.creation.icosphere(subdivisions=2).export(file_type="stl")
    header, body = stl[:80], stl[84:]
    records = np.frombuffer(body, dtype=[("normal", "<f4", 3), ("v", "<f4", (3, 3)), ("attribute", "<u2")]).copy()
    rng = np.random.default_rng(0)
    shuffled = records[rng.permutation(len(records))]
    turns = rng.integers(0, 3, len(shuffled))
    shuffled["v"] = shuffled["v"][np.arange(len(shuffled))[:, None], (turns[:, None] + np.arange(3)) % 3]
    assert shuffled.tobytes() != records.tobytes()
    assert canonical_stl(header, shuffled.tobytes()) == canonical_stl(header, body)
    import io

    mesh = trimesh.load(io.BytesIO(canonical_stl(header, shuffled.tobytes())), file_type="stl")
    assert len(mesh.faces) == len(records) and mesh.is_winding_consistent and mesh.volume > 0
