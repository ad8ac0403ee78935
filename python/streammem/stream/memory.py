"""``StreamMemory``: the streaming memory of one stream, synchronous and checkpointable.

One object owns every memory of a stream (StreamChat's motion gate, short-term
frames and long-term tree, StreamRAG's event knowledge base and knowledge
injection, the dialogue memory, ProStream's bounded growth) and nothing else:
no threads, no queues, no Ray.  It is what a scheduler drives:
``StreamPipeline`` runs it in three threads, a ``streammem.distributed``
shard holds many of them, ``index_archive`` fills one per video.

>>> mem = StreamMemory(MemoryConfig.from_preset("base"), frame_encoder, text_encoder)
>>> mem.push(timestamps, frames)            # (n,) seconds, (n, H, W, 3) uint8 RGB
>>> ctx = mem.ask("what did the cyclist do?")
>>> mem.save("ckpt/")                       # everything, restored exactly by StreamMemory.load("ckpt/")

The stages of ``push`` are public so a scheduler can run them apart or batch
them across streams: ``select`` (motion gate), ``encode`` (frame encoder),
``records``, ``form`` (short-term, long-term, events, bounded memory), and
``finish`` at the end of a stream; ``push_encoded`` skips the gate and the
encoder for streams that arrive as features (text turns, cached features).
``ask`` is likewise ``encode_question`` + ``retrieve`` + ``answer``.

Answers and abstention (``docs/answers.md``): ``retrieve`` chooses the basis
of the answer (the tree node, event or short-term frames the extractive answer
quotes; inside the span of a time reference such as "at the beginning" or
"before the car arrived", see ``components.timeref``), scores it with the
memory's ``Calibration`` and sets the context's ``confidence`` (the
calibrated probability that the basis answers the question) and ``outcome``
(``Outcome.ANSWERED``, or ``Outcome.NOT_IN_MEMORY`` below the threshold, when
a time reference's span holds nothing, or when the memory is empty).  ``ask``
calls ``answer_fn`` only for an answered context; otherwise the answer is
``NOT_IN_MEMORY_ANSWER``.

Checkpoints: ``state_dict()`` holds every piece of state (gate reference
frame, short-term frames and sampler state, node table, open chunk, tree index
row for row, segmenter state, open event, knowledge base, dialogue vectors,
bounded-memory statistics, counters) as tensors, numbers and strings, so
``torch.load(weights_only=True)`` reads it.  A memory restored from it answers
every later question exactly as the uninterrupted memory would (same thread
count and backend: kernels are deterministic, but float reductions depend on
the number of threads).  The models are not state: they are rebuilt from their
spec (``encoders.encoder_spec``) or passed again.

Thread safety: a ``StreamMemory`` may be shared between threads (the class
docstring says exactly how calls interleave); its components alone
(``LongTermMemory``, ``KnowledgeBase``, ...) are not thread-safe.
"""
from __future__ import annotations

import contextlib
import json
import math
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..checkpoint import StateReader, atomic_write, ensure_folder, reader_for
from ..checkpoint import load as load_checkpoint, save as save_checkpoint
from ..checks import is_real
from ..components.answers import (
    NOT_IN_MEMORY_ANSWER, Calibration, Outcome, WordVectors, answer_features, choose_basis, content_words, grounding,
    proper_names,
)
from ..components.bounded import BoundedMemory
from ..components.gate import MotionGate
from ..components.knowledge import DialogueMemory, EventSegmenter, InstantaneityScorer, KnowledgeInjector
from ..components.memory import (
    FrameRecord, LabelCaptioner, LongTermMemory, ShortTermMemory, check_query_embedding,
)
from ..components.timeref import TimeReference, parse_time_reference
from ..config import MemoryConfig, Preset
from ..models.encoders import EncodedFrames, encode_frames, encoder_spec, encoders_from_specs
from .basis import candidates as basis_candidates, time_basis
from .calibration import default_calibration
from .context import Context, PushResult, node_view
from .state_checks import FORMAT as _FORMAT, VERSION as _VERSION
from .state_checks import check_header, check_memory_state, saved_config

__all__ = ["StreamMemory"]

_STATE_FILE = "state.pt"
_INFO_FILE = "memory.json"
MAX_FEATURE_ABS = 1e15  # float32 squared distances of D <= 4096 such features over 10^4 rows stay finite


