"""Checks of the component states inside a checkpoint, run before a memory changes.

Each function reads one component's ``state_dict()`` through a ``StateReader`` (so every failure is
one ``ValueError`` naming the checkpoint's path and the dotted field) and checks what the
component's own ``load_state_dict`` trusts: types, finiteness, shapes, ranges and the consistency
of ids (children and parents inside the node table, the tree's rows one per node).  The loaders
then restore a state known to be whole; what they check themselves (a tree index's layout, a
segmenter's tensors) is reported under the component's field by ``StateReader.restore``.
"""
from __future__ import annotations

import torch

from ..checkpoint import StateReader

__all__ = ["check_format", "check_saved_config", "check_records", "check_node_table", "check_timings",
           "check_stream_time", "UNIT_NORM_SLACK"]

# Stored embeddings are L2-normalised (or zero); a row norm above 1 + this is a damaged or hostile
# state (a 1e30 embedding would give every question an infinite score).
UNIT_NORM_SLACK = 1e-3


def check_format(reader: StateReader, owner: str, fmt: str, version: int, kind: str = "state_dict") -> None:
    """The state's ``format`` is ``fmt`` and its ``version`` is ``version`` (an ``owner``'s ``kind``)."""
    got = reader.state.get("format")
    reader.require(got == fmt, "format", f"is not a {owner} {kind}'s ({fmt!r}), got {got!r:.60}")
    got = reader.state.get("version")
    reader.require(got == version, "version", f"is an unsupported {owner} state version {got!r:.20} "
                                              f"(this is {version})")


def check_saved_config(reader: StateReader, config) -> None:
    """The saved ``config`` field equals ``config`` (read back with ``type(config).from_dict``)."""
    saved = reader.dict("config")
    name = type(config).__name__
    try:
        same = type(config).from_dict(saved) == config
    except (TypeError, ValueError) as exc:
        raise reader.error("config", f"is not a {name} ({exc})") from None
    reader.require(same, "config", f"differs: the state was saved with another {name}")


def check_timings(reader: StateReader, name: str = "timings") -> None:
    """A dict of finite, non-negative seconds."""
    timings = reader.dict(name)
    sub = reader.sub(name)
    for key in timings:
        sub.require(isinstance(key, str), str(key), "must be a string key")
        sub.real(key, low=0.0)


def check_stream_time(reader: StateReader, name: str = "stream_time") -> float | None:
    """None (nothing pushed yet) or a finite number of seconds."""
    return reader.real(name, optional=True)


def check_unit_rows(reader: StateReader, name: str, rows: int, *, optional: bool = False) -> torch.Tensor | None:
    """A finite floating (rows, E) tensor whose rows have norm at most 1 (L2-normalised or zero)."""
    emb = reader.tensor(name, ndim=2, shape=(rows, None), finite=True, optional=optional)
    if emb is None:
        return None
    reader.require(emb.is_floating_point(), name, f"must be a floating tensor, got {emb.dtype}")
    if emb.numel():
        norm = float(torch.linalg.vector_norm(emb.double(), dim=1).max())
        reader.require(norm <= 1.0 + UNIT_NORM_SLACK, name,
                       f"must hold L2-normalised rows (norm <= 1), found a row of norm {norm:.3g}")
    return emb


def check_records(reader: StateReader, name: str) -> int:
    """Frame records (``records_state``): indices >= 0, finite times, one finite feature row each and
    a list of labels each; returns how many."""
    sub = reader.sub(name)
    n = len(sub.ints("index", low=0))
    sub.reals("timestamp", length=n)
    labels = sub.list("labels", length=n)
    for i in range(n):
        sub.require(isinstance(labels[i], (list, tuple)) and all(isinstance(x, str) for x in labels[i]),
                    f"labels[{i}]", "must be a list of strings")
    sub.tensor("feature", ndim=2, shape=(n, None), finite=True, optional=n == 0)
    return n


