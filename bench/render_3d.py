"""Benchmark: mesh views per CPU-second, our path (sandboxed trimesh + pyrender on OSMesa) vs pyvista.

    .venv/bin/python bench/render_3d.py [--files 40] [--size 512]

On the same seeded sample of ../shared/data/3d/ (meshes trimesh loads with some faces, per its
files.jsonl), in the same run, the same four views (renderers.views defaults) at --size:
- ours: MeshRenderer as the render stage uses it (file read and checks here, load, checks, views
  and PNG encode in the sandboxed worker); CPU = this process + the worker (/proc);
- pyvista: trimesh loads the file here, the same normalization, then an off-screen Plotter (VTK,
  Mesa) per mesh, camera set per view, render + screenshot, PNG encode (PIL) to match ours;
  CPU = this process. Both with LP_NUM_THREADS=1 (one llvmpipe thread; CPU time is what is compared).
Success = every view came back. A contact sheet of ours (first view of the first 16 meshes) is
written to bench/results/render_3d_sheet.png. The machine is shared: read CPU seconds and ratios.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("LP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from renderers.base import RenderError, RenderOptions  # noqa: E402
from renderers.mesh import MeshRenderer  # noqa: E402
from renderers.views import FIELD_OF_VIEW, ViewOptions, camera_pose, normalized  # noqa: E402

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "3d"
RESULTS = Path(__file__).resolve().parent / "results"
FORMATS = {".obj", ".ply", ".stl", ".off", ".gltf", ".glb", ".3mf"}


def sample(count: int, seed: int = 0, data: Path = DATA) -> list[Path]:
    rows = [json.loads(line) for line in (data / "files.jsonl").open()]
    good = [data / r["file"] for r in rows if r.get("load", {}).get("ok") and r["load"].get("faces", 0) > 0
            and Path(r["file"]).suffix.lower() in FORMATS]
    return sorted(random.Random(seed).sample(good, min(count, len(good))))


def process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_ours(files: list[Path], options: RenderOptions) -> tuple[list, float]:
    renderer = MeshRenderer()
    renderer.render("", files[0].parent, options, name=files[0].name)  # start and warm the worker
    start_self, pid = time.process_time(), renderer.sandbox.process.pid
    start_worker = process_cpu(pid)
    outputs = []
    for path in files:
        try:
            outputs.append(renderer.render("", path.parent, options, name=path.name).images)
        except RenderError as err:
            outputs.append(err.reason)
    cpu = time.process_time() - start_self + process_cpu(renderer.sandbox.process.pid) - start_worker
    renderer.close()
    return outputs, cpu


def run_pyvista(files: list[Path], size: int, views: ViewOptions) -> tuple[list, float]:
    import pyvista
    import trimesh
    from PIL import Image

    start, outputs = time.process_time(), []
    for path in files:
        try:
            meshes = [m for m in trimesh.load_scene(path).dump(concatenate=False)
                      if isinstance(m, trimesh.Trimesh) and len(m.faces)]
            plotter = pyvista.Plotter(off_screen=True, window_size=(size, size))
            for mesh in normalized(meshes):
                plotter.add_mesh(pyvista.wrap(mesh), color=views.color, smooth_shading=True)
            plotter.camera.view_angle = float(FIELD_OF_VIEW * 180 / 3.141592653589793)
            images = []
            for elevation, azimuth in views.angles:
                pose = camera_pose(elevation, azimuth, 3.4, "z" if path.suffix.lower() in {".stl", ".3mf", ".off"} else "y")
                plotter.camera_position = [tuple(pose[:3, 3]), (0, 0, 0), tuple(pose[:3, 1])]
                plotter.render()
                out = io.BytesIO()
                Image.fromarray(plotter.screenshot(return_img=True)).save(out, format="PNG", compress_level=6)
                images.append(out.getvalue())
            plotter.close()
            outputs.append(images)
        except Exception as err:  # noqa: BLE001 - a peer's failure is counted, not fatal
            outputs.append(type(err).__name__)
    return outputs, time.process_time() - start


def contact_sheet(outputs: list, size: int, path: Path) -> None:
    from PIL import Image

    firsts = [images[0] for images in outputs if isinstance(images, list)][:16]
    tile = size // 2
    sheet = Image.new("RGB", (tile * 4, tile * ((len(firsts) + 3) // 4)), "white")
    for index, png in enumerate(firsts):
        image = Image.open(io.BytesIO(png)).convert("RGB").resize((tile, tile))
        sheet.paste(image, ((index % 4) * tile, (index // 4) * tile))
    path.parent.mkdir(exist_ok=True)
    sheet.save(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=40)
    parser.add_argument("--size", type=int, default=512)
    args = parser.parse_args()
    if not DATA.is_dir():
        raise SystemExit(f"{DATA} is missing: this benchmark reads the shared meshes")
    files = sample(args.files)
    options = RenderOptions(size=args.size, timeout_s=120)
    ours, ours_cpu = run_ours(files, options)
    peer, peer_cpu = run_pyvista(files, args.size, options.views)
    views = len(options.views.angles)
    ours_ok, peer_ok = (sum(isinstance(o, list) for o in outputs) for outputs in (ours, peer))
    ours_rate, peer_rate = ours_ok * views / ours_cpu, peer_ok * views / peer_cpu
    contact_sheet(ours, args.size, RESULTS / "render_3d_sheet.png")
    failures = sorted({o for o in ours if isinstance(o, str)})
    print(f"{len(files)} meshes, {views} views of {args.size}px: ours {ours_ok} ok in {ours_cpu:.1f} CPU-s "
          f"({ours_rate:.1f} views/CPU-s; failures {failures}); pyvista {peer_ok} ok in {peer_cpu:.1f} CPU-s "
          f"({peer_rate:.1f} views/CPU-s)")
    print(f"bench render_3d: files={len(files)} views_per_cpu_s={ours_rate:.2f} success={ours_ok / len(files):.2f} "
          f"pyvista_views_per_cpu_s={peer_rate:.2f} pyvista_success={peer_ok / len(files):.2f} "
          f"x_vs_pyvista={ours_rate / peer_rate:.2f}")


if __name__ == "__main__":
    main()
