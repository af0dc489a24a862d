"""Connected components of a graph whose edges are a dataset, found on the workers.

A node is a record's place in the run, the pair (partition, position), ordered as the run
orders records. An edge is a row (part, pos) -> (to_part, to_pos) whose first node is the
larger. `connected_components` returns the stars of the components: one edge per node that
is not the smallest of its component, to that smallest node.

The passes alternate large-star and small-star (Kiveris et al., "Connected Components in
MapReduce and Beyond", 2014), each one grouping of the edges by a node:
- large-star: a node links each of its larger neighbours to the smallest of itself and its
  neighbours;
- small-star: a node links itself and each of its smaller neighbours to the smallest of them.
Both keep every component connected and no two joined; they change nothing exactly when every
component is one star around its smallest node. A round is the two groupings and one sum of
the edges they changed, the only number the driver sees; the last round changes nothing. The
paper bounds the rounds by O(log^2 n): bench/dedup.py's clusters (pairs, a few larger) take 2
rounds, a chain of 1,024 nodes 9 to 11, each round ~0.3 s of fixed cost on a small input.

A group is a hash bucket of nodes, not a node: one call handles a bucket's edges with numpy
(sort, scatter-minimum), where one Python call a node would cost more than the work.
"""
from __future__ import annotations

from typing import Any

import numpy as np

EDGE = ("part", "pos", "to_part", "to_pos")  # larger node -> smaller node
MAX_ROUNDS = 64  # large-star/small-star needs O(log^2 n) rounds: 64 is far beyond any real corpus
# Rows a grouping call gets, on average: ~3 MB, a call's overhead amortized, and still hundreds of
# buckets to spread over a cluster (a million documents make 15M key rows: 229 buckets).
ROWS_PER_BUCKET = 1 << 16


def connected_components(edges: Any, buckets: int) -> Any:
    """The stars (leaf -> smallest node of its component) of a dataset of EDGE rows."""
    for _ in range(MAX_ROUNDS):
        both_ways = edges.map_batches(orient_both_ways, fn_kwargs={"buckets": buckets}, batch_size=None,
                                      batch_format="pyarrow")
        larger = both_ways.groupby("bucket").map_groups(large_star, fn_kwargs={"buckets": buckets},
                                                         batch_format="pyarrow")
        edges = larger.groupby("bucket").map_groups(small_star, batch_format="pyarrow").materialize()
        if not edges.sum("changed"):  # None for no edges at all
            return edges.select_columns(list(EDGE))
    raise RuntimeError(f"connected components did not settle in {MAX_ROUNDS} rounds of large-star/small-star, "
                       "which cannot happen on a graph: a bug; report it with the recipe")


def bucket_count(rows: int) -> int:
    """Buckets for a grouping of about `rows` rows (at least 16: small inputs still spread over workers)."""
    return max(16, -(-rows // ROWS_PER_BUCKET))


def node_buckets(part: np.ndarray, pos: np.ndarray, buckets: int) -> np.ndarray:
    """A well-mixed hash of each node, modulo `buckets` (splitmix64's finalizer)."""
    h = part.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + pos.astype(np.uint64)
    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return ((h ^ (h >> np.uint64(31))) % np.uint64(buckets)).astype(np.int64)


def relabel(part: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Local ids 0..n-1 for the distinct nodes, in node order: (their part, their pos, id of each row)."""
    order = np.lexsort((pos, part))
    part, pos = part[order], pos[order]
    new = np.ones(len(order), bool)
    new[1:] = (part[1:] != part[:-1]) | (pos[1:] != pos[:-1])
    ids = np.empty(len(order), np.int64)
    ids[order] = np.cumsum(new) - 1
    return part[new], pos[new], ids


def local_graph(node_part, node_pos, other_part, other_pos) -> tuple[np.ndarray, ...]:
    """Edges as distinct (node, neighbour) pairs of local ids, ordered by node, and each id's part and pos."""
    part, pos, ids = relabel(np.concatenate([node_part, other_part]), np.concatenate([node_pos, other_pos]))
    pairs = np.unique(ids[: len(node_part)] * len(part) + ids[len(node_part) :])
    return pairs // len(part), pairs % len(part), part, pos


def columns(table, names) -> list[np.ndarray]:
    return [table.column(name).to_numpy() for name in names]


def smallest_neighbour(node: np.ndarray, neighbour: np.ndarray, count: int) -> np.ndarray:
    """For each local id, the smallest of itself and its neighbours."""
    smallest = np.arange(count)
    np.minimum.at(smallest, node, neighbour)
    return smallest


def orient_both_ways(table, buckets: int):
    """A Ray task: each edge as seen from both its nodes, bucketed by the node that sees it."""
    import pyarrow as pa

    hi_part, hi_pos, lo_part, lo_pos = columns(table, EDGE)
    node_part, node_pos = np.concatenate([hi_part, lo_part]), np.concatenate([hi_pos, lo_pos])
    return pa.table({"bucket": node_buckets(node_part, node_pos, buckets),
                     "node_part": node_part, "node_pos": node_pos,
                     "other_part": np.concatenate([lo_part, hi_part]), "other_pos": np.concatenate([lo_pos, hi_pos])})


def large_star(group, buckets: int):
    """A Ray task: every node's larger neighbours linked to the smallest of it and its neighbours,
    bucketed by the larger node for small_star; `changed` marks links that were not edges before."""
    node, neighbour, part, pos = local_graph(*columns(group, ("node_part", "node_pos", "other_part", "other_pos")))
    smallest = smallest_neighbour(node, neighbour, len(part))
    larger = neighbour > node
    hi, lo = neighbour[larger], smallest[node[larger]]
    table = edge_table(part, pos, hi, lo, lo != node[larger])
    return table.append_column("bucket", [node_buckets(part[hi], pos[hi], buckets)])


def small_star(group):
    """A Ray task: each node and its smaller neighbours linked to the smallest of them. A node
    keeps its link when it has one smaller neighbour; any other link is a change."""
    node, neighbour, part, pos = local_graph(*columns(group, EDGE))  # grouped by the larger node
    smallest = smallest_neighbour(node, neighbour, len(part))
    nodes = np.unique(node)
    moved = neighbour != smallest[node]
    hi = np.concatenate([nodes, neighbour[moved]])
    lo = np.concatenate([smallest[nodes], smallest[node[moved]]])
    changed = np.concatenate([np.zeros(len(nodes), bool), np.ones(int(moved.sum()), bool)])
    changed[:1] |= bool(group.column("changed").to_numpy().any())  # large-star's changes count in the round's sum
    return edge_table(part, pos, hi, lo, changed)


def edge_table(part: np.ndarray, pos: np.ndarray, hi: np.ndarray, lo: np.ndarray, changed: np.ndarray):
    import pyarrow as pa

    return pa.table({"part": part[hi], "pos": pos[hi], "to_part": part[lo], "to_pos": pos[lo],
                     "changed": changed.astype(np.int64)})
