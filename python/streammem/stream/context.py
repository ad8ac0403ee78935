"""What a ``StreamMemory`` returns: the context assembled for a question (``Context``) and what one
``push`` did (``PushResult``)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..components.answers import Outcome

__all__ = ["Context", "PushResult", "node_view"]


@dataclass
class Context:
    """The assembled context for one question, its timings and optional answer.

    ``rpd_s`` is the request processing delay: from submission (or, for a
    question scheduled at a stream time, from its release at that time) until
    the context is ready; the answer hook's time is reported apart.

    ``knowledge_best``: the knowledge base's best event for the question
    (cosine; injected or not).  ``basis``: what the answer rests on -- ``{source, t_start, t_end, text,
    score}`` (source short_term, tree or knowledge; ``node`` / ``event`` its
    id), or None when nothing can answer.  ``time_reference``: the question's
    time reference, its window and anchor (None without one).  ``features``,
    ``confidence`` (in [0, 1]: the calibrated probability that the basis
    answers the question) and ``outcome`` (``Outcome``) are the memory's
    decision (module docstring).
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
    knowledge_best: dict | None = None
    basis: dict | None = None
    time_reference: dict | None = None
    features: dict = field(default_factory=dict)
    confidence: float = 0.0
    outcome: Outcome = Outcome.NOT_IN_MEMORY

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
            "knowledge_best": self.knowledge_best,
            "outcome": Outcome(self.outcome).value,
            "confidence": round(self.confidence, 4),
            "basis": self.basis,
            "time_reference": self.time_reference,
            "features": {k: round(v, 4) for k, v in self.features.items()},
        }


@dataclass
class PushResult:
    """What one ``push`` did: frames received, stream indices kept, nodes created, events closed."""

    frames: int
    kept: list[int]
    nodes: int
    events: int


def node_view(node, score: float | None = None) -> dict:
    """A tree node as the JSON-friendly dict a context lists (its score rounded, when given)."""
    view = {"node": node.node_id, "level": node.level, "t_start": round(node.t_start, 3),
            "t_end": round(node.t_end, 3), "caption": node.caption}
    if score is not None:
        view["score"] = round(score, 4)
    return view
