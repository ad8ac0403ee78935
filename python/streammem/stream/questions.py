"""Questions at stream times: the ``"T: QUESTION"`` form, and the questions written for the sample clip.

A question asked at stream time T is answered from the memory of the frames up
to T (``StreamPipeline.submit(question, at=T)``); ``parse_query`` reads the
form the command line and the benchmarks write it in (``split_stream_time``
reads its time prefix, also for the command line's dialogue turns).
"""
from __future__ import annotations

import math
import re

__all__ = ["parse_query", "split_stream_time", "SAMPLE_QUERIES"]

# Stream time (s) and question, written for bikes.mp4 (10 s): a taxi fills the
# frame around 3 s, a cyclist passes about 4-5 s, bicycles are parked at the end.
# Asked only on the sample clip.
SAMPLE_QUERIES = (
    "3.5: What vehicle is in front of the camera right now?",
    "9.0: What did we see at the beginning of the video?",
    "10.0: Where are the bicycles?",
)

_TIME = re.compile(r"^\s*((?:\d+:){0,2}\d+(?:\.\d*)?|\.\d+)\s*s?\s*:(.*)$", re.S)


def split_stream_time(text: str, name: str = "time") -> tuple[float | None, str]:
    """``"1:30: the rest"`` -> (90.0, ``"the rest"``); no time prefix -> (None, the text), both stripped.

    The time prefix is stream seconds followed by a colon: ``SS`` (any number
    of seconds), ``M:SS`` or ``H:MM:SS``, a fraction on the last field, an
    optional ``s`` (``"20s: ..."``).  Minutes and seconds after the first field
    must be below 60, as a clock writes them.  Text before the first colon that
    is not a time stays in the rest (``"what: is this"``).  Raises ValueError
    naming ``name`` (the caller's argument) for a negative time, a time that is
    not finite (``"nan: ..."``, ``"inf: ..."``, overflowing digits) and fields
    out of range (``"99:99: ..."``).
    """
    if not isinstance(text, str):
        raise ValueError(f"{name} must be a string, got {type(text).__name__}")
    if re.match(r"^\s*-\s*\d", text):
        raise ValueError(f"{name} must be >= 0 seconds, got {text!r:.80}")
    if re.match(r"^\s*[+-]?\s*(nan|inf|infinity)\s*s?\s*:", text, re.I):
        raise ValueError(f"{name} must be a finite number of seconds, got {text!r:.80}")
    match = _TIME.match(text)
    if not match:
        return None, text.strip()
    fields = match.group(1).split(":")
    if any(float(field) >= 60.0 for field in fields[1:]):
        raise ValueError(f"{name} {match.group(1)!r} is out of range: minutes and seconds after the first field "
                         f"must be below 60 (SS, M:SS or H:MM:SS), got {text!r:.80}")
    seconds = 0.0
    for field in fields:
        seconds = 60.0 * seconds + float(field)
    if not math.isfinite(seconds):
        raise ValueError(f"{name} must be a finite number of seconds, got {text!r:.80}")
    return seconds, match.group(2).strip()


def parse_query(text: str) -> tuple[float | None, str]:
    """``"12.5: what is the rider doing?"`` -> (12.5, question); no time prefix -> (None, question).

    The time is stream seconds: ``SS``, ``M:SS`` or ``H:MM:SS``, fractions
    allowed, an optional ``s`` (``"1:30: ..."`` is 90 s, ``"20s: ..."`` 20 s;
    ``split_stream_time`` says exactly what is read).  Text before the first
    colon that is not a time stays in the question (``"what: is this"``).
    Raises ValueError for a negative time, minutes or seconds of 60 or more
    after the first field (``"99:99: ..."``), a time that is not finite
    (``"nan: ..."``, ``"inf: ..."``, overflowing digits) and an empty question.
    """
    if not isinstance(text, str):
        raise ValueError(f"query must be a string, got {type(text).__name__}")
    at, question = split_stream_time(text, "query time")
    if not question:
        raise ValueError(f"query has no question: {text!r} (write \"T: QUESTION\" or just QUESTION)")
    return at, question
