"""3D scene programs to views: Python trimesh programs in the code sandbox, three.js scenes in Chromium.

- Python (trimesh primitives, transforms, booleans through manifold3d, colours): the program runs
  in renderers.codebox like a CAD script (no network, its own folder only, a forked child per
  program under its own uid) with `trimesh` and `np` defined; the geometry is what it passes to
  show_object/show, else a variable named scene, result or mesh, else the last Trimesh or Scene
  left in scope. It comes back as a GLB (colours kept) and is rendered by the mesh renderer's
  worker, z up, smooth shading split at creases.
- three.js (a `.js` file, or code that imports "three"): a page that loads the program as a
  module with an import map pointing "three" at the copy `make install` put in the venv
  (renderers/threejs.py: from registry.npmjs.org, sha256-pinned; never a CDN), rendered by the
  web renderer (Chromium, SwiftShader's software WebGL, offline, seeded Math.random). The
  program builds its scene on `window.scene` / `window.camera` or renders itself; the page
  renders one frame and signals `window.__done`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from renderers.base import Render, RenderError, RenderOptions
from renderers.cad import ProgramRenderer
from renderers.codebox import run_child, settle_worker

LANGUAGE = ("Python (trimesh)", "python")
THREE_LANGUAGE = ("three.js", "javascript")
SCENE_NAMES = ("scene", "result", "mesh")


def is_threejs(code: str, name: str) -> bool:
    return name.lower().endswith((".js", ".mjs")) or ("from 'three'" in code or 'from "three"' in code)


class Scene3dRenderer(ProgramRenderer):
    name = "scene3d"
    target = "renderers.scene3d:run_request"

    def __init__(self):
        super().__init__()
        self.web = None  # renderers.web.WebRenderer, made for the first three.js program

    def render(self, code: str, asset_dir: Path | None, options: RenderOptions, name: str = "") -> Render:
        if is_threejs(code, name):
            from renderers.threejs import render_threejs

            if self.web is None:
                from renderers.web import WebRenderer

                self.web = WebRenderer()
            return render_threejs(self.web, code, asset_dir, options, THREE_LANGUAGE)
        reply, mesh = self.run("trimesh", code, asset_dir, name, options)
        return self.draw(reply, mesh, LANGUAGE, options, cad=False)

    def close(self) -> None:
        super().close()
        if self.web is not None:
            self.web.close()


# ---- in the worker and its children -------------------------------------------------------------

def run_request_trimesh(header: dict[str, Any], code: bytes) -> tuple[dict[str, Any], bytes]:
    return run_child(trimesh_job, header, code.decode("utf-8", "replace"))


def trimesh_job(header: dict[str, Any], code: str) -> tuple[dict[str, Any], bytes]:
    import numpy as np
    import trimesh

    shown: list = []
    namespace = {"__name__": "__main__", "__file__": header["name"], "trimesh": trimesh, "np": np,
                 "show_object": lambda obj, *a, **k: shown.append(obj), "show": lambda *objs, **k: shown.extend(objs)}
    exec(compile(code, header["name"], "exec"), namespace)  # noqa: S102 - in the sandboxed child
    geometry = shown or [namespace[key] for key in SCENE_NAMES if is_geometry(namespace.get(key))][:1]
    geometry = geometry or [value for value in reversed(list(namespace.values())) if is_geometry(value)][:1]
    scene = trimesh.Scene()
    for item in geometry:
        for part in item if isinstance(item, (list, tuple)) else [item]:
            if is_geometry(part):
                scene.add_geometry(part)
    if not any(len(getattr(g, "faces", ())) for g in scene.geometry.values()):
        raise RenderError("no_shape", "no show_object(), scene/result/mesh variable or Trimesh left in scope")
    return {"format": "glb", "dialect": "trimesh", "shapes": len(scene.geometry)}, scene.export(file_type="glb")


def is_geometry(value: Any) -> bool:
    import trimesh

    return isinstance(value, (trimesh.Trimesh, trimesh.Scene))


def preload() -> None:
    import manifold3d  # noqa: F401 - trimesh's boolean engine
    import numpy as np  # noqa: F401
    import trimesh

    box = trimesh.creation.box()
    box.difference(trimesh.creation.icosphere(1, radius=0.7))  # the boolean path's lazy imports
    trimesh.Scene([box]).export(file_type="glb")
    settle_worker()
