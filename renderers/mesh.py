"""Meshes and scenes (OBJ, PLY, STL, OFF, glTF/GLB, 3MF...) to views, in a sandboxed worker.

The parent (a Ray actor) reads the file and the local files it names (an OBJ's material
libraries and their textures, a glTF's buffers and images) from the document's folder,
checks archives (3MF is a zip: a bomb is refused from its directory, before anything is
inflated) and hands the bytes to the worker. The worker opens no file: trimesh loads from the
bytes through a resolver that knows only those files, so a glTF whose buffer is missing fails
as render.invalid, and one that names /etc/passwd gets nothing. The worker then checks the
geometry (some triangles, all coordinates finite, at most max_faces) and renders the views
(renderers.views) under its rlimits: a header claiming 10^12 vertices ends as a MemoryError
(render.too_large), not as a machine out of memory.

The code side of a mesh pair is its text serialization where the format is textual (OBJ,
ASCII STL/PLY/OFF, glTF JSON with embedded data: URIs cut to "data:..."), up to
`mesh_code_chars`; a binary mesh or a longer text is rendered but has no code
(notes["render"]["has_code"] false), and code_image_samples rejects it as no_code.
"""
from __future__ import annotations

import io
import json
import re
import zipfile
from pathlib import Path
from typing import Any

from renderers.base import Render, RenderError, RenderOptions, file_inside
from renderers.sandbox import Limits, Sandbox

WORKER_LIMITS = Limits(memory_mb=3072, nproc=16)  # llvmpipe's JIT and a 4M-face mesh fit in 3 GB; no file writes
MAX_UNZIPPED_BYTES = 512 << 20  # a 3MF's members together; more is a zip bomb (render.too_large)
MAX_ZIP_RATIO = 200  # deflate rarely beats 20:1 on real meshes; bombs reach 1000:1
TEXT_FORMATS = {".obj", ".stl", ".ply", ".off", ".gltf"}  # formats that may be text; binary ones are checked
Z_UP_FORMATS = {".stl", ".3mf", ".off"}  # 3D-printing formats are z-up; glTF and OBJ are y-up
MESH_LANGUAGES = {"obj": ("Wavefront OBJ", "obj"), "stl": ("ASCII STL", "stl"), "ply": ("ASCII PLY", "ply"),
                  "off": ("OFF", "off"), "gltf": ("glTF JSON", "json")}  # (name in prose, code-fence tag)
MTLLIB = re.compile(r"^\s*mtllib\s+(.+?)\s*$", re.MULTILINE)
MAP_LINE = re.compile(r"^\s*(?:map_\w+|bump|disp|decal|refl)\s+(?:-\S+\s+(?:\S+\s+)*?)?(\S+)\s*$", re.MULTILINE)
DATA_URI = re.compile(r'"data:[^"]{64,}"')


class MeshRenderer:
    """One sandboxed worker with a warm OSMesa context; Ray gives each actor its own."""

    name = "mesh"
    reads_file = True  # the render stage passes the file's name: a mesh renders from its bytes, not its text

    def __init__(self, limits: Limits = WORKER_LIMITS):
        self.sandbox = Sandbox("renderers.mesh:render_request", limits)

    def render(self, code: str, asset_dir: Path | None, options: RenderOptions, name: str = "") -> Render:
        if asset_dir is None or not name:
            raise RenderError("invalid", "a mesh renders from its file: read it with a `files` source")
        root = asset_dir.resolve()
        path = file_inside(root, name)
        if path is None:
            raise RenderError("invalid", f"{name}: not a file inside {root}")
        files = gather(path, root, options.max_input_bytes)
        images, reply = self.render_files(files, path.name, options, cad=False)
        text = mesh_code(path.suffix.lower(), files[path.name], options.mesh_code_chars)
        fmt = path.suffix.lower().lstrip(".")
        meta = {"renderer": "pyrender", "language": MESH_LANGUAGES.get(fmt, (fmt.upper(), "text")), "version": reply["version"], "sizes": [reply["size"]] * len(images),
                "options": {"size": options.size, "background": options.background, **options.views.model_dump()},
                "geometry": reply["geometry"], "has_code": bool(text), "format": fmt}
        return Render(images, meta, text)

    def render_files(self, files: dict[str, bytes], name: str, options: RenderOptions, cad: bool
                     ) -> tuple[list[bytes], dict[str, Any]]:
        """The views of `files[name]` (its neighbours resolvable by name), and the worker's reply."""
        from renderers.svg import rgba

        header = {"name": name, "sizes": [[key, len(data)] for key, data in files.items()], "cad": cad,
                  "size": options.size, "background": rgba(options.background), "views": options.views.model_dump()}
        reply, payload = self.sandbox.call(header, b"".join(files.values()), options.timeout_s)
        return split(payload, reply["lengths"]), reply

    def close(self) -> None:
        self.sandbox.stop()


