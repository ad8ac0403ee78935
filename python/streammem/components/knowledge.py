"""StreamRAG's event knowledge base and knowledge injection; StreamChat's dialogue memory.

* ``EventSegmenter`` closes events with ``StreamingSegmenter`` (depth scores in
  a sliding window) on kept-frame features; ``KnowledgeBase`` stores one caption
  and its embedding per event.
* ``KnowledgeInjector`` (StreamRAG sec. 3.4) decides how much of the knowledge
  base a question needs: S_c = gamma * S_t + (1 - gamma) * (1 - S_r), with S_r
  the mean cosine of the top-3 captions and S_t the question's instantaneity.
* ``DialogueMemory`` (StreamChat sec. 3.1.2): every (question, answer) is
  embedded once and appended to a faiss ``IndexFlatIP`` over normalised
  vectors; the public code rebuilds its index after every answer.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from streammem_kernels.extras import require

from ..checks import check_int, check_real
from ..config import MAX_SEGMENTER_WINDOW
from ..models.encoders import encode_texts
from .memory import FrameRecord, LabelCaptioner, check_query_embedding, records_from_state, records_state

__all__ = [
    "EventSegmenter",
    "KnowledgeEntry",
    "KnowledgeBase",
    "InstantaneityScorer",
    "KnowledgeInjector",
    "DialogueEntry",
    "DialogueMemory",
    "EmbeddingMatrix",
]


@dataclass
class KnowledgeEntry:
    """One closed event: its frames (kept-frame positions), time span and caption."""

    event_id: int
    first_frame: int
    last_frame: int
    t_start: float
    t_end: float
    caption: str
    embedding: torch.Tensor  # (E,) normalised
    frames: int


class EmbeddingMatrix:
    """Append-only (n, E) float32 rows with amortised doubling (no copy per append).

    ``append(v)`` adds one (E,) row; ``rows`` is the (n, E) view of the rows so far.  Not
    thread-safe: one writer at a time, and a reader's ``rows`` may be replaced by a later append.
    """

    def __init__(self):
        self._rows = torch.zeros(0, 0)
        self.n = 0

    def append(self, v: torch.Tensor) -> None:
        if self.n == 0 and self._rows.shape[1] != v.shape[0]:
            self._rows = torch.zeros(16, v.shape[0])
        if self.n == self._rows.shape[0]:
            grown = torch.zeros(2 * self._rows.shape[0], self._rows.shape[1])
            grown[: self.n] = self._rows[: self.n]
            self._rows = grown
        self._rows[self.n] = v
        self.n += 1

    @property
    def rows(self) -> torch.Tensor:
        return self._rows[: self.n]


class KnowledgeBase:
    """Event captions and their embeddings, searched exactly with ``cosine_topk``.

    Not thread-safe: one caller at a time (``add`` may grow the matrix that
    ``search`` reads).
    """

    def __init__(self):
        self.entries: list[KnowledgeEntry] = []
        self._matrix = EmbeddingMatrix()

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, entry: KnowledgeEntry) -> None:
        self.entries.append(entry)
        self._matrix.append(F.normalize(entry.embedding.float(), dim=0))

    def search(self, query_embedding: torch.Tensor, k: int) -> list[tuple[float, KnowledgeEntry]]:
        """Top-k entries by cosine, best first."""
        k = check_int(k, "k", 1)
        q = check_query_embedding(query_embedding, self._matrix.rows.shape[1] if self.entries else None)
        if not self.entries:
            return []
        from streammem_kernels import cosine_topk

        res = cosine_topk(q[None], self._matrix.rows, min(k, len(self.entries)))
        scores, ids = _topk_fields(res)
        return [(float(s), self.entries[int(i)]) for s, i in zip(scores[0].tolist(), ids[0].tolist()) if int(i) >= 0]

    def latest(self) -> KnowledgeEntry | None:
        return self.entries[-1] if self.entries else None

    def state_dict(self) -> dict:
        e = self.entries
        state = {name: [getattr(x, name) for x in e] for name in _ENTRY_SCALARS}
        state["embedding"] = torch.stack([x.embedding for x in e]) if e else None
        return state

    def load_state_dict(self, state: dict) -> None:
        self.entries = []
        self._matrix = EmbeddingMatrix()
        for i in range(len(state["event_id"])):
            self.add(KnowledgeEntry(**{name: state[name][i] for name in _ENTRY_SCALARS},
                                    embedding=state["embedding"][i].clone()))


_ENTRY_SCALARS = ("event_id", "first_frame", "last_frame", "t_start", "t_end", "caption", "frames")


def _topk_fields(res):
    """(scores, ids) from a ``cosine_topk`` result (named fields or a (scores, ids) pair)."""
    if hasattr(res, "scores") and hasattr(res, "ids"):
        return res.scores, res.ids
    if hasattr(res, "values") and hasattr(res, "indices"):
        return res.values, res.indices
    scores, ids = res
    return scores, ids


class EventSegmenter:
    """Closes events over kept-frame features and captions them into a knowledge base.

    Parameters
    ----------
    text_encoder : TextEncoder
    captioner : Captioner, optional
        Default ``LabelCaptioner()``; receives the previous event's caption so a
        language-model captioner can reuse its prefix.
    knowledge_base : KnowledgeBase, optional
    window, tau, min_depth, max_event, drift, flash, backend
        Passed to ``streammem_kernels.StreamingSegmenter``.  ``window`` is at
        most 4096; ``max_event`` (default 250 frames) bounds the frames held
        for the open event; ``flash`` defaults to 0 (off), since the frames
        pushed here are usually the motion gate's kept frames, where a still
        shot is one frame (``SegmenterConfig``).

    Not thread-safe: one caller at a time.
    """

    def __init__(self, text_encoder, captioner=None, knowledge_base: KnowledgeBase | None = None, *,
                 window: int = 8, tau: float = 0.7, min_depth: float = 0.2, max_event: int | None = 250,
                 drift: float | None = None, flash: int = 0, backend: str = "auto"):
        from streammem_kernels import StreamingSegmenter

        window = check_int(window, "window", 2, MAX_SEGMENTER_WINDOW)
        self.segmenter = StreamingSegmenter(window=window, tau=tau, min_depth=min_depth, max_event=max_event,
                                            drift=drift, flash=flash, backend=backend)
        self.text_encoder = text_encoder
        self.captioner = captioner if captioner is not None else LabelCaptioner()
        self.knowledge_base = knowledge_base if knowledge_base is not None else KnowledgeBase()
        self._open: list[FrameRecord] = []  # frames since the last boundary, oldest first
        self._first = 0  # segmenter frame index of _open[0]
        self.timings: Counter = Counter()

    def push(self, record: FrameRecord, closed: list | None = None) -> list[KnowledgeEntry]:
        """Add a kept frame; returns the knowledge entries of the events it closed.

        ``closed``: the events this frame closes, when the caller already pushed
        the frame's feature into ``self.segmenter`` (``StreamingSegmenter.push_many``
        batches that over many streams); None pushes it here.
        """
        self._open.append(record)
        if closed is None:
            t0 = time.perf_counter()
            closed = self.segmenter.push(record.feature.float())
            self.timings["segment"] += time.perf_counter() - t0
        return [self._close(e.start, e.end) for e in closed]

    def flush(self) -> list[KnowledgeEntry]:
        return [self._close(e.start, e.end) for e in self.segmenter.flush()]

    @property
    def open_frames(self) -> int:
        return len(self._open)

    def state_dict(self) -> dict:
        """Segmenter state, the open event's frames and the knowledge base."""
        return {"segmenter": self.segmenter.state_dict(), "open": records_state(self._open),
                "first": self._first, "knowledge_base": self.knowledge_base.state_dict(),
                "timings": dict(self.timings)}

    def load_state_dict(self, state: dict) -> None:
        self.segmenter.load_state_dict(state["segmenter"])
        self._open = records_from_state(state["open"])
        self._first = int(state["first"])
        self.knowledge_base.load_state_dict(state["knowledge_base"])
        self.timings = Counter(state.get("timings", {}))

    def _close(self, start: int, end: int) -> KnowledgeEntry:
        if start != self._first:
            raise RuntimeError(f"segmenter emitted event starting at {start}, expected {self._first}")
        n = end - start + 1
        frames, self._open = self._open[:n], self._open[n:]
        self._first = end + 1
        previous = self.knowledge_base.latest()
        t0 = time.perf_counter()
        caption = self.captioner.caption_frames(frames, previous.caption if previous else None)
        self.timings["caption"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        emb = F.normalize(encode_texts(self.text_encoder, [caption])[0], dim=0)
        self.timings["text_encode"] += time.perf_counter() - t0
        entry = KnowledgeEntry(len(self.knowledge_base), start, end, frames[0].timestamp, frames[-1].timestamp,
                               caption, emb, n)
        self.knowledge_base.add(entry)
        return entry


# --------------------------------------------------------------------------
# Knowledge injection (StreamRAG sec. 3.4)
# --------------------------------------------------------------------------
NOW_EXAMPLES = (
    "What is happening right now?",
    "What is the person doing now?",
    "What can you see at the moment?",
    "What is on the screen currently?",
    "Where is he going now?",
    "What colour is the car in front of us now?",
)
BEFORE_EXAMPLES = (
    "What happened earlier in the video?",
    "What did the person do before?",
    "What did we see at the beginning?",
    "Where was he a few minutes ago?",
    "What happened before the cyclist appeared?",
    "Earlier, which vehicles passed by?",
)


class InstantaneityScorer:
    """S_t in [0, 1]: how much a question is about the present.

    Compares the question's embedding with small example sets of "happening
    now" and "happened before" questions: S_t = (1 + max cos(now) - max cos(before)) / 2.
    Thread-safe: calls only read the example embeddings.
    """

    def __init__(self, text_encoder, now_examples: Sequence[str] = NOW_EXAMPLES,
                 before_examples: Sequence[str] = BEFORE_EXAMPLES):
        self._now = encode_texts(text_encoder, now_examples)
        self._before = encode_texts(text_encoder, before_examples)

    def __call__(self, question: str, query_embedding: torch.Tensor) -> float:
        q = F.normalize(torch.as_tensor(query_embedding, dtype=torch.float32).reshape(-1), dim=0)
        now = float((self._now @ q).max())
        before = float((self._before @ q).max())
        return min(1.0, max(0.0, 0.5 * (1.0 + now - before)))


@dataclass
class Injection:
    """What the injector chose: the knowledge-base entries and its scores."""

    entries: list[tuple[float, KnowledgeEntry]]
    mode: str  # "latest", "top3" or "top5"
    s_t: float
    s_r: float
    s_c: float


class KnowledgeInjector:
    """Chooses knowledge-base captions for a question (StreamRAG sec. 3.4).

    S_c > theta1: only the latest caption (the question is about now and the
    base has little on it); theta2 < S_c <= theta1: the top-3; otherwise the
    top-5.  StreamRAG does not publish theta1 / theta2; 0.6 / 0.4 are our
    defaults, with S_t and S_r both in [0, 1].

    Holds no state of its own (it reads the knowledge base): ``select`` is as
    thread-safe as the knowledge base and the instantaneity scorer it calls.
    """

    def __init__(self, knowledge_base: KnowledgeBase, instantaneity: Callable[[str, torch.Tensor], float], *,
                 gamma: float = 0.5, theta1: float = 0.6, theta2: float = 0.4):
        self.gamma = check_real(gamma, "gamma", 0.0, 1.0)
        self.theta1 = check_real(theta1, "theta1")
        self.theta2 = check_real(theta2, "theta2")
        if not self.theta2 <= self.theta1:
            raise ValueError(f"theta2 must be <= theta1, got theta1={theta1!r}, theta2={theta2!r}")
        self.knowledge_base = knowledge_base
        self.instantaneity = instantaneity

    def select(self, question: str, query_embedding: torch.Tensor) -> Injection:
        top5 = self.knowledge_base.search(query_embedding, 5)
        s_r = float(np.mean([s for s, _ in top5[:3]])) if top5 else 0.0
        s_t = float(self.instantaneity(question, query_embedding))
        s_c = self.gamma * s_t + (1.0 - self.gamma) * (1.0 - s_r)
        if s_c > self.theta1:
            latest = self.knowledge_base.latest()
            q = F.normalize(torch.as_tensor(query_embedding, dtype=torch.float32).reshape(-1), dim=0)
            chosen = [(float(latest.embedding @ q), latest)] if latest else []
            mode = "latest"
        elif s_c > self.theta2:
            chosen, mode = top5[:3], "top3"
        else:
            chosen, mode = top5, "top5"
        return Injection(chosen, mode, s_t, s_r, s_c)


# --------------------------------------------------------------------------
# Dialogue memory (StreamChat sec. 3.1.2)
# --------------------------------------------------------------------------
@dataclass
class DialogueEntry:
    question: str
    answer: str
    timestamp: float | None


class DialogueMemory:
    """(question, answer) pairs in an incremental faiss ``IndexFlatIP`` over normalised embeddings.

    Not thread-safe: one caller at a time, except ``embed`` (it only calls the
    text encoder), which schedulers run outside their lock.
    """

    def __init__(self, text_encoder):
        faiss = require("faiss", package="faiss-cpu", extra="pipeline", purpose="DialogueMemory")

        self.text_encoder = text_encoder
        self.index = faiss.IndexFlatIP(int(text_encoder.dim))
        self.entries: list[DialogueEntry] = []

    def __len__(self) -> int:
        return len(self.entries)

    def embed(self, question: str, answer: str) -> torch.Tensor:
        """(1, E) normalised embedding of one exchange (computed once, then appended)."""
        return F.normalize(encode_texts(self.text_encoder, [f"Q: {question} A: {answer}"]), dim=1)

    def add(self, question: str, answer: str, timestamp: float | None = None, *,
            embedding: torch.Tensor | None = None) -> None:
        """Append one exchange; ``embedding`` from ``embed`` when computed earlier (outside a lock)."""
        if embedding is None:
            emb = self.embed(question, answer)
        else:
            emb = F.normalize(check_query_embedding(embedding, int(self.index.d), "embedding")[None], dim=1)
        self.index.add(np.ascontiguousarray(emb.numpy(), dtype=np.float32))
        self.entries.append(DialogueEntry(question, answer, timestamp))

    def state_dict(self) -> dict:
        vectors = self.index.reconstruct_n(0, self.index.ntotal) if self.entries else None
        return {"question": [e.question for e in self.entries], "answer": [e.answer for e in self.entries],
                "timestamp": [e.timestamp for e in self.entries],
                "embedding": None if vectors is None else torch.from_numpy(np.array(vectors))}

    def load_state_dict(self, state: dict) -> None:
        import faiss

        self.index = faiss.IndexFlatIP(int(self.text_encoder.dim))
        self.entries = [DialogueEntry(q, a, t) for q, a, t in zip(state["question"], state["answer"],
                                                                  state["timestamp"])]
        if self.entries:
            self.index.add(np.ascontiguousarray(state["embedding"].numpy(), dtype=np.float32))

    def search(self, query_embedding: torch.Tensor, k: int = 3) -> list[tuple[float, DialogueEntry]]:
        """Top-k earlier exchanges by cosine with ``query_embedding`` ((E,), E = the text encoder's dim)."""
        k = check_int(k, "k", 1)
        q = F.normalize(check_query_embedding(query_embedding, int(self.index.d))[None], dim=1)
        if not self.entries:
            return []
        scores, ids = self.index.search(np.ascontiguousarray(q.numpy()), min(k, len(self.entries)))
        return [(float(s), self.entries[int(i)]) for s, i in zip(scores[0], ids[0]) if i >= 0]
