"""The checks of a ``StreamMemory`` state, run before a memory restores it (``StreamMemory.load_state_dict``).

Every field a restored memory would trust is checked through a ``StateReader``, each failure one
``ValueError`` naming the checkpoint's path and the dotted field: the format and version, the
config and encoder dimensions (the memory's own), the counters (non-negative ints), the stream time
(None or finite), every float anywhere in the state (finite), the long-term node table (ids,
children and parents, normalised embeddings, centres, tree rows), the frame records of the
short-term memory and the open event, the knowledge base and dialogue (normalised embeddings, one
per entry) and the bounded memory's statistics.
"""
from __future__ import annotations

from ..checkpoint import StateReader
from ..components.state_checks import (check_format, check_node_table, check_records, check_stream_time, check_timings,
                                       check_unit_rows)
from ..config import MemoryConfig

__all__ = ["FORMAT", "VERSION", "COUNTERS", "check_memory_state"]

FORMAT = "streammem.StreamMemory"
VERSION = 1
COUNTERS = ("frames_seen", "frames_missing", "frames_formed", "encoded_kept", "questions")
_REQUIRED = ("config", "encoders", "counters", "stream_time", "timings", "gate", "short_term", "long_term",
             "events", "bounded", "dialogue")


def check_header(reader: StateReader) -> None:
    """The format and version fields (a state of this class and layout)."""
    check_format(reader, "StreamMemory", FORMAT, VERSION)
    missing = [k for k in _REQUIRED if k not in reader.state]
    reader.require(not missing, missing[0] if missing else "",
                   f"is missing: not a complete StreamMemory state_dict (missing {missing})")


def saved_config(reader: StateReader) -> MemoryConfig:
    """The ``config`` field as a ``MemoryConfig``."""
    data = reader.dict("config")
    try:
        return MemoryConfig.from_dict(data)
    except (TypeError, ValueError) as exc:
        raise reader.error("config", f"is not a MemoryConfig ({exc})") from None


def check_memory_state(reader: StateReader, config: MemoryConfig, text_dim: int, frame_dim: int | None,
                       has_bounded: bool) -> None:
    """Check a whole ``StreamMemory.state_dict()`` against a memory of ``config`` with encoders of
    ``text_dim`` / ``frame_dim`` dimensions (see the module docstring)."""
    check_header(reader)
    saved = saved_config(reader)
    if saved != config:
        diff = sorted(k for k, v in saved.to_dict().items() if config.to_dict()[k] != v)
        raise reader.error("config", f"differs: the state was saved with another config (fields {diff} differ)")
    enc = reader.sub("encoders")
    saved_text = enc.int("text_dim", low=1)
    enc.require(saved_text == text_dim, "text_dim",
                f"is {saved_text}: the state was saved with a {saved_text}-d text encoder, this memory has "
                f"{text_dim}-d")
    saved_frame = enc.int("frame_dim", low=1, optional=True)
    enc.require(saved_frame is None or frame_dim is None or saved_frame == frame_dim, "frame_dim",
                f"is {saved_frame}: the state was saved with a {saved_frame}-d frame encoder, this memory has "
                f"{frame_dim}-d")
    counters = reader.sub("counters")
    for name in COUNTERS:
        counters.int(name, low=0)
    check_stream_time(reader)
    check_timings(reader)
    for name in _REQUIRED[5:]:
        reader.all_finite(name)
    reader.dict("gate")
    check_records(reader.sub("short_term"), "buffer")
    check_node_table(reader, "long_term")
    events = reader.sub("events")
    events.dict("segmenter")
    check_records(events, "open")
    events.int("first", low=0)
    kb = events.sub("knowledge_base")
    n = len(kb.ints("event_id", low=0))
    for name in ("first_frame", "last_frame", "frames"):
        kb.ints(name, length=n, low=0)
    kb.reals("t_start", length=n)
    kb.reals("t_end", length=n)
    kb.strs("caption", length=n)
    check_unit_rows(kb, "embedding", n, optional=n == 0)
    bounded = reader.get("bounded")
    reader.require((bounded is None) == (not has_bounded), "bounded",
                   "must be present exactly when the config has a bounded memory")
    if bounded is not None:
        b = reader.sub("bounded")
        b.real("now")
        stats = b.dict("stats")
        for key in stats:
            if key == "peak_cost" or isinstance(stats[key], int):
                b.sub("stats").int(key, low=0)
    dialogue = reader.sub("dialogue")
    n = len(dialogue.strs("question"))
    dialogue.strs("answer", length=n)
    dialogue.reals("timestamp", length=n)
    check_unit_rows(dialogue, "embedding", n, optional=n == 0)
