"""What a ProStream question recalls: the recalled units (turns or keyed facts) and the recall with its
decision, and ProStream's model-free answer registered for it."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ...components.answers import NOT_IN_MEMORY_ANSWER, Outcome, extractive_answer

__all__ = ["Recall", "RecalledUnit"]


@dataclass
class RecalledUnit:
    """One recalled turn (or merged run of turns) or keyed fact: turn indices, time, speaker, text, scores.

    ``cosine``: with the question; ``utility``: the retention utility u at the
    recall's stream time; ``score``: what ranked it (cosine x rank weight, see
    :meth:`ProStream.rank_weight`; the cosine for the flat baselines).  A
    keyed fact (a :class:`MemoryUnit`) has ``node`` -1, its ``unit`` id, the
    turn that stated it as ``first_turn`` = ``last_turn``, and its
    ``entity`` / ``attribute`` / ``value``; a turn has them None.
    """

    node: int
    first_turn: int
    last_turn: int
    t: float
    speaker: str
    text: str
    cosine: float
    utility: float
    score: float
    unit: int | None = None
    entity: str | None = None
    attribute: str | None = None
    value: str | None = None

    def covers(self, turn: int) -> bool:
        return self.first_turn <= turn <= self.last_turn


@dataclass
class Recall:
    """What one question recalled: units best first, the answer, timings.

    ``latency_s`` is the retrieval time (utility refresh + search + bookkeeping),
    question encoding excluded (``timings["question_encode"]`` when ``ask``
    encoded it).

    ``ask`` decides on the best unit (``answering.decide``): ``confidence`` in
    [0, 1] (the calibrated probability that it answers the question),
    ``outcome`` (``Outcome``; None for a recall nobody decided on, e.g.
    ``recall()``'s), ``features``; ``time_reference`` the question's time
    reference and window, or None.
    """

    question: str
    stream_time: float | None
    units: list[RecalledUnit]
    latency_s: float
    timings: dict = field(default_factory=dict)
    answer: str | None = None
    answer_kind: str | None = None
    outcome: Outcome | None = None
    confidence: float | None = None
    features: dict = field(default_factory=dict)
    time_reference: dict | None = None

    @property
    def best(self) -> RecalledUnit | None:
        return self.units[0] if self.units else None

    def to_dict(self) -> dict:
        return {
            "question": self.question,
            "stream_time": self.stream_time,
            "units": [{**asdict(u), "t": round(u.t, 3), "cosine": round(u.cosine, 4), "utility": round(u.utility, 4),
                       "score": round(u.score, 4)} for u in self.units],
            "answer": self.answer,
            "answer_kind": self.answer_kind,
            "outcome": None if self.outcome is None else Outcome(self.outcome).value,
            "confidence": None if self.confidence is None else round(self.confidence, 4),
            "features": {k: round(v, 4) for k, v in self.features.items()},
            "time_reference": self.time_reference,
            "latency_ms": round(1e3 * self.latency_s, 3),
            "timings_ms": {k: round(1e3 * v, 3) for k, v in self.timings.items()},
        }


@extractive_answer.register(Recall)
def _extractive_recall(recall: Recall) -> str | None:
    """ProStream's default answer: the best recalled turn's text, verbatim (extractive; no model);
    ``NOT_IN_MEMORY_ANSWER`` when the recall was decided not in memory; None when nothing was recalled."""
    if recall.outcome == Outcome.NOT_IN_MEMORY:
        return NOT_IN_MEMORY_ANSWER
    return recall.best.text if recall.best is not None else None
