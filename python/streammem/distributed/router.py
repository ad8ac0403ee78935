"""``StreamRouter``: stream ids to shards by consistent hashing, bounded in-flight pushes, fan-out questions.

Every push goes to the shard owning its stream (``HashRing``) as one call,
``push_many`` sends one call per shard for many streams (what lets the shard
batch its encoder and segmenter calls).  At most ``max_in_flight`` push calls
are outstanding per shard; when a shard is at its bound, the ``overflow``
policy decides, and every decision is counted in ``report()``:

* ``"block"``: wait for the shard's oldest call (backpressure; counts the
  waits and the seconds blocked);
* ``"drop"``: do not send; the frames are counted as dropped for the shard and
  the stream (their stream positions are still used, so the shard sees and
  counts the gap too);
* ``"raise"``: raise ``ShardOverloaded`` (counted), the caller decides.

Nothing is lost silently: per stream, the report gives frames sent, frames
dropped here, and frames the shard says it never received; the difference is
what restarts lost (frames since the shard's last checkpoint).  A failed push
is raised by the next call on that shard (or by ``flush``).

Backends: ``StreamRouter.with_ray(...)`` creates ``StreamShard`` actors;
``StreamRouter.local(...)`` runs ``ShardMemory`` shards in this process (one
push thread and two question threads per shard), with the same API.
"""
from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from collections import Counter, defaultdict, deque
from typing import Sequence

import numpy as np

from ..config import MemoryConfig
from .hashing import HashRing
from .shard import SearchHit, ShardMemory

__all__ = ["StreamRouter", "ShardOverloaded"]

_POLICIES = ("block", "drop", "raise")


class ShardOverloaded(RuntimeError):
    """A push found its shard at ``max_in_flight`` under ``overflow="raise"``."""


class _LocalShard:
    """A ``ShardMemory`` behind futures: one push thread, two question threads (like the actor's groups)."""

    def __init__(self, core: ShardMemory):
        self.core = core
        self._push = cf.ThreadPoolExecutor(1, thread_name_prefix="shard-push")
        self._ask = cf.ThreadPoolExecutor(2, thread_name_prefix="shard-ask")

    _PUSH_METHODS = ("push", "add_stream", "remove_stream", "finish", "checkpoint")

    def call(self, method: str, *args) -> cf.Future:
        pool = self._push if method in self._PUSH_METHODS else self._ask
        fn = self.core.stats if method == "stats" else getattr(self.core, method)
        return pool.submit(fn, *args)

    def close(self) -> None:
        self._push.shutdown(wait=False, cancel_futures=True)
        self._ask.shutdown(wait=False, cancel_futures=True)


class _RayShard:
    def __init__(self, actor):
        self.actor = actor

    def call(self, method: str, *args) -> cf.Future:
        return getattr(self.actor, method).remote(*args).future()

    def close(self) -> None:
        pass


