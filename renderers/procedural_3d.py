"""Seeded 3D scene programs (trimesh) and CAD programs (CadQuery, or OpenSCAD where it maps).

`scene_programs`: 2-5 primitives (box, sphere, cylinder, capsule, cone, torus) with sizes,
rotations and translations, one boolean (difference, union or intersection, through manifold3d)
in most scenes, and colours from a palette; kind scene3d.

`cad_programs`, in the spirit of CAD-Recode's generated CadQuery programs: a base solid (box,
cylinder, regular prism, a revolved profile, an extruded sketch with a slot), then features in
an order that keeps them valid (edge fillets or chamfers on the base, a boss, a cut, holes: one,
a rectangular or a polar pattern); `result` is the part. A third of them are emitted as
OpenSCAD instead (fillets and chamfers have no OpenSCAD primitive and are left out there); kind
cad. Dimensions are chosen so that every feature fits its face (holes inside the boss or the
top, fillets under a third of the thinnest side): the programs run. Everything derives from
(seed, source name, index), as for the other generators.
"""
from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from datapipe.readers.generators import seeded_rngs
from datapipe.schema import Document, new_document

COLORS = [[230, 57, 70, 255], [69, 123, 157, 255], [42, 157, 143, 255], [233, 196, 106, 255], [244, 162, 97, 255]]
PRIMITIVES = {
    "box": "trimesh.creation.box(extents=[{a}, {b}, {c}])",
    "sphere": "trimesh.creation.icosphere(subdivisions=3, radius={r})",
    "cylinder": "trimesh.creation.cylinder(radius={r}, height={c}, sections=48)",
    "capsule": "trimesh.creation.capsule(height={c}, radius={r})",
    "cone": "trimesh.creation.cone(radius={r}, height={c}, sections=48)",
    "torus": "trimesh.creation.torus(major_radius={a}, minor_radius={t})",
}


def scene_programs(cfg: Any, seed: int, start: int, stop: int) -> Iterator[Document]:
    for index, rng in seeded_rngs(cfg.name, seed, start, stop):
        yield new_document(cfg.name, str(index), make_scene(rng), kind="scene3d", meta={"generator": "scene_programs"})


def cad_programs(cfg: Any, seed: int, start: int, stop: int) -> Iterator[Document]:
    for index, rng in seeded_rngs(cfg.name, seed, start, stop):
        part = make_part(rng)
        code = to_openscad(part) if rng.random() < 1 / 3 else to_cadquery(part)
        yield new_document(cfg.name, str(index), code, kind="cad", meta={"generator": "cad_programs"})


def size(rng: random.Random, low: float = 0.4, high: float = 1.6) -> float:
    return round(rng.uniform(low, high), 2)


def make_scene(rng: random.Random) -> str:
    lines = ["import numpy as np", "import trimesh", "from trimesh.transformations import rotation_matrix", ""]
    names = []
    for i in range(rng.randint(2, 5)):
        kind = rng.choice(list(PRIMITIVES))
        a, b, c, r = size(rng), size(rng), size(rng), size(rng, 0.3, 0.9)
        name = f"{kind}_{i}"
        lines.append(f"{name} = " + PRIMITIVES[kind].format(a=a, b=b, c=c, r=r, t=round(min(a, r) / 3, 2)))
        axis = rng.choice(["[1, 0, 0]", "[0, 1, 0]", "[0, 0, 1]"])
        lines.append(f"{name}.apply_transform(rotation_matrix(np.radians({rng.randrange(0, 180, 15)}), {axis}))")
        offset = [round(rng.uniform(-1.2, 1.2), 2) for _ in range(3)]
        lines.append(f"{name}.apply_translation({offset})")
        names.append(name)
    if rng.random() < 0.7:
        operation = rng.choice(["difference", "union", "intersection"])
        lines.append(f"{names[0]}.apply_translation({names[1]}.centroid - {names[0]}.centroid)  # make them overlap")
        lines.append(f"{names[0]} = {names[0]}.{operation}({names[1]})")
        names.pop(1)
    for name in names:
        lines.append(f"{name}.visual.face_colors = {rng.choice(COLORS)}")
    lines.append(f"scene = trimesh.Scene([{', '.join(names)}])")
    return "\n".join(lines) + "\n"


