"""The MemVerse memory: a short-term window of chunks and the long-term graph they are consolidated into,
asked in one batched retrieval."""
from __future__ import annotations

import json
import math
import time
from collections import Counter, deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ...checkpoint import StateReader, atomic_write, ensure_folder, reader_for
from ...checkpoint import load as load_checkpoint, save as save_checkpoint
from ...components.answers import (
    NOT_IN_MEMORY_ANSWER, Calibration, Outcome, WordVectors, answer_features, content_words, extractive_answer,
)
from ...components.gate import MotionGate
from ...components.knowledge import EventSegmenter
from ...components.memory import FrameRecord, LabelCaptioner, records_from_state, records_state
from ...components.timeref import TimeReference, parse_time_reference, rank_in_window
from ...config import PRESETS
from ...models.encoders import encode_frames, encode_texts, encoder_spec, encoders_from_specs
from ...stream.memory import StreamMemory
from .calibration import default_calibration
from .config import MemVerseConfig
from .extraction import (
    CooccurrenceExtractor, ExtractionContext, MemoryChunk, _call_extractor, _chunks_from_state, _chunks_state, name_key,
)
from .graph import RELATION, GraphEvictionReport, GraphHits, LongTermGraph, interleave
from .hops import Resolution, resolve_possessives
from .state_checks import check_memverse_state

__all__ = ["MemVerse", "MemVerseContext"]


_FORMAT = "streammem.MemVerse"
_VERSION = 1


@dataclass
class MemVerseContext:
    """What one question retrieved.

    ``short_term``: the window's chunks in time order (with their cosine);
    ``chunks``: long-term chunks by rank, each with the node that brought it;
    ``facts``: the best-ranked relations (``facts_order="lightrag"``: every
    relation touching the seeds, LightRAG's order, with ``rank`` and
    ``weight``); ``seeds``: the nodes the search
    started from.  ``timings`` in seconds.

    The decision (``MemVerse.ask``): ``basis`` the chunk the answer rests on
    (its view, ``via``, ``cosine`` and ``confidence``) or None;
    ``confidence`` in [0, 1], the calibrated probability that it answers the
    question; ``outcome`` (``Outcome``); ``features`` what the calibration
    read; ``time_reference`` the question's time reference and window, or None;
    ``resolved`` the question as the graph was asked it when a possessive was
    resolved (``MemVerse.resolve``: "Where does Yara work?" for "Where does
    Alice's sister work?"), or None.  The basis is the chunk closest to it.
    """

    question: str
    stream_time: float | None
    short_term: list[dict]
    chunks: list[dict]
    facts: list[dict]
    seeds: list[dict]
    timings: dict
    answer: str | None = None
    basis: dict | None = None
    confidence: float = 0.0
    outcome: Outcome = Outcome.NOT_IN_MEMORY
    features: dict = field(default_factory=dict)
    time_reference: dict | None = None
    resolved: str | None = None

    def to_dict(self) -> dict:
        return {"question": self.question, "stream_time": self.stream_time, "short_term": self.short_term,
                "chunks": self.chunks, "facts": self.facts, "seeds": self.seeds,
                "timings_ms": {k: round(1e3 * v, 3) for k, v in self.timings.items()}, "answer": self.answer,
                "outcome": Outcome(self.outcome).value, "confidence": round(self.confidence, 4), "basis": self.basis,
                "features": {k: round(v, 4) for k, v in self.features.items()},
                "time_reference": self.time_reference, "resolved": self.resolved}


@extractive_answer.register(MemVerseContext)
def _extractive_memverse(context: MemVerseContext) -> str:
    """MemVerse's model-free answer: the text of the chunk it rests on (``basis``: the retrieved chunk
    closest to the question), or ``NOT_IN_MEMORY_ANSWER``."""
    if context.outcome != Outcome.ANSWERED or context.basis is None:
        return NOT_IN_MEMORY_ANSWER
    best = context.basis
    return f"{best['text']} (session {best['session']}, {best['t_start']:.1f}-{best['t_end']:.1f}s)"


