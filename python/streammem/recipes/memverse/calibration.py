"""MemVerse's default abstention calibrations, one per built-in text encoder.

``MemVerse.ask`` answers from the retrieved chunk (the graph's or flat
ranking's long-term chunks and the short-term window) closest to the question
and scores it by ``answer_features`` -- ``cosine`` of the chunk with the question,
``grounding`` / ``names`` of the question in the chunk's text together with
the graph node that led to it (``via``), and ``related`` (the question's other
content words that the chunk spells or has a close word for, by the text
encoder's word embeddings: "work" and "job") -- which a
:class:`~streammem.components.answers.Calibration` turns into a confidence;
below the threshold the answer is "not in memory".  The
values below were fitted by ``bench/bench_abstention.py`` (command and
figures: ``docs/answers.md``) on planted-fact memories
(``PlantedFactMemory`` with its questions and as many about people and kin
never mentioned) whose seeds are not those of the evaluation set, with at most
2 % of the unanswerable calibration questions answered.  Pass
``calibration=`` to ``MemVerse`` to use your own.
"""
from __future__ import annotations

from ...components.answers import Calibration, calibration_for

__all__ = ["MEMVERSE_CALIBRATIONS", "default_calibration"]

_FITTED_ON = ("bench/bench_abstention.py --system memverse: "
              "calibration seeds 101-104, PlantedFactMemory(people=16, sessions=6, fillers=30)")

MEMVERSE_CALIBRATIONS = {
    "all-MiniLM-L6-v2": Calibration({"cosine": 2.1887, "grounding": 3.2159, "names": 4.4527, "related": 1.3111},
                                    -9.0399, 0.4283, _FITTED_ON),
    "hashing": Calibration({"cosine": 0.0000, "grounding": 5.1219, "names": 2.6067, "related": 4.0691}, -9.6712,
                           0.1448, _FITTED_ON),
}


def default_calibration(text_encoder) -> Calibration:
    """MemVerse's calibration for ``text_encoder`` (MiniLM's for an encoder without one of its own)."""
    return calibration_for(MEMVERSE_CALIBRATIONS, text_encoder)
