"""``StreamPipeline``: StreamChat's three-thread scheduling (sec. 3.2) over one ``StreamMemory``.

Threads, joined by bounded queues (a full queue blocks its producer, so a slow
consumer slows the producer down and no selected frame is ever dropped):

1. frame stacking: decode, motion gate, encode the kept frames, fill the
   vision queue (``StreamMemory.select`` / ``encode``);
2. memory formation: short-term memory, long-term memory tree, event
   segmentation and knowledge base, bounded-memory upkeep
   (``StreamMemory.form``); it also releases questions scheduled at a stream
   time (see below);
3. contextual summarisation: answers questions from the memory
   (``StreamMemory.retrieve``; the question and the dialogue entry are
   embedded outside the memory lock).

Stream time is the source's own timestamps, whatever frames the gate drops.
A question scheduled at stream time T is answered from the memory of exactly
the frames with timestamp <= T: it is released when the first frame after T
(kept or dropped) reaches memory formation, which then waits until the
question's context is retrieved before it forms that frame; questions after
the last frame are answered after the end of the stream (``finish``).  The
context's ``stream_time`` is the last frame at or before T.  A question
scheduled at a time the stream has already passed is answered from the memory
as it is when the next frame arrives.

The memory itself is single-threaded; this class only schedules it.  A failure
in any thread stops the pipeline; ``wait()`` (and every pending question)
raises it.  ``close()`` returns within a second whatever the threads are
doing: every blocking queue operation polls a stop flag.  After ``wait()`` the
memory can be checkpointed with ``pipe.memory.save(dir)``.
"""
from __future__ import annotations

import heapq
import itertools
import queue
import threading
import time
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

from .config import BoundedConfig, MemoryConfig, SegmenterConfig, ShortTermConfig
from .core import Context, StreamMemory
from .gate import PRESETS, Preset

__all__ = ["StreamPipeline", "QueryResult", "PipelineStopped", "GateBatch", "config_from_keywords"]

QueryResult = Context  # the name before StreamMemory existed

_END = object()
_POLL_S = 0.05


class PipelineStopped(RuntimeError):
    """Raised for questions that cannot be answered because the pipeline was closed."""


@dataclass
class GateBatch:
    """One motion-gate call, as ``gate_hook`` sees it: every decoded frame, kept or not.

    ``frames`` is the (n, H, W, 3) uint8 batch itself (do not modify it);
    ``scores`` the gate's motion score per frame (1.0 for the stream's first
    frame, kept by definition).
    """

    indices: list[int]
    timestamps: list[float]
    scores: list[float]
    kept: list[bool]
    frames: np.ndarray


@dataclass
class _Dropped:
    """Vision-queue marker: timestamps of frames the gate dropped (they advance stream time)."""

    timestamps: list[float]


def config_from_keywords(*, preset: str | Preset = "base", budget: int | None = None,
                         bounded_kwargs: dict | None = None, segmenter_kwargs: dict | None = None,
                         motion_size: int | None = 224, short_term: tuple = (20, 5, 5.0), dialogue_k: int = 3,
                         seed: int = 0, backend: str = "auto") -> MemoryConfig:
    """The ``MemoryConfig`` of ``StreamPipeline``'s keyword arguments from before ``MemoryConfig`` existed."""
    if isinstance(preset, str):
        if preset not in PRESETS:
            raise ValueError(f"preset must be one of {sorted(PRESETS)} or a Preset, got {preset!r}")
        preset = PRESETS[preset]
    if bounded_kwargs and budget is None:
        raise ValueError("bounded_kwargs needs a budget")
    bounded = None if budget is None else BoundedConfig(budget, **(bounded_kwargs or {}))
    return MemoryConfig(preset=preset, motion_size=motion_size, short_term=ShortTermConfig(*short_term),
                        segmenter=SegmenterConfig(**(segmenter_kwargs or {})), bounded=bounded,
                        dialogue_k=dialogue_k, seed=seed, backend=backend)


_KEYWORDS = ("preset", "budget", "bounded_kwargs", "segmenter_kwargs", "motion_size", "short_term", "dialogue_k",
             "seed", "backend")


