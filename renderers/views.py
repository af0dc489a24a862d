"""Views of a 3D scene, rendered headless on CPU: pyrender on Mesa's OSMesa (llvmpipe, one thread).

Chosen by measurement on this kind of machine (README, bench/render_3d.py), per 512x512 view:
pyrender + OSMesa 35-83 ms, pyrender + EGL (llvmpipe) 67-227 ms, pyvista off-screen 73-224 ms,
trimesh's pyglet viewer 295-765 ms and only under Xvfb. With LP_NUM_THREADS=1 a worker holds one
core and renders are deterministic (the same scene and options give the same pixels).

Every scene is normalized the same way (bounding-box centre at the origin, bounding sphere of
radius 1) and seen by a perspective camera on a sphere around it at each (elevation, azimuth),
sized so that the whole object fits. Shading: smooth meshes are split at edges sharper than 30
degrees (a raw CAD mesh shaded smooth looks blobby); CAD parts are flat-shaded with their sharp
edges drawn. This module runs in the sandboxed worker; ViewOptions is what a recipe sets.
"""
from __future__ import annotations

import io
import math
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

SHARP_DEGREES = 30.0  # dihedral angle above which an edge is a crease: split normals, draw the edge
FIELD_OF_VIEW = math.radians(35.0)
EDGE_LIFT = 0.004  # edges drawn this far toward the camera (of a radius-1 object) so faces do not hide them


class ViewOptions(BaseModel):
    """The 3D views of a mesh, scene program or CAD part."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # (elevation, azimuth) in degrees; the first is isometric (35.26, 45), the others go round it
    angles: list[tuple[float, float]] = Field(default=[(35.26, 45.0), (35.26, 135.0), (35.26, 225.0), (-20.0, 315.0)],
                                              min_length=1, max_length=16)
    sheet: bool = False  # one image with every view tiled in a grid, instead of one image per view
    shading: Literal["auto", "smooth", "flat"] = "auto"  # auto: CAD flat, meshes smooth split at 30-degree creases
    edges: Literal["auto", "on", "off"] = "auto"  # draw crease and border edges; auto: CAD parts only
    up: Literal["auto", "y", "z"] = "auto"  # auto: z for CAD, scene programs, STL and 3MF (printing); y otherwise
    lighting: Literal["headlight", "studio"] = "studio"  # studio: a key light above-left of the camera plus a fill
    color: str = "#a9b4c8"  # surfaces without a material of their own
    max_faces: int = Field(4_000_000, ge=1)  # more is render.too_large: ~1 s a view and ~1 GB in the worker


def camera_pose(elevation: float, azimuth: float, distance: float, up: str) -> np.ndarray:
    """A camera at (elevation, azimuth) on a sphere of `distance`, looking at the origin."""
    el, az = math.radians(elevation), math.radians(azimuth)
    x, y, z = math.cos(el) * math.cos(az), math.cos(el) * math.sin(az), math.sin(el)
    eye = np.array([x, y, z] if up == "z" else [y, z, x]) * distance
    up_axis = np.array([0.0, 0.0, 1.0] if up == "z" else [0.0, 1.0, 0.0])
    back = eye / np.linalg.norm(eye)  # the camera looks down its -z axis
    right = np.cross(up_axis, back)
    right = right / np.linalg.norm(right) if np.linalg.norm(right) > 1e-6 else np.array([1.0, 0.0, 0.0])
    pose = np.eye(4)
    pose[:3, 0], pose[:3, 1], pose[:3, 2], pose[:3, 3] = right, np.cross(back, right), back, eye
    return pose


def normalized(meshes: list) -> list:
    """The meshes moved and scaled together: bounding-box centre at 0, bounding sphere radius 1."""
    corners = np.array([m.bounds for m in meshes]).reshape(-1, 3)
    low, high = corners.min(axis=0), corners.max(axis=0)
    radius = float(np.linalg.norm(high - low)) / 2 or 1.0
    transform = np.eye(4) / radius
    transform[:3, 3] = -(low + high) / 2 / radius
    transform[3, 3] = 1.0
    return [m.copy().apply_transform(transform) for m in meshes]


def shaded(mesh, shading: str):
    """The mesh as pyrender draws it: flat, smooth, or smooth with normals split at creases."""
    import pyrender
    import trimesh

    if shading == "flat":
        return pyrender.Mesh.from_trimesh(mesh, smooth=False)
    textured = isinstance(mesh.visual, trimesh.visual.TextureVisuals) and mesh.visual.uv is not None
    if mesh.visual.kind == "face":  # pyrender smooths vertex colours only
        mesh = mesh.copy()
        mesh.visual.vertex_colors = mesh.visual.vertex_colors
    if shading == "auto" and not textured and len(mesh.faces):
        mesh = trimesh.graph.smooth_shade(mesh, angle=math.radians(SHARP_DEGREES))
    return pyrender.Mesh.from_trimesh(mesh, smooth=True)


def crease_lines(meshes: list) -> np.ndarray:
    """Line-segment endpoints (2n x 3) of every crease sharper than SHARP_DEGREES and every open border."""
    segments = []
    for mesh in meshes:
        sharp = mesh.face_adjacency_edges[mesh.face_adjacency_angles > math.radians(SHARP_DEGREES)]
        edges = np.sort(mesh.edges, axis=1)
        unique, counts = np.unique(edges, axis=0, return_counts=True)
        segments.append(mesh.vertices[np.vstack([sharp, unique[counts == 1]]).reshape(-1)])
    return np.vstack(segments) if segments else np.zeros((0, 3))


def build_scene(meshes: list, options: ViewOptions, cad: bool, background: list[int]):
    """A pyrender scene of the normalized meshes, plus the node of their edges (or None)."""
    import pyrender
    from PIL import ImageColor

    base = np.array(ImageColor.getcolor(options.color, "RGBA")) / 255
    scene = pyrender.Scene(bg_color=np.array(background) / 255, ambient_light=np.full(3, 0.25))
    shading = "flat" if options.shading == "auto" and cad else options.shading
    for mesh in meshes:
        if not mesh.visual.defined:
            mesh.visual.vertex_colors = (base * 255).astype(np.uint8)
        scene.add(shaded(mesh, shading))
    edges_node = None
    if options.edges == "on" or (options.edges == "auto" and cad):
        lines = crease_lines(meshes)
        if len(lines):
            material = pyrender.MetallicRoughnessMaterial(baseColorFactor=[0.05, 0.05, 0.08, 1.0])
            primitive = pyrender.Primitive(positions=lines, mode=pyrender.constants.GLTF.LINES, material=material)
            edges_node = scene.add(pyrender.Mesh([primitive]))
    return scene, edges_node


def shaders_in_memory() -> None:
    """pyrender reads a shader's source file when it first compiles that program, which can be after
    the worker dropped to its unprivileged uid: from a checkout or venv inside a private folder (a
    home of mode 0700, `mktemp -d`) every view then failed with PermissionError on mesh.vert.
    Read them all now, while trusted, and let pyrender's module open them from memory."""
    import builtins
    import os

    from pyrender import shader_program

    if getattr(shader_program, "sources_in_memory", False):
        return
    folder = os.path.join(os.path.dirname(shader_program.__file__), "shaders")
    sources = {}
    for name in os.listdir(folder):
        with open(os.path.join(folder, name)) as source:
            sources[os.path.join(folder, name)] = source.read()

    def open_shader(path, *args, **kwargs):
        return io.StringIO(sources[path]) if path in sources else builtins.open(path, *args, **kwargs)

    shader_program.open = open_shader  # the module's own name `open` is looked up before the builtin
    shader_program.sources_in_memory = True


