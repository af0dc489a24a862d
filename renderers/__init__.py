"""Renderers: code or markup in, images out; one module a modality.

RENDERERS maps a Document.kind to the "module:Class" that renders it (renderers.base.Renderer:
`render(code, asset_dir, options) -> Render` or a RenderError). Classes load lazily, in the
Ray actor that renders, so importing this package costs nothing.
"""
from __future__ import annotations

RENDERERS: dict[str, str] = {
    "svg": "renderers.svg:SvgRenderer",  # resvg or cairosvg in a sandboxed worker process
    "html": "renderers.web:WebRenderer",  # Chromium via Playwright, one warm page per actor
    "mesh": "renderers.mesh:MeshRenderer",  # trimesh + pyrender on OSMesa in a sandboxed worker
    "scene3d": "renderers.scene3d:Scene3dRenderer",  # trimesh programs in bubblewrap; three.js in Chromium
    "cad": "renderers.cad:CadRenderer",  # CadQuery, build123d, OpenSCAD in bubblewrap, then the mesh renderer
}


def make_renderer(kind: str):
    """A new renderer for `kind`; an unknown kind lists the known ones."""
    from datapipe.stage import load

    if kind not in RENDERERS:
        raise KeyError(f"no renderer for kind {kind!r}; known kinds: {', '.join(sorted(RENDERERS))}")
    return load(RENDERERS[kind])()
