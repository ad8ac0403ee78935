"""Scoring VideoAgent on a planted video against uniform sampling and retrieve-once at the same budget."""
from __future__ import annotations

import math
from collections import Counter
from typing import Sequence

import numpy as np

from ...components.answers import Outcome
from .agent import VideoAgent
from .synthetic import PlantedEventVideo, PlantedQuestion

__all__ = ["evaluate", "STRATEGIES"]


STRATEGIES = ("iterative", "uniform", "retrieve-once")


def evaluate(agent: VideoAgent, video: PlantedEventVideo, strategy: str = "iterative", budget: int | None = None,
             *, questions: Sequence[PlantedQuestion] | None = None) -> dict:
    """Score a strategy on a planted video's questions at a frame budget.

    ``strategy``: "iterative" (``agent.ask``), "uniform" (``ask_uniform``:
    ``budget`` frames spread evenly) or "retrieve-once" (``ask_retrieve_once``:
    the ``budget`` frames most similar to the question).  The caption cache is
    cleared before every question, so each pays for its own captions.

    Returns accuracy (the answer is the right option; an answer withheld as
    not in memory is not), answered (the share not withheld), evidence_hit (a
    frame holding the answer was looked at), answer_in_span (the answer's best
    evidence frame lies in the true event), supported (the evidence named an
    option), frames_used (mean), stops (counts), latency_ms (p20 / p50 / p80)
    and the per-question results.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    ask = {"iterative": agent.ask, "uniform": agent.ask_uniform, "retrieve-once": agent.ask_retrieve_once}[strategy]
    questions = video.questions if questions is None else list(questions)
    results, correct, answered, hit, in_span, supported, frames, latency = [], 0, 0, 0, 0, 0, [], []
    stops: Counter = Counter()
    for pq in questions:
        agent.clear_captions()
        res = ask(pq.question, pq.options, budget=budget)
        results.append(res)
        correct += res.answer.option == pq.answer
        answered += res.answer.outcome == Outcome.ANSWERED
        hit += bool(set(res.frames) & set(pq.answer_frames))
        top = res.answer.evidence[0] if res.answer.evidence else -1
        in_span += pq.span[0] <= top < pq.span[1]
        supported += res.answer.supported
        frames.append(res.frames_used)
        latency.append(1e3 * res.timings["total"])
        stops[res.stop] += 1
    n = max(1, len(questions))
    p20, p50, p80 = (float(np.percentile(latency, p)) if latency else math.nan for p in (20, 50, 80))
    return {"strategy": strategy, "budget": agent._budget(budget), "questions": len(questions),
            "accuracy": correct / n, "answered": answered / n, "evidence_hit": hit / n,
            "answer_in_span": in_span / n,
            "supported": supported / n, "frames_used": float(np.mean(frames)) if frames else math.nan,
            "stops": dict(stops), "latency_ms": (p20, p50, p80), "results": results}