def _check_frames(frames, *, batched: bool):
    """(n, H, W, 3) uint8 frames (numpy or torch); ``batched=False`` also takes one (H, W, 3) frame."""
    if not isinstance(frames, torch.Tensor):
        try:
            frames = np.asarray(frames)
        except (TypeError, ValueError) as exc:  # ragged lists
            raise ValueError(f"frames must be a uint8 array of shape (n, H, W, 3): {exc}") from None
    if frames.ndim == 3 and not batched:
        frames = frames[None]
    shape = "(n, H, W, 3)" if batched else "(n, H, W, 3) or (H, W, 3)"
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype not in (np.uint8, torch.uint8) \
            or min(frames.shape[:3]) < 1:
        raise ValueError(f"frames must be uint8 RGB of shape {shape} with n, H, W >= 1, got {frames.dtype} "
                         f"{tuple(frames.shape)}")
    return frames


class StreamMemory:
    """Every memory of one stream behind ``push`` and ``ask``; thread-safe and picklable.

    Parameters
    ----------
    config : MemoryConfig, str or Preset
        A preset name ("slow", "base", "fast") is ``MemoryConfig.from_preset(name)``.
    frame_encoder : FrameEncoder, optional
        Needed by ``push`` (frames); ``push_encoded`` works without one.
    text_encoder : TextEncoder
        Embeds captions, questions and dialogue.
    captioner : Captioner, optional
        Tree leaves and parents (default ``LabelCaptioner``).
    event_captioner : Captioner, optional
        Knowledge-base events (default: the same captioner).
    answer_fn : callable(Context) -> str, optional
        Turns a context into an answer; answers go to the dialogue memory.
    instantaneity : callable(question, embedding) -> float, optional
        StreamRAG's S_t (default ``InstantaneityScorer(text_encoder)``).
    calibration : Calibration, optional
        Turns an answer's features into its confidence and outcome (default:
        ``stream.calibration.default_calibration(text_encoder)``, fitted for
        the built-in encoders; ``calibration.with_threshold(0.0)`` never abstains).

    Thread safety: every method may be called from any thread; three internal
    locks decide how calls interleave.

    * Pushes are serialised: ``push``, ``push_encoded`` and ``finish`` hold
      the push lock for their whole call, so two threads' batches never
      interleave frame by frame.
    * The memories (short-term, long-term tree, events, knowledge base,
      dialogue, bounded memory, ``stream_time``) are guarded by the state
      lock, held per stage: ``form`` (one frame), ``retrieve``,
      ``record_answer``, ``finish``.  ``ask`` encodes the question and runs
      ``answer_fn`` *outside* it, so a question from another thread waits at
      most for the frame being formed, and a slow answer never stalls a push.
    * The motion gate and the frame counters have their own lock (``select``),
      so a scheduler may gate the next frames while ``form`` runs (what
      ``StreamPipeline`` does).
    * ``state_dict``, ``load_state_dict``, ``save`` and ``summary`` take the
      gate and state locks together: a consistent snapshot between two frames.

    The stage methods (``select``, ``encode``, ``records``, ``form``, ``advance``) are for
    schedulers, which must call them in stream order.  Hooks (encoders,
    captioners, ``answer_fn``) run in the calling thread; a captioner runs
    under the state lock.  Pickling stores ``state_dict()`` and the encoders
    (the built-in model encoders pickle as their spec and reload their weights
    from their pip package).
    """

    def __init__(self, config: MemoryConfig | str | Preset | None = None, frame_encoder=None, text_encoder=None, *,
                 captioner=None, event_captioner=None, answer_fn: Callable | None = None,
                 instantaneity: Callable | None = None, calibration: Calibration | None = None):
        if config is None:
            config = MemoryConfig()
        elif isinstance(config, (str, Preset)):
            config = MemoryConfig.from_preset(config)
        elif not isinstance(config, MemoryConfig):
            raise ValueError(f"config must be a MemoryConfig, a preset name or a Preset, got {config!r}")
        if text_encoder is None:
            raise ValueError("text_encoder is required (captions, questions and dialogue are embedded with it); "
                             "e.g. streammem.load_text_encoder()")
        self.config = config
        self.frame_encoder = frame_encoder
        self.text_encoder = text_encoder
        self.captioner = captioner if captioner is not None else LabelCaptioner()
        self.event_captioner = event_captioner
        self.answer_fn = answer_fn
        if calibration is not None and not isinstance(calibration, Calibration):
            raise ValueError(f"calibration must be a Calibration or None, got {type(calibration).__name__}")
        self._custom_calibration = calibration
        self.calibration = calibration if calibration is not None else default_calibration(text_encoder)
        self.word_vectors = WordVectors(text_encoder)  # the ``related`` feature of answers
        self._word_lock = threading.Lock()
        self._custom_instantaneity = instantaneity
        p, cfg = config.preset, config
        self.gate = MotionGate(p.threshold, size=cfg.motion_size, reference=cfg.motion_reference,
                               window=cfg.motion_window, statistic=cfg.motion_statistic,
                               levels=cfg.motion_levels, backend=cfg.backend)
        st = cfg.short_term
        self.short_term = ShortTermMemory(st.candidates, st.keep, st.tau, seed=cfg.seed)
        self.long_term = LongTermMemory(text_encoder, self.captioner, chunk=p.chunk, group=p.group,
                                        centres=p.centres, kmeans_iters=cfg.kmeans_iters, seed=cfg.seed,
                                        backend=cfg.backend)
        self.bounded = None if cfg.bounded is None else BoundedMemory(self.long_term, cfg.bounded.budget,
                                                                      **cfg.bounded.kwargs())
        seg = cfg.segmenter
        self.events = EventSegmenter(text_encoder, event_captioner if event_captioner is not None else self.captioner,
                                     window=seg.window, tau=seg.tau, min_depth=seg.min_depth,
                                     max_event=seg.max_event, drift=seg.drift, flash=seg.flash,
                                     backend=cfg.backend)
        self.knowledge_base = self.events.knowledge_base
        scorer = instantaneity if instantaneity is not None else InstantaneityScorer(text_encoder)
        inj = cfg.injector
        self.injector = KnowledgeInjector(self.knowledge_base, scorer, gamma=inj.gamma, theta1=inj.theta1,
                                          theta2=inj.theta2)
        self.dialogue = DialogueMemory(text_encoder)
        self.frames_seen = 0  # stream positions pushed, including gaps
        self.frames_missing = 0  # positions skipped by ``first_index`` (frames the memory never received)
        self.frames_formed = 0
        self._encoded_kept = 0
        self.questions = 0
        self.stream_time: float | None = None
        self.timings: Counter = Counter()  # seconds per component
        # Lock order (never the reverse): push -> gate -> state.  Re-entrant, as push calls select and form.
        self._push_lock = threading.RLock()
        self._gate_lock = threading.RLock()
        self._state_lock = threading.RLock()

    @contextlib.contextmanager
    def _quiet(self):
        """The gate and state locks together: no frame is gated or formed meanwhile."""
        with self._gate_lock, self._state_lock:
            yield

    # ---- properties ------------------------------------------------------
    @property
    def preset(self) -> Preset:
        return self.config.preset

    @property
    def frames_kept(self) -> int:
        """Frames the motion gate kept (``push_encoded`` frames count as kept)."""
        return self.gate.frames_kept + self._encoded_kept

    # ---- push: the stages ------------------------------------------------
    def _check_push(self, timestamps, n: int) -> list[float]:
        try:
            array = np.asarray(timestamps.detach().cpu() if isinstance(timestamps, torch.Tensor) else timestamps)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"timestamps must be a number or a sequence of numbers (seconds), got "
                             f"{type(timestamps).__name__}") from exc
        if array.dtype.kind not in "iuf":  # bool, complex, strings, objects: not a time
            raise ValueError(f"timestamps must be real numbers (seconds), got {array.dtype} values")
        times = [float(t) for t in array.reshape(-1)]
        if len(times) != n:
            raise ValueError(f"timestamps must hold one time per frame ({n}), got {len(times)}")
        if not all(math.isfinite(t) for t in times):
            raise ValueError(f"timestamps must be finite, got {[t for t in times if not math.isfinite(t)][:3]}")
        previous = self.stream_time if self.stream_time is not None else -math.inf
        for t in times:
            if t < previous:
                raise ValueError(f"timestamps must not decrease, got {t} after {previous}")
            previous = t
        return times

    def _check_first_index(self, first_index) -> int | None:
        if first_index is None:
            return None
        if not is_real(first_index) or not math.isfinite(first_index) or int(first_index) != first_index:
            raise ValueError(f"first_index must be an int, got {first_index!r}")
        if first_index < self.frames_seen:
            raise ValueError(f"first_index must be >= {self.frames_seen} (frames already pushed), "
                             f"got {first_index}")
        return int(first_index)

    def _claim_indices(self, n: int, first_index: int | None) -> list[int]:
        first_index = self._check_first_index(first_index)
        if first_index is not None:
            self.frames_missing += first_index - self.frames_seen
            self.frames_seen = first_index
        start = self.frames_seen
        self.frames_seen += n
        return list(range(start, start + n))

    def select(self, frames, *, first_index: int | None = None, return_scores: bool = False):
        """Motion gate: stream indices of ``frames`` ((n, H, W, 3) uint8) and which of them are kept.

        ``first_index`` is the stream position of ``frames[0]`` when frames
        before it never arrived (they are counted in ``frames_missing``).
        Returns ``(indices, kept)``, or ``(indices, kept, scores)`` with
        ``return_scores`` (the gate's motion score per frame, 1.0 for the
        first frame of the stream, which is kept by definition).
        """
        frames = _check_frames(frames, batched=True)
        with self._gate_lock:
            self._check_first_index(first_index)  # before the gate moves
            t0 = time.perf_counter()
            scores, kept = self.gate.push(frames)
            self.timings["motion_gate"] += time.perf_counter() - t0
            indices = self._claim_indices(frames.shape[0], first_index)
            return (indices, kept, scores) if return_scores else (indices, kept)

    def encode(self, frames) -> EncodedFrames:
        """Frame encoder on (n, H, W, 3) uint8 frames."""
        if self.frame_encoder is None:
            raise ValueError("this StreamMemory has no frame_encoder; pass one, or use push_encoded(features)")
        t0 = time.perf_counter()
        out = encode_frames(self.frame_encoder, frames)
        self.timings["frame_encode"] += time.perf_counter() - t0
        return out

    @staticmethod
    def records(indices: Sequence[int], timestamps: Sequence[float], encoded: EncodedFrames) -> list[FrameRecord]:
        """Frame records of encoded frames (features copied as float32, labels as tuples)."""
        labels = encoded.labels if encoded.labels else [()] * len(indices)
        return [FrameRecord(int(i), float(t), encoded.features[row].float().clone(), tuple(labels[row]))
                for row, (i, t) in enumerate(zip(indices, timestamps))]

    def form(self, record: FrameRecord, *, closed: list | None = None) -> tuple[int, int]:
        """Form one kept frame into every memory; returns (nodes created, events closed).

        ``closed``: the events this frame closes when its feature was already
        pushed into ``self.events.segmenter`` (cross-stream batching).
        """
        with self._state_lock:
            t0 = time.perf_counter()
            self.short_term.add(record)
            t1 = time.perf_counter()
            created = self.long_term.add(record)
            t2 = time.perf_counter()
            entries = self.events.push(record, closed)
            t3 = time.perf_counter()
            if created and self.bounded is not None:
                self.bounded.enforce(record.timestamp)
            t4 = time.perf_counter()
            self.timings["short_term"] += t1 - t0
            self.timings["long_term"] += t2 - t1
            self.timings["events"] += t3 - t2
            self.timings["bounded"] += t4 - t3
            self.frames_formed += 1
            self._advance(record.timestamp)
            return len(created), len(entries)

    def advance(self, timestamp: float) -> None:
        """The stream reached ``timestamp`` without a frame to form (the motion gate dropped it).

        ``push`` does this itself; a scheduler that runs ``select`` and ``form``
        apart calls it for dropped frames, so ``stream_time`` (the "now" of
        every later question) is the stream's own time, not the last kept frame's.
        """
        if not is_real(timestamp) or not math.isfinite(timestamp):
            raise ValueError(f"timestamp must be a finite number of seconds, got {timestamp!r}")
        self._advance(float(timestamp))

    def _advance(self, timestamp: float) -> None:
        with self._state_lock:
            self.stream_time = timestamp if self.stream_time is None else max(self.stream_time, timestamp)

    # ---- push: the whole ---------------------------------------------------
    def push(self, timestamps, frames, *, first_index: int | None = None) -> PushResult:
        """Gate, encode and form a batch of consecutive frames.

        Parameters
        ----------
        timestamps : float or (n,) sequence of float
            Stream seconds of the frames, non-decreasing across pushes.
        frames : (n, H, W, 3) or (H, W, 3) uint8 RGB array
        first_index : int, optional
            Stream position of the first frame when earlier frames were lost.
        """
        frames = _check_frames(frames, batched=False)
        if self.frame_encoder is None:
            raise ValueError("this StreamMemory has no frame_encoder; pass one, or use push_encoded(features)")
        with self._push_lock:
            # Everything is validated before the gate moves: a rejected push changes nothing.
            times = self._check_push(timestamps, frames.shape[0])
            indices, kept = self.select(frames, first_index=first_index)
            rows = [i for i, k in enumerate(kept) if k]
            nodes = events = 0
            if rows:
                encoded = self.encode(frames[rows])
                for record in self.records([indices[i] for i in rows], [times[i] for i in rows], encoded):
                    n, e = self.form(record)
                    nodes += n
                    events += e
            self._advance(times[-1])
            return PushResult(len(times), [indices[i] for i in rows], nodes, events)

    def push_encoded(self, timestamps, features, labels: Sequence[Sequence[str]] | None = None, *,
                     first_index: int | None = None) -> PushResult:
        """Form already-encoded frames (no motion gate, no frame encoder): every row is kept.

        ``features`` is (n, D) (or (D,) with a scalar timestamp), finite and at
        most 1e15 in magnitude; ``labels`` one sequence of names per row
        (captions use them).  A rejected push changes nothing.
        """
        feats = torch.as_tensor(features)
        if feats.dim() == 1:
            feats = feats[None]
        if feats.dim() != 2 or feats.shape[0] < 1 or not feats.is_floating_point():
            raise ValueError(f"features must be a float (n, D) tensor with n >= 1, got {tuple(feats.shape)} "
                             f"{feats.dtype}")
        if not bool(torch.isfinite(feats).all()):
            raise ValueError("features must be finite")
        if bool((feats.abs() > MAX_FEATURE_ABS).any()):
            raise ValueError(f"features must be at most {MAX_FEATURE_ABS:g} in magnitude (k-means and the event "
                             f"segmenter work on float32 squared distances), got {float(feats.abs().max()):g}")
        expected = self._feature_dim()
        if expected is not None and feats.shape[1] != expected:
            raise ValueError(f"features must have {expected} columns (the memory's feature dim), got {feats.shape[1]}")
        if labels is not None:
            if isinstance(labels, str) or len(labels) != feats.shape[0] or \
                    any(isinstance(x, str) or not all(isinstance(n, str) for n in x) for x in labels):
                raise ValueError(f"labels must hold one sequence of names (str) per row ({feats.shape[0]} rows), "
                                 f"got {labels!r:.80}")
        with self._push_lock:
            times = self._check_push(timestamps, feats.shape[0])
            with self._gate_lock:
                indices = self._claim_indices(feats.shape[0], first_index)
                self._encoded_kept += feats.shape[0]
            encoded = EncodedFrames(feats, [tuple(x) for x in labels] if labels is not None else [])
            nodes = events = 0
            for record in self.records(indices, times, encoded):
                n, e = self.form(record)
                nodes += n
                events += e
            return PushResult(len(times), indices, nodes, events)

    def _feature_dim(self) -> int | None:
        """Columns of the frame features this memory holds (None until it knows)."""
        if self.frame_encoder is not None and getattr(self.frame_encoder, "dim", None) is not None:
            return int(self.frame_encoder.dim)
        return self.short_term.feature_dim

    def finish(self) -> PushResult:
        """End of stream (or of a section): close the partial chunk and the open event, enforce the budget."""
        with self._push_lock, self._state_lock:
            t0 = time.perf_counter()
            nodes = len(self.long_term.flush())
            t1 = time.perf_counter()
            events = len(self.events.flush())
            t2 = time.perf_counter()
            if self.bounded is not None and self.stream_time is not None:
                self.bounded.enforce(self.stream_time)
            self.timings["long_term"] += t1 - t0
            self.timings["events"] += t2 - t1
            self.timings["bounded"] += time.perf_counter() - t2
            return PushResult(0, [], nodes, events)

    # ---- questions ---------------------------------------------------------
    def encode_question(self, question: str) -> torch.Tensor:
        """(E,) normalised question embedding."""
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"question must be a non-empty string, got {question!r:.80}")
        out = torch.as_tensor(self.text_encoder.encode([question]))
        dim = int(self.text_encoder.dim)
        if tuple(out.shape) != (1, dim) or not out.is_floating_point():
            raise ValueError(f"text_encoder.encode([question]) must return a float (1, {dim}) tensor, got "
                             f"{out.dtype} {tuple(out.shape)}")
        if not bool(torch.isfinite(out).all()):
            raise ValueError(f"text_encoder.encode([question]) returned non-finite values for {question!r:.80}")
        return F.normalize(out[0].float(), dim=0)

    def retrieve(self, question: str, query_embedding: torch.Tensor, *, submitted: float | None = None,
                 timings: dict | None = None) -> Context:
        """Short-term frames, tree path and best node, dialogue hits and injected knowledge for a question,
        and the decision on its answer (``basis``, ``confidence``, ``outcome``; module docstring).

        Updates the retrieved nodes' access statistics (they feed the bounded
        memory's utility) and the short-term sampler's generator.  A time
        reference "before X" / "after X" embeds X (one text-encoder call), and
        a basis of short-term frames embeds their labels, both outside the
        memory's lock.
        """
        q = F.normalize(check_query_embedding(query_embedding, int(self.text_encoder.dim)), dim=0)
        ref = parse_time_reference(question) if isinstance(question, str) else None
        anchor_q = self.encode_question(ref.anchor) if ref is not None and ref.anchor else None
        with self._state_lock:
            timings = dict(timings or {})
            t1 = time.perf_counter()
            submitted = t1 if submitted is None else submitted
            now = self.stream_time
            short = [{"frame": r.index, "t": round(r.timestamp, 3), "labels": list(r.labels)}
                     for r in self.short_term.sample()]
            t2 = time.perf_counter()
            path, best, scores = self.long_term.search(q, now=now)
            t3 = time.perf_counter()
            dialogue = [{"score": round(s, 4), "question": e.question, "answer": e.answer, "t": e.timestamp}
                        for s, e in self.dialogue.search(q, self.config.dialogue_k)]
            t4 = time.perf_counter()
            injection = self.injector.select(question, q)
            best_event = self.knowledge_base.search(q, 1)
            t5 = time.perf_counter()
            tree_path = [node_view(n, s) for n, s in zip(path, scores)]
            tree_best = node_view(best, float(best.embedding @ q)) if best is not None else None
            knowledge = [{"score": round(s, 4), "event": e.event_id, "t_start": round(e.t_start, 3),
                          "t_end": round(e.t_end, 3), "caption": e.caption} for s, e in injection.entries]
            knowledge_best = [{"score": round(s, 4), "event": e.event_id, "t_start": round(e.t_start, 3),
                               "t_end": round(e.t_end, 3), "caption": e.caption} for s, e in best_event]
            timed = time_basis(self, ref, q, anchor_q, short) if ref is not None else None
            timings.update(short_term=t2 - t1, tree_search=t3 - t2, dialogue_search=t4 - t3,
                           knowledge_injection=t5 - t4)  # knowledge_best's top-1 search included
            if timed is not None:
                timings["time_reference"] = time.perf_counter() - t5
            self.questions += 1
            ctx = Context(
                question=question, stream_time=now, short_term=short, tree_path=tree_path, tree_best=tree_best,
                tree_centres=[n.centres for n in path], dialogue=dialogue, knowledge=knowledge,
                knowledge_best=knowledge_best[0] if knowledge_best else None,
                injection={"mode": injection.mode, "s_t": round(injection.s_t, 4), "s_r": round(injection.s_r, 4),
                           "s_c": round(injection.s_c, 4)},
                timings=timings, rpd_s=0.0,
            )
        t6 = time.perf_counter()
        self._decide(ctx, q, ref, timed)
        timings["decide"] = time.perf_counter() - t6
        ctx.rpd_s = time.perf_counter() - submitted
        timings["total"] = ctx.rpd_s
        return ctx

    def _decide(self, ctx: Context, q: torch.Tensor, ref: TimeReference | None, timed: dict | None) -> None:
        """Fill the context's basis, features, confidence and outcome (outside the state lock).

        Without a time reference the basis is the extractive answer's choice
        (``choose_basis``: the short-term frames for a question about now,
        else the best-matching node or event), unless it leaves some of the
        question's words unspelled and another retrieved candidate (the
        short-term frames, the tree's best node, an injected event, the
        knowledge base's best event) spells more of them: then that one
        (most words, then most names, then cosine).
        """
        question = ref.question if ref is not None else ctx.question
        if timed is not None:
            ctx.time_reference = timed["reference"]
            basis = timed["basis"]
        else:
            candidates = basis_candidates(ctx)
            source, item = choose_basis(ctx)
            basis = None
            if source != "none":
                default = next(c for c in candidates if c["source"] == source and
                               (source == "short_term" or c.get("node", c.get("event")) ==
                                item.get("node", item.get("event"))))
                basis = default
                words, names = content_words(question), proper_names(question)
                spelled = {id(c): (grounding(words, c["text"]), grounding(names, c["text"])) for c in candidates}
                if spelled[id(default)][0] < 1.0:
                    best = max(candidates, key=lambda c: (spelled[id(c)], c["score"] if c["score"] is not None
                                                          else -1.0))
                    if spelled[id(best)] > spelled[id(default)]:
                        basis = best
        if basis is None:
            ctx.basis, ctx.features, ctx.confidence, ctx.outcome = None, {}, 0.0, Outcome.NOT_IN_MEMORY
            return
        basis = dict(basis)
        if basis["score"] is None:  # short-term frames: their labels' text against the question
            basis["score"] = round(float(self.encode_question(basis["text"]) @ q), 4)
        ctx.basis = basis
        with self._word_lock:  # the word cache is shared by questions from any thread
            ctx.features = answer_features(question, basis["text"], float(basis["score"]),
                                           word_vectors=self.word_vectors)
        ctx.confidence, ctx.outcome = self.calibration.decide(ctx.features)

    def record_answer(self, context: Context, answer: str, *, embedding: torch.Tensor | None = None) -> None:
        """Attach an answer to its context and append the exchange to the dialogue memory."""
        if not isinstance(answer, str):
            raise TypeError(f"answer must be a str (what answer_fn returns), got {type(answer).__name__}")
        with self._state_lock:
            context.answer = answer
            self.dialogue.add(context.question, answer, context.stream_time, embedding=embedding)

    def answer_text(self, context: Context) -> str:
        """The answer to a decided context: ``answer_fn(context)`` when answered, else ``NOT_IN_MEMORY_ANSWER``
        (``answer_fn`` is not called).  TypeError when ``answer_fn`` returns no str."""
        if context.outcome != Outcome.ANSWERED:
            return NOT_IN_MEMORY_ANSWER
        text = self.answer_fn(context)
        if not isinstance(text, str):
            raise TypeError(f"answer_fn must return a str, got {type(text).__name__}")
        return text

    def ask(self, question: str, *, answer: bool = True) -> Context:
        """Retrieve the context of a question now; with ``answer_fn``, answer it (``answer_text``) and remember
        the exchange."""
        t0 = time.perf_counter()
        q = self.encode_question(question)
        ctx = self.retrieve(question, q, submitted=t0, timings={"question_encode": time.perf_counter() - t0})
        if answer and self.answer_fn is not None:
            t1 = time.perf_counter()
            text = self.answer_text(ctx)
            ctx.answer_s = time.perf_counter() - t1
            self.record_answer(ctx, text, embedding=self.dialogue.embed(question, text))  # embedded outside the lock
        return ctx

    # ---- reporting -----------------------------------------------------------
    def summary(self) -> dict:
        """Counts (frames seen, kept, formed, missing; nodes per level; events; questions) and seconds per part."""
        with self._quiet():
            levels = self.long_term.levels()
            timings = Counter(self.timings)
            timings.update({f"long_term.{k}": v for k, v in self.long_term.timings.items()})
            timings.update({f"events.{k}": v for k, v in self.events.timings.items()})
            out = {
                "preset": self.preset.name,
                "frames_seen": self.frames_seen,
                "frames_missing": self.frames_missing,
                "frames_kept": self.frames_kept,
                "frames_formed": self.frames_formed,
                "stream_time": self.stream_time,
                "events": len(self.knowledge_base),
                "tree_levels": len(levels),
                "tree_nodes": sum(levels.values()),
                "nodes_per_level": {str(k): v for k, v in levels.items()},
                "dialogue_entries": len(self.dialogue),
                "questions": self.questions,
                "component_seconds": {k: round(v, 4) for k, v in sorted(timings.items())},
            }
            if self.bounded is not None:
                s = self.bounded.stats
                out["bounded"] = {"budget": self.bounded.budget, "cost": self.bounded.total_cost(),
                                  "peak_cost": s.peak_cost, "rounds": s.rounds, "merged": s.merged,
                                  "removed_leaves": s.removed_leaves, "removed_parents": s.removed_parents,
                                  "skipped_redundant": s.skipped_redundant}
            return out

    # ---- checkpoints ---------------------------------------------------------
    def _encoder_info(self) -> dict:
        return {"frame": encoder_spec(self.frame_encoder), "text": encoder_spec(self.text_encoder),
                "frame_dim": None if self.frame_encoder is None else int(self.frame_encoder.dim),
                "text_dim": int(self.text_encoder.dim)}

    def state_dict(self) -> dict:
        """Every piece of state (see the module docstring); loadable with ``torch.load(weights_only=True)``."""
        with self._quiet():
            state = {
                "format": _FORMAT,
                "version": _VERSION,
                "config": self.config.to_dict(),
                "encoders": self._encoder_info(),
                "counters": {"frames_seen": self.frames_seen, "frames_missing": self.frames_missing,
                             "frames_formed": self.frames_formed, "encoded_kept": self._encoded_kept,
                             "questions": self.questions},
                "stream_time": self.stream_time,
                "timings": dict(self.timings),
                "gate": self.gate.state_dict(),
                "short_term": self.short_term.state_dict(),
                "long_term": self.long_term.state_dict(),
                "events": self.events.state_dict(),
                "bounded": None if self.bounded is None else self.bounded.state_dict(),
                "dialogue": self.dialogue.state_dict(),
            }
            for name in ("captioner", "event_captioner"):
                cap = getattr(self, name)
                if cap is not None and callable(getattr(cap, "state_dict", None)):
                    state[name] = cap.state_dict()
            return state

    def load_state_dict(self, state) -> None:
        """Restore ``state_dict()`` output into a memory built with the same config and encoder dimensions.

        ``state`` is a dict or a ``checkpoint.StateReader`` (what :meth:`load` reads from a file).
        Every field is checked before the memory changes (``state_checks.check_memory_state``:
        counters, stream time, finite floats, the node table's ids, children and embeddings, ...),
        each failure one ``ValueError`` naming the field (and the file).
        """
        reader = reader_for(state, "StreamMemory")
        with self._push_lock, self._quiet():
            check_memory_state(reader, self.config, int(self.text_encoder.dim),
                               None if self.frame_encoder is None else int(self.frame_encoder.dim),
                               self.bounded is not None)
            c = reader.state["counters"]
            self.frames_seen = int(c["frames_seen"])
            self.frames_missing = int(c["frames_missing"])
            self.frames_formed = int(c["frames_formed"])
            self._encoded_kept = int(c["encoded_kept"])
            self.questions = int(c["questions"])
            self.stream_time = None if reader.state["stream_time"] is None else float(reader.state["stream_time"])
            self.timings = Counter(reader.state["timings"])
            for name in ("gate", "short_term", "long_term", "events", "dialogue"):
                component = getattr(self, name)
                reader.restore(name, lambda: component.load_state_dict(reader.state[name]))
            if self.bounded is not None:
                reader.restore("bounded", lambda: self.bounded.load_state_dict(reader.state["bounded"]))
            for name in ("captioner", "event_captioner"):
                cap = getattr(self, name)
                if name in reader.state and cap is not None and callable(getattr(cap, "load_state_dict", None)):
                    reader.restore(name, lambda: cap.load_state_dict(reader.state[name]))

    def save(self, directory) -> Path:
        """Write the memory to ``directory`` (created): ``state.pt`` and a readable ``memory.json``.

        ``state.pt`` is a checkpoint file (``streammem.checkpoint``: a header, a SHA-256 of the
        payload) replaced atomically, so a crash during ``save`` leaves the previous checkpoint
        intact and no temporary behind (one left by a killed process is removed by the next save).
        """
        directory = ensure_folder(directory)
        with self._quiet():  # state and summary of the same moment
            state = self.state_dict()
            summary = self.summary()
        info = {"format": _FORMAT, "version": _VERSION, "config": state["config"], "encoders": state["encoders"],
                "summary": summary}
        atomic_write(directory / _INFO_FILE, lambda fh: fh.write(json.dumps(info, indent=1).encode()))
        save_checkpoint(directory / _STATE_FILE, "StreamMemory", state, version=_VERSION)
        return directory

    @classmethod
    def load(cls, directory, frame_encoder=None, text_encoder=None, **hooks) -> "StreamMemory":
        """A memory saved with ``save``; encoders not passed are rebuilt from their saved spec.

        ``hooks``: ``captioner``, ``event_captioner``, ``answer_fn``, ``instantaneity``,
        ``calibration`` as for the constructor (they are code and settings, not state).  A missing
        ``state.pt`` raises ``FileNotFoundError``; a damaged, truncated or foreign one, or a state
        with an invalid field, one ``ValueError`` naming the file (and the field).
        """
        path = Path(directory) / _STATE_FILE
        if not path.is_file():
            raise FileNotFoundError(f"no saved StreamMemory in {directory} (missing {_STATE_FILE})")
        state, _ = load_checkpoint(path, "StreamMemory", versions=(_VERSION,))
        return cls.from_state_dict(StateReader(path, "StreamMemory", state), frame_encoder, text_encoder, **hooks)

    @classmethod
    def from_state_dict(cls, state, frame_encoder=None, text_encoder=None, **hooks) -> "StreamMemory":
        """Build a memory from its config in ``state`` (a dict or a ``StateReader``) and restore it
        (encoders as for ``load``)."""
        reader = reader_for(state, "StreamMemory")
        check_header(reader)
        config = saved_config(reader)
        specs = reader.dict("encoders")
        frame_encoder, text_encoder = reader.restore(
            "encoders", lambda: encoders_from_specs(specs, frame_encoder, text_encoder))
        memory = cls(config, frame_encoder, text_encoder, **hooks)
        memory.load_state_dict(reader)
        return memory

    # ---- pickling ------------------------------------------------------------
    def __getstate__(self) -> dict:
        return {"state": self.state_dict(), "frame_encoder": self.frame_encoder, "text_encoder": self.text_encoder,
                "captioner": self.captioner, "event_captioner": self.event_captioner, "answer_fn": self.answer_fn,
                "instantaneity": self._custom_instantaneity, "calibration": self._custom_calibration}

    def __setstate__(self, data: dict) -> None:
        state = data.pop("state")
        self.__init__(MemoryConfig.from_dict(state["config"]), data.pop("frame_encoder"), data.pop("text_encoder"),
                      **data)
        self.load_state_dict(state)
