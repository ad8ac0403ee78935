"""``ShardMemory``: many streams' ``StreamMemory`` in one process; ``StreamShard``: the same as a Ray actor.

A push carries frames of several streams; the shard runs each stream's motion
gate, then **one** frame-encoder call over every kept frame of the push (per
frame size), then forms the frames round by round, each round pushing one
frame of every stream that still has one through **one** segmenter kernel call
(``StreamingSegmenter.push_many``), and finally the rest of each stream's
memory.  The result equals pushing every stream into its own ``StreamMemory``
(tested), so batching changes the cost, never the memory.

Frame positions: every push names the stream position of its first frame
(``seq``).  A push whose ``seq`` is past what the stream's memory has seen
leaves a gap, counted in that stream's ``frames_missing`` (frames dropped by a
router, or lost in a crash since the last checkpoint); a push entirely before
it is a duplicate (a retried call) and is skipped, counted in
``duplicate_pushes``.

Checkpoints: with ``checkpoint_dir`` the shard writes every stream changed
since the last checkpoint (``StreamMemory.save``, atomic per stream) and then
the shard's index ``shard.json`` (atomic), at most every
``checkpoint_every_s`` seconds (checked after each push) and on
``checkpoint()``; the constructor restores whatever the directory holds.  The
index is also written, durably, before ``add_stream`` / ``attach_stream``
return (an attached memory is saved first), so a shard restarted before its
first checkpoint still holds every stream it acknowledged.  A crash loses at
most the frames pushed since the last checkpoint, and the next push of each
stream reports exactly how many (its ``seq`` gap, counted in
``frames_missing``).  ``shard.json`` is checked on restore: a damaged file, or
a stream folder outside ``checkpoint_dir/streams``, is a ``ValueError`` naming
the file.

Concurrency: pushes are serialised (one at a time); questions (``ask``,
``search``, ``stats``) may run in other threads at the same time and only wait
for the formation of the stream they read, never for encoding.
"""
from __future__ import annotations

import hashlib
import re
import shutil
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from streammem_kernels import StreamingSegmenter

from ..checkpoint import ensure_folder, inside, load_json, save_json
from ..components.answers import NOT_IN_MEMORY_ANSWER, Outcome
from ..components.knowledge import InstantaneityScorer
from ..config import MemoryConfig
from ..models.encoders import EncodedFrames, encode_frames, encode_texts, resolve_encoder
from ..stream.context import Context
from ..stream.memory import StreamMemory
from ._threads import ensure_thread, thread_settings

__all__ = ["ShardMemory", "SearchHit", "stream_shard_class"]

_INDEX = "shard.json"
_INDEX_KIND = "streammem.ShardMemory"


@dataclass(frozen=True)
class SearchHit:
    """One retrieved item of ``ShardMemory.search`` / ``StreamRouter.ask_all``."""

    score: float
    stream_id: str
    kind: str  # "node" (long-term tree) or "event" (knowledge base)
    item: int  # node id or event id within its stream
    level: int  # tree level (events: -1)
    t_start: float
    t_end: float
    caption: str


