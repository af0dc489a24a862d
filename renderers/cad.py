"""CAD programs (CadQuery and build123d Python scripts, OpenSCAD files) to views.

Each script runs in renderers.codebox (bubblewrap, a forked child per script under its own uid,
no network, only its folder and the libraries visible). What the child sends back is a mesh:
- CadQuery / build123d: the script runs with `cq` and `show_object` already defined (doc
  snippets assume both; `show`, `show_all` and an `ocp_vscode` stand-in too); the shapes are
  those shown, else `result`, else the last shape left in scope (Workplane, Shape, Assembly,
  Sketch, a build123d builder or part, a list of them). They are tessellated with OCCT's
  BRepMesh at 0.1% of their size and sent as a GLB;
- OpenSCAD: Debian's `openscad` exports binary STL to stdout (OPENSCADPATH = the library
  folders, so `include <BOSL/...>` resolves; imports relative to the file work because the file
  runs in place, its folder mounted read-only).
The parent renders that mesh with the mesh renderer's sandboxed worker: flat shading, crease
edges drawn, z up, the first view isometric. One warm worker per dialect, started on first use
(importing CadQuery costs ~5 s and ~450 MB, build123d ~6 s, so it happens once per actor).
A script that shows nothing is render.no_shape; one that raises, render.script_error; OpenSCAD's
errors and its recursion limit, render.script_error.
"""
from __future__ import annotations

import re
import sys
import types
from pathlib import Path
from typing import Any

from renderers.base import Render, RenderError, RenderOptions
from renderers.codebox import CodeSandbox, python_roots, run_child, settle_worker
from renderers.mesh import MeshRenderer
from renderers.sandbox import Limits

LANGUAGES = {"cadquery": ("CadQuery", "python"), "build123d": ("build123d", "python"),
             "openscad": ("OpenSCAD", "openscad")}
WORKER_LIMITS = Limits(memory_mb=None, nproc=64, nofile=1024, fsize=None)  # the worker is trusted; children are capped
CHILD_MIN_MB = 4096  # OCCT maps ~1.5 GB of address space before it meshes anything
NPROC = 32  # processes (and threads) of a script's uid: OpenSCAD and OCCT use a few
BUILD123D_NAMES = re.compile(r"\bBuild(?:Part|Sketch|Line)\b|\b(?:Box|Cylinder|Sphere|Rectangle|Circle)\(")
STL_RECORD = [("normal", "<f4", 3), ("v", "<f4", (3, 3)), ("attribute", "<u2")]  # a binary STL's triangle, 50 bytes
TOLERANCE = 1e-3  # tessellation deflection, as a fraction of the part's bounding-box diagonal
# Run once by each Python worker (codebox.settle_worker): sketch, extrude, revolve, fillet, chamfer, a cut,
# transforms, tessellation and GLB export, so that every child finds them warm. Serial operations only:
# CadQuery's and build123d's own booleans run in parallel, and OCCT's thread pool must not start in the worker.
WARM_UP = {"cadquery": """import cadquery as cq
from OCP.BRepAlgoAPI import BRepAlgoAPI_Cut
plate = cq.Workplane("XY").box(30, 20, 10).edges("|Z").fillet(2).faces(">Z").chamfer(0.5)
peg = cq.Workplane("XY").center(5, 0).circle(4).extrude(15)
ring = cq.Workplane("XZ").center(8, 0).rect(3, 3).revolve(360, (-8, 0, 0), (-8, 1, 0))
body = plate.val()
show_object(body._bool_op((body,), (peg.val(), ring.val()), BRepAlgoAPI_Cut(), parallel=False))
show_object(cq.Workplane("XY").polygon(6, 10).extrude(3).translate((0, 0, 12)).rotate((0, 0, 0), (0, 0, 1), 30))
""", "build123d": """from build123d import *
with BuildPart() as block:
    Box(30, 20, 10)
    fillet(block.edges().filter_by(Axis.Z), radius=2)
    chamfer(block.edges().group_by(Axis.Z)[-1], length=0.5)
with BuildSketch() as profile:
    RegularPolygon(5, 6)
with BuildPart() as post:
    extrude(profile.sketch, amount=5)
with BuildPart() as ring:
    with BuildSketch(Plane.XZ):
        with Locations((8, 0)):
            Rectangle(3, 3)
    revolve(axis=Axis.Z)
show_object([block, Pos(0, 0, 12) * post.part, ring])
"""}