class StreamPipeline:
    """Streaming memory over a source of ``(timestamp, frame)`` pairs, in three threads.

    Parameters
    ----------
    source : iterable of (float, (H, W, 3) uint8 RGB array)
        For example a ``VideoSource``.
    frame_encoder : FrameEncoder
    text_encoder : TextEncoder
    config : MemoryConfig, optional
        What the memory remembers (default ``MemoryConfig()``: StreamChat Base).
    memory : StreamMemory, optional
        Drive an existing memory (for example one restored with
        ``StreamMemory.load``) instead of building one; then pass neither
        encoders, config nor hooks.
    captioner, event_captioner, answer_fn, instantaneity
        As for ``StreamMemory``.
    frame_hook : callable(FrameRecord), optional
        Called by the memory-formation thread for every frame it receives.
    gate_hook : callable(GateBatch), optional
        Called by the frame-stacking thread after every motion-gate call, with
        every decoded frame's time, score and decision (and the pixels).
    gate_batch : int
        Frames per motion-gate / encoder call.
    queue_size : int
        Capacity of the vision and question queues.
    preset, budget, bounded_kwargs, segmenter_kwargs, motion_size, short_term, dialogue_k, seed, backend
        The keywords of the pipeline before ``MemoryConfig``; still accepted
        instead of ``config`` (``config_from_keywords``).
    """

    def __init__(self, source: Iterable, frame_encoder=None, text_encoder=None, *, config: MemoryConfig | None = None,
                 memory: StreamMemory | None = None, captioner=None, event_captioner=None,
                 answer_fn: Callable | None = None, instantaneity: Callable | None = None,
                 frame_hook: Callable | None = None, gate_hook: Callable | None = None, gate_batch: int = 8,
                 queue_size: int = 32, **keywords):
        unknown = sorted(set(keywords) - set(_KEYWORDS))
        if unknown:
            raise TypeError(f"StreamPipeline got unexpected keyword arguments {unknown}")
        if isinstance(gate_batch, bool) or int(gate_batch) != gate_batch or gate_batch < 1:
            raise ValueError(f"gate_batch must be an int >= 1, got {gate_batch!r}")
        if isinstance(queue_size, bool) or int(queue_size) != queue_size or queue_size < 1:
            raise ValueError(f"queue_size must be an int >= 1, got {queue_size!r}")
        if memory is not None:
            given = [n for n, v in (("frame_encoder", frame_encoder), ("text_encoder", text_encoder),
                                    ("config", config), ("captioner", captioner),
                                    ("event_captioner", event_captioner), ("instantaneity", instantaneity))
                     if v is not None] + sorted(keywords)
            if given:
                raise ValueError(f"memory= already holds its encoders, config and hooks; do not also pass {given}")
            if memory.frame_encoder is None:
                raise ValueError("memory has no frame_encoder; the pipeline encodes frames")
        else:
            if config is not None and keywords:
                raise ValueError(f"give either config or the keywords {sorted(keywords)}, not both")
            if config is None:
                config = config_from_keywords(**keywords)
            if frame_encoder is None:
                raise ValueError("frame_encoder is required (e.g. streammem.load_frame_encoder())")
            memory = StreamMemory(config, frame_encoder, text_encoder, captioner=captioner,
                                  event_captioner=event_captioner, answer_fn=answer_fn, instantaneity=instantaneity)
        self.memory = memory
        self.source = source
        self.gate_batch = int(gate_batch)
        self.answer_fn = answer_fn if answer_fn is not None else memory.answer_fn
        self.frame_hook = frame_hook
        self.gate_hook = gate_hook

        self._vision_q: queue.Queue = queue.Queue(maxsize=int(queue_size))
        self._query_q: queue.Queue = queue.Queue(maxsize=int(queue_size))
        self.queue_size = int(queue_size)
        self.max_vision_depth = 0
        self.max_query_depth = 0
        self._stop = threading.Event()
        self._stream_done = threading.Event()
        self._memory_lock = threading.Lock()
        self._schedule_lock = threading.Lock()
        self._scheduled: list = []  # heap of (stream_time, seq, question, future)
        self._seq = itertools.count()
        self._error: BaseException | None = None
        self._error_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._started = False
        self.frames_decoded = 0
        self.frames_kept = 0
        self.frames_formed = 0
        self.stream_time: float | None = None
        self.timings: Counter = Counter()  # seconds the pipeline itself spends (decoding)
        self.results: list[Context] = []
        self._t_start = None
        self._t_stream_end = None

    # ---- the memory's parts, for convenience --------------------------
    config = property(lambda self: self.memory.config)
    preset = property(lambda self: self.memory.preset)
    frame_encoder = property(lambda self: self.memory.frame_encoder)
    text_encoder = property(lambda self: self.memory.text_encoder)
    gate = property(lambda self: self.memory.gate)
    short_term = property(lambda self: self.memory.short_term)
    long_term = property(lambda self: self.memory.long_term)
    bounded = property(lambda self: self.memory.bounded)
    events = property(lambda self: self.memory.events)
    knowledge_base = property(lambda self: self.memory.knowledge_base)
    injector = property(lambda self: self.memory.injector)
    dialogue = property(lambda self: self.memory.dialogue)

    # ---- lifecycle -----------------------------------------------------
    def start(self) -> "StreamPipeline":
        if self._started:
            raise RuntimeError("pipeline already started")
        self._started = True
        self._t_start = time.perf_counter()
        for name, fn in (("frame-stacking", self._frame_stacking), ("memory-formation", self._memory_formation),
                         ("contextual-summarisation", self._summarisation)):
            th = threading.Thread(target=self._guard, args=(fn,), name=f"streammem-{name}", daemon=True)
            self._threads.append(th)
            th.start()
        return self

    def __enter__(self) -> "StreamPipeline":
        return self.start() if not self._started else self

    def __exit__(self, *exc) -> None:
        self.close()

    def wait(self, timeout: float | None = None) -> None:
        """Wait until the stream has been fully formed into memory; raises a thread's failure."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._stream_done.is_set():
            self._raise_if_failed()
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError("stream not finished within the timeout")
            self._stream_done.wait(_POLL_S)
        self._raise_if_failed()

    def close(self) -> None:
        """Stop every thread; returns within about a second (threads are daemons)."""
        self._stop.set()
        deadline = time.monotonic() + 0.9
        for th in self._threads:
            th.join(max(0.0, deadline - time.monotonic()))
        self._fail_pending(PipelineStopped("pipeline closed before the question was answered"))

    @property
    def running(self) -> bool:
        return any(th.is_alive() for th in self._threads)

    @property
    def error(self) -> BaseException | None:
        return self._error

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def _guard(self, fn) -> None:
        try:
            fn()
        except BaseException as exc:  # every failure stops the pipeline and reaches the caller
            with self._error_lock:
                if self._error is None:
                    self._error = exc
            self._stop.set()
            self._fail_pending(exc)

    def _fail_pending(self, exc: BaseException) -> None:
        with self._schedule_lock:
            pending, self._scheduled = self._scheduled, []
        futures = [f for *_, f in pending]
        while True:
            try:
                item = self._query_q.get_nowait()
            except queue.Empty:
                break
            if item is not _END:
                futures.append(item[1])
                item[3].set()
        for fut in futures:
            if not fut.done():
                fut.set_exception(exc)

    def _put(self, q: queue.Queue, item) -> bool:
        """Blocking put that polls the stop flag; False when stopped."""
        while not self._stop.is_set():
            try:
                q.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _get(self, q: queue.Queue):
        while not self._stop.is_set():
            try:
                return q.get(timeout=_POLL_S)
            except queue.Empty:
                continue
        return _END

    # ---- questions -----------------------------------------------------
    def submit(self, question: str, at: float | None = None) -> Future:
        """Queue a question; with ``at``, it is released when the stream reaches ``at`` seconds
        (or ends).  Returns a Future of the ``Context``."""
        if not isinstance(question, str) or not question.strip():
            raise ValueError("question must be a non-empty string")
        self._raise_if_failed()
        if self._stop.is_set():
            raise PipelineStopped("pipeline is closed")
        fut: Future = Future()
        if at is None:
            self._release(question, fut)
        else:
            with self._schedule_lock:
                heapq.heappush(self._scheduled, (float(at), next(self._seq), question, fut))
            if self._stream_done.is_set():
                self._release_due(float("inf"))
        return fut

    def ask(self, question: str, timeout: float | None = None) -> Context:
        """Submit now and wait for the context (and answer)."""
        return self.submit(question).result(timeout)

    def _release(self, question: str, fut: Future) -> threading.Event:
        """Queue a question for thread 3; the returned event is set once its context is retrieved."""
        retrieved = threading.Event()
        item = (question, fut, time.perf_counter(), retrieved)
        if not self._put(self._query_q, item):
            fut.set_exception(self._error or PipelineStopped("pipeline is closed"))
            retrieved.set()
        self.max_query_depth = max(self.max_query_depth, self._query_q.qsize())
        return retrieved

    def _release_due(self, stream_time: float, *, before: bool = False) -> list[threading.Event]:
        """Release the questions scheduled at or before ``stream_time`` (strictly before with ``before``)."""
        due = []
        with self._schedule_lock:
            while self._scheduled and (self._scheduled[0][0] < stream_time if before
                                       else self._scheduled[0][0] <= stream_time):
                due.append(heapq.heappop(self._scheduled))
        return [self._release(question, fut) for _, _, question, fut in due]

    def _answer_due_before(self, timestamp: float) -> bool:
        """Before a frame at ``timestamp`` enters memory: questions scheduled before it get their
        context from the memory as it is now.  False when the pipeline stopped meanwhile."""
        for retrieved in self._release_due(timestamp, before=True):
            while not retrieved.wait(_POLL_S):
                if self._stop.is_set():
                    return False
        return True

    # ---- thread 1: frame stacking -------------------------------------
    def _frame_stacking(self) -> None:
        batch: list[tuple[int, float, np.ndarray]] = []
        source = iter(self.source)
        while not self._stop.is_set():
            t0 = time.perf_counter()
            try:
                ts, frame = next(source)
            except StopIteration:
                break
            self.timings["decode"] += time.perf_counter() - t0
            batch.append((self.frames_decoded, float(ts), frame))
            self.frames_decoded += 1
            if len(batch) == self.gate_batch and not self._stack(batch):
                return
        if batch and not self._stack(batch):
            return
        self._put(self._vision_q, _END)

    def _stack(self, batch: list) -> bool:
        frames = np.stack([f for _, _, f in batch])
        times = [ts for _, ts, _ in batch]
        batch.clear()
        indices, kept, scores = self.memory.select(frames, return_scores=True)
        if self.gate_hook is not None:
            self.gate_hook(GateBatch(indices, times, scores, kept, frames))
        keep = [i for i, k in enumerate(kept) if k]
        records = iter(self.memory.records([indices[i] for i in keep], [times[i] for i in keep],
                                           self.memory.encode(frames[keep]))) if keep else iter(())
        # Frames in stream order: each kept frame's record, and each run of dropped frames as one marker.
        dropped: list[float] = []
        for t, k in zip(times, kept):
            if not k:
                dropped.append(t)
                continue
            if dropped and not self._put(self._vision_q, _Dropped(dropped)):
                return False
            dropped = []
            if not self._put(self._vision_q, next(records)):
                return False
            self.frames_kept += 1
            self.max_vision_depth = max(self.max_vision_depth, self._vision_q.qsize())
        return not dropped or self._put(self._vision_q, _Dropped(dropped))

    # ---- thread 2: memory formation -----------------------------------
    def _memory_formation(self) -> None:
        while True:
            item = self._get(self._vision_q)
            if item is _END:
                if self._stop.is_set():
                    return
                break
            if isinstance(item, _Dropped):
                for t in item.timestamps:
                    if not self._answer_due_before(t):
                        return
                    with self._memory_lock:
                        self.memory.advance(t)
                    self.stream_time = t
                continue
            record = item
            if not self._answer_due_before(record.timestamp):
                return
            if self.frame_hook is not None:
                self.frame_hook(record)
            with self._memory_lock:
                self.memory.form(record)
            self.stream_time = record.timestamp
            self.frames_formed += 1
        with self._memory_lock:
            self.memory.finish()
        self._t_stream_end = time.perf_counter()
        self._stream_done.set()
        self._release_due(float("inf"))

    # ---- thread 3: contextual summarisation ---------------------------
    def _summarisation(self) -> None:
        while True:
            item = self._get(self._query_q)
            if item is _END:
                return
            question, fut, submitted, retrieved = item
            try:
                if fut.set_running_or_notify_cancel():
                    result = self._answer(question, submitted, retrieved)
                    self.results.append(result)
                    fut.set_result(result)
            finally:
                retrieved.set()

    def _answer(self, question: str, submitted: float, retrieved: threading.Event) -> Context:
        t0 = time.perf_counter()
        q = self.memory.encode_question(question)
        timings = {"question_encode": time.perf_counter() - t0}
        with self._memory_lock:
            result = self.memory.retrieve(question, q, submitted=submitted, timings=timings)
        retrieved.set()  # memory formation may go on; the answer is the summarisation thread's own work
        if self.answer_fn is not None:
            t1 = time.perf_counter()
            answer = self.answer_fn(result)
            result.answer_s = time.perf_counter() - t1
            embedding = self.memory.dialogue.embed(question, answer)  # the slow part, outside the lock
            with self._memory_lock:
                self.memory.record_answer(result, answer, embedding=embedding)
        return result

    # ---- reporting -----------------------------------------------------
    def summary(self) -> dict:
        """The memory's summary plus this run's frame counts, wall time, processed FPS and queue depths."""
        elapsed = None
        if self._t_start is not None:
            end = self._t_stream_end if self._t_stream_end is not None else time.perf_counter()
            elapsed = end - self._t_start
        with self._memory_lock:
            out = self.memory.summary()
        components = Counter(out["component_seconds"])
        components.update({k: round(v, 4) for k, v in self.timings.items()})
        out.update({
            "frames_decoded": self.frames_decoded,
            "frames_kept": self.frames_kept,
            "frames_formed": self.frames_formed,
            "seconds": None if elapsed is None else round(elapsed, 3),
            "processed_fps": None if not elapsed else round(self.frames_decoded / elapsed, 2),
            "max_vision_queue": self.max_vision_depth,
            "max_query_queue": self.max_query_depth,
            "component_seconds": dict(sorted(components.items())),
        })
        return out

    def run(self, queries: Iterable[tuple[float | None, str]] = ()) -> list[Context]:
        """Start, ask ``queries`` ((stream_time or None, question)), finish the stream, close.

        Returns the results in the order of ``queries``; raises any thread's failure.
        """
        if not self._started:
            self.start()
        try:
            futures = [self.submit(q, at) for at, q in queries]
            self.wait()
            return [f.result() for f in futures]
        finally:
            self.close()
