"""The stream's default abstention calibrations, one per built-in text encoder.

``StreamMemory`` decides whether the basis of an answer (the caption of the
tree node or event, or the short-term frames' labels, it would quote) answers
the question with a :class:`~streammem.components.answers.Calibration`: the
confidence is a logistic function of the basis's ``cosine``, ``grounding`` and
``names`` (``answer_features``), the outcome "not in memory" below the
threshold.  The values below were fitted by ``bench/bench_abstention.py``
(command and figures: ``docs/answers.md``) on its
calibration set for the pipeline -- planted label streams with seeds separate
from the evaluation set -- with at most 2 % of the unanswerable calibration
questions answered.  Pass ``calibration=`` to ``StreamMemory`` /
``StreamPipeline`` to use your own (``Calibration.fit`` on your questions).
"""
from __future__ import annotations

from ..components.answers import Calibration, calibration_for

__all__ = ["PIPELINE_CALIBRATIONS", "default_calibration"]

_FITTED_ON = ("bench/bench_abstention.py --system pipeline: "
              "calibration seeds 101-104, PlantedEventVideo(1800, 16)")

PIPELINE_CALIBRATIONS = {
    "all-MiniLM-L6-v2": Calibration({"cosine": 8.4962, "grounding": 3.4955, "names": 9.8793, "related": 3.6250},
                                    -18.3205, 0.7930, _FITTED_ON),
    "hashing": Calibration({"cosine": 2.0548, "grounding": 6.4620, "names": 1.6801, "related": 1.3628}, -6.6825,
                           0.7879, _FITTED_ON),
}


def default_calibration(text_encoder) -> Calibration:
    """The pipeline's calibration for ``text_encoder`` (MiniLM's for an encoder without one of its own)."""
    return calibration_for(PIPELINE_CALIBRATIONS, text_encoder)
