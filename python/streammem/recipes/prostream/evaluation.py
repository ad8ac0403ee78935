"""Recall accuracy and latency of ProStream against retrieve-everything and a recent window (the baselines,
``FlatTurnMemory``) on the same embeddings."""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ...components.knowledge import EmbeddingMatrix
from .config import ProStreamConfig
from .dialogue import Question, Turn
from .distill import Distiller
from .extract import FactExtractor
from .memory import ProStream, Recall, RecalledUnit

__all__ = ["evaluate", "FlatTurnMemory", "recalls_answer"]


def _turn_cost(text: str) -> int:
    return len(text.split()) + 1  # as BoundedMemory prices a turn: its words + its one embedding


class FlatTurnMemory:
    """Every turn (``window_tokens=None``: retrieve-everything) or the newest within a token budget.

    Recall is exact ``cosine_topk`` over the stored turns (the window is a
    view of the newest rows: nothing is copied), best ``k`` with cosine >=
    ``min_similarity``.  Same ``push`` / ``recall`` interface as :class:`ProStream`.
    """

    def __init__(self, text_encoder, *, window_tokens: int | None = None, k: int = 5, min_similarity: float = -1.0,
                 backend: str = "auto"):
        if window_tokens is not None and (isinstance(window_tokens, bool) or not isinstance(window_tokens, int)
                                          or window_tokens < 1):
            raise ValueError(f"window_tokens must be an int >= 1 or None, got {window_tokens!r}")
        self.text_encoder = text_encoder
        self.window_tokens = window_tokens
        self.k = k
        self.min_similarity = float(min_similarity)
        self.backend = backend
        self._rows = EmbeddingMatrix()
        self._turns: list[Turn] = []
        self._costs: list[int] = []
        self._start = 0  # first turn in the window
        self._window_cost = 0
        self.stream_time: float | None = None

    @property
    def name(self) -> str:
        return "retrieve-everything" if self.window_tokens is None else "recent-window"

    @property
    def stored_turns(self) -> int:
        return len(self._turns) - self._start

    @property
    def memory_tokens(self) -> int:
        return self._window_cost

    def push(self, turns: Turn | Sequence[Turn], embeddings: torch.Tensor | None = None) -> int:
        turns = [turns] if isinstance(turns, Turn) else list(turns)
        if not turns:
            return 0
        if embeddings is None:
            embeddings = self.text_encoder.encode([t.text for t in turns])
        embeddings = F.normalize(torch.as_tensor(embeddings).float(), dim=1)
        if embeddings.shape[0] != len(turns):
            raise ValueError(f"embeddings must hold one row per turn ({len(turns)}), got {embeddings.shape[0]}")
        for turn, emb in zip(turns, embeddings):
            self._rows.append(emb)
            self._turns.append(turn)
            cost = _turn_cost(turn.text)
            self._costs.append(cost)
            self._window_cost += cost
            self.stream_time = turn.t
        if self.window_tokens is not None:
            while self._window_cost > self.window_tokens and self._start < len(self._turns) - 1:
                self._window_cost -= self._costs[self._start]
                self._start += 1
        return 0

    def finish(self) -> int:
        return 0

    def recall(self, query_embedding, *, question: str = "", k: int | None = None) -> Recall:
        from streammem_kernels import cosine_topk

        k = self.k if k is None else k
        q = F.normalize(torch.as_tensor(query_embedding, dtype=torch.float32).reshape(1, -1), dim=1)
        t0 = time.perf_counter()
        units = []
        if self._turns:
            # The window is a view of the newest rows: nothing outside it is read (or validated).
            res = cosine_topk(q, self._rows.rows[self._start:], k, backend=self.backend)
            for i, s in zip(res.ids[0].tolist(), res.scores[0].tolist()):
                i += self._start
                if i >= self._start and s >= self.min_similarity:
                    turn = self._turns[i]
                    units.append(RecalledUnit(-1, i, i, turn.t, turn.speaker, turn.text, s, 1.0, s))
        latency = time.perf_counter() - t0
        return Recall(question, self.stream_time, units, latency, {"total": latency})


def recalls_answer(unit: RecalledUnit | None, q: Question) -> bool:
    """Whether a recalled unit answers ``q``: it covers the question's ground-truth turn, or (without one)
    its text holds the ground-truth answer."""
    if unit is None:
        return False
    if q.turn is not None:
        return unit.covers(q.turn)
    return q.answer is not None and q.answer.lower() in unit.text.lower()


def _percentiles(values: Sequence[float]) -> dict:
    if not values:
        return {"p20": None, "p50": None, "p80": None}
    a = np.asarray(values) * 1e3
    return {f"p{p}": round(float(np.percentile(a, p)), 4) for p in (20, 50, 80)}