def dialect_of(code: str, name: str) -> str:
    """By the file's extension; a program with no file (a generator's) by its first line (Python has no
    //); build123d by its import or, in doc snippets that assume it, its builders."""
    if name.lower().endswith(".scad") or (not name and code.lstrip().startswith(("//", "/*"))):
        return "openscad"
    return "build123d" if "build123d" in code or BUILD123D_NAMES.search(code) and "cq." not in code else "cadquery"


class ProgramRenderer:
    """Shared by CAD and 3D scene programs: run in a code sandbox (one per dialect), render the mesh."""

    name = "program"
    reads_file = True  # OpenSCAD runs the file in place; Python scripts get their name in tracebacks
    target = "renderers.cad:run_request"

    def __init__(self):
        self.sandboxes: dict[str, CodeSandbox] = {}
        self.meshes = MeshRenderer()

    def run(self, dialect: str, code: str, asset_dir: Path | None, name: str, options: RenderOptions
            ) -> tuple[dict[str, Any], bytes]:
        if len(code.encode("utf-8", "surrogatepass")) > options.max_input_bytes:
            raise RenderError("too_large", f"over max_input_bytes={options.max_input_bytes}")
        sandbox = self.sandboxes.get(dialect) or self.sandboxes.setdefault(
            dialect, CodeSandbox(f"{self.target}_{dialect}", WORKER_LIMITS))
        asset = str(asset_dir.resolve()) if asset_dir is not None else ""
        header = {"dialect": dialect, "name": name or f"script.{'scad' if dialect == 'openscad' else 'py'}",
                  "asset_dir": asset, "libraries": [str(Path(p).resolve()) for p in options.libraries],
                  "memory_mb": max(options.memory_mb, CHILD_MIN_MB), "nproc": NPROC, "python_roots": python_roots(),
                  "scratch_cwd": dialect != "openscad"}
        return sandbox.run(header, code, options.timeout_s)

    def draw(self, reply: dict[str, Any], mesh: bytes, language: tuple[str, str], options: RenderOptions,
             cad: bool) -> Render:
        images, views = self.meshes.render_files({f"part.{reply['format']}": mesh}, f"part.{reply['format']}",
                                                 options, cad=cad)
        meta = {"renderer": "pyrender", "version": views["version"], "sizes": [views["size"]] * len(images),
                "language": language, "program": {k: v for k, v in reply.items() if k != "format"},
                "geometry": views["geometry"], "options": {"size": options.size, **options.views.model_dump()}}
        return Render(images, meta)

    def close(self) -> None:
        for sandbox in self.sandboxes.values():
            sandbox.stop()
        self.meshes.close()


class CadRenderer(ProgramRenderer):
    name = "cad"

    def render(self, code: str, asset_dir: Path | None, options: RenderOptions, name: str = "") -> Render:
        dialect = dialect_of(code, name)
        reply, mesh = self.run(dialect, code, asset_dir, name, options)
        return self.draw(reply, mesh, LANGUAGES[dialect], options, cad=True)


# ---- in the worker (run_request_*) and its children (the jobs) ---------------------------------

def run_request_cadquery(header: dict[str, Any], code: bytes) -> tuple[dict[str, Any], bytes]:
    return run_child(python_job, header, code.decode("utf-8", "replace"))


run_request_build123d = run_request_cadquery


def run_request_openscad(header: dict[str, Any], code: bytes) -> tuple[dict[str, Any], bytes]:
    return run_child(openscad_job, header, code.decode("utf-8", "replace"), guarded=False)


def openscad_job(header: dict[str, Any], code: str) -> tuple[dict[str, Any], bytes]:
    import subprocess

    path = Path(header["asset_dir"]) / header["name"] if header["asset_dir"] else None
    if path is None or not path.is_file() or path.read_text("utf-8", "replace") != code:
        path = Path("/tmp") / Path(header["name"]).name  # generated code, or text that differs from the file
        path.write_text(code)
    env = {"PATH": "/usr/bin", "HOME": "/tmp", "OPENSCADPATH": ":".join(header["libraries"])}
    done = subprocess.run(["openscad", "-o", "-", "--export-format", "binstl", str(path)], capture_output=True,
                          env=env, cwd=str(path.parent), timeout=header["timeout_s"], check=False)
    errors = [line for line in done.stderr.decode("utf-8", "replace").splitlines() if "ERROR" in line]
    if done.returncode != 0 or errors:
        raise RenderError("script_error", ("; ".join(errors) or f"openscad exit {done.returncode}")[:500])
    if len(done.stdout) <= 84:  # an STL header and a zero triangle count
        raise RenderError("no_shape", "OpenSCAD made no 3D geometry (2-D only, or empty)")
    # Writing to a pipe, OpenSCAD cannot seek back to fill in the triangle count: it is computed here.
    count = (len(done.stdout) - 84) // 50
    return {"format": "stl", "dialect": "openscad"}, canonical_stl(done.stdout[:80], done.stdout[84 : 84 + 50 * count])


