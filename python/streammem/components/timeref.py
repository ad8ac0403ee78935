"""Time references in questions: "at 20 s", "at 1:05", "at the beginning", "before the car arrived", ...

``parse_time_reference(question)`` finds the first time reference of a
question and returns a :class:`TimeReference`: its kind, the phrase, the
question without it (what retrieval ranks by) and its numbers.  A memory turns
it into a window of stream time with :meth:`TimeReference.window` (it knows
where its stream starts, where it is now, and -- for "before X" / "after X" --
when X happened, found by its own search for the anchor text) and keeps the
units (frames, nodes, turns, chunks) whose span meets the window
(:func:`in_window`).  A question with no content of its own ("What happened at
the beginning?") is answered by the unit nearest the reference point
(:meth:`TimeReference.proximity`: the earliest for "the beginning", the
latest for "the end" or "before X", ...); others by the best match inside the
window.

Understood (case-insensitive; ``T`` is ``SS``, ``M:SS``, ``H:MM:SS``, or a
number with a unit -- s, sec, second(s), min, minute(s), h, hour(s) -- words
"a"/"one".."sixty" allowed; ``D`` a duration written the same way):

==========================================  ==========  ===============================================
phrase                                      kind        window
==========================================  ==========  ===============================================
at / around / about T                       ``at``      [T - 2 s, T + 2 s]  (``AT_TOLERANCE_S``)
between T1 and T2, from T1 to T2            ``between`` [T1, T2]
before / until T                            ``before``  [start, T)
after / since T                             ``after``   (T, now]
in / during the first D                     ``first``   [start, start + D]
in / during / over the last / past D        ``last``    [now - D, now]   ("in the last minute": D = 60 s)
D ago                                       ``ago``     [now - D - 2 s, now - D + 2 s]
at / in the (very) beginning / start (of    ``beginning`` the first 10 % of [start, now]
the video, ...), at first, initially                  (``EDGE_FRACTION``; at least the first unit)
at / in / near / towards the (very) end,    ``end``     the last 10 % of [start, now] (at least the last unit)
in the end, lastly
before X / after X (X not a time)           ``before`` / ``after`` with ``anchor`` X: [start, X's start) /
                                                        (X's end, now]
==========================================  ==========  ===============================================

Thread-safe: pure functions and frozen objects.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch

__all__ = ["TimeReference", "parse_time_reference", "in_window", "rank_in_window", "best_in_window",
           "AT_TOLERANCE_S", "EDGE_FRACTION", "KINDS"]

AT_TOLERANCE_S = 2.0  # "at T" means within this many seconds of T
EDGE_FRACTION = 0.1  # "the beginning" / "the end": this share of the stream so far
KINDS = ("at", "between", "before", "after", "first", "last", "ago", "beginning", "end")

_NUMBER_WORDS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
                 "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "fifteen": 15, "twenty": 20,
                 "thirty": 30, "forty": 40, "forty-five": 45, "fifty": 50, "sixty": 60, "ninety": 90}
_UNITS = {"s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0, "min": 60.0, "mins": 60.0,
          "minute": 60.0, "minutes": 60.0, "h": 3600.0, "hr": 3600.0, "hrs": 3600.0, "hour": 3600.0,
          "hours": 3600.0}
_NUM = r"(?:\d+(?:\.\d+)?|\.\d+|" + "|".join(sorted(map(re.escape, _NUMBER_WORDS), key=len, reverse=True)) + r")"
_UNIT = r"(?:" + "|".join(sorted(map(re.escape, _UNITS), key=len, reverse=True)) + r")\b"
_CLOCK = r"\d+:\d{1,2}(?::\d{1,2})?(?:\.\d+)?"
# A point or duration: a clock time, "N unit [and M seconds]", or "second N" / "minute N".
_AMOUNT = (rf"(?:{_CLOCK}|{_NUM}\s*{_UNIT}(?:\s*(?:and\s+)?{_NUM}\s*(?:seconds?|secs?|s)\b)?"
           rf"|(?:second|minute)\s+\d+(?:\.\d+)?)")
_OF_STREAM = (r"(?:\s+of\s+(?:the|this|our)\s+(?:video|clip|stream|recording|conversation|dialogue|session|"
              r"movie|film|footage|day|talk|chat))?")
_PATTERNS = (
    ("between", re.compile(rf"\b(?:between|from)\s+(?P<a>{_AMOUNT}|{_NUM})\s+(?:and|to|until|till|-)\s+"
                           rf"(?P<b>{_AMOUNT})", re.I)),
    ("first", re.compile(rf"\b(?:in|during|over|within|for)\s+the\s+(?:first|opening)\s+(?P<d>{_AMOUNT}|{_UNIT})",
                         re.I)),
    ("last", re.compile(rf"\b(?:in|during|over|within|for)\s+the\s+(?:last|past|previous|final)\s+"
                        rf"(?P<d>{_AMOUNT}|{_UNIT})", re.I)),
    ("ago", re.compile(rf"\b(?P<d>{_AMOUNT})\s+ago\b", re.I)),
    ("at", re.compile(rf"\b(?:(?:at|around|about|near|roughly)\s+)+(?:the\s+)?(?:(?:time|mark)\s+)?(?P<t>{_AMOUNT})"
                      rf"(?:\s+mark)?", re.I)),
    ("before", re.compile(rf"\b(?:before|until|till|by)\s+(?P<t>{_AMOUNT})", re.I)),
    ("after", re.compile(rf"\b(?:after|since)\s+(?P<t>{_AMOUNT})", re.I)),
    ("beginning", re.compile(rf"\b(?:(?:at|in|near|towards?)\s+the\s+(?:very\s+)?(?:beginning|start|outset)"
                             rf"{_OF_STREAM}|at\s+first|initially)\b", re.I)),
    ("end", re.compile(rf"\b(?:(?:at|in|near|towards?)\s+the\s+(?:very\s+)?(?:end|finish|close){_OF_STREAM}"
                       rf"|lastly)\b", re.I)),
    ("anchor", re.compile(rf"\b(?P<rel>before|after)\s+(?!{_AMOUNT})(?P<x>(?!\s*[?.!,;]|\s*$)[^?.!,;]+)", re.I)),
)


def _amount(text: str) -> float:
    """Seconds of a point or duration phrase (``_AMOUNT``, or a bare unit: "minute" = 60 s)."""
    text = text.strip().lower()
    if re.fullmatch(_CLOCK, text):
        seconds = 0.0
        for part in text.split(":"):
            seconds = 60.0 * seconds + float(part)
        return seconds
    m = re.fullmatch(r"(second|minute)\s+(\d+(?:\.\d+)?)", text)
    if m:
        return float(m.group(2)) * (60.0 if m.group(1) == "minute" else 1.0)
    if text in _UNITS:
        return _UNITS[text]
    total = 0.0
    for num, unit in re.findall(rf"({_NUM})\s*({_UNIT[:-2]})", text):
        value = _NUMBER_WORDS.get(num.lower())
        total += (float(num) if value is None else value) * _UNITS[unit.lower()]
    return total


@dataclass(frozen=True)
class TimeReference:
    """A time reference found in a question (see the module docstring for the phrases and windows).

    ``kind`` is one of ``KINDS``; ``phrase`` the text matched; ``question`` the
    question without it; ``start`` / ``end`` absolute stream seconds (``at``,
    ``between``, ``before`` / ``after`` a time); ``duration`` seconds
    (``first``, ``last``, ``ago``); ``anchor`` the event text of "before X" /
    "after X".
    """

    kind: str
    phrase: str
    question: str
    start: float | None = None
    end: float | None = None
    duration: float | None = None
    anchor: str | None = None

    def window(self, *, stream_start: float, now: float,
               anchor_span: tuple[float, float] | None = None) -> tuple[float, float]:
        """(lo, hi) stream seconds the reference means in a stream from ``stream_start`` to ``now``.

        ``anchor_span``: (t_start, t_end) of the anchor event for "before X" /
        "after X" (ValueError without it).  "at T" is [T - 2 s, T + 2 s]; the
        beginning and the end are the first and last ``EDGE_FRACTION`` of the stream.
        """
        if not (math.isfinite(stream_start) and math.isfinite(now)):
            raise ValueError(f"stream_start and now must be finite seconds, got {stream_start!r}, {now!r}")
        span = max(0.0, now - stream_start)
        k = self.kind
        if k == "at":
            return self.start - AT_TOLERANCE_S, self.start + AT_TOLERANCE_S
        if k == "between":
            return min(self.start, self.end), max(self.start, self.end)
        if k == "first":
            return stream_start, stream_start + self.duration
        if k == "last":
            return now - self.duration, now
        if k == "ago":
            return now - self.duration - AT_TOLERANCE_S, now - self.duration + AT_TOLERANCE_S
        if k == "beginning":
            return stream_start, stream_start + EDGE_FRACTION * span
        if k == "end":
            return now - EDGE_FRACTION * span, now
        if self.anchor is not None:
            if anchor_span is None:
                raise ValueError(f"anchor_span is needed for {self.phrase!r} (when did {self.anchor!r} happen?)")
            return (stream_start, anchor_span[0]) if k == "before" else (anchor_span[1], now)
        return (stream_start, self.start) if k == "before" else (self.start, now)

    @property
    def open_low(self) -> bool:
        """Whether the window excludes its low end (after an anchor or a time: strictly later)."""
        return self.kind == "after"

    @property
    def open_high(self) -> bool:
        """Whether the window excludes its high end (before an anchor or a time, the beginning: strictly earlier)."""
        return self.kind in ("before", "beginning")

    def proximity(self, t_start: torch.Tensor, t_end: torch.Tensor, *, stream_start: float, now: float,
                  anchor_span: tuple[float, float] | None = None) -> torch.Tensor:
        """(n,) seconds from each unit to the reference point (0 best): what a question with no content of its
        own is answered by (the earliest unit for the beginning, the latest before an anchor, ...)."""
        lo, hi = self.window(stream_start=stream_start, now=now, anchor_span=anchor_span)
        t_start, t_end = t_start.double(), t_end.double()
        k = self.kind
        if k in ("at", "ago"):
            point = (lo + hi) / 2.0
            return (t_start - point).clamp_min(0) + (point - t_end).clamp_min(0)
        if k in ("end", "last", "before"):
            return (hi - t_end).abs()
        return (t_start - lo).abs()  # beginning, first, between, after

    def to_dict(self) -> dict:
        return {"kind": self.kind, "phrase": self.phrase, "start": self.start, "end": self.end,
                "duration": self.duration, "anchor": self.anchor}


def parse_time_reference(question: str) -> TimeReference | None:
    """The first time reference of ``question`` (module docstring), or None; ValueError for a non-string."""
    if not isinstance(question, str):
        raise ValueError(f"question must be a str, got {type(question).__name__}")
    found = []
    for kind, pattern in _PATTERNS:
        m = pattern.search(question)
        if m:
            found.append((m.start(), -len(m.group(0)), kind, m))
    if not found:
        return None
    _, _, kind, m = min(found, key=lambda f: (f[0], f[1]))
    phrase = m.group(0).strip()
    rest = re.sub(r"\s+", " ", (question[:m.start()] + " " + question[m.end():])).strip()
    rest = re.sub(r"\s+([?.!,;])", r"\1", rest)
    if not re.search(r"[A-Za-z0-9]", rest):  # nothing but the time phrase: rank by the question as written
        rest = question
    if kind == "between":
        b = _amount(m.group("b"))
        a_text = m.group("a")
        a = _amount(a_text) if re.search(r"[a-z:]", a_text, re.I) and a_text.lower() not in _NUMBER_WORDS else None
        if a is None:  # "between 10 and 20 s": the unit of the second number
            unit = re.search(_UNIT[:-2] + r"\s*$", m.group("b").strip(), re.I)
            a = float(_NUMBER_WORDS.get(a_text.lower(), a_text)) * (_UNITS[unit.group(0).lower()] if unit else 1.0)
        return TimeReference("between", phrase, rest, start=a, end=b)
    if kind in ("first", "last", "ago"):
        return TimeReference(kind, phrase, rest, duration=_amount(m.group("d")))
    if kind in ("at", "before", "after"):
        return TimeReference(kind, phrase, rest, start=_amount(m.group("t")))
    if kind == "anchor":
        anchor = re.sub(r"^\s*(?:the|a|an)\s+", "", m.group("x")).strip()
        return TimeReference(m.group("rel").lower(), phrase, rest, anchor=anchor or m.group("x").strip())
    return TimeReference(kind, phrase, rest)


def in_window(ref: TimeReference, t_start: torch.Tensor, t_end: torch.Tensor, *, stream_start: float, now: float,
              anchor_span: tuple[float, float] | None = None) -> torch.Tensor:
    """(n,) bool: the units whose span [t_start, t_end] meets the reference's window.

    The beginning and the end always hold at least the earliest / latest unit
    (a stream whose first unit is longer than its first tenth still has a
    beginning).
    """
    t_start = torch.as_tensor(t_start, dtype=torch.float64).reshape(-1)
    t_end = torch.as_tensor(t_end, dtype=torch.float64).reshape(-1)
    if t_start.shape != t_end.shape:
        raise ValueError(f"t_start and t_end must have one entry per unit, got {tuple(t_start.shape)} and "
                         f"{tuple(t_end.shape)}")
    lo, hi = ref.window(stream_start=stream_start, now=now, anchor_span=anchor_span)
    low_ok = t_end > lo if ref.open_low else t_end >= lo
    high_ok = t_start < hi if ref.open_high else t_start <= hi
    mask = low_ok & high_ok
    if t_start.numel() and ref.kind == "beginning":
        mask |= t_start == t_start.min()
    if t_start.numel() and ref.kind == "end":
        mask |= t_end == t_end.max()
    return mask


def rank_in_window(ref: TimeReference, t_start, t_end, scores, *, generic: bool, stream_start: float, now: float,
                   anchor_span: tuple[float, float] | None = None) -> list[int]:
    """Indices of the units meeting the reference's window, best first (empty when none does).

    ``scores``: (n,) cosine of each unit with the question.  For a
    ``generic`` question (no content words of its own: "What happened at the
    beginning?") the unit nearest the reference point comes first
    (:meth:`TimeReference.proximity`; ties to the higher score); for any
    other the best-scoring unit (ties to the nearer, then the earlier index).
    """
    t_start = torch.as_tensor(t_start, dtype=torch.float64).reshape(-1)
    t_end = torch.as_tensor(t_end, dtype=torch.float64).reshape(-1)
    scores = torch.as_tensor(scores, dtype=torch.float64).reshape(-1)
    if scores.shape != t_start.shape:
        raise ValueError(f"scores must have one entry per unit ({t_start.shape[0]}), got {scores.shape[0]}")
    mask = in_window(ref, t_start, t_end, stream_start=stream_start, now=now, anchor_span=anchor_span)
    rows = mask.nonzero()[:, 0].tolist()
    if not rows:
        return []
    near = ref.proximity(t_start, t_end, stream_start=stream_start, now=now, anchor_span=anchor_span).tolist()
    score = scores.tolist()
    if generic:
        return sorted(rows, key=lambda i: (near[i], -score[i], i))
    return sorted(rows, key=lambda i: (-score[i], near[i], i))


def best_in_window(ref: TimeReference, t_start, t_end, scores, *, generic: bool, stream_start: float, now: float,
                   anchor_span: tuple[float, float] | None = None) -> int | None:
    """The first of :func:`rank_in_window`: the unit a time-referenced question is answered from, or None."""
    ranked = rank_in_window(ref, t_start, t_end, scores, generic=generic, stream_start=stream_start, now=now,
                            anchor_span=anchor_span)
    return ranked[0] if ranked else None
