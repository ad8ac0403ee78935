"""Scale ``StreamMemory`` beyond one process: archive indexing and many live streams (optional extra ``[ray]``).

* ``index_archive(paths, out_dir, ...)``: one video is the unit of work
  (decode -> gate -> encode -> memory -> save), run by Ray worker actors
  (``backend="ray"``) or on this machine (``backend="local"``: a loop, or
  processes); a manifest makes runs resumable and idempotent.
  ``VideoMemory.load(dir)`` opens one result.
* ``ShardMemory``: many streams' memories in one process, their encoder and
  segmenter calls batched across streams, checkpointed every T seconds and
  restored on construction.  ``StreamShard`` is the same as a Ray actor
  (concurrency groups: questions do not queue behind pushes; ``max_restarts``).
* ``StreamRouter``: consistent hashing of stream ids to shards, a bound on
  in-flight pushes per shard with an explicit overflow policy (counted and
  reported), ``push`` / ``ask`` / ``ask_all`` / ``add_stream`` / ``remove_stream``;
  ``StreamRouter.with_ray(...)`` or ``StreamRouter.local(...)`` (threads, no Ray).

Ray is imported only by what needs it; without it those entry points raise an
``ImportError`` naming the extra to install, and everything else works.
"""
from __future__ import annotations

from ._ray import require_ray
from ._threads import configure_threads, thread_settings
from .archive import ArchiveResult, VideoMemory, index_archive, index_video
from .hashing import HashRing
from .router import ShardOverloaded, StreamRouter
from .shard import SearchHit, ShardMemory

__all__ = [
    "ArchiveResult",
    "HashRing",
    "SearchHit",
    "ShardMemory",
    "ShardOverloaded",
    "StreamRouter",
    "StreamShard",
    "VideoMemory",
    "configure_threads",
    "index_archive",
    "index_video",
    "require_ray",
    "thread_settings",
]


def __getattr__(name):
    if name == "StreamShard":  # the Ray actor class is built on first use, so importing needs no Ray
        from .shard import stream_shard_class

        return stream_shard_class()
    raise AttributeError(f"module 'streammem.distributed' has no attribute {name!r}")