class StreamRouter:
    """Routes many live streams to shards.

    Parameters
    ----------
    shards : sequence of shard handles
        Built by ``with_ray`` or ``local``.
    max_in_flight : int
        Push calls outstanding per shard.
    overflow : {"block", "drop", "raise"}
        What a push does when its shard is at ``max_in_flight`` (module docstring).
    replicas : int
        Virtual nodes per shard on the hash ring.
    """

    def __init__(self, shards: Sequence, *, max_in_flight: int = 4, overflow: str = "block", replicas: int = 64):
        if not shards:
            raise ValueError("shards must hold at least one shard")
        if isinstance(max_in_flight, bool) or int(max_in_flight) != max_in_flight or max_in_flight < 1:
            raise ValueError(f"max_in_flight must be an int >= 1, got {max_in_flight!r}")
        if overflow not in _POLICIES:
            raise ValueError(f"overflow must be one of {_POLICIES}, got {overflow!r}")
        self.shards = list(shards)
        self.max_in_flight = int(max_in_flight)
        self.overflow = overflow
        self.ring = HashRing(range(len(self.shards)), replicas=replicas)
        self._stream_shard: dict[str, int] = {}
        self._next_seq: dict[str, int] = {}
        self._in_flight: list[list[tuple[cf.Future, dict]]] = [[] for _ in self.shards]
        self._errors: list[BaseException | None] = [None] * len(self.shards)
        self._lock = threading.Lock()
        self.shard_counts = [Counter() for _ in self.shards]
        self.stream_counts: dict[str, Counter] = defaultdict(Counter)
        self.blocked_seconds = [0.0] * len(self.shards)
        self.last_ack: dict[str, dict] = {}
        # (seconds from arrival to the shard's acknowledgement, frames) of the latest push calls.
        self.push_latencies: deque = deque(maxlen=100_000)

    # ---- construction ----------------------------------------------------------
    @classmethod
    def local(cls, num_shards: int, config: MemoryConfig | str = "base", *, frame_encoder="auto",
              text_encoder="auto", checkpoint_dir=None, checkpoint_every_s: float | None = None,
              answer_fn=None, **router_kwargs) -> "StreamRouter":
        """Shards in this process (no Ray); ``checkpoint_dir/shard-<i>`` per shard."""
        from pathlib import Path

        shards = []
        for i in range(_check_count(num_shards)):
            ckpt = None if checkpoint_dir is None else Path(checkpoint_dir) / f"shard-{i}"
            shards.append(_LocalShard(ShardMemory(config, frame_encoder, text_encoder, checkpoint_dir=ckpt,
                                                  checkpoint_every_s=checkpoint_every_s, answer_fn=answer_fn)))
        return cls(shards, **router_kwargs)

    @classmethod
    def with_ray(cls, num_shards: int, config: MemoryConfig | str = "base", *, frame_encoder="auto",
                 text_encoder="auto", checkpoint_dir=None, checkpoint_every_s: float | None = 30.0,
                 num_cpus_per_shard: float = 1, max_restarts: int = 3, max_task_retries: int = 3,
                 answer_fn=None, **router_kwargs) -> "StreamRouter":
        """``StreamShard`` actors (Ray must be initialised, or is with defaults).

        Each shard gets ``num_cpus_per_shard`` CPUs and as many torch / OpenMP
        threads; on a crash Ray restarts it up to ``max_restarts`` times and
        retries its calls up to ``max_task_retries`` times; the new process
        restores ``checkpoint_dir/shard-<i>``.  Encoders are given as names or
        spec dicts (each shard loads its own).
        """
        from pathlib import Path

        from ._ray import require_ray
        from .shard import stream_shard_class

        ray = require_ray()
        if not ray.is_initialized():
            ray.init()
        config = MemoryConfig.from_preset(config) if isinstance(config, str) else config
        actor = stream_shard_class()
        threads = max(1, int(num_cpus_per_shard))
        shards = []
        for i in range(_check_count(num_shards)):
            ckpt = None if checkpoint_dir is None else str(Path(checkpoint_dir).resolve() / f"shard-{i}")
            handle = actor.options(num_cpus=num_cpus_per_shard, max_restarts=max_restarts,
                                   max_task_retries=max_task_retries, name=None).remote(
                config.to_dict(), frame_encoder, text_encoder, ckpt, checkpoint_every_s, threads, answer_fn)
            shards.append(_RayShard(handle))
        return cls(shards, **router_kwargs)

    # ---- streams -------------------------------------------------------------------
    def shard_of(self, stream_id: str) -> int:
        """The shard index owning ``stream_id`` (consistent hashing)."""
        return self._stream_shard.get(stream_id, self.ring.lookup(stream_id))

    @property
    def streams(self) -> list[str]:
        return list(self._stream_shard)

    def add_stream(self, stream_id: str, *, timeout: float | None = 120) -> int:
        """Register a stream on its shard (restored state is kept); returns the shard index."""
        if not isinstance(stream_id, str) or not stream_id:
            raise ValueError(f"stream_id must be a non-empty string, got {stream_id!r}")
        shard = self.ring.lookup(stream_id)
        self.shards[shard].call("add_stream", stream_id).result(timeout)
        stats = self.shards[shard].call("stats").result(timeout)
        seen = stats["streams"].get(stream_id, {}).get("frames_seen", 0)
        with self._lock:
            self._stream_shard[stream_id] = shard
            self._next_seq[stream_id] = max(self._next_seq.get(stream_id, 0), seen)
        return shard

    def remove_stream(self, stream_id: str, *, timeout: float | None = 120) -> None:
        """Drop a stream from its shard (after its in-flight pushes)."""
        shard = self._shard(stream_id)
        self.flush(shard, timeout=timeout)
        self.shards[shard].call("remove_stream", stream_id).result(timeout)
        with self._lock:
            del self._stream_shard[stream_id]

    def _shard(self, stream_id: str) -> int:
        try:
            return self._stream_shard[stream_id]
        except KeyError:
            raise ValueError(f"stream_id {stream_id!r} is not routed (add_stream first)") from None

    # ---- pushes ------------------------------------------------------------------------
    def push(self, stream_id: str, timestamps, frames, *, arrival: float | None = None) -> bool:
        """Send one stream's frames; False when the overflow policy dropped them."""
        return self.push_many({stream_id: (timestamps, frames)}, arrival=arrival)[stream_id]

    def push_many(self, pushes: dict, *, arrival: float | None = None) -> dict[str, bool]:
        """Frames of many streams, ``{stream_id: (timestamps, frames)}``: one call per shard.

        Returns, per stream, whether its frames were sent (False: dropped by the
        overflow policy).  ``arrival`` (``time.perf_counter()`` when the frames
        arrived; default: now) starts the latency recorded for each call until
        its shard acknowledges it, blocking in the router included
        (``push_latencies``, summarised by ``report()``).
        """
        arrival = time.perf_counter() if arrival is None else float(arrival)
        by_shard: dict[int, list] = defaultdict(list)
        for stream_id, (timestamps, frames) in pushes.items():
            shard = self._shard(stream_id)
            frames = np.asarray(frames)
            if frames.ndim == 3:
                frames = frames[None]
            n = frames.shape[0]
            with self._lock:
                seq = self._next_seq[stream_id]
                self._next_seq[stream_id] = seq + n
            by_shard[shard].append((stream_id, seq, timestamps, frames))
        sent: dict[str, bool] = {}
        pending = list(by_shard.items())
        try:
            while pending:
                shard, items = pending[0]
                ok = self._send(shard, items, arrival)
                pending.pop(0)
                for item in items:
                    sent[item[0]] = ok
        except BaseException:
            # Nothing of the unsent items reached a shard: give their stream positions back, so an
            # overload error (or a raised earlier failure) does not show up as a gap.
            with self._lock:
                for _, items in pending:
                    for stream_id, seq, _, _ in items:
                        self._next_seq[stream_id] = min(self._next_seq[stream_id], seq)
            raise
        return sent

    def _reap(self, shard: int) -> None:
        """Collect finished push calls of a shard: record acks, keep the first failure."""
        still = []
        for fut, meta in self._in_flight[shard]:
            if not fut.done():
                still.append((fut, meta))
                continue
            exc = fut.exception()
            if exc is not None:
                self.shard_counts[shard]["failed_pushes"] += 1
                self.shard_counts[shard]["failed_frames"] += meta["frames"]
                for stream_id, n in meta["streams"]:
                    self.stream_counts[stream_id]["failed_frames"] += n
                if self._errors[shard] is None:
                    self._errors[shard] = exc
            else:
                self.last_ack.update(fut.result())
        self._in_flight[shard] = still

    def _raise_failure(self, shard: int) -> None:
        exc = self._errors[shard]
        if exc is not None:
            self._errors[shard] = None
            raise exc

    def _send(self, shard: int, items: list, arrival: float) -> bool:
        counts = self.shard_counts[shard]
        frames = sum(item[3].shape[0] for item in items)
        self._reap(shard)
        self._raise_failure(shard)
        if len(self._in_flight[shard]) >= self.max_in_flight:
            counts["overflows"] += 1
            if self.overflow == "drop":
                counts["dropped_pushes"] += 1
                counts["dropped_frames"] += frames
                for item in items:
                    self.stream_counts[item[0]]["dropped_frames"] += item[3].shape[0]
                return False
            if self.overflow == "raise":
                raise ShardOverloaded(f"shard {shard} has {self.max_in_flight} pushes in flight")
            t0 = time.perf_counter()
            while len(self._in_flight[shard]) >= self.max_in_flight:
                cf.wait([f for f, _ in self._in_flight[shard]], return_when=cf.FIRST_COMPLETED)
                self._reap(shard)
            self.blocked_seconds[shard] += time.perf_counter() - t0
            counts["blocked_pushes"] += 1
            self._raise_failure(shard)
        fut = self.shards[shard].call("push", items)
        latencies = self.push_latencies
        fut.add_done_callback(lambda f: latencies.append((time.perf_counter() - arrival, frames)))
        self._in_flight[shard].append((fut, {"frames": frames,
                                             "streams": [(item[0], item[3].shape[0]) for item in items]}))
        counts["pushes"] += 1
        counts["frames"] += frames
        counts["max_in_flight_seen"] = max(counts["max_in_flight_seen"], len(self._in_flight[shard]))
        for item in items:
            self.stream_counts[item[0]]["frames_sent"] += item[3].shape[0]
        return True

    def flush(self, shard: int | None = None, *, timeout: float | None = None) -> None:
        """Wait for in-flight pushes (of one shard or all); raises the first failure."""
        targets = range(len(self.shards)) if shard is None else [shard]
        for s in targets:
            futures = [f for f, _ in self._in_flight[s]]
            if futures:
                done, pending = cf.wait(futures, timeout=timeout)
                if pending:
                    raise TimeoutError(f"shard {s}: {len(pending)} pushes still in flight after {timeout} s")
            self._reap(s)
            self._raise_failure(s)

    def finish(self, stream_id: str, *, timeout: float | None = 120) -> None:
        """End of a stream: after its in-flight pushes, close its partial chunk and open event."""
        shard = self._shard(stream_id)
        self.flush(shard, timeout=timeout)
        self.shards[shard].call("finish", stream_id).result(timeout)

    def checkpoint(self, *, timeout: float | None = 300) -> list[dict]:
        """Checkpoint every shard now (after its in-flight pushes)."""
        futures = [h.call("checkpoint") for h in self.shards]
        return [f.result(timeout) for f in futures]

    # ---- questions ---------------------------------------------------------------------
    def ask(self, stream_id: str, question: str, *, timeout: float | None = 120):
        """One stream's ``Context``; it does not wait for that stream's in-flight pushes."""
        shard = self._shard(stream_id)
        return self.shards[shard].call("ask", stream_id, question).result(timeout)

    def ask_all(self, question: str, k: int = 5, *, timeout: float | None = 120) -> list[SearchHit]:
        """Top-k nodes and events over every stream: each shard's top-k (in parallel), merged."""
        futures = [h.call("search", question, k) for h in self.shards]
        hits = [hit for f in futures for hit in f.result(timeout)]
        hits.sort(key=lambda h: -h.score)
        return hits[:k]

    def memory_state(self, stream_id: str, *, timeout: float | None = 120) -> dict:
        """A stream's ``StreamMemory.state_dict()`` (after its in-flight pushes)."""
        shard = self._shard(stream_id)
        self.flush(shard, timeout=timeout)
        return self.shards[shard].call("memory_state", stream_id).result(timeout)

    # ---- reporting ------------------------------------------------------------------------
    def report(self, *, timeout: float | None = 120) -> dict:
        """Per shard and per stream: sent, dropped, blocked, failed, and frames the shards never received.

        ``lost_to_restarts`` per stream is frames the shard counts as missing
        less frames this router dropped and frames of pushes the shard
        rejected: frames a shard lost since its last checkpoint when it was
        restarted.  ``push_latency``: arrival -> acknowledgement percentiles of
        the latest push calls.
        """
        stats = [h.call("stats").result(timeout) for h in self.shards]
        shards = []
        for i, (counts, st) in enumerate(zip(self.shard_counts, stats)):
            shards.append({"shard": i, "streams": len(st["streams"]), "in_flight": len(self._in_flight[i]),
                           "blocked_seconds": round(self.blocked_seconds[i], 4), **dict(counts),
                           "restarted": bool(st.get("restarted", False)),
                           "restored_streams": st.get("restored_streams", 0), "pid": st.get("pid"),
                           "rss_mb": st.get("rss_mb"),
                           "shard_counters": st["counters"], "shard_seconds": st["seconds"],
                           "checkpoint_seconds": st.get("checkpoint_seconds", [])})
        streams = {}
        for stream_id, shard in self._stream_shard.items():
            s = stats[shard]["streams"].get(stream_id, {})
            c = self.stream_counts[stream_id]
            missing = s.get("frames_missing", 0)
            streams[stream_id] = {"shard": shard, "frames_sent": c["frames_sent"],
                                  "dropped_frames": c["dropped_frames"], "failed_frames": c["failed_frames"],
                                  "frames_seen": s.get("frames_seen", 0), "frames_formed": s.get("frames_formed", 0),
                                  "frames_missing": missing,
                                  "lost_to_restarts": max(0, missing - c["dropped_frames"] - c["failed_frames"])}
        totals = Counter()
        for s in shards:
            totals.update({k: s.get(k, 0) for k in ("pushes", "frames", "dropped_pushes", "dropped_frames",
                                                    "blocked_pushes", "overflows", "failed_pushes", "failed_frames")})
        totals["lost_to_restarts"] = sum(s["lost_to_restarts"] for s in streams.values())
        lat = np.array([t for t, _ in list(self.push_latencies)])
        latency = {"calls": int(lat.size)}
        if lat.size:
            latency.update({f"p{q}_ms": round(1e3 * float(np.percentile(lat, q)), 2) for q in (50, 95, 99)})
        return {"policy": self.overflow, "max_in_flight": self.max_in_flight, "totals": dict(totals),
                "push_latency": latency, "shards": shards, "streams": streams}

    def close(self) -> None:
        """Stop local shards' threads (Ray actors end with their handles)."""
        for h in self.shards:
            h.close()

    def __enter__(self) -> "StreamRouter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _check_count(n) -> int:
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise ValueError(f"num_shards must be an int >= 1, got {n!r}")
    return int(n)
