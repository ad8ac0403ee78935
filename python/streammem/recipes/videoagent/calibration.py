"""VideoAgent's default abstention calibrations, one per built-in text encoder, and its answer's features.

The agent scores the basis of its answer -- the captions of the frames the
answer rests on (the caption vote's voters, or the most relevant frame) and
of the three observed frames most relevant to the question --
with ``answer_features`` (``cosine``: the best relevance among them,
``grounding``, ``names``, ``related``) plus ``supported`` (1 when a caption named the
chosen option, 0 for the answerer's fallback), and a
:class:`~streammem.components.answers.Calibration` turns them into the
confidence that the answer is right; below its threshold the answer is "not
in memory".  The values below were fitted by ``bench/bench_abstention.py``
(command and figures: ``docs/answers.md``) on planted
videos (``PlantedEventVideo`` with its questions and as many about animals that
never appear) whose seeds are not those of the evaluation set, with at most
2 % of the unanswerable calibration questions answered.  Pass
``calibration=`` to ``VideoAgent`` to use your own.
"""
from __future__ import annotations

from ...components.answers import Calibration, WordVectors, answer_features, calibration_for

__all__ = ["VIDEOAGENT_CALIBRATIONS", "default_calibration", "agent_features"]

_FITTED_ON = ("bench/bench_abstention.py --system videoagent: "
              "calibration seeds 101-108, PlantedEventVideo(1800, 16)")

VIDEOAGENT_CALIBRATIONS = {
    "all-MiniLM-L6-v2": Calibration({"cosine": 5.2604, "grounding": 1.3669, "names": 6.1225, "related": 3.5452,
                                     "supported": 5.4814}, -17.6468, 0.4722, _FITTED_ON),
    "hashing": Calibration({"cosine": 3.2684, "grounding": 4.3131, "names": 4.2890, "related": 0.0000,
                            "supported": 3.2874}, -10.4559, 0.1721, _FITTED_ON),
}


def default_calibration(query_encoder) -> Calibration:
    """VideoAgent's calibration for ``query_encoder`` (MiniLM's for an encoder without one of its own)."""
    return calibration_for(VIDEOAGENT_CALIBRATIONS, query_encoder)


def agent_features(question: str, captions: list[str], relevance: float, supported: bool,
                   word_vectors: WordVectors | None = None) -> dict[str, float]:
    """The features of one answer: ``answer_features`` of the basis captions (with ``related`` when
    ``word_vectors`` is given) and ``supported`` (0 or 1)."""
    features = answer_features(question, captions, relevance, word_vectors=word_vectors)
    features["supported"] = 1.0 if supported else 0.0
    return features