def check_node_table(reader: StateReader, name: str) -> set[int]:
    """A ``LongTermMemory`` state (its node table, open chunk, roots and tree rows); returns the node ids.

    Checked: unique ids >= 0 below ``next_id``; levels, frame indices and counters non-negative;
    finite times with ``t_start <= t_end``; every child and parent an id of the table, each node's
    parent listing it among its children and each child naming its parent; L2-normalised finite
    embeddings (one per node) and finite centres (as many rows as ``centres_count`` says); the
    tree's rows one per node; the roots ids of the table.
    """
    table = reader.sub(name)
    nodes = table.sub("nodes")
    ids = nodes.ints("node_id", low=0)
    n = len(ids)
    nodes.require(len(set(ids)) == n, "node_id", "must hold unique ids")
    known = set(ids)
    nodes.ints("level", length=n, low=0)
    nodes.spans("t_start", "t_end", length=n)
    nodes.ints("first_frame", length=n)
    nodes.ints("last_frame", length=n)
    nodes.strs("caption", length=n)
    nodes.reals("created_at", length=n)
    nodes.reals("last_access", length=n)
    nodes.ints("access_count", length=n, low=0)
    nodes.ints("merged", length=n, low=0)
    parents = nodes.ints("parent", length=n, optional_items=True)
    children = nodes.list("children", length=n)
    kids_of = {}
    for i, kids in enumerate(children):
        ints = isinstance(kids, (list, tuple)) and all(isinstance(k, int) and not isinstance(k, bool) for k in kids)
        nodes.require(ints, f"children[{i}]", "must be a list of ints")
        outside = [k for k in kids if k not in known]
        nodes.require(not outside, f"children[{i}]", f"must name nodes of the table, got unknown ids {outside[:5]}")
        kids_of[ids[i]] = set(kids)
    for i, parent in enumerate(parents):
        if parent is not None:
            nodes.require(parent in known, f"parent[{i}]", f"must name a node of the table, got {parent}")
            nodes.require(ids[i] in kids_of[parent], f"parent[{i}]",
                          f"names node {parent}, which does not list node {ids[i]} among its children")
    parent_of = dict(zip(ids, parents))
    for i, kids in enumerate(children):
        for k in kids:
            nodes.require(parent_of[k] == ids[i], f"children[{i}]",
                          f"lists node {k}, whose parent is {parent_of[k]}, not {ids[i]}")
    labels = nodes.list("label_counts", length=n)
    for i, counts in enumerate(labels):
        nodes.require(isinstance(counts, dict) and all(isinstance(c, int) and c >= 0 for c in counts.values()),
                      f"label_counts[{i}]", "must map labels to counts >= 0")
    check_unit_rows(nodes, "embedding", n, optional=n == 0)
    counts = nodes.ints("centres_count", length=n, low=0)
    centres = nodes.tensor("centres", ndim=2, shape=(sum(counts), None), finite=True, optional=n == 0)
    if centres is not None:
        nodes.require(centres.is_floating_point(), "centres", f"must be a floating tensor, got {centres.dtype}")
    table.int("next_id", low=max(ids) + 1 if ids else 0)
    rows = table.ints("node_of_row")
    table.require(len(rows) == n and set(rows) == known, "node_of_row",
                  f"must list each of the {n} nodes once (the tree's rows), got {len(rows)} entries")
    roots = table.list("roots_by_level")
    for i, entry in enumerate(roots):
        ok = isinstance(entry, (list, tuple)) and len(entry) == 2 and isinstance(entry[1], (list, tuple))
        table.require(ok, f"roots_by_level[{i}]", "must be a [level, ids] pair")
        outside = [r for r in entry[1] if r not in known]
        table.require(not outside, f"roots_by_level[{i}]", f"must name nodes of the table, got {outside[:5]}")
    check_records(table, "pending")
    if table.has("timings"):
        check_timings(table)
    tree = table.get("tree")
    table.require(n == 0 or tree is not None, "tree", "must be present when the table holds nodes")
    return known
