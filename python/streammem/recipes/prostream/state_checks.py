"""The checks of a ``ProStream`` state, run before a memory restores it (``ProStream.load_state_dict``).

Each failure is one ``ValueError`` naming the checkpoint's path and the dotted field: the format,
version, config and encoder dimension; the dialogue tree's node table (``check_node_table``: ids,
children and parents, normalised embeddings, tree rows); the bounded memory's clock and statistics;
the counters (non-negative ints); the stream time (None or finite); finite timings; the session
(None or an int); the keyed units (ids below their next id, normalised embeddings); and every stored
id (open turns and segments, superseded turns) a
node id the tree has handed out (in ``[0, next_id)``; a node evicted since may still be named).
"""
from __future__ import annotations

from ...checkpoint import StateReader
from ...components.state_checks import (
    check_format, check_node_table, check_saved_config, check_stream_time, check_timings, check_unit_rows,
)

__all__ = ["check_prostream_state"]


def check_prostream_state(reader: StateReader, fmt: str, version: int, config, text_dim: int) -> None:
    """Check a whole ``ProStream.state_dict()`` against a memory of ``config`` (a ``ProStreamConfig``)
    whose text encoder has ``text_dim`` dimensions."""
    check_format(reader, "ProStream", fmt, version)
    check_saved_config(reader, config)
    dim = reader.int("text_dim", low=1)
    reader.require(dim == text_dim, "text_dim",
                   f"is {dim}: the state was saved with a {dim}-d text encoder, this memory has {text_dim}-d")
    check_node_table(reader, "tree")
    next_id = reader.sub("tree").int("next_id", low=0)
    bounded = reader.sub("bounded")
    bounded.real("now")
    stats = bounded.dict("stats")
    for key, value in stats.items():
        if isinstance(value, int):
            bounded.sub("stats").int(key, low=0)
    reader.dict("segmenter")
    counters = reader.dict("stats")
    for key in counters:
        reader.sub("stats").int(key, low=0)
    check_stream_time(reader)
    check_timings(reader)
    reader.int("session", optional=True)
    turns = reader.list("open_turns")
    for i, pair in enumerate(turns):
        reader.require(isinstance(pair, (list, tuple)) and len(pair) == 2, f"open_turns[{i}]",
                       "must be a [segmenter position, node id or -1] pair")
        sub = StateReader(reader.path, reader.kind, {"position": pair[0], "node": pair[1]},
                          reader.field(f"open_turns[{i}]."))
        sub.int("position", low=0)
        sub.int("node", low=-1, high=next_id - 1)
    for name in ("open_segments", "superseded"):
        reader.ints(name, low=0, high=next_id - 1)
    units = reader.sub("units")
    ids = units.ints("unit_id", low=0)
    units.int("next_id", low=max(ids) + 1 if ids else 0)
    check_unit_rows(units, "embedding", len(ids), optional=not ids)
    reader.all_finite("units")