def canonical_stl(header: bytes, body: bytes) -> bytes:
    """A binary STL whose triangles are sorted, each starting at its smallest vertex (winding kept).
    OpenSCAD writes the same triangles in another order from run to run (three orders in five runs of
    one file), and the order changes edge pixels: the render must depend on the shape alone."""
    import numpy as np

    records = np.frombuffer(body, dtype=STL_RECORD).copy()
    corners, n = records["v"], len(records)
    flat = corners.reshape(-1, 3)
    by_triangle = np.lexsort((flat[:, 2], flat[:, 1], flat[:, 0], np.repeat(np.arange(n), 3)))
    first = by_triangle[::3] % 3  # each triangle's smallest corner
    records["v"] = corners[np.arange(n)[:, None], (first[:, None] + np.arange(3)) % 3]
    records = records[np.lexsort(records["v"].reshape(n, 9).T[::-1])]
    return header + n.to_bytes(4, "little") + records.tobytes()


def python_job(header: dict[str, Any], code: str) -> tuple[dict[str, Any], bytes]:
    shown: list = []
    namespace = script_namespace(header["dialect"], shown, header["name"])
    sys.path[:0] = [folder for folder in [header["asset_dir"], *header["libraries"]] if folder]
    exec(compile(code, header["name"], "exec"), namespace)  # noqa: S102 - in the sandboxed child
    shapes = shown or pick_shapes(namespace)
    if not shapes:
        raise RenderError("no_shape", "no show_object(), `result` or shape left in scope")
    return {"format": "glb", "dialect": header["dialect"], "shapes": len(shapes)}, to_glb(shapes)


def script_namespace(dialect: str, shown: list, name: str) -> dict[str, Any]:
    """What real scripts expect to find: show_object (CQ-editor), show/show_all (ocp_vscode), cq."""
    def show_object(obj, *args, **kwargs):
        shown.append(obj)

    def show(*objs, **kwargs):
        shown.extend(objs)

    viewer = types.ModuleType("ocp_vscode")
    viewer.show, viewer.show_object, viewer.show_all = show, show_object, lambda *a, **k: None
    viewer.set_port = viewer.set_defaults = viewer.reset_show = lambda *a, **k: None
    viewer.__all__ = ["show", "show_object", "show_all", "set_port", "set_defaults", "reset_show"]
    sys.modules["ocp_vscode"] = viewer
    namespace = {"__name__": "__main__", "__file__": name, "show_object": show_object, "show": show,
                 "show_all": viewer.show_all, "debug": lambda *a, **k: None, "log": lambda *a, **k: None}
    if dialect == "cadquery":
        import cadquery

        namespace["cq"] = cadquery
        vis = types.ModuleType("cadquery.vis")  # CadQuery's VTK window: showing is collecting here
        vis.show, vis.show_object = show, show_object
        sys.modules["cadquery.vis"] = vis
    else:  # build123d's doc snippets assume `from build123d import *`
        import build123d

        namespace.update({key: getattr(build123d, key) for key in build123d.__all__})
    return namespace


def pick_shapes(namespace: dict[str, Any]) -> list:
    if is_shape(namespace.get("result")):
        return [namespace["result"]]
    for value in reversed(list(namespace.values())):
        if is_shape(value):
            return [value]
    return []


