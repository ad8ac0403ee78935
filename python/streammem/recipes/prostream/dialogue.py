"""A dialogue stream: turns and questions at stream times, and their JSONL form."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from numbers import Integral, Real
from pathlib import Path
from typing import Iterable

__all__ = ["Turn", "Question", "read_dialogue", "write_dialogue"]


@dataclass(frozen=True)
class Turn:
    """One dialogue turn: stream time in seconds, speaker, text; ``session`` optional.

    A change of ``session`` between consecutive turns closes the session (as a
    pause of ``ProStreamConfig.session_gap`` seconds does).
    """

    t: float
    speaker: str
    text: str
    session: int | None = None

    def __post_init__(self):
        _check_time(self.t, "Turn")
        if not isinstance(self.speaker, str) or not isinstance(self.text, str):
            raise ValueError(f"Turn: speaker and text must be strings, got {type(self.speaker).__name__} and "
                             f"{type(self.text).__name__}")
        if self.session is not None and (isinstance(self.session, bool) or not isinstance(self.session, Integral)):
            raise ValueError(f"Turn: session must be an int or None, got {self.session!r:.40}")


@dataclass(frozen=True)
class Question:
    """A question asked at stream time ``t``, with optional ground truth.

    ``answer``: the expected value (a recall is correct when the best unit
    states it, case-insensitively); ``turn``: the index (among turns, from 0)
    of the turn stating the current answer, which decides correctness when
    given; ``superseded``: indices of turns holding earlier, no longer valid
    versions; ``kind``: a label for reporting ("near", "far", "updated").
    """

    t: float
    question: str
    answer: str | None = None
    turn: int | None = None
    kind: str | None = None
    superseded: tuple[int, ...] = ()


def _check_time(value, where: str) -> float:
    try:  # an int beyond float's range (10**400) overflows: not a time either
        ok = not isinstance(value, bool) and isinstance(value, Real) and math.isfinite(float(value))
    except OverflowError:
        ok = False
    if not ok:
        raise ValueError(f"{where}: t must be a finite number of seconds, got {value!r:.60}")
    return float(value)


def _item_from_json(obj, where: str) -> Turn | Question:
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    t = _check_time(obj.get("t"), where)
    if "question" in obj:
        q = obj["question"]
        if not isinstance(q, str) or not q.strip():
            raise ValueError(f"{where}: question must be a non-empty string")
        turn = obj.get("turn")
        if turn is not None and (isinstance(turn, bool) or not isinstance(turn, int) or turn < 0):
            raise ValueError(f"{where}: turn must be a turn index >= 0, got {turn!r}")
        sup = obj.get("superseded", [])
        if not isinstance(sup, list) or not all(isinstance(i, int) and i >= 0 for i in sup):
            raise ValueError(f"{where}: superseded must be a list of turn indices")
        answer = obj.get("answer")
        if answer is not None and not isinstance(answer, str):
            raise ValueError(f"{where}: answer must be a string")
        return Question(t, q, answer, turn, obj.get("kind"), tuple(sup))
    text = obj.get("text")
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{where}: a turn needs a non-empty 'text' (or the line needs a 'question')")
    speaker = obj.get("speaker", "")
    session = obj.get("session")
    if session is not None and (isinstance(session, bool) or not isinstance(session, int)):
        raise ValueError(f"{where}: session must be an int, got {session!r}")
    return Turn(t, str(speaker), text, session)


def read_dialogue(path) -> list[Turn | Question]:
    """Read a JSONL dialogue: one object per line, turns and questions in stream order.

    A turn is ``{"t": 12.5, "speaker": "user", "text": "..."}`` (optional
    ``"session": 3``); a question is ``{"t": 14.0, "question": "..."}`` with
    optional ground truth ``"answer"``, ``"turn"``, ``"superseded"``,
    ``"kind"`` (see :class:`Question`).  Times must not decrease.  Blank lines
    are skipped; a bad line raises ValueError naming it.
    """
    items: list[Turn | Question] = []
    last = -math.inf
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: not valid JSON ({exc.msg})") from None
            except RecursionError:
                raise ValueError(f"{where}: JSON nested too deeply (a turn or question is one flat object)") from None
            item = _item_from_json(obj, where)
            if item.t < last:
                raise ValueError(f"{where}: t = {item.t} is before the previous line's {last}")
            last = item.t
            items.append(item)
    return items


def write_dialogue(path, items: Iterable[Turn | Question]) -> Path:
    """Write turns and questions as JSONL (the format :func:`read_dialogue` reads)."""
    path = Path(path)
    with open(path, "w", encoding="utf-8") as fh:
        for item in items:
            if isinstance(item, Turn):
                obj = {"t": round(item.t, 3), "speaker": item.speaker, "text": item.text}
                if item.session is not None:
                    obj["session"] = item.session
            elif isinstance(item, Question):
                obj = {"t": round(item.t, 3), "question": item.question}
                for name in ("answer", "turn", "kind"):
                    if getattr(item, name) is not None:
                        obj[name] = getattr(item, name)
                if item.superseded:
                    obj["superseded"] = list(item.superseded)
            else:
                raise ValueError(f"items must be Turn or Question objects, got {type(item).__name__}")
            fh.write(json.dumps(obj) + "\n")
    return path
