"""Questions at stream times: the ``"T: QUESTION"`` form, and the questions written for the sample clip.

A question asked at stream time T is answered from the memory of the frames up
to T (``StreamPipeline.submit(question, at=T)``); ``parse_query`` reads the
form the command line and the benchmarks write it in.
"""
from __future__ import annotations

import math
import re

__all__ = ["parse_query", "SAMPLE_QUERIES"]

# Stream time (s) and question, written for bikes.mp4 (10 s): a taxi fills the
# frame around 3 s, a cyclist passes about 4-5 s, bicycles are parked at the end.
# Asked only on the sample clip.
SAMPLE_QUERIES = (
    "3.5: What vehicle is in front of the camera right now?",
    "9.0: What did we see at the beginning of the video?",
    "10.0: Where are the bicycles?",
)

_TIME = re.compile(r"^\s*((?:\d+:){0,2}\d+(?:\.\d*)?|\.\d+)\s*s?\s*:(.*)$", re.S)


def parse_query(text: str) -> tuple[float | None, str]:
    """``"12.5: what is the rider doing?"`` -> (12.5, question); no time prefix -> (None, question).

    The time is stream seconds: ``SS``, ``M:SS`` or ``H:MM:SS``, fractions
    allowed, an optional ``s`` (``"1:30: ..."`` is 90 s, ``"20s: ..."`` 20 s).
    Text before the first colon that is not a time stays in the question
    (``"what: is this"``).  Raises ValueError for a negative time or an empty
    question, and for a time that is not finite (``"nan: ..."``, ``"inf: ..."``,
    overflowing digits).
    """
    if not isinstance(text, str):
        raise ValueError(f"query must be a string, got {type(text).__name__}")
    if re.match(r"^\s*-\s*\d", text):
        raise ValueError(f"query time must be >= 0 seconds, got {text!r}")
    if re.match(r"^\s*[+-]?\s*(nan|inf|infinity)\s*s?\s*:", text, re.I):
        raise ValueError(f"query time must be a finite number of seconds, got {text!r:.80}")
    match = _TIME.match(text)
    at, question = None, text.strip()
    if match:
        seconds = 0.0
        for part in match.group(1).split(":"):
            seconds = 60.0 * seconds + float(part)
        if not math.isfinite(seconds):
            raise ValueError(f"query time must be a finite number of seconds, got {text!r:.80}")
        at, question = seconds, match.group(2).strip()
    if not question:
        raise ValueError(f"query has no question: {text!r} (write \"T: QUESTION\" or just QUESTION)")
    return at, question
