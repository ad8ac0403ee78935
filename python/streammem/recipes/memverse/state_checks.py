"""The checks of a ``MemVerse`` state, run before a memory restores it (``MemVerse.load_state_dict``).

Each failure is one ``ValueError`` naming the checkpoint's path and the dotted field: the format,
version, config and text dimension; the counters (``next_chunk`` above every chunk id, sessions,
questions and frames non-negative); the stream time (None or finite); every float of the state
finite; the chunks of the window, the pending list and the graph (ids, finite times, strings,
normalised embeddings); and the long-term graph's tables (one row per node, kinds, heads and tails
inside the table, normalised embeddings, non-negative counts) and both CSRs (pointers from 0,
non-decreasing, to the column count; columns inside the node or chunk table).
"""
from __future__ import annotations

import torch

from ...checkpoint import StateReader
from ...components.state_checks import (
    check_format, check_records, check_saved_config, check_stream_time, check_timings, check_unit_rows,
)

__all__ = ["check_memverse_state"]


def check_chunks(reader: StateReader, name: str, dim: int) -> list[int]:
    """A ``_chunks_state`` list of chunks; returns their ids."""
    sub = reader.sub(name)
    ids = sub.ints("chunk_id", low=0)
    n = len(ids)
    sub.ints("session", length=n, low=0)
    sub.spans("t_start", "t_end", length=n)
    sub.strs("modality", length=n)
    sub.strs("text", length=n)
    sub.strs("speaker", length=n, optional_items=True)
    sub.ints("first_frame", length=n, low=-1)
    sub.ints("last_frame", length=n, low=-1)
    labels = sub.list("labels", length=n)
    for i, row in enumerate(labels):
        sub.require(isinstance(row, (list, tuple)) and all(isinstance(x, str) for x in row), f"labels[{i}]",
                    "must be a list of strings")
    emb = check_unit_rows(sub, "embedding", n, optional=n == 0)
    sub.require(emb is None or emb.shape[1] == dim, "embedding", f"must have {dim} columns")
    return ids


def _check_csr(reader: StateReader, name: str, rows: int, cols: int) -> None:
    pair = reader.list(name, length=2)
    sub = StateReader(reader.path, reader.kind, {"ptr": pair[0], "col": pair[1]}, reader.field(name + "."))
    col = sub.tensor("col", dtype=torch.int64, ndim=1, low=0, high=max(cols - 1, 0))
    sub.require(cols > 0 or col.numel() == 0, "col", "must be empty when there is nothing to point at")
    ptr = sub.tensor("ptr", dtype=torch.int64, shape=(rows + 1,), low=0, high=col.numel())
    sub.require(int(ptr[0]) == 0 and int(ptr[-1]) == col.numel() and bool((ptr[1:] >= ptr[:-1]).all()), "ptr",
                f"must rise from 0 to the column count {col.numel()} without falling")


def check_graph(reader: StateReader, name: str, dim: int) -> int:
    """A ``LongTermGraph.state_dict()``; returns the largest chunk id it holds (-1 if none)."""
    g = reader.sub(name)
    g.require(g.int("dim") == dim, "dim", f"must be the text encoder's {dim}")
    n = len(g.strs("texts"))
    g.strs("predicates", length=n)
    check_unit_rows(g, "embedding", n)
    g.require(g.get("embedding").shape[1] == dim, "embedding", f"must have {dim} columns")
    g.tensor("kind", dtype=torch.int8, shape=(n,), low=0, high=1)
    for column in ("head", "tail"):
        g.tensor(column, dtype=torch.int64, shape=(n,), low=-1, high=n - 1)
    g.tensor("access", dtype=torch.int64, shape=(n,), low=0)
    g.tensor("cost", dtype=torch.int64, shape=(n,), low=0)
    for column in ("last", "created"):
        g.tensor(column, dtype=torch.float64, shape=(n,), finite=True)
    chunk_ids = check_chunks(g, "chunks", dim)
    c = len(chunk_ids)
    g.tensor("chunk_access", dtype=torch.int64, shape=(c,), low=0)
    g.tensor("chunk_last", dtype=torch.float64, shape=(c,), finite=True)
    _check_csr(g, "adjacency", n, n)
    _check_csr(g, "chunk_links", n, c)
    if g.has("timings"):
        check_timings(g)
    return max(chunk_ids, default=-1)


def check_memverse_state(reader: StateReader, fmt: str, version: int, config, text_dim: int) -> None:
    """Check a whole ``MemVerse.state_dict()`` against a memory of ``config`` (a ``MemVerseConfig``)
    whose text encoder has ``text_dim`` dimensions."""
    check_format(reader, "MemVerse", fmt, version)
    check_saved_config(reader, config)
    dim = reader.sub("encoders").int("text_dim", low=1)
    reader.require(dim == text_dim, "encoders.text_dim",
                   f"is {dim}: the state was saved with a {dim}-d text encoder, this memory has {text_dim}-d")
    for name in ("session", "questions", "frames_seen", "open_first"):
        reader.int(name, low=0)
    check_stream_time(reader)
    check_timings(reader)
    for name in reader.state:
        if name != "config":
            reader.all_finite(name)
    ids = check_chunks(reader, "window", text_dim) + check_chunks(reader, "pending", text_dim)
    last = reader.get("last_consolidated")
    if last is not None:
        sub = reader.sub("last_consolidated")
        ids += check_chunks(sub, "chunk", text_dim)
        sub.require(len(sub.get("chunk")["chunk_id"]) == 1, "chunk", "must hold one chunk")
        sub.strs("entities")
    newest = max(max(ids, default=-1), check_graph(reader, "graph", text_dim))
    reader.int("next_chunk", low=newest + 1)
    reader.dict("gate")
    reader.dict("events")
    check_records(reader, "open")
    for i, report in enumerate(reader.list("evictions")):
        reader.require(isinstance(report, dict), f"evictions[{i}]", "must be a dict of counts")