class MemVerse:
    """MemVerse's short-term window and long-term knowledge graph, fed by video, dialogue and text.

    Parameters
    ----------
    text_encoder : TextEncoder
        Embeds chunk texts, node names and questions.
    frame_encoder : FrameEncoder, optional
        Needed by :meth:`push_frames` (labels feed the extractor).
    config : MemVerseConfig, optional
    extractor : Extractor or callable(chunk, context) -> Extraction, optional
        Default :class:`CooccurrenceExtractor` (deterministic, not a model).
    captioner : Captioner, optional
        Captions video events (default ``LabelCaptioner``).
    answer_fn : callable(MemVerseContext) -> str, optional
        Turns a context into an answer (a user's model); none by default.
        Called only for a context whose outcome is answered.
    calibration : Calibration, optional
        Decides the confidence and outcome of each question (default:
        ``calibration.default_calibration(text_encoder)``).

    Single-threaded.  Timestamps are seconds on one clock for the whole
    memory (non-decreasing across sessions: the budget's recency uses them).
    """

    def __init__(self, text_encoder, frame_encoder=None, *, config: MemVerseConfig | None = None, extractor=None,
                 captioner=None, answer_fn: Callable | None = None, calibration: Calibration | None = None):
        if text_encoder is None:
            raise ValueError("text_encoder is required (chunks, entities and questions are embedded with it)")
        config = MemVerseConfig() if config is None else config
        if not isinstance(config, MemVerseConfig):
            raise ValueError(f"config must be a MemVerseConfig, got {config!r}")
        if extractor is not None and not (hasattr(extractor, "extract") or callable(extractor)):
            raise ValueError("extractor must have .extract(chunk, context) or be a callable(chunk, context)")
        self.config = config
        self.text_encoder = text_encoder
        self.frame_encoder = frame_encoder
        self.extractor = extractor if extractor is not None else CooccurrenceExtractor()
        self.captioner = captioner if captioner is not None else LabelCaptioner()
        self.answer_fn = answer_fn
        if calibration is not None and not isinstance(calibration, Calibration):
            raise ValueError(f"calibration must be a Calibration or None, got {type(calibration).__name__}")
        self.calibration = calibration if calibration is not None else default_calibration(text_encoder)
        self.word_vectors = WordVectors(text_encoder)  # the ``related`` feature of answers
        self.graph = LongTermGraph(int(text_encoder.dim), backend=config.backend, scan_copy=config.scan_copy)
        self.window: deque[MemoryChunk] = deque()
        self.pending: list[MemoryChunk] = []
        self.session = 0
        self.stream_time: float | None = None
        self._next_chunk = 0
        self._last_consolidated: tuple[MemoryChunk, tuple[str, ...]] | None = None
        self.evictions: list[GraphEvictionReport] = []
        self.questions = 0
        self.timings: Counter = Counter()
        self.frames_seen = 0  # video frames pushed, every session
        self._new_video_front()

    # ---- video front end -------------------------------------------------------
    def _new_video_front(self) -> None:
        cfg = self.config
        threshold = PRESETS[cfg.preset].threshold if cfg.motion_threshold is None else cfg.motion_threshold
        self.gate = MotionGate(threshold, size=cfg.motion_size, backend=cfg.backend)
        seg = cfg.segmenter
        self.events = EventSegmenter(self.text_encoder, self.captioner, window=seg.window, tau=seg.tau,
                                     min_depth=seg.min_depth, max_event=seg.max_event, drift=seg.drift,
                                     flash=seg.flash, backend=cfg.backend)
        self._open: list[FrameRecord] = []  # frames pushed to the segmenter and not yet in a closed event
        self._open_first = 0  # segmenter index of _open[0]

    def push_frames(self, timestamps, frames) -> list[MemoryChunk]:
        """Gate, encode and segment video frames; returns the chunks of the events they closed.

        Parameters
        ----------
        timestamps : float or (n,) sequence of float
            Seconds, non-decreasing.
        frames : (n, H, W, 3) or (H, W, 3) uint8 RGB
        """
        if self.frame_encoder is None:
            raise ValueError("this MemVerse has no frame_encoder; pass one to push video frames")
        frames = np.asarray(frames) if not isinstance(frames, torch.Tensor) else frames
        if frames.ndim == 3:
            frames = frames[None]
        if frames.ndim != 4 or frames.shape[0] < 1 or frames.shape[-1] != 3 or frames.dtype not in (np.uint8,
                                                                                                      torch.uint8):
            raise ValueError(f"frames must be uint8 of shape (n, H, W, 3) or (H, W, 3), got {frames.dtype} "
                             f"{tuple(frames.shape)}")
        times = self._check_times(timestamps, frames.shape[0])
        t0 = time.perf_counter()
        _, kept = self.gate.push(frames)
        rows = [i for i, k in enumerate(kept) if k]
        indices = list(range(self.frames_seen, self.frames_seen + frames.shape[0]))
        self.frames_seen += frames.shape[0]
        t1 = time.perf_counter()
        out = []
        if rows:
            encoded = encode_frames(self.frame_encoder, frames[rows])
            t2 = time.perf_counter()
            for record in StreamMemory.records([indices[i] for i in rows], [times[i] for i in rows], encoded):
                self._open.append(record)
                out += [self._video_chunk(e) for e in self.events.push(record)]
            self.timings["frame_encode"] += t2 - t1
            self.timings["segment"] += time.perf_counter() - t2
        self.timings["motion_gate"] += t1 - t0
        self._advance(times[-1])
        return out

    def end_video(self) -> list[MemoryChunk]:
        """Close the open video event (end of a clip); returns its chunk(s)."""
        return [self._video_chunk(e) for e in self.events.flush()]

    def _video_chunk(self, entry) -> MemoryChunk:
        n = entry.last_frame - entry.first_frame + 1
        start = entry.first_frame - self._open_first
        frames, self._open = self._open[start:start + n], self._open[start + n:]
        self._open_first = entry.last_frame + 1
        counts = Counter(label for f in frames for label in f.labels)
        labels = tuple(name for name, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
                       [: self.config.labels_per_chunk])
        chunk = MemoryChunk(self._new_chunk_id(), self.session, entry.t_start, entry.t_end, "video", entry.caption,
                            labels, None, frames[0].index, frames[-1].index, entry.embedding.float())
        self._push(chunk)
        return chunk

    # ---- dialogue and text --------------------------------------------------------
    def add_turn(self, timestamp: float, speaker: str, text: str, labels: Sequence[str] = ()) -> MemoryChunk:
        """One dialogue turn (embedded as ``"speaker: text"``)."""
        return self.add_texts([timestamp], [text], speakers=[speaker], labels=[labels], modality="dialogue")[0]

    def add_texts(self, timestamps, texts: Sequence[str], *, speakers: Sequence[str | None] | None = None,
                  labels: Sequence[Sequence[str]] | None = None, modality: str = "text") -> list[MemoryChunk]:
        """Several text chunks at once (one encoder call), in order.

        ``speakers`` (dialogue turns) and ``labels`` (names attached to each
        text, e.g. an upstream tagger's) are optional, one entry per text.
        """
        if isinstance(texts, str) or not all(isinstance(t, str) and t.strip() for t in texts):
            raise ValueError("texts must be a sequence of non-empty strings")
        texts = [str(t) for t in texts]
        n = len(texts)
        if n == 0:
            return []
        speakers = [None] * n if speakers is None else list(speakers)
        labels = [()] * n if labels is None else [tuple(x) for x in labels]
        if len(speakers) != n or len(labels) != n:
            raise ValueError(f"speakers and labels must hold one entry per text ({n}), got {len(speakers)} and "
                             f"{len(labels)}")
        if not all(s is None or (isinstance(s, str) and s.strip()) for s in speakers):
            raise ValueError("speakers must be non-empty strings or None")
        if not all(isinstance(x, str) for ls in labels for x in ls):
            raise ValueError("labels must be sequences of strings")
        speakers = [None if x is None else str(x) for x in speakers]
        labels = [tuple(str(x) for x in ls) for ls in labels]  # plain str (numpy's would not load weights_only)
        if not isinstance(modality, str) or not modality:
            raise ValueError(f"modality must be a non-empty string, got {modality!r}")
        times = self._check_times(timestamps, n)
        t0 = time.perf_counter()
        shown = [t if s is None else f"{s}: {t}" for s, t in zip(speakers, texts)]
        emb = F.normalize(encode_texts(self.text_encoder, shown), dim=1)
        self.timings["text_encode"] += time.perf_counter() - t0
        out = []
        for i in range(n):
            chunk = MemoryChunk(self._new_chunk_id(), self.session, times[i], times[i], modality, shown[i],
                                labels[i], speakers[i], embedding=emb[i].clone())
            self._push(chunk)
            out.append(chunk)
        self._advance(times[-1])
        return out

    # ---- short-term -> long-term ----------------------------------------------------
    def _new_chunk_id(self) -> int:
        self._next_chunk += 1
        return self._next_chunk - 1

    def _push(self, chunk: MemoryChunk) -> None:
        self.window.append(chunk)
        while len(self.window) > self.config.window:
            self.pending.append(self.window.popleft())
        if len(self.pending) >= self.config.consolidate_every:
            self.consolidate()

    def consolidate(self, *, everything: bool = False) -> dict | None:
        """Write the chunks that left the window (``everything``: the window too) into the graph."""
        batch = self.pending + (list(self.window) if everything else [])
        self.pending = []
        if everything:
            self.window.clear()
        if not batch:
            return None
        t0 = time.perf_counter()
        batch_names: set[str] = set()
        extractions = []
        previous = self._last_consolidated
        for chunk in batch:
            if previous is not None and previous[0].session != chunk.session:
                previous = None
            context = ExtractionContext(previous[0] if previous else None, previous[1] if previous else (),
                                        lambda name: name_key(name) in batch_names or self.graph.has_entity(name))
            ext = _call_extractor(self.extractor, chunk, context)
            extractions.append(ext)
            names = ext.entities + tuple(x for h, _, t in ext.relations for x in (h, t))
            batch_names.update(name_key(x) for x in names)
            previous = (chunk, ext.entities)
        self._last_consolidated = previous
        t1 = time.perf_counter()
        now = max(c.t_end for c in batch)
        added = self.graph.consolidate(batch, extractions, self._embed, now)
        t2 = time.perf_counter()
        self.timings["extract"] += t1 - t0
        self.timings["consolidate"] += t2 - t1
        if self.config.budget is not None:
            self.enforce_budget()
        return added

    def enforce_budget(self) -> GraphEvictionReport | None:
        cfg = self.config
        if cfg.budget is None or self.stream_time is None:
            return None
        t0 = time.perf_counter()
        report = self.graph.evict(cfg.budget, self.stream_time, alpha=cfg.alpha, beta=cfg.beta, tau=cfg.tau,
                                  low_water=cfg.low_water)
        self.timings["budget"] += time.perf_counter() - t0
        if report is not None:
            self.evictions.append(report)
        return report

    def end_session(self) -> dict | None:
        """Close the open video event, consolidate the window into the graph and start a new session."""
        self.end_video()
        added = self.consolidate(everything=True)
        self.session += 1
        self._last_consolidated = None
        self._new_video_front()
        return added

    def _embed(self, texts: list[str]) -> torch.Tensor:
        t0 = time.perf_counter()
        out = encode_texts(self.text_encoder, texts)
        self.timings["text_encode"] += time.perf_counter() - t0
        return out

    def _check_times(self, timestamps, n: int) -> list[float]:
        kind = np.asarray(timestamps.detach() if isinstance(timestamps, torch.Tensor) else timestamps).dtype.kind
        if kind not in "iuf":  # "9" would convert to 9.0: a time is a number, never text
            raise ValueError(f"timestamps must be numbers (seconds), got {timestamps!r:.60}")
        times = [timestamps] if np.ndim(timestamps) == 0 else list(np.asarray(timestamps, np.float64).reshape(-1))
        if len(times) != n:
            raise ValueError(f"timestamps must hold one time per item ({n}), got {len(times)}")
        times = [float(t) for t in times]
        if not all(math.isfinite(t) for t in times):
            raise ValueError("timestamps must be finite")
        previous = -math.inf if self.stream_time is None else self.stream_time
        for t in times:
            if t < previous:
                raise ValueError(f"timestamps must not decrease, got {t} after {previous}")
            previous = t
        return times

    def _advance(self, t: float) -> None:
        self.stream_time = t if self.stream_time is None else max(self.stream_time, t)

    # ---- questions --------------------------------------------------------------------
    def encode_questions(self, questions: Sequence[str]) -> torch.Tensor:
        """(Q, E) normalised question embeddings."""
        if isinstance(questions, str) or not questions or not all(isinstance(q, str) and q.strip()
                                                                  for q in questions):
            raise ValueError("questions must be a non-empty sequence of non-empty strings")
        return F.normalize(encode_texts(self.text_encoder, questions), dim=1)

    def resolve(self, questions: Sequence[str]) -> list[Resolution]:
        """Each question with its ``"X's R"`` possessives resolved through the graph
        (``hops.resolve_possessives``; consolidates pending chunks first).  With
        ``config.resolve_possessives`` off, the questions as they are."""
        if isinstance(questions, str) or not all(isinstance(q, str) and q.strip() for q in questions):
            raise ValueError("questions must be a sequence of non-empty strings")
        if not self.config.resolve_possessives:
            return [Resolution(q) for q in questions]
        if self.pending:
            self.consolidate()
        return [resolve_possessives(self.graph, q, self.encode_questions) for q in questions]

    def search(self, query_embeddings: torch.Tensor, *, update_access: bool = False,
               bridges: torch.Tensor | None = None) -> GraphHits:
        """Long-term graph search for Q embedded questions (consolidates pending chunks first); ``bridges``
        (Q, b) relation nodes whose chunks lead (``LongTermGraph.search``)."""
        if self.pending:
            self.consolidate()
        cfg = self.config
        hits = self.graph.search(query_embeddings, seeds=cfg.seeds, hops=cfg.hops, capacity=cfg.capacity,
                                 max_fanout=cfg.max_fanout, max_frontier=cfg.max_frontier, min_score=cfg.min_score,
                                 chunks=cfg.chunks, chunks_per_node=cfg.chunks_per_node, ranking=cfg.ranking,
                                 bridges=bridges)
        if update_access and self.stream_time is not None:
            self.graph.touch(torch.cat([hits.chunk_nodes, hits.seeds], 1), hits.chunks, self.stream_time)
        return hits

    def search_flat(self, query_embeddings: torch.Tensor, chunks: int | None = None):
        """The baseline over the same long-term chunks: (rows, scores) of a cosine top-k."""
        if self.pending:
            self.consolidate()
        return self.graph.search_flat(query_embeddings, self.config.chunks if chunks is None else chunks)

    def ask(self, question: str, *, answer: bool = True) -> MemVerseContext:
        """The short-term window, the graph's chunks, facts and seeds for a question, and its answer.

        The answer rests on the retrieved chunk (long-term and window) closest
        to the question by cosine (``basis``; the graph's rank is how it was
        found, not what it says); below the calibration's threshold the
        outcome is not in memory and the answer ``NOT_IN_MEMORY_ANSWER``.  A question
        with a time reference ("in the last minute", "at the beginning",
        "before X", ``components.timeref``) is answered from the chunks (long-term
        and window) whose span meets its window, ranked by cosine (by nearness
        to the reference for a question with no content words of its own).
        ``answer_fn`` (when given) is called for answered contexts only.
        """
        t0 = time.perf_counter()
        ref = parse_time_reference(question)
        resolved = Resolution(question)
        if self.config.mode != "flat" and ref is None:
            resolved = self.resolve([question])[0]
        q_all = self.encode_questions(list(dict.fromkeys([question, resolved.question])))
        q, q_graph = q_all[:1], q_all[-1:]  # the question as asked (flat), and as resolved (graph)
        t1 = time.perf_counter()
        hits = self.search(q_graph, update_access=True,
                           bridges=torch.tensor([resolved.bridges]) if resolved.bridges else None)
        g = self.graph
        short = [c.view(float(c.embedding @ q[0])) for c in self.window]
        graph_chunks = [(row, score, g.texts[node]) for row, score, node in
                        zip(hits.chunks[0].tolist(), hits.chunk_scores[0].tolist(), hits.chunk_nodes[0].tolist())
                        if row >= 0]
        ranked = graph_chunks
        if self.config.mode != "graph":
            t2 = time.perf_counter()
            rows, scores = self.search_flat(q_graph)  # the flat mode never resolves: q_graph is q
            flat = [(row, score, "flat cosine") for row, score in zip(rows[0].tolist(), scores[0].tolist())
                    if row >= 0]
            ranked = flat if self.config.mode == "flat" else interleave(flat, graph_chunks, self.config.chunks)
            hits.timings["flat"] = time.perf_counter() - t2
        chunks = []
        for row, score, via in ranked:
            view = g.chunks[row].view(score)
            view["via"] = via
            chunks.append(view)
        kinds = g.kinds
        facts, seeds = [], []
        if self.config.facts_order == "lightrag":
            facts = [{"fact": g.texts[rel], "rank": rank, "weight": weight}
                     for rel, rank, weight in g.seed_relations(hits.seeds[:1], limit=self.config.facts)[0]]
        else:
            for node, score, hop in zip(hits.nodes[0].tolist(), hits.node_scores[0].tolist(),
                                        hits.node_hops[0].tolist()):
                if node >= 0 and len(facts) < self.config.facts and int(kinds[node]) == RELATION:
                    facts.append({"fact": g.texts[node], "score": round(score, 4), "hop": hop})
        for node, score in zip(hits.seeds[0].tolist(), hits.seed_scores[0].tolist()):
            if node >= 0:
                seeds.append({"node": g.texts[node], "kind": "relation" if int(kinds[node]) else "entity",
                              "score": round(score, 4)})
        t3 = time.perf_counter()
        ctx = MemVerseContext(question, self.stream_time, short, chunks, facts, seeds, {})
        if resolved.bridges:
            ctx.resolved = resolved.question
        candidates = ([(g.chunks[row], via) for row, _, via in ranked] + [(c, None) for c in self.window]
                      if ref is None else self._time_candidates(ctx, ref, q[0]))
        self._decide(ctx, ref.question if ref is not None else resolved.question, candidates, q_graph[0])
        timings = {"question_encode": t1 - t0, **hits.timings, "decide": time.perf_counter() - t3,
                   "total": time.perf_counter() - t0}
        ctx.timings = timings
        self.questions += 1
        if answer and self.answer_fn is not None:
            ctx.answer = self.answer_fn(ctx) if ctx.outcome == Outcome.ANSWERED else NOT_IN_MEMORY_ANSWER
        return ctx

    def _decide(self, ctx: MemVerseContext, question: str, candidates: list, q: torch.Tensor) -> None:
        """Basis: the candidate chunk closest to the question (cosine; ties: the earlier); then its features,
        confidence and outcome."""
        best = None
        for chunk, via in candidates:
            cosine = float(chunk.embedding @ q)
            if best is None or cosine > best[0]:
                best = (cosine, chunk, via)
        if best is None:
            ctx.basis, ctx.features, ctx.confidence, ctx.outcome = None, {}, 0.0, Outcome.NOT_IN_MEMORY
            return
        cosine, chunk, via = best
        texts = [chunk.text] + ([via] if via and via != "flat cosine" else [])
        ctx.features = answer_features(question, texts, cosine, word_vectors=self.word_vectors)
        ctx.confidence, ctx.outcome = self.calibration.decide(ctx.features)
        ctx.basis = {**chunk.view(cosine), "via": via, "confidence": round(ctx.confidence, 4)}

    def _time_candidates(self, ctx: MemVerseContext, ref: TimeReference, q: torch.Tensor) -> list:
        """The chunks (long-term and window) inside a time reference's window, best first (``rank_in_window``);
        fills ``ctx.time_reference``.  Empty when the window holds none or the anchor of "before X" / "after
        X" is not in memory."""
        pool = list(self.graph.chunks) + list(self.window)
        reference = ref.to_dict()
        ctx.time_reference = reference
        if not pool or self.stream_time is None:
            reference["reason"] = "the memory is empty"
            return []
        start, now = min(c.t_start for c in pool), float(self.stream_time)
        emb = torch.stack([c.embedding for c in pool]).float()
        anchor_span = None
        if ref.anchor is not None:
            a = self.encode_questions([ref.anchor])[0]
            scores = (emb @ a).tolist()
            j = max(range(len(pool)), key=lambda i: (scores[i], -i))
            conf, outcome = self.calibration.decide(answer_features(ref.anchor, pool[j].text, scores[j],
                                                                    word_vectors=self.word_vectors))
            reference["anchor_match"] = {**pool[j].view(scores[j]), "confidence": round(conf, 4)}
            if outcome != Outcome.ANSWERED:
                reference["reason"] = "the anchor is not in memory"
                return []
            anchor_span = (pool[j].t_start, pool[j].t_end)
        lo, hi = ref.window(stream_start=start, now=now, anchor_span=anchor_span)
        reference["window"] = [round(lo, 3), round(hi, 3)]
        order = rank_in_window(ref, [c.t_start for c in pool], [c.t_end for c in pool], (emb @ q).tolist(),
                               generic=not content_words(ref.question), stream_start=start, now=now,
                               anchor_span=anchor_span)
        if not order:
            reference["reason"] = "nothing in memory in that span"
        return [(pool[i], None) for i in order[:1]]

    # ---- reporting and checkpoints --------------------------------------------------------
    def summary(self) -> dict:
        g = self.graph
        out = {"session": self.session, "stream_time": self.stream_time, "frames_seen": self.frames_seen,
               "short_term_chunks": len(self.window), "pending_chunks": len(self.pending),
               "long_term_chunks": g.num_chunks, "entities": g.num_entities, "relations": g.num_relations,
               "graph_entries": g.num_edges, "cost_words": g.cost(), "questions": self.questions,
               "extractor": getattr(self.extractor, "name", type(self.extractor).__name__),
               "component_seconds": {k: round(v, 4) for k, v in sorted((self.timings + g.timings).items())}}
        if self.config.budget is not None:
            out["budget"] = {"budget": self.config.budget, "rounds": len(self.evictions),
                             "chunks_removed": sum(r.chunks for r in self.evictions),
                             "relations_removed": sum(r.relations for r in self.evictions),
                             "entities_removed": sum(r.entities for r in self.evictions)}
        return out

    def state_dict(self) -> dict:
        """The whole memory (window, pending chunks, graph, video front end, counters); models are not state.

        An open video event is kept (frames and segmenter state), so pushing
        continues exactly where it stopped.
        """
        last = self._last_consolidated
        return {
            "format": _FORMAT, "version": _VERSION, "config": self.config.to_dict(),
            "encoders": {"text": encoder_spec(self.text_encoder), "text_dim": int(self.text_encoder.dim),
                         "frame": encoder_spec(self.frame_encoder)},
            "session": self.session, "stream_time": self.stream_time, "next_chunk": self._next_chunk,
            "questions": self.questions, "frames_seen": self.frames_seen,
            "window": _chunks_state(list(self.window)), "pending": _chunks_state(self.pending),
            "last_consolidated": None if last is None else {"chunk": _chunks_state([last[0]]),
                                                            "entities": list(last[1])},
            "graph": self.graph.state_dict(),
            "gate": self.gate.state_dict(), "events": self.events.state_dict(),
            "open": records_state(self._open), "open_first": self._open_first,
            "evictions": [asdict(r) for r in self.evictions], "timings": dict(self.timings),
        }

    def load_state_dict(self, state) -> None:
        """Restore ``state_dict()`` output (a dict, or a ``checkpoint.StateReader`` of a file).  Every
        field is checked before the memory changes (``state_checks.check_memverse_state``), each
        failure one ``ValueError`` naming the field (and the file)."""
        reader = reader_for(state, "MemVerse")
        check_memverse_state(reader, _FORMAT, _VERSION, self.config, int(self.text_encoder.dim))
        state = reader.state
        self._new_video_front()
        self.session, self.stream_time = int(state["session"]), state["stream_time"]
        self._next_chunk, self.questions = int(state["next_chunk"]), int(state["questions"])
        self.window = deque(_chunks_from_state(state["window"]))
        self.pending = _chunks_from_state(state["pending"])
        last = state["last_consolidated"]
        self._last_consolidated = None if last is None else (_chunks_from_state(last["chunk"])[0],
                                                             tuple(last["entities"]))
        reader.restore("graph", lambda: self.graph.load_state_dict(state["graph"]))
        reader.restore("gate", lambda: self.gate.load_state_dict(state["gate"]))
        reader.restore("events", lambda: self.events.load_state_dict(state["events"]))
        self._open, self._open_first = records_from_state(state["open"]), int(state["open_first"])
        self.frames_seen = int(state["frames_seen"])
        self.evictions = [GraphEvictionReport(**r) for r in state["evictions"]]
        self.timings = Counter(state["timings"])

    def save(self, directory) -> Path:
        """``state.pt`` (a checkpoint file: ``streammem.checkpoint``'s header, SHA-256 and atomic
        replacement) and a readable ``memverse.json`` in ``directory``."""
        directory = ensure_folder(directory)
        state = self.state_dict()
        info = {"format": _FORMAT, "version": _VERSION, "config": state["config"], "encoders": state["encoders"],
                "summary": self.summary()}
        atomic_write(directory / "memverse.json", lambda fh: fh.write(json.dumps(info, indent=1).encode()))
        save_checkpoint(directory / "state.pt", "MemVerse", state, version=_VERSION)
        return directory

    @classmethod
    def load(cls, directory, text_encoder=None, frame_encoder=None, **hooks) -> "MemVerse":
        """A memory saved with :meth:`save`; encoders not passed are rebuilt from their saved spec.

        ``hooks``: ``extractor``, ``captioner``, ``answer_fn``, ``calibration`` (code and settings, not state).
        """
        path = Path(directory) / "state.pt"
        if not path.is_file():
            raise FileNotFoundError(f"no saved MemVerse in {directory} (missing state.pt)")
        state, _ = load_checkpoint(path, "MemVerse", versions=(_VERSION,))
        reader = StateReader(path, "MemVerse", state)
        specs = reader.dict("encoders")
        frame_encoder, text_encoder = reader.restore("encoders",
                                                     lambda: encoders_from_specs(specs, frame_encoder, text_encoder))
        config = reader.restore("config", lambda: MemVerseConfig.from_dict(reader.dict("config")))
        memory = cls(text_encoder, frame_encoder, config=config, **hooks)
        memory.load_state_dict(reader)
        return memory
