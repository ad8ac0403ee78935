"""ProStream's answer boundary: the calibrated decision on a recall, and recall inside a time reference.

``decide(recall, calibration)`` scores the recall's best unit -- the turn (or
fact) the extractive answer quotes -- by ``answer_features`` (its ``cosine``
with the question, ``grounding`` and ``names`` of the question in its text)
and sets the recall's ``confidence`` (the calibrated probability that the
unit answers the question) and ``outcome``.  ``recall_in_window`` answers a
question with a time reference ("in the last minute", "at the beginning",
"before X", :mod:`streammem.components.timeref`) from the stored turns whose
time meets its window.

The default calibrations were fitted by ``bench/bench_abstention.py`` (command
and figures: ``docs/answers.md``) on synthetic dialogues
(``synthetic_dialogue`` with its questions and as many about subjects never
stated: an entity's attribute nobody mentioned) whose seeds are not those of
the evaluation set, with at most 2 % of the unanswerable calibration questions
answered.  Pass ``calibration=`` to ``ProStream`` to use your own.
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from ...components.answers import Calibration, Outcome, answer_features, calibration_for, content_words
from ...components.timeref import TimeReference, rank_in_window
from .recall import Recall, RecalledUnit

__all__ = ["PROSTREAM_CALIBRATIONS", "default_calibration", "decide", "recall_in_window"]

_FITTED_ON = ("bench/bench_abstention.py --system prostream: "
              "calibration seeds 101-102, synthetic_dialogue(3000, questions=120)")

PROSTREAM_CALIBRATIONS = {
    "all-MiniLM-L6-v2": Calibration({"cosine": 6.9913, "grounding": 13.0399, "names": 5.5939}, -19.0386, 0.5145,
                                    _FITTED_ON),
    "hashing": Calibration({"cosine": 2.2987, "grounding": 15.5842, "names": 6.0046}, -17.6444, 0.5203, _FITTED_ON),
}


def default_calibration(text_encoder) -> Calibration:
    """ProStream's calibration for ``text_encoder`` (MiniLM's for an encoder without one of its own)."""
    return calibration_for(PROSTREAM_CALIBRATIONS, text_encoder)


def decide(recall, calibration: Calibration, question: str | None = None) -> None:
    """Set ``recall``'s features, confidence and outcome from its best unit (not in memory when it has none).

    ``question``: the text the features ground (default ``recall.question``;
    a time-referenced question passes it without its time phrase).
    """
    best = recall.best
    if best is None:
        recall.features, recall.confidence, recall.outcome = {}, 0.0, Outcome.NOT_IN_MEMORY
        return
    recall.features = answer_features(recall.question if question is None else question, best.text, best.cosine)
    recall.confidence, recall.outcome = calibration.decide(recall.features)


def recall_in_window(memory, q: torch.Tensor, ref: TimeReference, *, question: str = "", k: int | None = None,
                     anchor: torch.Tensor | None = None):
    """A ``Recall`` of the stored turns inside the window of ``ref``: the best ``k`` by cosine (for a question
    with no content words of its own, the ``k`` nearest the reference point), with ``recall.time_reference``.

    ``anchor``: the embedding of "X" in "before X" / "after X" (the stored turn
    closest to it, if the calibration accepts it, places the window).  Reads
    the memory without changing it (no use is counted).
    """
    t0 = time.perf_counter()
    k = memory.config.k if k is None else k
    q = F.normalize(torch.as_tensor(q, dtype=torch.float32).reshape(-1), dim=0)
    turns = [n for n in memory.tree.nodes.values() if n.level == 0]
    reference = ref.to_dict()
    units = []
    if turns and memory.stream_time is not None:
        emb = torch.stack([n.embedding for n in turns]).float()
        start, now = min(n.t_start for n in turns), float(memory.stream_time)
        anchor_span = None
        if ref.anchor is not None:
            scores = (emb @ F.normalize(anchor.float().reshape(-1), dim=0)).tolist()
            j = max(range(len(turns)), key=lambda i: (scores[i], -i))
            conf, outcome = memory.calibration.decide(answer_features(ref.anchor, turns[j].caption, scores[j]))
            reference["anchor_match"] = {"turn": turns[j].first_frame, "t": turns[j].t_start,
                                         "text": turns[j].caption, "confidence": round(conf, 4)}
            if outcome == Outcome.ANSWERED:
                anchor_span = (turns[j].t_start, turns[j].t_end)
            else:
                reference["reason"] = "the anchor is not in memory"
        if ref.anchor is None or anchor_span is not None:
            lo, hi = ref.window(stream_start=start, now=now, anchor_span=anchor_span)
            reference["window"] = [round(lo, 3), round(hi, 3)]
            cosines = (emb @ q).tolist()
            order = rank_in_window(ref, [n.t_start for n in turns], [n.t_end for n in turns], cosines,
                                   generic=not content_words(ref.question), stream_start=start, now=now,
                                   anchor_span=anchor_span)
            for i in order[:k]:
                n = turns[i]
                speaker = next(iter(n.label_counts), "") if n.label_counts else ""
                units.append(RecalledUnit(n.node_id, n.first_frame, n.last_frame, n.t_start, speaker, n.caption,
                                          cosines[i], memory.bounded.utility(n, now), cosines[i]))
            if not order:
                reference["reason"] = "nothing in memory in that span"
    else:
        reference["reason"] = "the memory is empty"
    latency = time.perf_counter() - t0
    recall = Recall(question, memory.stream_time, units, latency, {"time_reference": latency, "total": latency})
    recall.time_reference = reference
    return recall