def gather(path: Path, root: Path, max_bytes: int) -> dict[str, bytes]:
    """The file and the local files it names (relative to its folder), at most max_bytes in all."""
    files = {path.name: read_capped(path, max_bytes)}
    for reference in references(path, files[path.name], root):
        found = file_inside(path.parent, reference)
        if found is not None and found.is_relative_to(root) and reference not in files:
            files[reference] = read_capped(found, max_bytes)
        if sum(map(len, files.values())) > max_bytes:
            raise RenderError("too_large", f"{path.name} and its files: over max_input_bytes={max_bytes}")
    if path.suffix.lower() == ".3mf":
        check_zip(files[path.name])
    return files


def read_capped(path: Path, max_bytes: int) -> bytes:
    if path.stat().st_size > max_bytes:
        raise RenderError("too_large", f"{path.name}: {path.stat().st_size} bytes > max_input_bytes={max_bytes}")
    return path.read_bytes()


def references(path: Path, data: bytes, root: Path) -> list[str]:
    """Names of the local files a glTF or OBJ (through its .mtl files) loads."""
    suffix = path.suffix.lower()
    if suffix == ".gltf":
        try:
            gltf = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            return []
        entries = (gltf.get("buffers") or []) + (gltf.get("images") or []) if isinstance(gltf, dict) else []
        return [e["uri"] for e in entries if isinstance(e, dict) and isinstance(e.get("uri"), str)
                and not e["uri"].startswith("data:")]
    if suffix != ".obj":
        return []
    libraries = MTLLIB.findall(data.decode("utf-8", "replace"))
    textures = []
    for library in libraries:
        found = file_inside(path.parent, library)
        if found is not None and found.is_relative_to(root) and found.stat().st_size < 1 << 20:
            textures += MAP_LINE.findall(found.read_text("utf-8", "replace"))
    return libraries + textures


def check_zip(data: bytes) -> None:
    """Refuse a zip (3MF) that would inflate past the limits, from its directory alone."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            infos = archive.infolist()
    except zipfile.BadZipFile as err:
        raise RenderError("invalid", f"3MF is not a zip: {err}") from None
    unzipped = sum(info.file_size for info in infos)
    if unzipped > MAX_UNZIPPED_BYTES or unzipped > MAX_ZIP_RATIO * max(1, len(data)):
        raise RenderError("too_large", f"zip inflates to {unzipped} bytes from {len(data)}: a zip bomb")


def mesh_code(suffix: str, data: bytes, max_chars: int) -> str:
    """The text serialization a model could learn to write, or "" (binary, or longer than max_chars)."""
    if suffix not in TEXT_FORMATS or b"\x00" in data[:4096]:
        return ""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return ""  # a binary PLY/STL whose header happens to be text
    if suffix == ".gltf":
        text = DATA_URI.sub('"data:..."', text)
    if suffix == ".ply" and "format ascii" not in text[:300]:
        return ""
    return text if len(text) <= max_chars else ""


def split(payload: bytes, lengths: list[int]) -> list[bytes]:
    parts, start = [], 0
    for length in lengths:
        parts.append(payload[start:start + length])
        start += length
    return parts


# ---- in the worker process ----------------------------------------------------------------

_views = None


def render_request(header: dict[str, Any], payload: bytes) -> tuple[dict[str, Any], bytes]:
    """The worker's entry point: load the mesh from the bytes it was given, check it, render its views."""
    from renderers.views import ViewOptions

    files = dict(zip([key for key, _ in header["sizes"]], split(payload, [size for _, size in header["sizes"]])))
    views = ViewOptions(**header["views"])
    check_textures(files, header["name"])
    meshes = triangle_meshes(load_scene(files, header["name"]))
    check_geometry(meshes, views.max_faces)
    up = views.up if views.up != "auto" else "z" if header["cad"] or Path(header["name"]).suffix.lower() in \
        Z_UP_FORMATS else "y"
    images = _views.render(meshes, views, header["size"], header["background"], header["cad"], up)
    geometry = {"meshes": len(meshes), "vertices": sum(len(m.vertices) for m in meshes),
                "faces": sum(len(m.faces) for m in meshes)}
    import pyrender

    return {"lengths": [len(image) for image in images], "size": [header["size"]] * 2, "geometry": geometry,
            "version": f"pyrender {pyrender.__version__} osmesa"}, b"".join(images)


