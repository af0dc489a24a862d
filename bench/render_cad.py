"""Benchmark: CAD scripts per CPU-second and success rate, the code sandbox's cost, and OpenSCAD's time.

    .venv/bin/python bench/render_cad.py [--per-dialect 12] [--size 384]

On a seeded sample of ../shared/data/cad/manifest.jsonl (--per-dialect CadQuery, build123d and
OpenSCAD files each; OpenSCAD with OPENSCADPATH at cad/openscad), in the same run:
- ours, end to end: CadRenderer (bubblewrap worker per dialect, a forked child per script,
  tessellation, then four views by the mesh worker); scripts per CPU-second (this process + every
  worker's process tree, reaped children included) and the share that rendered;
- the sandbox's cost: the same Python scripts run (exec + tessellation + GLB) by the sandbox vs
  bare in this warm process (the kernel imported once, no fork, no namespaces, no limits);
  CPU of the scripts that succeeded in both; target at most 1.2x;
- OpenSCAD: our sandboxed STL export vs Debian's `openscad -o x.stl` run bare on the same files.
The machine is shared: read CPU seconds and ratios. Worker start-up (imports) is not counted.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from renderers.base import RenderError, RenderOptions  # noqa: E402
from renderers.cad import CadRenderer, dialect_of, python_job  # noqa: E402

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "cad"
LIBRARIES = [str(DATA / "openscad")]


def sample(per_dialect: int, seed: int = 0) -> dict[str, list[Path]]:
    rows = [json.loads(line) for line in (DATA / "manifest.jsonl").open()]
    chosen = {}
    for kind in ("cadquery", "build123d", "openscad"):
        files = [DATA / r["file"] for r in rows if r["kind"] == kind and r.get("python_syntax_ok", True)
                 and "NORENDER" not in (r.get("example_options") or "")]
        chosen[kind] = sorted(random.Random(seed).sample(files, min(per_dialect, len(files))))
    return chosen


def tree_cpu(pid: int) -> float:
    """CPU seconds of pid and its live descendants, their reaped children included."""
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
            for task in os.listdir(f"/proc/{current}/task"):
                todo += [int(c) for c in Path(f"/proc/{current}/task/{task}/children").read_text().split()]
        except (OSError, ValueError):
            continue
    return total


def workers_cpu(renderer: CadRenderer) -> float:
    sandboxes = [*renderer.sandboxes.values(), renderer.meshes.sandbox]
    return sum(tree_cpu(s.process.pid) for s in sandboxes if s.process is not None)


def run_ours(renderer: CadRenderer, files: list[Path], options: RenderOptions) -> tuple[dict, float]:
    start_self, start_workers = time.process_time(), workers_cpu(renderer)
    outcomes = {}
    for path in files:
        try:
            renderer.render(path.read_text("utf-8", "replace"), path.parent, options, name=path.name)
            outcomes[path] = "ok"
        except RenderError as err:
            outcomes[path] = err.reason
    return outcomes, time.process_time() - start_self + workers_cpu(renderer) - start_workers


def sandboxed_run_cpu(renderer: CadRenderer, path: Path, options: RenderOptions) -> float | None:
    """CPU of running one script in the code sandbox (no rendering), or None when it failed."""
    dialect = dialect_of(path.read_text("utf-8", "replace"), path.name)
    sandbox_cpu = workers_cpu(renderer)
    start = time.process_time()
    try:
        renderer.run(dialect, path.read_text("utf-8", "replace"), path.parent, path.name, options)
    except RenderError:
        return None
    return time.process_time() - start + workers_cpu(renderer) - sandbox_cpu


def bare_run_cpu(path: Path) -> float | None:
    """CPU of the same script run bare here: exec + tessellation + GLB, no fork, no sandbox. It runs in a
    scratch copy of its folder (the sandbox's overlay does the same): scripts export result.step and the
    like beside themselves, and a file left in the shared data is one the next sandboxed run cannot write
    over (its copy belongs to root)."""
    code = path.read_text("utf-8", "replace")
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch) / path.parent.name
        shutil.copytree(path.parent, work, symlinks=True)
        header = {"dialect": dialect_of(code, path.name), "name": path.name, "asset_dir": str(work), "libraries": []}
        cwd, start = os.getcwd(), time.process_time()
        try:
            os.chdir(work)
            python_job(header, code)
        except BaseException:  # noqa: BLE001 - any failure: the pair is left out of the comparison
            return None
        finally:
            os.chdir(cwd)
            sys.path[:] = [entry for entry in sys.path if not entry.startswith(scratch)]  # python_job added it
        return time.process_time() - start


def openscad_bare_cpu(path: Path) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run(["openscad", "-o", f"{scratch}/out.stl", str(path)], capture_output=True, timeout=120,
                       env={**os.environ, "OPENSCADPATH": ":".join(LIBRARIES)}, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-dialect", type=int, default=12)
    parser.add_argument("--size", type=int, default=384)
    args = parser.parse_args()
    if not DATA.is_dir():
        raise SystemExit(f"{DATA} is missing: this benchmark reads the shared CAD scripts")
    files = sample(args.per_dialect)
    options = RenderOptions(size=args.size, timeout_s=60, libraries=LIBRARIES)
    renderer = CadRenderer()
    all_files = [path for group in files.values() for path in group]
    for group in files.values():  # start each dialect's worker (imports) before timing
        run_ours(renderer, group[:1], options)
    outcomes, cpu = run_ours(renderer, all_files, options)
    ok = sum(outcome == "ok" for outcome in outcomes.values())
    by_dialect = {d: f"{sum(outcomes[p] == 'ok' for p in g)}/{len(g)}" for d, g in files.items()}
    reasons = sorted({outcome for outcome in outcomes.values() if outcome != "ok"})
    print(f"end to end: {ok}/{len(all_files)} rendered ({by_dialect}; rejects {reasons}) in {cpu:.1f} CPU-s")

    python_files = [p for p in files["cadquery"] + files["build123d"] if outcomes[p] == "ok"]
    for path in python_files:  # the bare path warm too: its first run pays lazy imports the workers paid
        bare_run_cpu(path)
    pairs = [(sandboxed_run_cpu(renderer, p, options), bare_run_cpu(p)) for p in python_files]
    pairs = [(s, b) for s, b in pairs if s is not None and b is not None]
    sandbox_cpu, bare_cpu = sum(s for s, _ in pairs), sum(b for _, b in pairs)
    print(f"sandbox vs bare, {len(pairs)} Python scripts: {sandbox_cpu:.2f} vs {bare_cpu:.2f} CPU-s")

    scad = [p for p in files["openscad"] if outcomes[p] == "ok"]
    ours_scad = [sandboxed_run_cpu(renderer, p, options) for p in scad]
    bare_scad = [openscad_bare_cpu(p) for p in scad]
    renderer.close()
    ours_total, bare_total = sum(c or 0 for c in ours_scad), sum(bare_scad)
    print(f"OpenSCAD, {len(scad)} files: sandboxed export {ours_total:.2f} CPU-s vs bare openscad {bare_total:.2f}")
    print(f"bench render_cad: scripts={len(all_files)} scripts_per_cpu_s={len(all_files) / cpu:.2f} "
          f"success={ok / len(all_files):.2f} sandbox_cpu_ratio={sandbox_cpu / max(bare_cpu, 1e-9):.2f} "
          f"x_vs_bare={bare_cpu / max(sandbox_cpu, 1e-9):.2f} x_vs_openscad={bare_total / max(ours_total, 1e-9):.2f}")


if __name__ == "__main__":
    main()