def is_shape(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return bool(value) and all(is_shape(v) for v in value)
    kernel = type(value).__module__.split(".")[0]
    return kernel in {"cadquery", "build123d", "OCP"} and bool(topods_of(value))


def topods_of(value: Any) -> list:
    """The OCCT shapes inside a CadQuery or build123d object (or a list of them)."""
    if isinstance(value, (list, tuple)):
        return [shape for item in value for shape in topods_of(item)]
    if type(value).__name__.startswith("Build"):  # build123d's BuildPart, BuildSketch, BuildLine
        inner = [getattr(value, attribute, None) for attribute in ("part", "sketch", "line")]
        return topods_of([shape for shape in inner if shape is not None])
    if type(value).__name__ == "Workplane":
        return [shape.wrapped for shape in value.vals() if hasattr(shape, "wrapped")]
    if type(value).__name__ in {"Assembly", "Sketch"} and type(value).__module__.startswith("cadquery"):
        compound = value.toCompound() if hasattr(value, "toCompound") else value._faces
        return [compound.wrapped]
    if type(value).__name__.startswith("TopoDS"):  # a raw OCP shape: show_object(part.wrapped)
        return [value]
    wrapped = getattr(value, "wrapped", None)
    if wrapped is not None and type(wrapped).__name__.startswith("TopoDS"):
        return [wrapped]
    return []


def to_glb(shapes: list) -> bytes:
    import trimesh

    meshes = [tessellate(shape) for shape in topods_of(shapes)]
    meshes = [mesh for mesh in meshes if len(mesh.faces)]
    if not meshes:
        raise RenderError("no_shape", "the shapes have no faces (wires, points or empty compounds)")
    return trimesh.Scene(meshes).export(file_type="glb")


def tessellate(shape):
    """An OCCT shape as a trimesh: BRepMesh at TOLERANCE of its size, faces oriented outward."""
    import numpy as np
    import trimesh
    from OCP.Bnd import Bnd_Box
    from OCP.BRep import BRep_Tool
    from OCP.BRepBndLib import BRepBndLib
    from OCP.BRepMesh import BRepMesh_IncrementalMesh
    from OCP.TopAbs import TopAbs_FACE, TopAbs_REVERSED
    from OCP.TopExp import TopExp_Explorer
    from OCP.TopLoc import TopLoc_Location
    from OCP.TopoDS import TopoDS

    box = Bnd_Box()
    BRepBndLib.Add_s(shape, box)
    if box.IsVoid():
        return trimesh.Trimesh()
    diagonal = box.CornerMin().Distance(box.CornerMax()) or 1.0
    # One thread (isInParallel False): meshing faces in parallel gave a different triangle order, and
    # different edge pixels, when the machine was loaded; renders must not depend on timing.
    BRepMesh_IncrementalMesh(shape, diagonal * TOLERANCE, False, 0.3, False)
    vertices, faces = [], []
    explorer = TopExp_Explorer(shape, TopAbs_FACE)
    while explorer.More():
        face = TopoDS.Face_s(explorer.Current())
        location = TopLoc_Location()
        triangulation = BRep_Tool.Triangulation_s(face, location)
        if triangulation is not None:
            transform, offset = location.Transformation(), sum(len(v) for v in vertices)
            nodes = [triangulation.Node(i).Transformed(transform) for i in range(1, triangulation.NbNodes() + 1)]
            vertices.append(np.array([[p.X(), p.Y(), p.Z()] for p in nodes]))
            triangles = np.array([triangulation.Triangle(i).Get() for i in range(1, triangulation.NbTriangles() + 1)])
            if face.Orientation() == TopAbs_REVERSED:
                triangles = triangles[:, ::-1]
            faces.append(triangles - 1 + offset)
        explorer.Next()
    if not faces:
        return trimesh.Trimesh()
    return trimesh.Trimesh(np.vstack(vertices), np.vstack(faces), process=False)


def preload() -> None:
    """Import the worker's kernel while trusted (the dialect is the target's suffix: `serve TARGET ...`),
    then warm and settle it for forking (codebox.settle_worker). The OpenSCAD worker imports no trimesh
    (its children run a program and sort an STL with numpy): 25 MB of heap to copy a fork, not 70."""
    target = next((arg for arg in sys.argv if arg.startswith("renderers.")), "")
    dialect = target.rsplit("_", 1)[-1]
    import numpy  # noqa: F401 - canonical_stl; before the warm-up: its BLAS starts threads on import
    if dialect == "openscad":
        settle_worker()
        return
    import cadquery  # noqa: F401 - build123d scripts may use cq too
    import trimesh  # noqa: F401 - to_glb; also before the warm-up (scipy's BLAS threads)
    if dialect == "build123d":
        import build123d  # noqa: F401
    header = {"dialect": dialect, "name": "warm_up.py", "asset_dir": "", "libraries": []}
    settle_worker(lambda: python_job(header, WARM_UP[dialect]))
