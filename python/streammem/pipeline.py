"""``StreamPipeline``: StreamChat's three-thread scheduling (sec. 3.2) over the memories.

Threads, joined by bounded queues (a full queue blocks its producer, so a slow
consumer slows the producer down and no selected frame is ever dropped):

1. frame stacking: decode, motion gate, encode the kept frames, fill the
   vision queue;
2. memory formation: short-term memory, long-term memory tree, event
   segmentation and knowledge base, bounded-memory upkeep; it also releases
   questions scheduled at a stream time once the stream reaches that time;
3. contextual summarisation: answers questions from the memories.

A failure in any thread stops the pipeline; ``wait()`` (and every pending
question) raises it.  ``close()`` returns within a second whatever the threads
are doing: every blocking queue operation polls a stop flag.
"""
from __future__ import annotations

import heapq
import itertools
import queue
import threading
import time
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np
import torch
import torch.nn.functional as F

from .bounded import BoundedMemory
from .gate import PRESETS, MotionGate, Preset
from .knowledge import DialogueMemory, EventSegmenter, InstantaneityScorer, KnowledgeBase, KnowledgeInjector
from .memory import FrameRecord, LabelCaptioner, LongTermMemory, ShortTermMemory

__all__ = ["StreamPipeline", "QueryResult", "PipelineStopped"]

_END = object()
_POLL_S = 0.05


class PipelineStopped(RuntimeError):
    """Raised for questions that cannot be answered because the pipeline was closed."""


@dataclass
class QueryResult:
    """The assembled context for one question, its timings and optional answer.

    ``rpd_s`` is the request processing delay: from submission (or, for a
    question scheduled at a stream time, from its release at that time) until
    the context is ready; the answer hook's time is reported apart.
    """

    question: str
    stream_time: float | None
    short_term: list[dict]
    tree_path: list[dict]
    tree_best: dict | None
    tree_centres: list[torch.Tensor]
    dialogue: list[dict]
    knowledge: list[dict]
    injection: dict
    timings: dict
    rpd_s: float
    answer: str | None = None
    answer_s: float | None = None

    def to_dict(self) -> dict:
        """JSON-friendly view (centres summarised by their shapes)."""
        return {
            "question": self.question,
            "stream_time": self.stream_time,
            "short_term": self.short_term,
            "tree_path": self.tree_path,
            "tree_best": self.tree_best,
            "tree_centres": [list(c.shape) for c in self.tree_centres],
            "dialogue": self.dialogue,
            "knowledge": self.knowledge,
            "injection": self.injection,
            "timings_ms": {k: round(1e3 * v, 3) for k, v in self.timings.items()},
            "rpd_ms": round(1e3 * self.rpd_s, 3),
            "answer": self.answer,
        }


def _node_view(node, score: float | None = None) -> dict:
    view = {"node": node.node_id, "level": node.level, "t_start": round(node.t_start, 3),
            "t_end": round(node.t_end, 3), "caption": node.caption}
    if score is not None:
        view["score"] = round(score, 4)
    return view


