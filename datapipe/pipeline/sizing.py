"""What each stage asks of the Ray cluster, and whether the cluster can give it.

No Ray here: the runner passes in what Ray reports (`ray.cluster_resources()`, the alive nodes of
`ray.nodes()`), so the rules are plain functions of dicts. Each task or actor of a stage reserves
`demand(cfg)`: num_cpus CPUs (1 when unset: Ray Data's default, GPU stages included), num_gpus
GPUs, reserved_memory_mb of Ray's `memory` and its custom resources. Three rules follow:

- Where: one task or actor must fit on one node. Ray would otherwise wait forever for a node that
  never comes (a `chromium: 1` stage on a cluster without render nodes), so the run fails at start
  and the message lists every node's resources.
- How many: an actor pool runs `concurrency` actors at most, or [min, max]; unset, 1 up to as many
  as the whole cluster holds for its demand (2 CPUs, tokenize at 1 CPU an actor: up to 2). Ray Data
  starts `min` actors and adds more while they are busy and the cluster has room. A stage that must
  be one actor (render_dedup: global and ordered) sets its Config's default to 1.
- Room to read: the minimum pools are held for the whole run, so together they must leave one read
  task's CPU (or one task of a task stage, if it needs more of a resource) free, else the reads
  wait forever behind them. Above the minimums, sharing the cluster is Ray Data's to decide.
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence

from datapipe.stage import StageConfig

READ_TASK = {"CPU": 1.0}  # what a read task reserves (Ray Data's default)
NODES_SHOWN = 8  # nodes listed in full in a message; the rest are counted


def demand(cfg: StageConfig) -> dict[str, float]:
    """What one task or actor of the stage reserves, by Ray resource name."""
    asked = {"CPU": cfg.num_cpus if cfg.num_cpus is not None else 1.0, "GPU": cfg.num_gpus or 0.0,
             "memory": float((cfg.reserved_memory_mb or 0) << 20), **cfg.resources}
    return {name: float(amount) for name, amount in asked.items() if amount}


def copies(need: Mapping[str, float], have: Mapping[str, float]) -> int:
    """How many tasks or actors that each reserve `need` fit into `have` at once."""
    counts = [math.floor(have.get(name, 0.0) / amount + 1e-9) for name, amount in need.items()]
    return min(counts, default=0)


def pool_bounds(cfg: StageConfig, totals: Mapping[str, float]) -> tuple[int, int]:
    """(min, max) actors of an actor stage on a cluster with these resources in all."""
    low, high = cfg.pool_range()
    return low, high if high is not None else max(low, copies(demand(cfg), totals))


def placement_problems(stages: Sequence[StageConfig], nodes: Sequence[Mapping[str, float]]) -> list[str]:
    """Stages whose one task or actor fits on no node (each node as Ray lists its resources)."""
    problems = [placement_problem(index, cfg, nodes) for index, cfg in enumerate(stages)
                if not any(copies(demand(cfg), node) for node in nodes)]
    return [*problems, f"the cluster's nodes: {describe_nodes(nodes)}"] if problems else []


def placement_problem(index: int, cfg: StageConfig, nodes: Sequence[Mapping[str, float]]) -> str:
    need = demand(cfg)
    absent = [name for name in need if not any(node.get(name) for node in nodes)]
    custom = {name: int(need[name]) if need[name].is_integer() else need[name] for name in absent if name in cfg.resources}
    why = f"no node has {', '.join(absent)}" if absent else "no single node has all of that"
    add = f"start one with `ray start --address HEAD:PORT --resources '{json.dumps(custom)}'`" if custom else "add one"
    return (f"stages[{index}] ({cfg.stage}) needs {describe(need)} for each task or actor, and {why} (Ray would "
            f"wait for it forever): {add}, or lower the stage's num_cpus, num_gpus, reserved_memory_mb or resources")


def held_problems(stages: Sequence[StageConfig], totals: Mapping[str, float]) -> list[str]:
    """Resources that the minimum actor pools hold so fully that no read or task stage can run."""
    held: dict[str, float] = {}
    pools: dict[str, list[str]] = {}
    spare = dict(READ_TASK)  # what must stay free: one read task, or one task of the hungriest task stage
    for cfg in stages:
        need = demand(cfg)
        if not type(cfg).actor:
            spare = {name: max(spare.get(name, 0.0), need.get(name, 0.0)) for name in {*spare, *need}}
            continue
        low = cfg.pool_range()[0]
        for name, amount in need.items():
            held[name] = held.get(name, 0.0) + low * amount
            pools.setdefault(name, []).append(f"{cfg.stage} {low} x {amount:g}")
    return [held_problem(name, held[name], spare.get(name, 0.0), totals.get(name, 0.0), pools[name])
            for name in held if held[name] + spare.get(name, 0.0) > totals.get(name, 0.0) + 1e-9]


def held_problem(name: str, held: float, spare: float, total: float, pools: list[str]) -> str:
    needs = f", and reading or a task stage needs {describe({name: spare})} more" if spare else ""
    local = f"; for a local Ray, set ray.num_cpus to at least {held + spare:g} (logical CPUs may exceed cores)"
    return (f"actor stages hold {describe({name: held})} from start to end ({', '.join(pools)}: minimum actors x "
            f"each){needs}, but the cluster has {describe({name: total}) if total else f'no {name}'}: lower the "
            "minimum of their concurrency ([MIN, MAX]) or what each actor reserves, or add nodes"
            f"{local if name == 'CPU' else ''}")


def describe(resources: Mapping[str, float]) -> str:
    """`CPU 2, GPU 1, memory 4 GiB, chromium 1`: Ray's names, memory in GiB."""
    parts = []
    for name, amount in sorted(resources.items(), key=lambda item: (item[0] not in ("CPU", "GPU"), item[0])):
        if name.startswith("node:") or name == "object_store_memory":
            continue  # every node has its own node:<ip>; object store memory is never reserved by a stage
        parts.append(f"{name} {amount / 2**30:.3g} GiB" if name == "memory" else f"{name} {amount:g}")
    return ", ".join(parts) or "nothing"


def describe_nodes(nodes: Sequence[Mapping[str, float]]) -> str:
    shown = [f"[{describe(node)}]" for node in nodes[:NODES_SHOWN]]
    more = f" and {len(nodes) - NODES_SHOWN} more" if len(nodes) > NODES_SHOWN else ""
    return "; ".join(shown) + more if shown else "none alive"
