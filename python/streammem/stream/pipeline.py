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
   embedded outside the memory's lock).

Stream time is the source's own timestamps, whatever frames the gate drops.
A question scheduled at stream time T is answered from the memory of exactly
the frames with timestamp <= T: it is released when the first frame after T
(kept or dropped) reaches memory formation, which then waits until the
question's context is retrieved before it forms that frame; questions after
the last frame are answered after the end of the stream (``finish``).  The
context's ``stream_time`` is the last frame at or before T.  A question
scheduled at a time the stream has already passed is answered from the memory
as it is when the next frame arrives.

The memory does its own locking (``StreamMemory``'s thread-safety contract);
this class only schedules it.

Nothing waits forever, by construction:

* every ``Future`` that ``submit`` returns is resolved on every path: with its
  ``Context``; with the exception raised while answering it (``answer_fn``,
  the text encoder: that question fails, the stream goes on); with the
  failure that stopped the pipeline; or with ``PipelineStopped`` when the
  pipeline is closed first;
* stream times are checked where they enter: ``submit(at=...)`` and ``run``
  reject NaN and ``-inf`` (``ValueError`` naming the argument; ``+inf`` means
  after the end of the stream), and a source
  whose timestamps are not finite and non-decreasing stops the pipeline with
  a ``ValueError`` naming the frame;
* ``submit`` / ``ask`` / ``wait`` before ``start()`` raise ``RuntimeError``;
  after ``close()`` they raise ``PipelineStopped``; ``ask`` and ``wait`` from
  one of the pipeline's own threads (inside ``answer_fn`` or ``frame_hook``)
  raise ``RuntimeError`` instead of waiting for themselves;
* a failure in any thread stops the pipeline; ``wait()`` (and every pending
  question) raises it;
* ``close()`` returns within a second whatever the threads are doing: every
  blocking queue operation polls a stop flag, and the threads are daemons.
  A source blocked inside ``next()`` cannot be interrupted from Python; its
  thread stays blocked until ``next()`` returns, then exits without passing
  the frame on.  ``close()`` calls ``close()`` on the iterator the pipeline
  took from the source, if it has one: a generator's ``finally`` blocks run
  (when it is not blocked), and an iterator blocked on a socket or camera can
  implement ``close()`` to wake its read up.

After ``wait()`` (or ``close()``) the memory can be checkpointed with
``pipe.memory.save(dir)``; a checkpoint taken while the pipeline runs misses
the frames still in its queues.
"""
from __future__ import annotations

import heapq
import itertools
import math
import queue
import threading
import time
from collections import Counter
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

from ..checks import check_int, is_real
from ..components.answers import NOT_IN_MEMORY_ANSWER, Calibration, Outcome
from ..config import MemoryConfig
from .context import Context
from .memory import StreamMemory


__all__ = ["StreamPipeline", "PipelineStopped", "GateBatch"]

_END = object()
_POLL_S = 0.05
_CLOSE_S = 0.9
MAX_GATE_BATCH = 4096  # frames per gate / encoder call; one batch is held in memory


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


class StreamPipeline:
    """Streaming memory over a source of ``(timestamp, frame)`` pairs, in three threads.

    Parameters
    ----------
    source : iterable of (float, (H, W, 3) uint8 RGB array)
        For example a ``VideoSource``.  Timestamps (stream seconds) must be
        finite and non-decreasing, frames of one shape; each frame is copied
        when it arrives, so the source may reuse its buffer.
    frame_encoder : FrameEncoder
    text_encoder : TextEncoder
    config : MemoryConfig, optional
        What the memory remembers (default ``MemoryConfig()``: StreamChat Base).
    memory : StreamMemory, optional
        Drive an existing memory (for example one restored with
        ``StreamMemory.load``) instead of building one; then pass neither
        encoders, config nor hooks.
    captioner, event_captioner, answer_fn, instantaneity, calibration
        As for ``StreamMemory`` (``answer_fn`` is called only for a context whose
        outcome is answered; "not in memory" gets ``NOT_IN_MEMORY_ANSWER``).
    frame_hook : callable(FrameRecord), optional
        Called by the memory-formation thread for every frame it receives.
    gate_hook : callable(GateBatch), optional
        Called by the frame-stacking thread after every motion-gate call, with
        every decoded frame's time, score and decision (and the pixels).
    gate_batch : int in [1, 4096]
        Frames per motion-gate / encoder call.
    queue_size : int >= 1
        Capacity of the vision and question queues.

    Thread safety: ``submit``, ``ask``, ``wait``, ``summary``, ``close``,
    ``running`` and ``error`` may be called from any thread, concurrently
    with each other and with the pipeline's threads (``start`` once; ``close``
    any number of times).  ``pipe.memory`` is thread-safe too (see
    ``StreamMemory``), but frames pushed into it directly interleave with the
    source's.  The counters (``frames_decoded``, ``frames_kept``, ...) are each
    written by one thread and may be read anywhere.  The module docstring
    lists what can and cannot block.
    """

    def __init__(self, source: Iterable, frame_encoder=None, text_encoder=None, *, config: MemoryConfig | None = None,
                 memory: StreamMemory | None = None, captioner=None, event_captioner=None,
                 answer_fn: Callable | None = None, instantaneity: Callable | None = None,
                 calibration: Calibration | None = None, frame_hook: Callable | None = None,
                 gate_hook: Callable | None = None, gate_batch: int = 8, queue_size: int = 32):
        gate_batch = check_int(gate_batch, "gate_batch", 1, MAX_GATE_BATCH)
        queue_size = check_int(queue_size, "queue_size", 1)
        if frame_hook is not None and not callable(frame_hook):
            raise ValueError(f"frame_hook must be callable or None, got {frame_hook!r}")
        if gate_hook is not None and not callable(gate_hook):
            raise ValueError(f"gate_hook must be callable or None, got {gate_hook!r}")
        if answer_fn is not None and not callable(answer_fn):
            raise ValueError(f"answer_fn must be callable or None, got {answer_fn!r}")
        if not hasattr(source, "__iter__") and not hasattr(source, "__next__"):
            raise ValueError(f"source must be an iterable of (timestamp, frame) pairs, got {type(source).__name__}")
        if memory is not None:
            given = [n for n, v in (("frame_encoder", frame_encoder), ("text_encoder", text_encoder),
                                    ("config", config), ("captioner", captioner),
                                    ("event_captioner", event_captioner), ("instantaneity", instantaneity),
                                    ("calibration", calibration))
                     if v is not None]
            if given:
                raise ValueError(f"memory= already holds its encoders, config and hooks; do not also pass {given}")
            if memory.frame_encoder is None:
                raise ValueError("memory has no frame_encoder; the pipeline encodes frames")
        else:
            if config is None:
                config = MemoryConfig()
            if frame_encoder is None:
                raise ValueError("frame_encoder is required (e.g. streammem.load_frame_encoder())")
            memory = StreamMemory(config, frame_encoder, text_encoder, captioner=captioner,
                                  event_captioner=event_captioner, answer_fn=answer_fn, instantaneity=instantaneity,
                                  calibration=calibration)
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
        self._schedule_lock = threading.Lock()
        self._scheduled: list = []  # heap of (stream_time, seq, question, future)
        self._seq = itertools.count()
        self._error: BaseException | None = None
        self._error_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._summariser: threading.Thread | None = None
        self._iterator = None  # iter(source), taken by the frame-stacking thread
        self._started = False
        self.frames_decoded = 0
        self.frames_kept = 0
        self.frames_formed = 0
        self.questions_failed = 0  # questions whose answering raised (their futures hold the exception)
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
        """Start the three threads; a pipeline runs once (build a new one to run again)."""
        if self._started:
            raise RuntimeError("pipeline already started (a pipeline runs once; build a new one)")
        if self._stop.is_set():
            raise PipelineStopped("pipeline was closed before it started")
        self._started = True
        self._t_start = time.perf_counter()
        for name, fn in (("frame-stacking", self._frame_stacking), ("memory-formation", self._memory_formation),
                         ("contextual-summarisation", self._summarisation)):
            th = threading.Thread(target=self._guard, args=(fn,), name=f"streammem-{name}", daemon=True)
            self._threads.append(th)
        self._summariser = self._threads[2]
        for th in self._threads:
            th.start()
        return self

    def __enter__(self) -> "StreamPipeline":
        return self.start() if not self._started else self

    def __exit__(self, *exc) -> None:
        self.close()

    def wait(self, timeout: float | None = None) -> None:
        """Wait until the stream has been fully formed into memory.

        Raises a thread's failure; ``PipelineStopped`` when the pipeline was
        closed before the stream ended; ``TimeoutError`` after ``timeout``
        seconds; ``RuntimeError`` before ``start()`` or from the pipeline's
        own threads.
        """
        timeout = _check_timeout(timeout)
        self._require_started("wait")
        self._refuse_own_thread("wait")
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._stream_done.is_set():
            self._raise_if_failed()
            if self._stop.is_set():
                raise PipelineStopped("pipeline was closed before the stream ended")
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"stream not finished within {timeout} s")
            self._stream_done.wait(_POLL_S)
        self._raise_if_failed()

    def close(self) -> None:
        """Stop every thread and fail the questions not yet answered; returns within about a second.

        Safe to call from any thread, more than once.  A thread still busy
        after the deadline (a source blocked in ``next()``, a slow hook) is a
        daemon and ends on its own once that call returns; ``running`` tells.
        """
        self._stop.set()
        deadline = time.monotonic() + _CLOSE_S
        closer = self._close_iterator()  # first: it may wake a source blocked in next()
        me = threading.current_thread()
        for th in self._threads + ([closer] if closer is not None else []):
            if th is not me:
                th.join(max(0.0, deadline - time.monotonic()))
        self._fail_pending(PipelineStopped("pipeline closed before the question was answered"))

    def _close_iterator(self) -> threading.Thread | None:
        """``close()`` of the source's iterator, if it has one, in a daemon thread (it may block)."""
        close = getattr(self._iterator, "close", None)
        if not callable(close):
            return None

        def run():
            try:
                close()
            except Exception:  # a generator still executing ("generator already executing"), or the source's own
                pass

        th = threading.Thread(target=run, name="streammem-source-close", daemon=True)
        th.start()
        return th

    @property
    def running(self) -> bool:
        """Whether any of the pipeline's threads is still alive."""
        return any(th.is_alive() for th in self._threads)

    @property
    def error(self) -> BaseException | None:
        """The failure that stopped the pipeline, if any."""
        return self._error

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def _require_started(self, method: str) -> None:
        if not self._started:
            raise RuntimeError(f"StreamPipeline.{method}() before start(): call pipe.start(), use `with pipe:`, "
                               f"or pipe.run(queries)")

    def _refuse_own_thread(self, method: str, threads=None) -> None:
        if threading.current_thread() in (self._threads if threads is None else threads):
            raise RuntimeError(f"StreamPipeline.{method}() from the pipeline's own thread "
                               f"{threading.current_thread().name} would wait for itself (called from answer_fn "
                               f"or frame_hook?); use pipe.memory directly there")

    def _guard(self, fn) -> None:
        try:
            fn()
        except BaseException as exc:  # every failure stops the pipeline and reaches the caller
            with self._error_lock:
                if self._error is None:
                    self._error = exc
            self._stop.set()
            self._fail_pending(self._error)

    def _fail_pending(self, exc: BaseException) -> None:
        """Resolve every question not yet taken by the summarisation thread with ``exc``."""
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
            _resolve(fut, exc)

    def _settle_if_stopped(self) -> None:
        # A question enqueued while close() (or a failure) drained the queues: drain again, so it is resolved.
        if self._stop.is_set():
            self._fail_pending(self._error or PipelineStopped("pipeline closed before the question was answered"))

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
        """Queue a question; returns a ``Future`` of its ``Context``, always resolved (module docstring).

        Parameters
        ----------
        question : str
            Non-empty.
        at : float, optional
            Stream time in seconds: the question is answered from the memory
            of exactly the frames up to ``at`` (released when the first frame
            after ``at`` arrives; at the end of the stream at the latest).
            ``math.inf``: after the end of the stream.  None: now.  NaN and
            ``-inf`` raise ``ValueError``.
        """
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"question must be a non-empty string, got {question!r:.80}")
        at = _check_at(at)
        self._require_started("submit")
        self._refuse_own_thread("submit", [self._summariser])
        self._raise_if_failed()
        if self._stop.is_set():
            raise PipelineStopped("pipeline is closed")
        fut: Future = Future()
        if at is None:
            self._release(question, fut)
        else:
            with self._schedule_lock:
                heapq.heappush(self._scheduled, (at, next(self._seq), question, fut))
            if self._stream_done.is_set():
                self._release_due(math.inf)
        self._settle_if_stopped()
        return fut

    def ask(self, question: str, timeout: float | None = None) -> Context:
        """Submit now and wait for the context (and answer); raises what answering it raised."""
        timeout = _check_timeout(timeout)
        self._require_started("ask")
        self._refuse_own_thread("ask")
        return self.submit(question).result(timeout)

    def _release(self, question: str, fut: Future) -> threading.Event:
        """Queue a question for thread 3; the returned event is set once its context is retrieved."""
        retrieved = threading.Event()
        item = (question, fut, time.perf_counter(), retrieved)
        if not self._put(self._query_q, item):
            _resolve(fut, self._error or PipelineStopped("pipeline is closed"))
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
        it = self._iterator = iter(self.source)
        batch = None  # (gate_batch, H, W, 3) uint8: each frame is copied in as it arrives
        times: list[float] = []
        previous = -math.inf
        while not self._stop.is_set():
            t0 = time.perf_counter()
            try:
                item = next(it)
            except StopIteration:
                break
            except BaseException:
                if self._stop.is_set():  # closed meanwhile: what the source raises now is not a failure
                    return
                raise
            if self._stop.is_set():  # a frame that arrived after close() is not formed
                return
            self.timings["decode"] += time.perf_counter() - t0
            ts, frame = _check_source_item(item, self.frames_decoded, previous,
                                           None if batch is None else batch.shape[1:])
            if batch is None:
                batch = np.empty((self.gate_batch,) + frame.shape, np.uint8)
            batch[len(times)] = frame
            times.append(ts)
            previous = ts
            self.frames_decoded += 1
            if len(times) == self.gate_batch:
                if not self._stack(batch, times):
                    return
                batch, times = np.empty_like(batch), []
        if times and not self._stack(batch[:len(times)], times):
            return
        self._put(self._vision_q, _END)

    def _stack(self, frames: np.ndarray, times: list[float]) -> bool:
        if self._stop.is_set():
            return False
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
                    self.memory.advance(t)
                    self.stream_time = t
                continue
            record = item
            if not self._answer_due_before(record.timestamp):
                return
            if self.frame_hook is not None:
                self.frame_hook(record)
            self.memory.form(record)
            self.stream_time = record.timestamp
            self.frames_formed += 1
        self.memory.finish()
        self._t_stream_end = time.perf_counter()
        self._stream_done.set()
        self._release_due(math.inf)

    # ---- thread 3: contextual summarisation ---------------------------
    def _summarisation(self) -> None:
        while True:
            item = self._get(self._query_q)
            if item is _END:
                return
            question, fut, submitted, retrieved = item
            try:
                if not fut.set_running_or_notify_cancel():
                    continue  # cancelled by the caller
                try:
                    result = self._answer(question, submitted, retrieved)
                except Exception as exc:  # this question fails; the stream and the other questions go on
                    self.questions_failed += 1
                    _resolve(fut, exc)
                    continue
                except BaseException as exc:  # KeyboardInterrupt and the like stop the pipeline (_guard)
                    _resolve(fut, exc)
                    raise
                self.results.append(result)
                fut.set_result(result)
            finally:
                retrieved.set()  # memory formation waits for it (it is also set once the context is retrieved)

    def _answer(self, question: str, submitted: float, retrieved: threading.Event) -> Context:
        t0 = time.perf_counter()
        q = self.memory.encode_question(question)
        timings = {"question_encode": time.perf_counter() - t0}
        result = self.memory.retrieve(question, q, submitted=submitted, timings=timings)
        retrieved.set()  # memory formation may go on; the answer is the summarisation thread's own work
        if self.answer_fn is not None:
            t1 = time.perf_counter()
            # answer_fn is asked only when the memory answers (StreamMemory.answer_text's rule).
            answer = self.answer_fn(result) if result.outcome == Outcome.ANSWERED else NOT_IN_MEMORY_ANSWER
            result.answer_s = time.perf_counter() - t1
            if not isinstance(answer, str):
                raise TypeError(f"answer_fn must return a str, got {type(answer).__name__}")
            embedding = self.memory.dialogue.embed(question, answer)  # the slow part, outside the memory's lock
            self.memory.record_answer(result, answer, embedding=embedding)
        return result

    # ---- reporting -----------------------------------------------------
    def summary(self) -> dict:
        """The memory's summary plus this run's frame counts, wall time, processed FPS and queue depths.

        With a source that reports its decoding (``VideoSource.decode_report``),
        ``"source"`` holds its counts (frames declared, decoded, truncated).
        """
        elapsed = None
        if self._t_start is not None:
            end = self._t_stream_end if self._t_stream_end is not None else time.perf_counter()
            elapsed = end - self._t_start
        out = self.memory.summary()
        components = Counter(out["component_seconds"])
        components.update({k: round(v, 4) for k, v in self.timings.items()})
        out.update({
            "frames_decoded": self.frames_decoded,
            "frames_kept": self.frames_kept,
            "frames_formed": self.frames_formed,
            "questions_failed": self.questions_failed,
            "seconds": None if elapsed is None else round(elapsed, 3),
            "processed_fps": None if not elapsed else round(self.frames_decoded / elapsed, 2),
            "max_vision_queue": self.max_vision_depth,
            "max_query_queue": self.max_query_depth,
            "component_seconds": dict(sorted(components.items())),
        })
        report = getattr(self.source, "decode_report", None)
        if callable(getattr(report, "to_dict", None)):
            out["source"] = report.to_dict()
        return out

    def run(self, queries: Iterable[tuple[float | None, str]] = ()) -> list[Context]:
        """Start, ask ``queries`` ((stream_time or None, question)), finish the stream, close.

        Every query is checked before the pipeline starts (``ValueError``
        naming ``queries[i]``).  Returns the results in the order of
        ``queries``; raises any thread's failure, or the first question's.
        """
        checked = []
        for i, item in enumerate(queries):
            if not isinstance(item, (tuple, list)) or len(item) != 2:
                raise ValueError(f"queries[{i}] must be a (stream_time or None, question) pair, got {item!r:.80}")
            at, question = item
            if not isinstance(question, str) or not question.strip():
                raise ValueError(f"queries[{i}] question must be a non-empty string, got {question!r:.80}")
            checked.append((_check_at(at, f"queries[{i}][0]"), question))
        if not self._started:
            self.start()
        try:
            futures = [self.submit(q, at) for at, q in checked]
            self.wait()
            return [f.result() for f in futures]
        finally:
            self.close()