def evaluate(items: Sequence[Turn | Question], text_encoder, *, config: ProStreamConfig | None = None,
             methods: Sequence[str] = ("prostream", "everything", "recent"),
             turn_embeddings: torch.Tensor | None = None,
             question_embeddings: torch.Tensor | None = None, distiller: Distiller | None = None,
             extractor: FactExtractor | None = None, keep_recalls: bool = False,
             keep_memories: bool = False) -> dict:
    """Stream ``items`` through each method, asking every question when it comes; score and time the recalls.

    Methods: ``"prostream"`` (:class:`ProStream`, with ``distiller`` and
    ``extractor`` when given), ``"everything"`` (retrieve-everything),
    ``"recent"`` (flat retrieval over the newest turns within
    ``config.budget`` tokens: flat RAG at ProStream's budget).  All three get
    the same embeddings (computed once here, or passed), the same ``k`` and
    ``min_similarity``, and every question's text.  A recall is
    correct when its best turn is the question's ground-truth turn (or states
    its answer); ``hit`` when any returned turn is; ``stale`` when the best
    turn is a superseded version.

    Returns a dict: per method ``accuracy`` / ``hit`` / ``stale`` per question
    kind and overall, recall latency percentiles (ms, question encoding
    excluded), push seconds, stored turns and memory tokens at the end, and
    ``summary`` (ProStream's) -- plus ``recalls`` (per method, per question)
    with ``keep_recalls``, and ``memory`` (the memory object after the stream)
    with ``keep_memories``.
    """
    config = ProStreamConfig() if config is None else config
    unknown = sorted(set(methods) - {"prostream", "everything", "recent"})
    if unknown or not methods:
        raise ValueError(f"methods must be among 'prostream', 'everything', 'recent', got {list(methods)}")
    turns = [x for x in items if isinstance(x, Turn)]
    questions = [x for x in items if isinstance(x, Question)]
    if len(turns) + len(questions) != len(items):
        raise ValueError("items must be Turn and Question objects")
    t0 = time.perf_counter()
    if turn_embeddings is None:
        turn_embeddings = text_encoder.encode([x.text for x in turns]) if turns else torch.zeros(0, text_encoder.dim)
    if question_embeddings is None:
        question_embeddings = (text_encoder.encode([x.question for x in questions]) if questions
                               else torch.zeros(0, text_encoder.dim))
    encode_s = time.perf_counter() - t0
    if turn_embeddings.shape[0] != len(turns) or question_embeddings.shape[0] != len(questions):
        raise ValueError("turn_embeddings / question_embeddings must hold one row per turn / question")

    def build(name):
        if name == "prostream":
            return ProStream(text_encoder, config, distiller=distiller, extractor=extractor)
        window = None if name == "everything" else config.budget
        return FlatTurnMemory(text_encoder, window_tokens=window, k=config.k, min_similarity=config.min_similarity,
                              backend=config.backend)

    report = {"turns": len(turns), "questions": len(questions), "encode_seconds": round(encode_s, 3), "methods": {}}
    for name in methods:
        memory = build(name)
        rows, push_s, ti, qi = [], 0.0, 0, 0
        pending: list[Turn] = []

        def flush_pending():
            nonlocal pending, ti, push_s
            if pending:
                t1 = time.perf_counter()
                memory.push(pending, turn_embeddings[ti:ti + len(pending)])
                push_s += time.perf_counter() - t1
                ti += len(pending)
                pending = []

        for item in items:
            if isinstance(item, Turn):
                pending.append(item)
                continue
            flush_pending()
            rec = memory.recall(question_embeddings[qi], question=item.question)
            qi += 1
            best = rec.best
            rows.append({"kind": item.kind or "all", "correct": recalls_answer(best, item),
                         "hit": any(recalls_answer(u, item) for u in rec.units),
                         "stale": best is not None and any(best.covers(i) for i in item.superseded),
                         "answered": best is not None, "latency": rec.latency_s, "recall": rec})
        flush_pending()
        t1 = time.perf_counter()
        memory.finish()
        push_s += time.perf_counter() - t1
        by_kind = {}
        for kind in sorted({r["kind"] for r in rows}) + ["all"]:
            sel = [r for r in rows if kind == "all" or r["kind"] == kind]
            by_kind[kind] = {"n": len(sel), **{m: round(sum(r[m] for r in sel) / len(sel), 4) if sel else None
                                               for m in ("correct", "hit", "stale", "answered")}}
        out = {"by_kind": by_kind, "latency_ms": _percentiles([r["latency"] for r in rows]),
               "push_seconds": round(push_s, 3), "push_us_per_turn": round(1e6 * push_s / max(1, len(turns)), 2),
               "stored_turns": memory.stored_turns, "memory_tokens": memory.memory_tokens}
        if name == "prostream":
            out["summary"] = memory.summary()
        if keep_recalls:
            out["recalls"] = [r["recall"] for r in rows]
        if keep_memories:
            out["memory"] = memory
        report["methods"][name] = out
    return report