class StreamPipeline:
    """Streaming memory over a source of ``(timestamp, frame)`` pairs.

    Parameters
    ----------
    source : iterable of (float, (H, W, 3) uint8 RGB array)
        For example a ``VideoSource``.
    frame_encoder : FrameEncoder
    text_encoder : TextEncoder
    preset : str or Preset
        StreamChat's (t, L, g, C): "slow", "base" (default) or "fast".
    captioner : Captioner, optional
        For tree leaves and parents (default ``LabelCaptioner``).
    event_captioner : Captioner, optional
        For knowledge-base events (default: the same captioner).
    answer_fn : callable(QueryResult) -> str, optional
        Turns a context into an answer; answers go to the dialogue memory.
    budget : int, optional
        Token budget of the long-term memory (``BoundedMemory``); None: unbounded.
    bounded_kwargs : dict, optional
        Extra ``BoundedMemory`` parameters.
    segmenter_kwargs : dict, optional
        Extra ``EventSegmenter`` parameters (window, tau, min_depth, max_event...).
    gate_batch : int
        Frames per motion-gate / encoder call.
    queue_size : int
        Capacity of the vision and question queues.
    motion_size : int
        Working resolution of the motion gate.
    short_term : (N, S, tau)
        Short-term memory parameters.
    dialogue_k, seed, backend
    frame_hook : callable(FrameRecord), optional
        Called by the memory-formation thread for every frame it receives.
    """

    def __init__(self, source: Iterable, frame_encoder, text_encoder, *, preset: str | Preset = "base",
                 captioner=None, event_captioner=None, answer_fn: Callable | None = None, budget: int | None = None,
                 bounded_kwargs: dict | None = None, segmenter_kwargs: dict | None = None, gate_batch: int = 8,
                 queue_size: int = 32, motion_size: int | None = 224, short_term: tuple = (20, 5, 5.0),
                 dialogue_k: int = 3, seed: int = 0, backend: str = "auto",
                 instantaneity: Callable | None = None, frame_hook: Callable | None = None):
        self.preset = PRESETS[preset] if isinstance(preset, str) else preset
        if isinstance(gate_batch, bool) or int(gate_batch) != gate_batch or gate_batch < 1:
            raise ValueError(f"gate_batch must be an int >= 1, got {gate_batch!r}")
        if isinstance(queue_size, bool) or int(queue_size) != queue_size or queue_size < 1:
            raise ValueError(f"queue_size must be an int >= 1, got {queue_size!r}")
        self.source = source
        self.frame_encoder = frame_encoder
        self.text_encoder = text_encoder
        self.gate = MotionGate(self.preset.threshold, size=motion_size, backend=backend)
        self.gate_batch = int(gate_batch)
        captioner = captioner if captioner is not None else LabelCaptioner()
        self.short_term = ShortTermMemory(*short_term, seed=seed)
        self.long_term = LongTermMemory(text_encoder, captioner, chunk=self.preset.chunk, group=self.preset.group,
                                        centres=self.preset.centres, seed=seed, backend=backend)
        self.bounded = None if budget is None else BoundedMemory(self.long_term, budget, **(bounded_kwargs or {}))
        self.events = EventSegmenter(text_encoder, event_captioner if event_captioner is not None else captioner,
                                     backend=backend, **(segmenter_kwargs or {}))
        self.knowledge_base = self.events.knowledge_base
        scorer = instantaneity if instantaneity is not None else InstantaneityScorer(text_encoder)
        self.injector = KnowledgeInjector(self.knowledge_base, scorer)
        self.dialogue = DialogueMemory(text_encoder)
        self.dialogue_k = int(dialogue_k)
        self.answer_fn = answer_fn
        self.frame_hook = frame_hook

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
        self.timings: Counter = Counter()  # seconds per component
        self.results: list[QueryResult] = []
        self._t_start = None
        self._t_stream_end = None

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
        (or ends).  Returns a Future of the ``QueryResult``."""
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

    def ask(self, question: str, timeout: float | None = None) -> QueryResult:
        """Submit now and wait for the context (and answer)."""
        return self.submit(question).result(timeout)

    def _release(self, question: str, fut: Future) -> None:
        item = (question, fut, time.perf_counter())
        if not self._put(self._query_q, item):
            fut.set_exception(self._error or PipelineStopped("pipeline is closed"))
        self.max_query_depth = max(self.max_query_depth, self._query_q.qsize())

    def _release_due(self, stream_time: float) -> None:
        due = []
        with self._schedule_lock:
            while self._scheduled and self._scheduled[0][0] <= stream_time:
                due.append(heapq.heappop(self._scheduled))
        for _, _, question, fut in due:
            self._release(question, fut)

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
        t0 = time.perf_counter()
        _, kept = self.gate.push(frames)
        self.timings["motion_gate"] += time.perf_counter() - t0
        keep = [i for i, k in enumerate(kept) if k]
        batch_items = list(batch)
        batch.clear()
        if not keep:
            return True
        t0 = time.perf_counter()
        encoded = self.frame_encoder.encode(frames[keep])
        self.timings["frame_encode"] += time.perf_counter() - t0
        labels = encoded.labels if encoded.labels else [()] * len(keep)
        for row, i in enumerate(keep):
            index, ts, _ = batch_items[i]
            record = FrameRecord(index, ts, encoded.features[row].float().clone(), tuple(labels[row]))
            if not self._put(self._vision_q, record):
                return False
            self.frames_kept += 1
            self.max_vision_depth = max(self.max_vision_depth, self._vision_q.qsize())
        return True

    # ---- thread 2: memory formation -----------------------------------
    def _memory_formation(self) -> None:
        while True:
            record = self._get(self._vision_q)
            if record is _END:
                if self._stop.is_set():
                    return
                break
            if self.frame_hook is not None:
                self.frame_hook(record)
            with self._memory_lock:
                self._form(record)
            self.stream_time = record.timestamp
            self.frames_formed += 1
            self._release_due(record.timestamp)
        with self._memory_lock:
            t0 = time.perf_counter()
            self.long_term.flush()
            self.timings["long_term"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            self.events.flush()
            self.timings["events"] += time.perf_counter() - t0
            if self.bounded is not None and self.stream_time is not None:
                self.bounded.enforce(self.stream_time)
        self._t_stream_end = time.perf_counter()
        self._stream_done.set()
        self._release_due(float("inf"))

    def _form(self, record: FrameRecord) -> None:
        t0 = time.perf_counter()
        self.short_term.add(record)
        t1 = time.perf_counter()
        created = self.long_term.add(record)
        t2 = time.perf_counter()
        self.events.push(record)
        t3 = time.perf_counter()
        if created and self.bounded is not None:
            self.bounded.enforce(record.timestamp)
        t4 = time.perf_counter()
        self.timings["short_term"] += t1 - t0
        self.timings["long_term"] += t2 - t1
        self.timings["events"] += t3 - t2
        self.timings["bounded"] += t4 - t3

    # ---- thread 3: contextual summarisation ---------------------------
    def _summarisation(self) -> None:
        while True:
            item = self._get(self._query_q)
            if item is _END:
                return
            question, fut, submitted = item
            if fut.set_running_or_notify_cancel():
                result = self._answer(question, submitted)
                self.results.append(result)
                fut.set_result(result)

    def _answer(self, question: str, submitted: float) -> QueryResult:
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        q = F.normalize(self.text_encoder.encode([question])[0].float(), dim=0)
        t1 = time.perf_counter()
        timings["question_encode"] = t1 - t0
        with self._memory_lock:
            now = self.stream_time
            short = [{"frame": r.index, "t": round(r.timestamp, 3), "labels": list(r.labels)}
                     for r in self.short_term.sample()]
            t2 = time.perf_counter()
            path, best, scores = self.long_term.search(q, now=now)
            t3 = time.perf_counter()
            dialogue = [{"score": round(s, 4), "question": e.question, "answer": e.answer, "t": e.timestamp}
                        for s, e in self.dialogue.search(q, self.dialogue_k)]
            t4 = time.perf_counter()
            injection = self.injector.select(question, q)
            t5 = time.perf_counter()
            tree_path = [_node_view(n, s) for n, s in zip(path, scores)]
            tree_best = _node_view(best, float(best.embedding @ q)) if best is not None else None
            centres = [n.centres for n in path]
            knowledge = [{"score": round(s, 4), "event": e.event_id, "t_start": round(e.t_start, 3),
                          "t_end": round(e.t_end, 3), "caption": e.caption} for s, e in injection.entries]
        timings.update(short_term=t2 - t1, tree_search=t3 - t2, dialogue_search=t4 - t3,
                       knowledge_injection=t5 - t4)
        rpd = time.perf_counter() - submitted
        timings["total"] = rpd
        result = QueryResult(
            question=question, stream_time=now, short_term=short, tree_path=tree_path, tree_best=tree_best,
            tree_centres=centres, dialogue=dialogue, knowledge=knowledge,
            injection={"mode": injection.mode, "s_t": round(injection.s_t, 4), "s_r": round(injection.s_r, 4),
                       "s_c": round(injection.s_c, 4)},
            timings=timings, rpd_s=rpd,
        )
        if self.answer_fn is not None:
            t6 = time.perf_counter()
            result.answer = self.answer_fn(result)
            result.answer_s = time.perf_counter() - t6
            self.dialogue.add(question, result.answer, now)
        return result

    # ---- reporting -----------------------------------------------------
    def summary(self) -> dict:
        elapsed = None
        if self._t_start is not None:
            end = self._t_stream_end if self._t_stream_end is not None else time.perf_counter()
            elapsed = end - self._t_start
        with self._memory_lock:
            levels = self.long_term.levels()
            timings = Counter(self.timings)
            timings.update({f"long_term.{k}": v for k, v in self.long_term.timings.items()})
            timings.update({f"events.{k}": v for k, v in self.events.timings.items()})
            out = {
                "preset": self.preset.name,
                "frames_decoded": self.frames_decoded,
                "frames_kept": self.frames_kept,
                "frames_formed": self.frames_formed,
                "events": len(self.knowledge_base),
                "tree_levels": len(levels),
                "tree_nodes": sum(levels.values()),
                "nodes_per_level": {str(k): v for k, v in levels.items()},
                "dialogue_entries": len(self.dialogue),
                "seconds": None if elapsed is None else round(elapsed, 3),
                "processed_fps": None if not elapsed else round(self.frames_decoded / elapsed, 2),
                "max_vision_queue": self.max_vision_depth,
                "max_query_queue": self.max_query_depth,
                "component_seconds": {k: round(v, 4) for k, v in sorted(timings.items())},
            }
            if self.bounded is not None:
                s = self.bounded.stats
                out["bounded"] = {"budget": self.bounded.budget, "cost": self.bounded.total_cost(),
                                  "peak_cost": s.peak_cost, "rounds": s.rounds, "merged": s.merged,
                                  "removed_leaves": s.removed_leaves, "removed_parents": s.removed_parents,
                                  "skipped_redundant": s.skipped_redundant}
        return out

    def run(self, queries: Iterable[tuple[float | None, str]] = ()) -> list[QueryResult]:
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
