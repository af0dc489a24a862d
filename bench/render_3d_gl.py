"""Benchmark: views per second of the 3D view stack (pyrender) on one OpenGL platform, in one process.

    .venv/bin/python bench/render_3d_gl.py [--gl osmesa|egl] [--files 40] [--size 512] [--data DIR]

What a user with GPUs buys: the same meshes as bench/render_3d.py (its seeded sample of
../shared/data/3d/, or --data), the same four default views at --size, rendered by
renderers.views.ViewRenderer (the code the sandboxed mesh worker runs) with PyOpenGL on OSMesa
(Mesa's llvmpipe on the CPU, one thread: what the renderers use) or on EGL (with an NVIDIA
driver: the GPU; on Mesa without a GPU: llvmpipe again). Meshes are loaded and normalized before
the clock starts; each mesh is rendered --repeats times and the median taken. Two figures per
run: views/s with the PNG encode that every render pays (on a GPU this is the CPU's share), and
views/s of the pixels alone. No sandbox (the GPU's device files would need binding into it): read
these beside bench/render_3d.py's sandboxed CPU figure, not as a replacement for it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def load(files: list[Path]) -> list[tuple[str, list]]:
    import trimesh

    loaded = []
    for path in files:
        try:
            meshes = [m for m in trimesh.load_scene(path).dump(concatenate=False)
                      if isinstance(m, trimesh.Trimesh) and len(m.faces)]
        except Exception as err:  # noqa: BLE001 - a file the loader refuses is left out and counted
            print(f"skip {path.name}: {type(err).__name__}", file=sys.stderr)
            continue
        if meshes:
            up = "z" if path.suffix.lower() in {".stl", ".3mf", ".off"} else "y"
            loaded.append((up, meshes))
    return loaded


def time_views(renderer, loaded: list, views, size: int, repeats: int, encode: bool) -> tuple[float, float]:
    """Median seconds and CPU-seconds over `repeats` passes over every mesh."""
    from renderers import views as module

    encode_png = module.encode_png
    if not encode:
        module.encode_png = lambda pixels: b""  # the pixels alone: read back, not compressed
    walls, cpus = [], []
    try:
        for _ in range(repeats):
            wall, cpu = time.perf_counter(), time.process_time()
            for up, meshes in loaded:
                renderer.render(meshes, views, size, [255, 255, 255, 255], False, up)
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
    finally:
        module.encode_png = encode_png
    return statistics.median(walls), statistics.median(cpus)


def gl_strings() -> dict:
    from OpenGL import GL

    return {key: GL.glGetString(getattr(GL, f"GL_{key.upper()}")).decode() for key in ("vendor", "renderer")}


def main() -> None:
    from bench.render_3d import DATA, sample

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gl", choices=["osmesa", "egl"], default="osmesa")
    parser.add_argument("--files", type=int, default=40)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--save", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    os.environ["PYOPENGL_PLATFORM"] = args.gl
    os.environ["PYGLET_HEADLESS"] = "1" if args.gl == "egl" else ""  # pyrender imports pyglet: no X libraries on EGL
    os.environ.setdefault("LP_NUM_THREADS", "1")
    if not (args.data / "files.jsonl").is_file():
        raise SystemExit(f"{args.data}/files.jsonl is missing: point --data at a copy of ../shared/data/3d")

    from renderers.views import ViewOptions, ViewRenderer

    loaded = load(sample(args.files, data=args.data))
    views, renderer = ViewOptions(), ViewRenderer()
    renderer.render(loaded[0][1], views, args.size, [255, 255, 255, 255], False, loaded[0][0])  # context, shaders
    count = len(loaded) * len(views.angles)
    encoded = time_views(renderer, loaded, views, args.size, args.repeats, encode=True)
    pixels = time_views(renderer, loaded, views, args.size, args.repeats, encode=False)
    result = {"gl": args.gl, **gl_strings(), "meshes": len(loaded), "views": count, "size": args.size,
              "views_per_s": round(count / encoded[0], 1), "views_per_cpu_s": round(count / encoded[1], 1),
              "pixels_views_per_s": round(count / pixels[0], 1),
              "pixels_views_per_cpu_s": round(count / pixels[1], 1)}
    print(json.dumps(result, indent=1))
    if args.save:
        args.save.write_text(json.dumps(result, indent=1) + "\n")
    print("bench render_3d_gl: " + " ".join(f"{k}={v}" for k, v in result.items() if k not in {"vendor", "renderer"}))


if __name__ == "__main__":
    main()