def stable_context_keys() -> None:
    """pyrender caches compiled shader programs under OpenGL.contextdata.getContext(), which in PyOpenGL
    3.1.10 (the version whose OSMesa binding works) returns a new pointer object per call: the cache
    never hit and every view recompiled its shaders (~0.4 s a view, 3-4 s a 4-view render, measured).
    Keyed by the context's address instead, a worker compiles each program once."""
    import ctypes

    from OpenGL import contextdata

    if getattr(contextdata.getContext, "stable", False):
        return
    original = contextdata.getContext

    def get_context(context=None):
        found = original(context)
        return found if found is None or isinstance(found, int) else ctypes.cast(found, ctypes.c_void_p).value

    get_context.stable = True
    contextdata.getContext = get_context


class ViewRenderer:
    """One warm OSMesa context per worker (made for the first size asked, remade when it changes)."""

    def __init__(self):
        self.renderer = None
        self.size = 0
        shaders_in_memory()

    def render(self, meshes: list, options: ViewOptions, size: int, background: list[int], cad: bool, up: str
               ) -> list[bytes]:
        import pyrender

        if self.size != size:
            stable_context_keys()
            if self.renderer is not None:
                self.renderer.delete()
            self.renderer, self.size = pyrender.OffscreenRenderer(size, size), size
        scene, edges_node = build_scene(normalized(meshes), options, cad, background)
        distance = 1.02 / math.sin(FIELD_OF_VIEW / 2)
        camera = scene.add(pyrender.PerspectiveCamera(yfov=FIELD_OF_VIEW, znear=distance - 1.1, zfar=distance + 1.1))
        lights = [scene.add(pyrender.DirectionalLight(intensity=3.0 if options.lighting == "studio" else 3.5))]
        if options.lighting == "studio":
            lights.append(scene.add(pyrender.DirectionalLight(intensity=1.2)))
        flags = pyrender.RenderFlags.SKIP_CULL_FACES | (pyrender.RenderFlags.RGBA if background[3] < 255 else 0)
        images = []
        for elevation, azimuth in options.angles:
            pose = camera_pose(elevation, azimuth, distance, up)
            scene.set_pose(camera, pose)
            scene.set_pose(lights[0], camera_pose(elevation + 25, azimuth - 30, distance, up)
                           if options.lighting == "studio" else pose)
            if len(lights) > 1:
                scene.set_pose(lights[1], camera_pose(elevation - 10, azimuth + 60, distance, up))
            if edges_node is not None:
                lift = np.eye(4)
                lift[:3, 3] = pose[:3, 2] * EDGE_LIFT
                scene.set_pose(edges_node, lift)
            color, _ = self.renderer.render(scene, flags=flags)
            images.append(np.ascontiguousarray(color))
        return [encode_png(tile(images))] if options.sheet else [encode_png(image) for image in images]


def tile(images: list[np.ndarray]) -> np.ndarray:
    """The views in a grid, row by row, ceil(sqrt(n)) columns; empty cells take the first pixel's colour."""
    columns = math.ceil(math.sqrt(len(images)))
    rows = math.ceil(len(images) / columns)
    height, width, channels = images[0].shape
    sheet = np.empty((rows * height, columns * width, channels), dtype=np.uint8)
    sheet[...] = images[0][0, 0]
    for index, image in enumerate(images):
        row, column = divmod(index, columns)
        sheet[row * height:(row + 1) * height, column * width:(column + 1) * width] = image
    return sheet


def encode_png(pixels: np.ndarray) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG", compress_level=6)
    return out.getvalue()