def _stream_dir(stream_id: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", stream_id)[:40]
    return f"{safe}-{hashlib.blake2b(stream_id.encode(), digest_size=6).hexdigest()}"


def _check_stream_id(stream_id) -> str:
    if not isinstance(stream_id, str) or not stream_id:
        raise ValueError(f"stream_id must be a non-empty string, got {stream_id!r}")
    return stream_id


class ShardMemory:
    """Memories of many streams, batched, checkpointed; Ray-free (``StreamShard`` wraps it in an actor).

    Parameters
    ----------
    config : MemoryConfig or preset name
        Every stream of the shard uses it.
    frame_encoder, text_encoder : encoder, name or spec dict
        Shared by all streams ("auto", "efficientnet-lite0", "pixel", "minilm",
        "hashing", ``{"name": "pixel", "grid": 8}``, or an encoder object).
    checkpoint_dir : path, optional
        Where checkpoints go; restored from here on construction.
    checkpoint_every_s : float, optional
        Checkpoint after a push once this many seconds passed since the last one
        (None: only on ``checkpoint()``).
    num_threads : int
        torch / OpenMP threads of every thread that runs kernels (``configure_threads``).
    answer_fn, captioner
        As for ``StreamMemory`` (shared by the streams).
    """

    def __init__(self, config: MemoryConfig | str = "base", frame_encoder="auto", text_encoder="auto", *,
                 checkpoint_dir=None, checkpoint_every_s: float | None = None, num_threads: int = 1,
                 answer_fn: Callable | None = None, captioner=None):
        self.num_threads = int(num_threads)
        ensure_thread(self.num_threads)
        self.config = MemoryConfig.from_preset(config) if isinstance(config, str) else config
        if not isinstance(self.config, MemoryConfig):
            raise ValueError(f"config must be a MemoryConfig or a preset name, got {config!r}")
        if checkpoint_every_s is not None and not float(checkpoint_every_s) > 0:
            raise ValueError(f"checkpoint_every_s must be > 0 or None, got {checkpoint_every_s!r}")
        t0 = time.perf_counter()
        self.frame_encoder = resolve_encoder(frame_encoder, "frame")
        self.text_encoder = resolve_encoder(text_encoder, "text")
        self.model_load_s = time.perf_counter() - t0
        self.answer_fn = answer_fn
        self.captioner = captioner
        self._instantaneity = InstantaneityScorer(self.text_encoder)  # shared: its example embeddings are constant
        self.checkpoint_dir = None if checkpoint_dir is None else Path(checkpoint_dir)
        self.checkpoint_every_s = None if checkpoint_every_s is None else float(checkpoint_every_s)
        self._memories: dict[str, StreamMemory] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._dirty: set[str] = set()
        self._push_lock = threading.Lock()  # one push (or checkpoint, add, remove) at a time
        self._table_lock = threading.Lock()  # guards the stream table itself
        self.counters: Counter = Counter()
        self.timings: Counter = Counter()
        self.restored_streams = 0
        self.last_checkpoint: float | None = None
        self.checkpoint_seconds: list[float] = []
        t0 = time.perf_counter()
        if self.checkpoint_dir is not None:
            self._restore()
        self.restore_s = time.perf_counter() - t0
        self._last_checkpoint_clock = time.monotonic()

    # ---- streams ---------------------------------------------------------------
    def _new_memory(self) -> StreamMemory:
        return StreamMemory(self.config, self.frame_encoder, self.text_encoder, captioner=self.captioner,
                            answer_fn=self.answer_fn, instantaneity=self._instantaneity)

    def add_stream(self, stream_id: str) -> bool:
        """Start a stream's memory; False if the shard already holds it (e.g. restored)."""
        ensure_thread(self.num_threads)
        stream_id = _check_stream_id(stream_id)
        with self._push_lock, self._table_lock:
            if stream_id in self._memories:
                return False
            self._memories[stream_id] = self._new_memory()
            self._locks[stream_id] = threading.Lock()
            self._dirty.add(stream_id)
        if self.checkpoint_dir is not None:  # durable before the stream is acknowledged
            with self._push_lock:
                self._write_index()
        return True

    def remove_stream(self, stream_id: str) -> StreamMemory:
        """Drop a stream (and its checkpoint); returns its memory (e.g. to move it elsewhere)."""
        with self._push_lock, self._table_lock:
            memory = self._memory(stream_id)
            del self._memories[stream_id]
            del self._locks[stream_id]
            self._dirty.discard(stream_id)
        if self.checkpoint_dir is not None:
            shutil.rmtree(self.checkpoint_dir / "streams" / _stream_dir(stream_id), ignore_errors=True)
            self._write_index()
        return memory

    def attach_stream(self, stream_id: str, memory: StreamMemory) -> None:
        """Adopt an existing memory (moved from another shard); its config must be the shard's."""
        stream_id = _check_stream_id(stream_id)
        if memory.config != self.config:
            raise ValueError("memory has another config than this shard")
        state = memory.state_dict()
        with self._push_lock, self._table_lock:
            if stream_id in self._memories:
                raise ValueError(f"stream {stream_id!r} is already on this shard")
            fresh = self._new_memory()
            fresh.load_state_dict(state)
            self._memories[stream_id] = fresh
            self._locks[stream_id] = threading.Lock()
            self._dirty.add(stream_id)
        if self.checkpoint_dir is not None:  # its frames and its place in the index, durable before returning
            with self._push_lock:
                fresh.save(self.checkpoint_dir / "streams" / _stream_dir(stream_id))
                self._write_index()

    def streams(self) -> list[str]:
        with self._table_lock:
            return list(self._memories)

    def _mark_dirty(self, stream_id: str) -> None:
        with self._table_lock:
            if stream_id in self._memories:
                self._dirty.add(stream_id)

    def _memory(self, stream_id: str) -> StreamMemory:
        try:
            return self._memories[stream_id]
        except KeyError:
            raise ValueError(f"stream_id {stream_id!r} is not on this shard (add_stream first)") from None

    # ---- push ----------------------------------------------------------------------
    def push(self, items: Sequence[tuple]) -> dict[str, dict]:
        """Push frames of several streams at once.

        Parameters
        ----------
        items : sequence of (stream_id, seq, timestamps, frames)
            ``seq``: stream position of the first frame (None: right after the
            last one); ``timestamps``: (n,) seconds; ``frames``: (n, H, W, 3)
            uint8.  At most one item per stream.

        Returns
        -------
        dict stream_id -> {"frames_seen", "frames_missing", "kept", "duplicate"}
        """
        ensure_thread(self.num_threads)
        with self._push_lock:
            acks = self._push_locked(items)
            if self.checkpoint_dir is not None and self.checkpoint_every_s is not None \
                    and time.monotonic() - self._last_checkpoint_clock >= self.checkpoint_every_s:
                self._checkpoint_locked()
        return acks

    def _push_locked(self, items) -> dict[str, dict]:
        t0 = time.perf_counter()
        seen_ids = [item[0] for item in items]
        if len(set(seen_ids)) != len(seen_ids):
            raise ValueError("items must hold at most one push per stream")
        acks: dict[str, dict] = {}
        # Validate every item before touching any memory, so a bad item leaves the shard unchanged.
        checked = []
        for stream_id, seq, timestamps, frames in items:
            memory = self._memory(stream_id)
            frames = np.asarray(frames)
            if frames.ndim == 3:
                frames = frames[None]
            if frames.ndim != 4 or frames.shape[0] < 1 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
                raise ValueError(f"frames of stream {stream_id!r} must be uint8 (n, H, W, 3), got {frames.dtype} "
                                 f"{frames.shape}")
            times = np.asarray(timestamps, dtype=np.float64).reshape(-1)
            n = frames.shape[0]
            if seq is not None and int(seq) + n <= memory.frames_seen:  # a retried call: already formed
                self.counters["duplicate_pushes"] += 1
                acks[stream_id] = self._ack(memory, 0, duplicate=True)
                continue
            if seq is not None and int(seq) < memory.frames_seen:  # partly seen: keep the new tail
                cut = memory.frames_seen - int(seq)
                frames, times, seq = frames[cut:], times[cut:], memory.frames_seen
            checked.append((stream_id, memory, seq, memory._check_push(times, frames.shape[0]), frames))
        plans = []  # (stream_id, memory, times of kept frames, indices of kept frames, kept frames, last time)
        for stream_id, memory, seq, times, frames in checked:
            indices, kept = memory.select(frames, first_index=seq)
            rows = [i for i, k in enumerate(kept) if k]
            plans.append((stream_id, memory, [times[i] for i in rows], [indices[i] for i in rows], frames[rows],
                          times[-1]))
            self.counters["frames_pushed"] += frames.shape[0]
        t1 = time.perf_counter()
        encoded = self._encode_all([p[4] for p in plans])
        t2 = time.perf_counter()
        records = [StreamMemory.records(idx, ts, enc) for (_, _, ts, idx, _, _), enc in zip(plans, encoded)]
        self._form_all([(p[0], p[1]) for p in plans], records)
        for (stream_id, memory, _, _, _, last_time), recs in zip(plans, records):
            memory._advance(last_time)
            acks[stream_id] = self._ack(memory, len(recs))
            self._mark_dirty(stream_id)
        t3 = time.perf_counter()
        self.counters["pushes"] += 1
        self.counters["stream_pushes"] += len(plans)
        self.timings["gate"] += t1 - t0
        self.timings["encode"] += t2 - t1
        self.timings["form"] += t3 - t2
        return acks

    @staticmethod
    def _ack(memory: StreamMemory, kept: int, duplicate: bool = False) -> dict:
        return {"frames_seen": memory.frames_seen, "frames_missing": memory.frames_missing, "kept": kept,
                "duplicate": duplicate}

    def _encode_all(self, frame_sets: list[np.ndarray]) -> list[EncodedFrames]:
        """One encoder call per frame size over every stream's kept frames."""
        if self.frame_encoder is None and any(len(f) for f in frame_sets):
            raise ValueError("this shard has no frame_encoder")
        by_shape: dict[tuple, list[int]] = {}
        for i, frames in enumerate(frame_sets):
            if len(frames):
                by_shape.setdefault(tuple(frames.shape[1:]), []).append(i)
        out: list[EncodedFrames | None] = [EncodedFrames(torch.zeros(0, 1), []) for _ in frame_sets]
        for members in by_shape.values():
            stacked = np.concatenate([frame_sets[i] for i in members])
            enc = encode_frames(self.frame_encoder, stacked)
            self.counters["encoder_calls"] += 1
            start = 0
            for i in members:
                n = len(frame_sets[i])
                out[i] = EncodedFrames(enc.features[start:start + n],
                                       list(enc.labels[start:start + n]) if enc.labels else [])
                start += n
        return out

    def _form_all(self, streams: list[tuple[str, StreamMemory]], records: list[list]) -> None:
        """Round j forms the j-th kept frame of every stream that has one; one segmenter call per round."""
        rounds = max((len(r) for r in records), default=0)
        for j in range(rounds):
            active = [(sid, mem, recs[j]) for (sid, mem), recs in zip(streams, records) if j < len(recs)]
            features = torch.stack([rec.feature.float() for _, _, rec in active])
            t0 = time.perf_counter()
            closed = StreamingSegmenter.push_many([mem.events.segmenter for _, mem, _ in active], features)
            self.timings["segment"] += time.perf_counter() - t0
            self.counters["segmenter_calls"] += 1
            for (sid, mem, rec), events in zip(active, closed):
                with self._locks[sid]:
                    mem.form(rec, closed=events)

    def finish(self, stream_id: str) -> None:
        """End of a stream: close its partial chunk and open event."""
        with self._push_lock:
            memory = self._memory(stream_id)
            with self._locks[stream_id]:
                memory.finish()
            self._mark_dirty(stream_id)

    # ---- questions --------------------------------------------------------------------
    def ask(self, stream_id: str, question: str) -> Context:
        """A stream's context for a question (answered with ``answer_fn`` if the shard has one and the memory's
        outcome is answered; ``NOT_IN_MEMORY_ANSWER`` otherwise)."""
        ensure_thread(self.num_threads)
        memory = self._memory(stream_id)
        t0 = time.perf_counter()
        q = memory.encode_question(question)
        timings = {"question_encode": time.perf_counter() - t0}
        with self._locks[stream_id]:
            ctx = memory.retrieve(question, q, submitted=t0, timings=timings)
        if self.answer_fn is not None:  # asked only when the memory answers, as StreamMemory.ask does
            answer = self.answer_fn(ctx) if ctx.outcome == Outcome.ANSWERED else NOT_IN_MEMORY_ANSWER
            embedding = memory.dialogue.embed(question, answer)
            with self._locks[stream_id]:
                memory.record_answer(ctx, answer, embedding=embedding)
        self._mark_dirty(stream_id)
        self.counters["questions"] += 1
        return ctx

    def search(self, question: str, k: int = 5) -> list[SearchHit]:
        """Top-k tree nodes and events of all streams for a question: one ``cosine_topk`` over all of them.

        Read-only (access statistics are not touched).  Ties keep stream order.
        """
        ensure_thread(self.num_threads)
        if isinstance(k, bool) or int(k) != k or k < 1:
            raise ValueError(f"k must be an int >= 1, got {k!r}")
        from streammem_kernels import cosine_topk

        if not isinstance(question, str) or not question.strip():
            raise ValueError("question must be a non-empty string")
        q = torch.nn.functional.normalize(encode_texts(self.text_encoder, [question])[0], dim=0)
        keys, meta = [], []
        for stream_id in self.streams():
            memory = self._memories.get(stream_id)
            if memory is None:
                continue
            with self._locks[stream_id]:
                for node in memory.long_term.nodes.values():
                    keys.append(node.embedding)
                    meta.append((stream_id, "node", node.node_id, node.level, node.t_start, node.t_end, node.caption))
                for e in memory.knowledge_base.entries:
                    keys.append(e.embedding)
                    meta.append((stream_id, "event", e.event_id, -1, e.t_start, e.t_end, e.caption))
        if not keys:
            return []
        res = cosine_topk(q[None], torch.stack(keys), min(int(k), len(keys)))
        return [SearchHit(round(float(s), 6), *meta[int(i)])
                for s, i in zip(res.scores[0].tolist(), res.ids[0].tolist()) if int(i) >= 0]

    def memory_state(self, stream_id: str) -> dict:
        """A stream's ``StreamMemory.state_dict()`` (for moving it, or checking it)."""
        with self._locks[stream_id]:
            return self._memory(stream_id).state_dict()

    def stats(self) -> dict:
        """Counters, seconds per stage, per-stream frame counts (seen, missing, formed) and thread settings."""
        per_stream = {}
        for stream_id in self.streams():
            m = self._memories.get(stream_id)
            if m is not None:
                per_stream[stream_id] = {"frames_seen": m.frames_seen, "frames_missing": m.frames_missing,
                                         "frames_formed": m.frames_formed, "nodes": len(m.long_term.nodes),
                                         "events": len(m.knowledge_base)}
        return {"streams": per_stream, "counters": dict(self.counters),
                "seconds": {k: round(v, 4) for k, v in self.timings.items()},
                "restored_streams": self.restored_streams, "last_checkpoint": self.last_checkpoint,
                "model_load_s": round(self.model_load_s, 4), "restore_s": round(self.restore_s, 4),
                "checkpoint_seconds": list(self.checkpoint_seconds[-20:]), "threads": thread_settings(),
                "process_cpu_s": time.process_time()}

    # ---- checkpoints -------------------------------------------------------------------
    def checkpoint(self) -> dict:
        """Save every stream changed since the last checkpoint, then the shard index; returns what it did."""
        if self.checkpoint_dir is None:
            raise ValueError("this shard has no checkpoint_dir")
        with self._push_lock:
            return self._checkpoint_locked()

    def _checkpoint_locked(self) -> dict:
        t0 = time.perf_counter()
        saved = []
        with self._table_lock:
            dirty, self._dirty = sorted(self._dirty), set()
        for stream_id in dirty:
            memory = self._memories.get(stream_id)
            if memory is None:
                continue
            with self._locks[stream_id]:
                memory.save(self.checkpoint_dir / "streams" / _stream_dir(stream_id))
            saved.append(stream_id)
        self._write_index()
        seconds = time.perf_counter() - t0
        self.last_checkpoint = time.time()
        self._last_checkpoint_clock = time.monotonic()
        self.checkpoint_seconds.append(seconds)
        self.counters["checkpoints"] += 1
        return {"streams_saved": len(saved), "seconds": seconds}

    def _write_index(self) -> None:
        index = {"config": self.config.to_dict(), "streams": {sid: _stream_dir(sid) for sid in self.streams()},
                 "time": time.time()}
        ensure_folder(self.checkpoint_dir)
        save_json(self.checkpoint_dir / _INDEX, _INDEX_KIND, index)

    def _restore(self) -> None:
        path = self.checkpoint_dir / _INDEX
        if not path.is_file():
            return
        streams = _read_index(path, self.config)
        for stream_id, dirname in streams.items():
            stream_dir = inside(self.checkpoint_dir / "streams", dirname)
            if (stream_dir / "state.pt").is_file():
                memory = StreamMemory.load(stream_dir, self.frame_encoder, self.text_encoder,
                                           captioner=self.captioner, answer_fn=self.answer_fn,
                                           instantaneity=self._instantaneity)
            else:  # added but never checkpointed: it starts empty, its frames count as missing
                memory = self._new_memory()
            self._memories[stream_id] = memory
            self._locks[stream_id] = threading.Lock()
            self.restored_streams += 1


def _read_index(path: Path, config: MemoryConfig) -> dict[str, str]:
    """The streams (id -> folder name) of the shard index ``path``, checked: an index of this kind and
    version with its checksum (``checkpoint.load_json``), the shard's config, stream ids non-empty
    strings, folder names strings that stay inside the ``streams`` folder (``checkpoint.inside``);
    otherwise one ``ValueError`` naming ``path``."""
    index, _ = load_json(path, _INDEX_KIND)
    try:
        saved = MemoryConfig.from_dict(index.get("config"))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: field 'config' is not a MemoryConfig ({exc})") from None
    if saved != config:
        raise ValueError(f"{path}: the checkpoint folder holds a shard with another config")
    streams = index.get("streams")
    if not isinstance(streams, dict):
        raise ValueError(f"{path}: field 'streams' must map stream ids to folder names")
    folder = path.parent / "streams"
    for stream_id, dirname in streams.items():
        if not stream_id or not isinstance(dirname, str):
            raise ValueError(f"{path}: field 'streams' entry {stream_id!r:.60} must name a folder")
        try:
            inside(folder, dirname)
        except ValueError as exc:
            raise ValueError(f"{path}: field 'streams' entry {stream_id!r:.60}: {exc}") from None
    return streams


def _rss_mb() -> float | None:
    try:
        import psutil
    except ImportError:
        return None
    return round(psutil.Process().memory_info().rss / 2**20, 1)


def stream_shard_class():
    """The ``StreamShard`` Ray actor class (built on first use; needs Ray)."""
    global _STREAM_SHARD
    if _STREAM_SHARD is not None:
        return _STREAM_SHARD
    from ._ray import require_ray

    ray = require_ray()

    @ray.remote(concurrency_groups={"push": 1, "ask": 2})
    class StreamShard:
        """``ShardMemory`` in a Ray actor.

        Pushes, stream changes and checkpoints run in the ``push`` group (one at
        a time); questions, searches and statistics in the ``ask`` group (two
        threads), so a question never queues behind a push.  Create it with
        ``.options(max_restarts=..., max_task_retries=..., num_cpus=...)``: on a
        restart the constructor restores the last checkpoint.
        """

        def __init__(self, config: dict, frame_encoder, text_encoder, checkpoint_dir=None,
                     checkpoint_every_s=None, num_threads: int = 1, answer_fn=None):
            self.core = ShardMemory(MemoryConfig.from_dict(config), frame_encoder, text_encoder,
                                    checkpoint_dir=checkpoint_dir, checkpoint_every_s=checkpoint_every_s,
                                    num_threads=num_threads, answer_fn=answer_fn)

        @ray.method(concurrency_group="push")
        def push(self, items):
            return self.core.push(items)

        @ray.method(concurrency_group="push")
        def add_stream(self, stream_id):
            return self.core.add_stream(stream_id)

        @ray.method(concurrency_group="push")
        def remove_stream(self, stream_id):
            return self.core.remove_stream(stream_id).state_dict()

        @ray.method(concurrency_group="push")
        def finish(self, stream_id):
            return self.core.finish(stream_id)

        @ray.method(concurrency_group="push")
        def checkpoint(self):
            return self.core.checkpoint()

        @ray.method(concurrency_group="ask")
        def ask(self, stream_id, question):
            return self.core.ask(stream_id, question)

        @ray.method(concurrency_group="ask")
        def search(self, question, k):
            return self.core.search(question, k)

        @ray.method(concurrency_group="ask")
        def streams(self):
            return self.core.streams()

        @ray.method(concurrency_group="ask")
        def memory_state(self, stream_id):
            return self.core.memory_state(stream_id)

        @ray.method(concurrency_group="ask")
        def stats(self):
            import os
            import warnings

            out = self.core.stats()
            with warnings.catch_warnings():  # the property reads a deprecated field inside Ray 2.60
                warnings.simplefilter("ignore")
                restarted = bool(ray.get_runtime_context().was_current_actor_reconstructed)
            out.update(pid=os.getpid(), restarted=restarted, rss_mb=_rss_mb())
            return out

    _STREAM_SHARD = StreamShard
    return StreamShard


_STREAM_SHARD = None
