"""Renderers: code or markup in, images out; one module a modality.

RENDERERS maps a Document.kind to the "module:attribute" that renders it. It is empty
until the renderer modules land (SVG, webpages, 3D, CAD).
"""
RENDERERS: dict[str, str] = {}