def _resolve(fut: Future, exc: BaseException) -> None:
    """Fail a future unless it is already resolved (another path may have won the race)."""
    try:
        if not fut.done():
            fut.set_exception(exc)
    except InvalidStateError:
        pass


def _check_at(at, name: str = "at") -> float | None:
    if at is None:
        return None
    # +inf is "after the last frame" (released once the stream ends); NaN compares false with every time
    # and would never be released, -inf precedes every frame: both are errors.
    if not is_real(at) or math.isnan(at) or at == -math.inf:
        raise ValueError(f"{name} must be a stream time in seconds (finite, or +inf for after the end of the "
                         f"stream; None for now), got {at!r}")
    return float(at)


def _check_timeout(timeout) -> float | None:
    if timeout is None:
        return None
    if not is_real(timeout) or math.isnan(timeout) or timeout < 0:
        raise ValueError(f"timeout must be None or a number of seconds >= 0, got {timeout!r}")
    return None if math.isinf(timeout) else float(timeout)


def _check_source_item(item, index: int, previous: float, shape: tuple | None) -> tuple[float, np.ndarray]:
    """One ``(timestamp, frame)`` of the source, checked: ValueError naming the frame otherwise."""
    if not isinstance(item, (tuple, list)) or len(item) != 2:
        raise ValueError(f"source must yield (timestamp, frame) pairs; item {index} is {type(item).__name__}")
    ts, frame = item
    if not is_real(ts) or not math.isfinite(ts):
        raise ValueError(f"source yielded timestamp {ts!r} for frame {index}; timestamps must be finite seconds")
    ts = float(ts)
    if ts < previous:
        raise ValueError(f"source yielded timestamp {ts} for frame {index} after {previous}; timestamps must not "
                         f"decrease")
    frame = np.asarray(frame)
    if frame.ndim != 3 or frame.shape[-1] != 3 or frame.dtype != np.uint8 or min(frame.shape) < 1:
        raise ValueError(f"source yielded frame {index} of {frame.dtype} {frame.shape}; frames must be uint8 RGB "
                         f"(H, W, 3)")
    if shape is not None and frame.shape != tuple(shape):
        raise ValueError(f"source yielded frame {index} of shape {frame.shape} after frames of shape {tuple(shape)}; "
                         f"the frame size must not change within a stream")
    return ts, frame