def check_textures(files: dict[str, bytes], name: str) -> None:
    """A texture past MAX_IMAGE_PIXELS is a decompression bomb: refused from its header (loaders that
    would skip a texture they cannot decode would otherwise hide it)."""
    from PIL import Image

    for key, data in files.items():
        if key == name or Path(key).suffix.lower() in {".bin", ".mtl"}:
            continue
        try:
            with Image.open(io.BytesIO(data)) as image:
                width, height = image.size
        except (OSError, ValueError, Image.DecompressionBombError) as err:
            if isinstance(err, Image.DecompressionBombError):
                raise RenderError("too_large", f"texture {key}: {err}") from None
            continue  # not an image (or a broken one): the loader decides
        if width * height > Image.MAX_IMAGE_PIXELS:
            raise RenderError("too_large", f"texture {key}: {width}x{height} pixels, a decompression bomb")


def load_scene(files: dict[str, bytes], name: str):
    import trimesh
    from PIL import Image

    resolver = trimesh.resolvers.ZipResolver({key: data for key, data in files.items() if key != name})
    suffix = Path(name).suffix.lower().lstrip(".")
    try:
        return trimesh.load_scene(io.BytesIO(files[name]), file_type=suffix, resolver=resolver)
    except MemoryError:
        raise RenderError("too_large", f"{name}: out of memory while loading (a header claiming too much?)") from None
    except Image.DecompressionBombError as err:
        raise RenderError("too_large", f"{name}: texture: {err}") from None
    except RecursionError:
        raise RenderError("invalid", f"{name}: its scene graph nests without end (a cycle)") from None
    except Exception as err:  # noqa: BLE001 - trimesh's loaders raise anything on malformed input
        raise RenderError("invalid", f"{name}: {type(err).__name__}: {str(err)[:300]}") from None


def triangle_meshes(scene) -> list:
    """The scene's triangle meshes with their node transforms applied (points and lines dropped)."""
    import trimesh

    try:
        meshes = scene.dump(concatenate=False)
    except (RecursionError, ValueError, KeyError) as err:
        raise RenderError("invalid", f"scene graph: {type(err).__name__}: {str(err)[:200]}") from None
    return [m for m in meshes if isinstance(m, trimesh.Trimesh) and len(m.faces)]


def check_geometry(meshes: list, max_faces: int) -> None:
    import numpy as np

    if not meshes:
        raise RenderError("invalid", "no triangles (empty, points or lines only)")
    faces = sum(len(m.faces) for m in meshes)
    if faces > max_faces:
        raise RenderError("too_large", f"{faces} faces > max_faces={max_faces}")
    if not all(np.isfinite(m.vertices).all() for m in meshes):
        raise RenderError("invalid", "NaN or infinite vertex coordinates")


def warm_up(trimesh) -> None:
    """Render the common draw states once (plain, vertex- and face-coloured, textured; smooth, flat,
    edged) so llvmpipe compiles them at start-up (~5 s), not within a render's timeout."""
    import numpy as np
    from PIL import Image

    from renderers.views import ViewOptions

    plain, colored, textured = trimesh.creation.box(), trimesh.creation.icosphere(1), trimesh.creation.box()
    colored.visual.face_colors = np.arange(len(colored.faces) * 4, dtype=np.uint8).reshape(-1, 4) | 128
    texture = Image.fromarray(np.arange(64 * 64 * 3, dtype=np.uint8).reshape(64, 64, 3))
    textured.visual = trimesh.visual.TextureVisuals(uv=textured.vertices[:, :2] + 0.5, image=texture)
    for cad in (False, True):
        for background in ([255, 255, 255, 255], [0, 0, 0, 0]):
            _views.render([plain, colored, textured], ViewOptions(angles=[(30, 30)]), 64, background, cad, "z")


def preload() -> None:
    """Import (and warm) everything a render needs while still trusted: after the uid drop the
    interpreter may not read its own library. OSMesa is chosen before OpenGL is imported."""
    import codecs
    import os

    global _views
    os.environ["PYOPENGL_PLATFORM"] = "osmesa"
    os.environ["MESA_SHADER_CACHE_DISABLE"] = "true"  # the worker writes no file; programs stay compiled in memory
    os.environ["LP_NUM_THREADS"] = "1"  # llvmpipe: one thread, one core a worker, the same pixels every run
    import networkx  # noqa: F401 - glTF scene graphs
    import pyrender  # noqa: F401
    import scipy.spatial  # noqa: F401 - smooth_shade
    import trimesh
    from PIL import Image

    from renderers.views import ViewRenderer

    for codec in ("cp437", "latin-1", "utf-16", "ascii"):  # zipfile (3MF) names, PLY/OBJ headers: imported lazily
        codecs.lookup(codec)
    Image.init()
    Image.MAX_IMAGE_PIXELS = 64 << 20  # textures past 128 M pixels raise DecompressionBombError
    _views = ViewRenderer()
    warm_up(trimesh)
    for loader in ("obj", "stl", "ply", "off", "glb", "gltf", "3mf"):
        trimesh.exchange.load.mesh_loaders.get(loader) or trimesh.exchange.load.scene_loaders.get(loader)