def make_part(rng: random.Random) -> dict[str, Any]:
    """A design both emitters read: the base solid and its features, sized to fit one another."""
    width, depth, height = (round(rng.uniform(20, 80)) for _ in range(3))
    height = max(5, height // 3)
    part = {"base": rng.choice(["box", "cylinder", "prism", "revolve", "slot"]), "w": width, "d": depth, "h": height,
            "sides": rng.randint(5, 8), "features": []}
    thinnest = min(width, depth, height)
    if part["base"] in {"box", "prism"} and rng.random() < 0.6:
        part["features"].append((rng.choice(["fillet", "chamfer"]), round(thinnest * rng.uniform(0.08, 0.3), 1)))
    if rng.random() < 0.5:
        part["features"].append(("boss", round(min(width, depth) * rng.uniform(0.15, 0.3), 1), round(height * 0.6, 1)))
    hole = round(min(width, depth) * rng.uniform(0.06, 0.12), 1)
    part["features"].append(rng.choice([("hole", hole), ("grid", hole, rng.randint(2, 3), rng.randint(2, 3)),
                                        ("polar", hole, rng.randint(3, 8))]))
    return part


# base solid -> (CadQuery, OpenSCAD), formatted with the part's dimensions (dims())
BASES = {
    "box": ("cq.Workplane('XY').box({w}, {d}, {h})", "translate([0, 0, {h2}]) cube([{w}, {d}, {h}], center=true);"),
    "cylinder": ("cq.Workplane('XY').circle({r}).extrude({h})", "cylinder(h={h}, r={r}, $fn=64);"),
    "prism": ("cq.Workplane('XY').polygon({sides}, {side}).extrude({h})", "cylinder(h={h}, r={r}, $fn={sides});"),
    "revolve": ("cq.Workplane('XZ').polyline([(0, 0), ({r}, 0), ({r}, {h}), ({neck}, {top}), (0, {top})]).close()"
                ".revolve(360, (0, 0, 0), (0, 1, 0))",
                "rotate_extrude($fn=64) polygon([[0, 0], [{r}, 0], [{r}, {h}], [{neck}, {top}], [0, {top}]]);"),
    "slot": ("cq.Workplane('XY').slot2D({long}, {wide}).extrude({h})",
             "hull() {{ for (x = [-1, 1]) translate([x * {reach}, 0, 0]) cylinder(h={h}, r={half}, $fn=48); }}"),
}


def dims(part: dict[str, Any]) -> dict[str, Any]:
    w, d, h = part["w"], part["d"], part["h"]
    side, long = min(w, d), max(w, d)
    return {"w": w, "d": d, "h": h, "h2": h / 2, "sides": part["sides"], "side": side, "r": side / 2, "long": long,
            "neck": round(side * 0.3, 1), "top": round(h * 1.5, 1), "wide": round(side * 0.6, 1),
            "half": round(side * 0.3, 1), "reach": round((long - side * 0.6) / 2, 1)}


def to_cadquery(part: dict[str, Any]) -> str:
    lines = ["import cadquery as cq", "", f"part = {BASES[part['base']][0].format(**dims(part))}"]
    for feature in part["features"]:
        lines.append(cadquery_feature(feature, dims(part)["r"]))
    return "\n".join(lines + ["result = part", ""])


def cadquery_feature(feature: tuple, radius: float) -> str:
    kind, value, *rest = feature
    top = "part = part.faces('>Z').workplane()"
    if kind in {"fillet", "chamfer"}:
        return f"part = part.edges('|Z').{kind}({value})"
    if kind == "boss":
        return f"{top}.circle({value}).extrude({rest[0]})"
    if kind == "hole":
        return f"{top}.hole({value})"
    if kind == "grid":
        spacing = round(radius * 0.8 / max(rest), 1)
        return f"{top}.rarray({spacing}, {spacing}, {rest[0]}, {rest[1]}).hole({value})"
    return f"{top}.polarArray({round(radius * 0.6, 1)}, 0, 360, {rest[0]}).hole({value})"


def to_openscad(part: dict[str, Any]) -> str:
    """The same design in OpenSCAD: features as a union, holes as a difference (no fillets)."""
    h, radius = part["h"], dims(part)["r"]
    base = BASES[part["base"]][1].format(**dims(part))
    top = h * 1.5 if part["base"] == "revolve" else h
    solids, holes = [base], []
    for kind, value, *rest in part["features"]:
        if kind == "boss":
            solids.append(f"translate([0, 0, {top}]) cylinder(h={rest[0]}, r={value}, $fn=48);")
            top += rest[0]
        elif kind == "hole":
            holes.append(f"cylinder(h={top * 3}, d={value}, center=true, $fn=32);")
        elif kind == "grid":
            spacing = round(radius * 0.8 / max(rest), 1)
            holes.append(f"for (i = [0:{rest[0] - 1}], j = [0:{rest[1] - 1}]) translate([(i - {(rest[0] - 1) / 2}) * "
                         f"{spacing}, (j - {(rest[1] - 1) / 2}) * {spacing}, 0]) cylinder(h={top * 3}, d={value}, "
                         f"center=true, $fn=32);")
        elif kind == "polar":
            holes.append(f"for (a = [0:{360 / rest[0]:.2f}:359]) rotate([0, 0, a]) translate([{radius * 0.6:.1f}, 0, "
                         f"0]) cylinder(h={top * 3}, d={value}, center=true, $fn=32);")
    body = "\n".join(f"    {line}" for line in solids)
    cuts = "\n".join(f"  {line}" for line in holes)
    return f"// OpenSCAD\ndifference() {{\n  union() {{\n{body}\n  }}\n{cuts}\n}}\n"
