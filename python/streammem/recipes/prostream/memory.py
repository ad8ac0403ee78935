"""ProStream over a dialogue stream: drift segments, multi-granular distillation, bounded memory, ad-hoc recall.

ProStream (Wang, Li and Xu, "Proactive Memory for Ad-Hoc Recall over Streaming
Dialogues", arXiv 2603.04885, with the STEM-Bench benchmark) keeps a bounded,
hierarchical memory of an endless dialogue and answers questions at any point
of it.  This recipe composes it from the kernels and the memory pieces the
package already has:

* **Stream in**: ``Turn(t, speaker, text)`` objects (or a JSONL file of them,
  :func:`read_dialogue`), pushed in any batch size with :meth:`ProStream.push`;
  texts are embedded in one encoder call per batch (or passed pre-computed).
* **Drift segmentation**: ``streammem_kernels.StreamingSegmenter(drift=...,
  max_event=...)`` on the turn embeddings cuts a segment where the cosine of
  consecutive turns drops below ``drift`` or the open segment reaches
  ``max_event`` turns.  A pause of ``session_gap`` seconds (or a change of
  ``Turn.session``) closes the session.
* **Multi-granular distillation**: turn -> segment summary -> session summary,
  stored as the three levels of one ``CosineTree`` (leaves = turns, level 1 =
  segments, level 2 = sessions) through :class:`DialogueTree`, a
  ``LongTermMemory`` whose grouping is by segments and sessions instead of by
  counts.  The default :class:`ExtractiveDistiller` is **extractive and uses
  no model**: a segment's summary quotes its most informative turns (proper
  nouns and numbers, the way classic extractive summarisers weight named
  entities), a session's summary quotes the most informative sentences of its
  segment summaries.  :class:`ModelDistiller` wraps a user's language model
  (any ``generate(prompt) -> str``) for abstractive summaries; any object with
  ``distill_segment`` / ``distill_session`` plugs in.
* **Utility-based bounded memory**: ``BoundedMemory`` (ProStream sec. 5.3)
  with its rule u = 0.6 log(f + 1) + 0.4 exp(-dt / tau), enforced at every
  segment and session close: turns are evicted by least u / token cost, and a
  segment or session goes with its last turn.  f counts uses of a turn: being
  quoted by its segment summary is one (so distilled turns outlive chatter),
  being a recall's best turn is another (``config.access``).
  **Supersession** (at a segment's close, when its summary quotes a turn):
  when a quoted turn is close to an older quoted turn (cosine >=
  ``theta_update``: the same subject restated, e.g. a changed address), the
  newer one takes over the older one's uses, the older one's drop to 0 (it is
  evicted first) and it is marked superseded (it ranks lower in recall).
* **Ad-hoc recall** (:meth:`ProStream.recall`, :meth:`ProStream.ask`), at any
  point of the stream: ``tree_search`` beam search as in ProStream -- the top
  ``beam[0]`` sessions, the top ``beam[1]`` segments under them (plus the open
  session's segments and the open segment's turns, which are roots), and the
  turns under those ranked by cos(q, v) x w (w = (1 + 0.05 u), halved for a superseded turn:
  ``rank_utility``, ``superseded_weight``) among those with cosine >=
  ``min_similarity``.  The default answer (:func:`extractive_answer`) is the
  best unit's text, labelled extractive: it is not a language model; pass
  ``answer_fn`` for one.

Baselines on the same embeddings (:class:`FlatTurnMemory`): retrieve-everything
(exact ``cosine_topk`` over every turn: unbounded memory, latency linear in the
stream) and a recent window (the newest turns within the same token budget).
:func:`synthetic_dialogue` generates a deterministic STEM-like stream with
planted facts, later updates of some of them, chatter on drifting topics and
questions about near, far and superseded facts with their ground truth;
:func:`evaluate` streams it through any of the three and reports recall
accuracy and question latency.  ``streammem prostream`` runs it from the shell.

Out of scope: STEM-Bench's temporal-reasoning and global-awareness question
types (this recipe measures recall of planted facts), and ProStream's
language-model answering and summarisation themselves (hooks only).
"""
from __future__ import annotations

import json
import math
import random
import re
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Callable, Iterable, Protocol, Sequence, runtime_checkable

import numpy as np
import torch
import torch.nn.functional as F

from ...components.answers import extractive_answer
from ...components.bounded import BoundedMemory
from ...components.knowledge import EmbeddingMatrix
from ...components.memory import FrameRecord, LongTermMemory, MemoryNode

__all__ = [
    "Turn",
    "Question",
    "read_dialogue",
    "write_dialogue",
    "Distillate",
    "Distiller",
    "ExtractiveDistiller",
    "ModelDistiller",
    "ProStreamConfig",
    "DialogueTree",
    "RecalledUnit",
    "Recall",
    "ProStream",
    "FlatTurnMemory",
    "SyntheticDialogue",
    "synthetic_dialogue",
    "evaluate",
    "recalls_answer",
]

_FORMAT = "streammem.ProStream"
_VERSION = 1


# --------------------------------------------------------------------------
# The stream: turns and questions, JSONL in and out
# --------------------------------------------------------------------------
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
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{where}: t must be a finite number of seconds, got {value!r}")
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


# --------------------------------------------------------------------------
# Distillation: turn -> segment summary -> session summary
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class Distillate:
    """A segment's summary and which of its turns the summary keeps.

    ``cited``: positions (in the segment) of the turns whose content the
    summary carries; each counts as one use of that turn for the bounded
    memory.  None lets :class:`ProStream` decide by similarity: the turns whose
    cosine with the summary's embedding is at least ``cite_threshold``.
    """

    summary: str
    cited: tuple[int, ...] | None = None


@runtime_checkable
class Distiller(Protocol):
    """Summarises a closed segment's turns, and a closed session's segment summaries.

    ``distill_segment(texts, embeddings)`` gets the segment's turn texts and
    their (n, E) normalised embeddings and returns a :class:`Distillate` (or a
    plain summary string, cited by similarity); ``distill_session(summaries)``
    returns the session's summary text.
    """

    def distill_segment(self, texts: Sequence[str], embeddings: torch.Tensor) -> Distillate | str: ...

    def distill_session(self, summaries: Sequence[str]) -> str: ...


_TOKEN = re.compile(r"[A-Za-z][\w'’-]*|\d[\w:.-]*")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def informative_tokens(text: str) -> int:
    """Proper nouns and numbers in ``text``: tokens with a digit, or capitalised and not starting a sentence.

    The pronoun "I" does not count.  (A sentence-initial name is not seen as
    one; a deterministic heuristic, not a named-entity model.)
    """
    count = 0
    for sentence in _SENTENCE_END.split(text.strip()):
        for i, tok in enumerate(_TOKEN.findall(sentence)):
            if any(c.isdigit() for c in tok):
                count += 1
            elif i > 0 and tok[0].isupper() and tok != "I":
                count += 1
    return count


class ExtractiveDistiller:
    """Model-free extractive distillation (the default; it does not pretend to be a model).

    A segment's summary quotes, in time order, its turns with at least
    ``min_informative`` proper nouns or numbers (:func:`informative_tokens`),
    at most ``segment_turns`` of them (the most informative first, earlier on
    ties); those turns are cited.  A segment without such a turn is summarised
    by its most central turn (highest cosine with the segment's mean
    embedding), which is not cited.  A session's summary quotes the
    ``session_sentences`` most informative sentences of its segment summaries,
    in time order.

    Parameters
    ----------
    segment_turns : int >= 1
    session_sentences : int >= 1
    min_informative : int >= 1
    """

    name = "extractive"

    def __init__(self, *, segment_turns: int = 2, session_sentences: int = 3, min_informative: int = 1):
        for arg, value in (("segment_turns", segment_turns), ("session_sentences", session_sentences),
                           ("min_informative", min_informative)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{arg} must be an int >= 1, got {value!r}")
        self.segment_turns = segment_turns
        self.session_sentences = session_sentences
        self.min_informative = min_informative

    def distill_segment(self, texts: Sequence[str], embeddings: torch.Tensor) -> Distillate:
        if not texts:
            raise ValueError("texts must hold at least one turn")
        scores = [informative_tokens(t) for t in texts]
        ranked = sorted((i for i, s in enumerate(scores) if s >= self.min_informative), key=lambda i: (-scores[i], i))
        cited = tuple(sorted(ranked[: self.segment_turns]))
        if cited:
            return Distillate(" ".join(texts[i] for i in cited), cited)
        centre = F.normalize(embeddings.float().mean(0), dim=0)
        central = int(torch.argmax(embeddings.float() @ centre))
        return Distillate(texts[central], ())

    def distill_session(self, summaries: Sequence[str]) -> str:
        if not summaries:
            raise ValueError("summaries must hold at least one segment summary")
        sentences = [s for summary in summaries for s in _SENTENCE_END.split(summary.strip()) if s]
        scores = [informative_tokens(s) for s in sentences]
        best = sorted(range(len(sentences)), key=lambda i: (-scores[i], i))[: self.session_sentences]
        return " ".join(sentences[i] for i in sorted(best))


class ModelDistiller:
    """Abstractive distillation by a user's language model: ``generate(prompt) -> str``.

    The recipe provides the prompts and the loop; the model is yours (nothing
    is downloaded).  Turns are cited by similarity to the summary
    (``ProStreamConfig.cite_threshold``), since an abstractive summary does not
    say which turns it used.

    >>> distiller = ModelDistiller(lambda prompt: my_llm(prompt, max_new_tokens=48))
    """

    name = "model"

    def __init__(self, generate: Callable[[str], str], *,
                 segment_prompt: str = "Summarise the facts stated in this part of a conversation in one "
                                       "sentence.\n{turns}\nSummary:",
                 session_prompt: str = "Summarise these notes about a conversation in two sentences.\n"
                                       "{summaries}\nSummary:"):
        if not callable(generate):
            raise ValueError(f"generate must be callable(prompt) -> str, got {type(generate).__name__}")
        for arg, prompt, slot in (("segment_prompt", segment_prompt, "{turns}"),
                                  ("session_prompt", session_prompt, "{summaries}")):
            if slot not in prompt:
                raise ValueError(f"{arg} must contain {slot}")
        self.generate = generate
        self.segment_prompt = segment_prompt
        self.session_prompt = session_prompt

    def _call(self, prompt: str) -> str:
        out = self.generate(prompt)
        if not isinstance(out, str) or not out.strip():
            raise ValueError(f"generate(prompt) must return a non-empty string, got {out!r}")
        return out.strip()

    def distill_segment(self, texts: Sequence[str], embeddings: torch.Tensor) -> Distillate:
        return Distillate(self._call(self.segment_prompt.format(turns="\n".join(f"- {t}" for t in texts))), None)

    def distill_session(self, summaries: Sequence[str]) -> str:
        return self._call(self.session_prompt.format(summaries="\n".join(f"- {s}" for s in summaries)))


# --------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------
_ACCESS = ("context", "answer", "none")


@dataclass(frozen=True)
class ProStreamConfig:
    """Every parameter of a :class:`ProStream` memory.

    Parameters
    ----------
    drift : float in [-1, 1]
        Cut a segment where cos(turn_t, turn_{t-1}) < drift (ProStream sec. 5.1).
    max_event : int >= 1
        A segment closes when it reaches this many turns.
    session_gap : float > 0
        Seconds of silence that close the session.
    budget : int >= 1
        Token budget of the memory (``BoundedMemory``: a node costs its words + 1).
    alpha, beta, tau, low_water
        ``BoundedMemory`` utility u = alpha log(f + 1) + beta exp(-dt / tau)
        (tau in stream seconds) and eviction hysteresis.
    theta_update : float in [-1, 1] or None
        Supersession threshold between cited turns (None: off).
    theta_concept : float in [-1, 1] or None
        ``BoundedMemory``'s novelty check (skip a turn this close to a stored
        one).  Off by default: in a dialogue an update ("X is now B") is close
        to what it replaces, and skipping it would keep the stale version.
    beam : (int, int)
        Sessions kept, then segments kept.  ProStream keeps 5 scenes and 10
        events each (5, 50); the default is wider because an extractive session
        summary quotes only ``session_sentences`` sentences, so a session whose
        summary does not mention the asked fact is often outside a 5-session
        beam: on ``synthetic_dialogue(10_000)`` top-1 accuracy is 0.57 with
        (5, 50), 0.73 with (20, 100) and 0.74 exhaustive (hashing encoder).
    k : int >= 1
        Turns returned per recall.
    min_similarity : float
        Turns with cosine below it are never returned.
    access : {"context", "answer", "none"}
        Which recalled turns count a use (every returned turn, the best one,
        none) -- for the eviction utility only.
    rank_utility : float >= 0
        Recall ranks turns by cos(q, v) x w with w = 1 + ``rank_utility`` x u:
        0 ranks by cosine alone, larger values let the eviction utility u
        (uses, recency) lift a turn.  Small by default: counting a recall's
        answer as a use would otherwise let a turn that was (wrongly) recalled
        once keep winning -- a feedback loop that the synthetic stream shows.
    superseded_weight : float in (0, 1]
        w is further multiplied by this for a superseded turn, so the newer
        version of a restated subject ranks above the older one (1: no effect).
    cite_threshold : float
        Citation by similarity for distillers that do not cite (``Distillate.cited`` None).
    backend : str
        Kernel backend for every op.

    ``ProStreamConfig.for_encoder("minilm" | "hashing")`` gives the thresholds
    calibrated for the built-in text encoders on :func:`synthetic_dialogue`
    (the defaults are MiniLM's).
    """

    drift: float = 0.3
    max_event: int = 24
    session_gap: float = 1800.0
    budget: int = 6000
    alpha: float = 0.6
    beta: float = 0.4
    tau: float = 3600.0
    low_water: float = 0.8
    theta_update: float | None = 0.66
    theta_concept: float | None = None
    beam: tuple[int, int] = (20, 100)
    k: int = 5
    min_similarity: float = 0.35
    access: str = "answer"
    rank_utility: float = 0.05
    superseded_weight: float = 0.5
    cite_threshold: float = 0.5
    backend: str = "auto"

    def __post_init__(self):
        def real(name, low=None, high=None, open_low=False, optional=False):
            value = getattr(self, name)
            if value is None and optional:
                return
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
            if low is not None and (value <= low if open_low else value < low):
                raise ValueError(f"{name} must be {'>' if open_low else '>='} {low}, got {value!r}")
            if high is not None and value > high:
                raise ValueError(f"{name} must be <= {high}, got {value!r}")
            object.__setattr__(self, name, float(value))

        def integer(name, low):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
            object.__setattr__(self, name, int(value))

        real("drift", -1.0, 1.0)
        integer("max_event", 1)
        real("session_gap", 0.0, open_low=True)
        integer("budget", 1)
        real("alpha")
        real("beta")
        real("tau", 0.0, open_low=True)
        real("low_water", 0.0, 1.0, open_low=True)
        real("theta_update", -1.0, 1.0, optional=True)
        real("theta_concept", -1.0, 1.0, optional=True)
        beam = self.beam
        if (not isinstance(beam, (tuple, list)) or len(beam) != 2
                or not all(isinstance(b, (int, np.integer)) and not isinstance(b, bool) and b >= 1 for b in beam)):
            raise ValueError(f"beam must be (sessions, segments), two ints >= 1, got {beam!r}")
        object.__setattr__(self, "beam", (int(beam[0]), int(beam[1])))
        integer("k", 1)
        real("min_similarity", -1.0, 1.0)
        if self.access not in _ACCESS:
            raise ValueError(f"access must be one of {_ACCESS}, got {self.access!r}")
        real("rank_utility", 0.0)
        real("superseded_weight", 0.0, 1.0, open_low=True)
        real("cite_threshold", -1.0, 1.0)
        if not isinstance(self.backend, str):
            raise ValueError(f"backend must be a string, got {self.backend!r}")

    @classmethod
    def for_encoder(cls, name: str, **changes) -> "ProStreamConfig":
        """Thresholds calibrated for a built-in text encoder ("minilm" / "all-MiniLM-L6-v2" or "hashing")."""
        if name in ("minilm", "all-MiniLM-L6-v2"):
            base = {}
        elif name == "hashing":
            base = {"drift": 0.08, "theta_update": 0.7, "min_similarity": 0.3}
        else:
            raise ValueError(f"name must be 'minilm' or 'hashing' (calibrated encoders), got {name!r}")
        base.update(changes)
        return cls(**base)

    def replace(self, **changes) -> "ProStreamConfig":
        return replace(self, **changes)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["beam"] = list(self.beam)
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "ProStreamConfig":
        if not isinstance(data, dict):
            raise ValueError(f"data must be a dict from ProStreamConfig.to_dict(), got {type(data).__name__}")
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"data has unknown ProStreamConfig fields {unknown}")
        data = dict(data)
        if "beam" in data and isinstance(data["beam"], list):
            data["beam"] = tuple(data["beam"])
        return cls(**data)


# --------------------------------------------------------------------------
# The memory tree: turns, segments, sessions
# --------------------------------------------------------------------------
class _KeepCaption:
    """``LongTermMemory.merge_leaves`` re-captions a merged leaf; dialogue turns keep their own texts."""

    @staticmethod
    def summarize(nodes) -> str:
        return " ".join(n.caption for n in nodes)


class DialogueTree(LongTermMemory):
    """``LongTermMemory`` whose leaves are turns and whose parents are segments and sessions.

    Same node table, ``CosineTree`` index, eviction and checkpoint machinery
    (so ``BoundedMemory`` manages it unchanged); only formation differs:
    :meth:`add_turn` adds one leaf per turn (its caption the text, its
    embedding the turn's, its one "centre" the same vector: nothing to
    compress in text), and :meth:`add_summary` adds a parent over given
    current roots (a closed segment's turns, a closed session's segments),
    instead of StreamChat's every-g-nodes grouping.
    """

    def __init__(self, text_encoder, *, backend: str = "auto"):
        super().__init__(text_encoder, _KeepCaption(), chunk=1, group=2, centres=1, backend=backend)

    def _grow(self) -> list[MemoryNode]:
        return []  # parents come from segment and session closes, not from counts

    def add_turn(self, index: int, t: float, speaker: str, text: str, embedding: torch.Tensor) -> MemoryNode | None:
        """Add turn ``index`` as a leaf; None when the novelty filter (if installed) skips it."""
        emb = F.normalize(embedding.float().reshape(-1), dim=0)
        if self.novelty_filter is not None and self.novelty_filter(emb, [FrameRecord(index, t, emb, (speaker,))]):
            return None
        node = MemoryNode(node_id=self._new_id(), level=0, t_start=t, t_end=t, first_frame=index, last_frame=index,
                          caption=text, embedding=emb, centres=emb[None].clone(), created_at=t, last_access=t)
        node.label_counts[speaker] += 1
        t0 = time.perf_counter()
        self._insert(node)
        self.timings["tree_insert"] += time.perf_counter() - t0
        return node

    def add_summary(self, child_ids: Sequence[int], caption: str, embedding: torch.Tensor) -> MemoryNode:
        """Add a parent (segment or session) over current roots ``child_ids`` of one level."""
        children = [self.nodes[i] for i in child_ids]
        levels = {c.level for c in children}
        if not children or len(levels) != 1 or any(c.parent is not None for c in children):
            raise ValueError(f"child_ids must be current roots of one level, got {list(child_ids)}")
        emb = F.normalize(embedding.float().reshape(-1), dim=0)
        label_counts = sum((c.label_counts for c in children), type(children[0].label_counts)())
        node = MemoryNode(
            node_id=self._new_id(), level=children[0].level + 1, t_start=children[0].t_start,
            t_end=children[-1].t_end, first_frame=children[0].first_frame, last_frame=children[-1].last_frame,
            caption=caption, embedding=emb, centres=emb[None].clone(), label_counts=label_counts,
            children=[c.node_id for c in children], created_at=children[-1].t_end,
            last_access=max(c.last_access for c in children), merged=sum(c.merged for c in children))
        t0 = time.perf_counter()
        self._insert(node)
        self.timings["tree_insert"] += time.perf_counter() - t0
        return node


# --------------------------------------------------------------------------
# Recall results
# --------------------------------------------------------------------------
@dataclass
class RecalledUnit:
    """One recalled turn (or merged run of turns): turn indices, time, speaker, text and its scores.

    ``cosine``: with the question; ``utility``: the eviction utility u at the
    recall's stream time; ``score``: what ranked it (cosine x rank weight, see
    :meth:`ProStream.rank_weight`; the cosine for the flat baselines).
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

    def covers(self, turn: int) -> bool:
        return self.first_turn <= turn <= self.last_turn


@dataclass
class Recall:
    """What one question recalled: units best first, the answer, timings.

    ``latency_s`` is the retrieval time (utility refresh + search + bookkeeping),
    question encoding excluded (``timings["question_encode"]`` when ``ask``
    encoded it).
    """

    question: str
    stream_time: float | None
    units: list[RecalledUnit]
    latency_s: float
    timings: dict = field(default_factory=dict)
    answer: str | None = None
    answer_kind: str | None = None

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
            "latency_ms": round(1e3 * self.latency_s, 3),
            "timings_ms": {k: round(1e3 * v, 3) for k, v in self.timings.items()},
        }


@extractive_answer.register(Recall)
def _extractive_recall(recall: Recall) -> str | None:
    """ProStream's default answer: the best recalled turn's text, verbatim (extractive; no model); None
    when nothing was recalled."""
    return recall.best.text if recall.best is not None else None


def _unit(node: MemoryNode, q: torch.Tensor, utility: float, score: float | None = None) -> RecalledUnit:
    cos = float(node.embedding @ q)
    speaker = next(iter(node.label_counts), "") if node.label_counts else ""
    return RecalledUnit(node.node_id, node.first_frame, node.last_frame, node.t_start, speaker, node.caption, cos,
                        utility, cos * utility if score is None else score)


# --------------------------------------------------------------------------
# ProStream
# --------------------------------------------------------------------------
@dataclass
class ProStreamStats:
    turns: int = 0
    skipped: int = 0
    segments: int = 0
    sessions: int = 0
    cited: int = 0
    superseded: int = 0
    recalls: int = 0


class ProStream:
    """ProStream's bounded hierarchical memory of one dialogue stream (see the module docstring).

    Parameters
    ----------
    text_encoder : TextEncoder
        Embeds turns (unless embeddings are passed to ``push``), summaries and questions.
    config : ProStreamConfig, optional
    distiller : Distiller, optional
        Default :class:`ExtractiveDistiller` (model-free).
    answer_fn : callable(Recall) -> str, optional
        A language model's answer from the recalled turns; default
        :func:`extractive_answer` (reported as ``answer_kind="extractive"``).

    Single-threaded.  ``state_dict`` / ``save`` / ``load`` checkpoint
    everything (the segmenter's state, the node table and tree row for row,
    the open segment and session, statistics), so a restored memory continues
    exactly; the encoder and hooks are not state.
    """

    def __init__(self, text_encoder, config: ProStreamConfig | None = None, *, distiller: Distiller | None = None,
                 answer_fn: Callable[[Recall], str] | None = None):
        from streammem_kernels import StreamingSegmenter

        if text_encoder is None or not callable(getattr(text_encoder, "encode", None)):
            raise ValueError("text_encoder must have encode(texts) -> (n, E) tensor (e.g. load_text_encoder())")
        config = ProStreamConfig() if config is None else config
        if not isinstance(config, ProStreamConfig):
            raise ValueError(f"config must be a ProStreamConfig, got {type(config).__name__}")
        distiller = ExtractiveDistiller() if distiller is None else distiller
        if not (callable(getattr(distiller, "distill_segment", None))
                and callable(getattr(distiller, "distill_session", None))):
            raise ValueError("distiller must have distill_segment(texts, embeddings) and distill_session(summaries)")
        if answer_fn is not None and not callable(answer_fn):
            raise ValueError("answer_fn must be callable(Recall) -> str")
        self.text_encoder = text_encoder
        self.config = config
        self.distiller = distiller
        self.answer_fn = answer_fn
        self.tree = DialogueTree(text_encoder, backend=config.backend)
        # theta_sim = 1: BoundedMemory never merges two different turns (a merge would blend an
        # update with what it replaces); only exact duplicates can exceed it through rounding.
        self.bounded = BoundedMemory(self.tree, config.budget, alpha=config.alpha, beta=config.beta, tau=config.tau,
                                     theta_sim=1.0, theta_concept=config.theta_concept, tokens_per_centre=1,
                                     low_water=config.low_water)
        self.segmenter = StreamingSegmenter(window=8, max_event=config.max_event, drift=config.drift,
                                            backend=config.backend)
        self.stats = ProStreamStats()
        self.stream_time: float | None = None
        self.timings: dict[str, float] = {}
        self._session: int | None = None  # Turn.session of the last turn
        self._open_turns: list[tuple[int, int | None]] = []  # (segmenter position, node id or None if skipped)
        self._open_segments: list[int] = []  # segment node ids of the open session
        self._cited: set[int] = set()  # cited, not superseded turn node ids
        self._superseded: set[int] = set()  # turn node ids replaced by a newer statement
        self._cost = 0  # == self.bounded.total_cost(), kept incrementally

    # ---- reading the memory ----------------------------------------------------
    @property
    def memory_tokens(self) -> int:
        """Token cost of everything stored (what ``budget`` bounds)."""
        return self._cost

    @property
    def stored_turns(self) -> int:
        return sum(1 for n in self.tree.nodes.values() if n.level == 0)

    def summary(self) -> dict:
        levels = self.tree.levels()
        s = self.bounded.stats
        return {
            "turns": self.stats.turns, "skipped_redundant": self.stats.skipped, "segments": self.stats.segments,
            "sessions": self.stats.sessions, "cited": self.stats.cited, "superseded": self.stats.superseded,
            "recalls": self.stats.recalls, "stream_time": self.stream_time,
            "stored": {"turns": levels.get(0, 0), "segments": levels.get(1, 0), "sessions": levels.get(2, 0)},
            "memory_tokens": self.memory_tokens, "budget": self.bounded.budget, "peak_tokens": s.peak_cost,
            "evicted_turns": s.removed_leaves, "evicted_summaries": s.removed_parents, "eviction_rounds": s.rounds,
            "distiller": getattr(self.distiller, "name", type(self.distiller).__name__),
            "seconds": {k: round(v, 4) for k, v in sorted(self.timings.items())},
        }

    def _time(self, name: str, t0: float) -> None:
        self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - t0

    # ---- the stream --------------------------------------------------------------
    def push(self, turns: Turn | Sequence[Turn], embeddings: torch.Tensor | None = None) -> int:
        """Add turns in stream order; returns the number of segments closed.

        Parameters
        ----------
        turns : Turn or sequence of Turn
            Times must not decrease (across pushes too).
        embeddings : (n, E) float tensor, optional
            The turns' text embeddings, if already computed (else one encoder call).
        """
        if isinstance(turns, Turn):
            turns = [turns]
        turns = list(turns)
        if not all(isinstance(x, Turn) for x in turns):
            raise ValueError("turns must be Turn objects")
        if not turns:
            return 0
        last = self.stream_time if self.stream_time is not None else -math.inf
        for i, turn in enumerate(turns):
            t = _check_time(turn.t, f"turns[{i}]")
            if t < last:
                raise ValueError(f"turns[{i}].t = {t} is before the stream time {last}; times must not decrease")
            if not isinstance(turn.text, str) or not turn.text.strip():
                raise ValueError(f"turns[{i}].text must be a non-empty string")
            last = t
        t0 = time.perf_counter()
        if embeddings is None:
            embeddings = self.text_encoder.encode([turn.text for turn in turns])
            self._time("encode", t0)
        embeddings = torch.as_tensor(embeddings)
        if embeddings.dim() != 2 or embeddings.shape[0] != len(turns) or not embeddings.is_floating_point():
            raise ValueError(f"embeddings must be a float ({len(turns)}, E) tensor, got {tuple(embeddings.shape)}")
        if not bool(torch.isfinite(embeddings).all()):
            raise ValueError("embeddings must be finite")
        embeddings = F.normalize(embeddings.float(), dim=1)
        closed = 0
        for turn, emb in zip(turns, embeddings):
            closed += self._push_one(turn, emb)
        return closed

    def _push_one(self, turn: Turn, emb: torch.Tensor) -> int:
        closed = 0
        gap = self.stream_time is not None and turn.t - self.stream_time >= self.config.session_gap
        new_session = turn.session is not None and self._session is not None and turn.session != self._session
        if gap or new_session:
            closed += self.close_session()
        self.stream_time = turn.t if self.stream_time is None else max(self.stream_time, turn.t)
        self._session = turn.session
        index = self.stats.turns
        self.stats.turns += 1
        t0 = time.perf_counter()
        node = self.tree.add_turn(index, turn.t, turn.speaker, turn.text, emb)
        self._time("insert", t0)
        if node is None:
            self.stats.skipped += 1
        else:
            self._cost += self.bounded.cost(node)
        t0 = time.perf_counter()
        events = self.segmenter.push(emb)
        self._time("segment", t0)
        self._open_turns.append((self.segmenter.frames_seen - 1, None if node is None else node.node_id))
        for event in events:
            self._close_segment(event.start, event.end)
            closed += 1
        return closed

    def _close_segment(self, start: int, end: int) -> None:
        members = [(pos, nid) for pos, nid in self._open_turns if start <= pos <= end]
        self._open_turns = [(pos, nid) for pos, nid in self._open_turns if pos > end]
        ids = [nid for _, nid in members if nid is not None and nid in self.tree.nodes]
        if not ids:
            return
        t0 = time.perf_counter()
        nodes = [self.tree.nodes[i] for i in ids]
        embs = torch.stack([n.embedding for n in nodes])
        out = self.distiller.distill_segment([n.caption for n in nodes], embs)
        distillate = out if isinstance(out, Distillate) else Distillate(str(out), None)
        if not isinstance(distillate.summary, str) or not distillate.summary.strip():
            raise ValueError(f"distill_segment must return a non-empty summary, got {distillate.summary!r}")
        self._time("distill", t0)
        summary_emb = self._embed_summary(distillate.summary, nodes)
        if distillate.cited is None:
            cited = [i for i, c in enumerate((embs @ summary_emb).tolist()) if c >= self.config.cite_threshold]
        else:
            cited = sorted(set(int(i) for i in distillate.cited))
            if any(not 0 <= i < len(nodes) for i in cited):
                raise ValueError(f"Distillate.cited must index the segment's {len(nodes)} turns, got {cited}")
        t0 = time.perf_counter()
        segment = self.tree.add_summary(ids, distillate.summary, summary_emb)
        self._cost += self.bounded.cost(segment)
        self._time("insert", t0)
        self._open_segments.append(segment.node_id)
        self.stats.segments += 1
        t0 = time.perf_counter()
        for i in cited:
            self._cite(nodes[i])
        self._time("supersede", t0)
        self._enforce()

    def _embed_summary(self, summary: str, nodes: Sequence[MemoryNode]) -> torch.Tensor:
        for n in nodes:  # an extractive summary of one turn is that turn: reuse its embedding
            if n.caption == summary:
                return n.embedding
        t0 = time.perf_counter()
        emb = self.text_encoder.encode([summary])[0]
        self._time("encode", t0)
        return F.normalize(emb.float(), dim=0)

    def _cite(self, node: MemoryNode) -> None:
        """Count the summary's use of a turn, then let it supersede the closest older cited turn."""
        node.access_count += 1
        self.stats.cited += 1
        theta = self.config.theta_update
        others = [i for i in self._cited if i in self.tree.nodes]
        self._cited = set(others)
        if theta is not None and others:
            from streammem_kernels import cosine_topk

            keys = torch.stack([self.tree.nodes[i].embedding for i in others])
            res = cosine_topk(node.embedding[None], keys, 1, backend=self.config.backend)
            if float(res.scores[0, 0]) >= theta:
                old = self.tree.nodes[others[int(res.ids[0, 0])]]
                # The newer statement takes over the older one's uses (not their sum: a subject
                # restated ten times is not ten times as useful as one stated once).
                node.access_count = max(node.access_count, old.access_count)
                old.access_count = 0
                self._cited.discard(old.node_id)
                self._superseded.add(old.node_id)
                self.stats.superseded += 1
        self._cited.add(node.node_id)

    def close_session(self) -> int:
        """Close the open segment and the open session (a pause did); returns the segments closed."""
        closed = 0
        for event in self.segmenter.flush():
            self._close_segment(event.start, event.end)
            closed += 1
        ids = [i for i in self._open_segments if i in self.tree.nodes]
        self._open_segments = []
        if ids:
            t0 = time.perf_counter()
            caption = self.distiller.distill_session([self.tree.nodes[i].caption for i in ids])
            if not isinstance(caption, str) or not caption.strip():
                raise ValueError(f"distill_session must return a non-empty summary, got {caption!r}")
            self._time("distill", t0)
            emb = self._embed_summary(caption, [self.tree.nodes[i] for i in ids])
            t0 = time.perf_counter()
            session = self.tree.add_summary(ids, caption, emb)
            self._cost += self.bounded.cost(session)
            self._time("insert", t0)
            self.stats.sessions += 1
            self._enforce()
        return closed

    def finish(self) -> int:
        """End of stream: close the open segment and session."""
        return self.close_session()

    def _enforce(self) -> None:
        if self.stream_time is None:
            return
        # Node costs are fixed at creation, so the running sum is exact and BoundedMemory's
        # O(nodes) pass (total_cost, then eviction) runs only when the budget is exceeded.
        stats = self.bounded.stats
        stats.peak_cost = max(stats.peak_cost, self._cost)
        if self._cost <= self.bounded.budget:
            return
        t0 = time.perf_counter()
        self.bounded.enforce(self.stream_time)
        self._cost = self.bounded.total_cost()
        self._time("evict", t0)

    # ---- questions ---------------------------------------------------------------
    def encode_question(self, question: str) -> torch.Tensor:
        if not isinstance(question, str) or not question.strip():
            raise ValueError("question must be a non-empty string")
        return F.normalize(self.text_encoder.encode([question])[0].float(), dim=0)

    def ask(self, question: str, *, k: int | None = None, answer: bool = True) -> Recall:
        """Encode the question, recall now, and answer (``answer_fn`` or extractive)."""
        t0 = time.perf_counter()
        q = self.encode_question(question)
        encode_s = time.perf_counter() - t0
        rec = self.recall(q, question=question, k=k)
        rec.timings["question_encode"] = encode_s
        if answer:
            if self.answer_fn is not None:
                t1 = time.perf_counter()
                rec.answer, rec.answer_kind = self.answer_fn(rec), "model"
                rec.timings["answer"] = time.perf_counter() - t1
            else:
                rec.answer, rec.answer_kind = extractive_answer(rec), "extractive"
        return rec

    def _beam(self) -> tuple[int, ...]:
        sessions, segments = self.config.beam
        return (sessions, segments) if self.tree.tree.height >= 2 else (segments,)

    def rank_weight(self, node: MemoryNode, now: float | None = None) -> float:
        """Recall's weight of a turn: (1 + rank_utility x u) x (superseded_weight if superseded)."""
        now = (self.stream_time or 0.0) if now is None else now
        w = 1.0 + self.config.rank_utility * self.bounded.utility(node, now)
        return w * self.config.superseded_weight if node.node_id in self._superseded else w

    def refresh_utility(self) -> None:
        """Write every stored turn's rank weight at the current stream time into the tree's utility column."""
        tree = self.tree.tree
        if tree is None or tree.num_live == 0:
            return
        now = self.stream_time if self.stream_time is not None else 0.0
        self._superseded &= self.tree.nodes.keys()
        rows = ((tree.level == 0) & tree.alive).nonzero()[:, 0]
        nodes = [self.tree.node_at(r) for r in rows.tolist()]
        # rank_weight for every stored turn at once (one Python pass to read the nodes, then tensors).
        uses = torch.tensor([n.access_count for n in nodes], dtype=torch.float64)
        idle = (now - torch.tensor([n.last_access for n in nodes], dtype=torch.float64)).clamp_min(0.0)
        b = self.bounded
        utility = b.alpha * torch.log1p(uses) + b.beta * torch.exp(-idle / b.tau)
        weight = 1.0 + self.config.rank_utility * utility
        superseded = torch.tensor([n.node_id in self._superseded for n in nodes], dtype=torch.bool)
        weight = torch.where(superseded, weight * self.config.superseded_weight, weight)
        tree.set_utility(rows, weight.to(torch.float32))

    def recall(self, query_embedding, *, question: str = "", k: int | None = None) -> Recall:
        """Ad-hoc recall now: beam over sessions and segments, turns by cos x rank weight (cos >= min_similarity).

        Parameters
        ----------
        query_embedding : (E,) float tensor
            The question's embedding (normalised here).
        k : int, optional
            Turns returned (default ``config.k``).

        The returned turns count a use (``config.access``) at the current stream time.
        """
        from streammem_kernels import tree_search

        k = self.config.k if k is None else k
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an int >= 1, got {k!r}")
        q = torch.as_tensor(query_embedding, dtype=torch.float32).reshape(-1)
        if q.shape[0] != self.text_encoder.dim or not bool(torch.isfinite(q).all()):
            raise ValueError(f"query_embedding must be a finite ({self.text_encoder.dim},) vector, "
                             f"got {tuple(q.shape)}")
        q = F.normalize(q, dim=0)
        t0 = time.perf_counter()
        tree = self.tree.tree
        units: list[RecalledUnit] = []
        timings = {}
        if tree is not None and tree.num_live > 0:
            self.refresh_utility()
            t1 = time.perf_counter()
            res = tree_search(tree, q[None], beam=self._beam(), k=k, min_score=self.config.min_similarity,
                              use_utility=True, backend=self.config.backend)
            t2 = time.perf_counter()
            timings.update(utility=t1 - t0, search=t2 - t1)
            now = self.stream_time if self.stream_time is not None else 0.0
            for row, score in zip(res.ids[0].tolist(), res.scores[0].tolist()):
                if row >= 0:
                    node = self.tree.node_at(row)
                    units.append(_unit(node, q, self.bounded.utility(node, now), score))
            used = units if self.config.access == "context" else units[:1] if self.config.access == "answer" else []
            for u in used:
                node = self.tree.nodes[u.node]
                node.access_count += 1
                node.last_access = max(node.last_access, now)
        latency = time.perf_counter() - t0
        timings["total"] = latency
        self.stats.recalls += 1
        return Recall(question, self.stream_time, units, latency, timings)

    # ---- checkpoints ---------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything needed to continue exactly; ``torch.load(weights_only=True)`` reads it."""
        return {
            "format": _FORMAT, "version": _VERSION, "config": self.config.to_dict(),
            "text_dim": int(self.text_encoder.dim),
            "tree": self.tree.state_dict(), "bounded": self.bounded.state_dict(),
            "segmenter": self.segmenter.state_dict(),
            "stats": asdict(self.stats), "stream_time": self.stream_time, "timings": dict(self.timings),
            "session": self._session, "open_turns": [[p, -1 if n is None else n] for p, n in self._open_turns],
            "open_segments": list(self._open_segments), "cited": sorted(self._cited),
            "superseded": sorted(self._superseded),
        }

    def load_state_dict(self, state: dict) -> None:
        if not isinstance(state, dict) or state.get("format") != _FORMAT:
            raise ValueError("state is not a ProStream state_dict")
        if state.get("version") != _VERSION:
            raise ValueError(f"unsupported ProStream state version {state.get('version')!r} (this is {_VERSION})")
        if ProStreamConfig.from_dict(state["config"]) != self.config:
            raise ValueError("state was saved with another ProStreamConfig")
        if state["text_dim"] != int(self.text_encoder.dim):
            raise ValueError(f"state was saved with a {state['text_dim']}-d text encoder, this memory has "
                             f"{self.text_encoder.dim}-d")
        self.tree.load_state_dict(state["tree"])
        self.bounded.load_state_dict(state["bounded"])
        self.segmenter.load_state_dict(state["segmenter"])
        self.stats = ProStreamStats(**state["stats"])
        self.stream_time = state["stream_time"]
        self.timings = dict(state["timings"])
        self._session = state["session"]
        self._open_turns = [(int(p), None if n < 0 else int(n)) for p, n in state["open_turns"]]
        self._open_segments = [int(i) for i in state["open_segments"]]
        self._cited = set(int(i) for i in state["cited"])
        self._superseded = set(int(i) for i in state["superseded"])
        self._cost = self.bounded.total_cost()

    def save(self, path) -> Path:
        """Write ``state_dict()`` to ``path`` (a file)."""
        path = Path(path)
        torch.save(self.state_dict(), path)
        return path

    @classmethod
    def load(cls, path, text_encoder, **hooks) -> "ProStream":
        """A memory saved with ``save`` (pass the same encoder; ``distiller`` / ``answer_fn`` as hooks)."""
        state = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(state, dict) or state.get("format") != _FORMAT:
            raise ValueError(f"{path} does not hold a ProStream state")
        memory = cls(text_encoder, ProStreamConfig.from_dict(state["config"]), **hooks)
        memory.load_state_dict(state)
        return memory


# --------------------------------------------------------------------------
# Baselines: retrieve-everything and a recent window
# --------------------------------------------------------------------------
def _turn_cost(text: str) -> int:
    return len(text.split()) + 1  # as BoundedMemory prices a turn: its words + its one embedding


class FlatTurnMemory:
    """Every turn (``window_tokens=None``: retrieve-everything) or the newest within a token budget.

    Recall is exact ``cosine_topk`` over the stored turns (the window is a
    view of the newest rows: nothing is copied), best ``k`` with cosine >=
    ``min_similarity``.  Same ``push`` / ``recall`` interface as :class:`ProStream`.
    """

    def __init__(self, text_encoder, *, window_tokens: int | None = None, k: int = 5, min_similarity: float = -1.0,
                 backend: str = "auto"):
        if window_tokens is not None and (isinstance(window_tokens, bool) or not isinstance(window_tokens, int)
                                          or window_tokens < 1):
            raise ValueError(f"window_tokens must be an int >= 1 or None, got {window_tokens!r}")
        self.text_encoder = text_encoder
        self.window_tokens = window_tokens
        self.k = k
        self.min_similarity = float(min_similarity)
        self.backend = backend
        self._rows = EmbeddingMatrix()
        self._turns: list[Turn] = []
        self._costs: list[int] = []
        self._start = 0  # first turn in the window
        self._window_cost = 0
        self.stream_time: float | None = None

    @property
    def name(self) -> str:
        return "retrieve-everything" if self.window_tokens is None else "recent-window"

    @property
    def stored_turns(self) -> int:
        return len(self._turns) - self._start

    @property
    def memory_tokens(self) -> int:
        return self._window_cost

    def push(self, turns: Turn | Sequence[Turn], embeddings: torch.Tensor | None = None) -> int:
        turns = [turns] if isinstance(turns, Turn) else list(turns)
        if not turns:
            return 0
        if embeddings is None:
            embeddings = self.text_encoder.encode([t.text for t in turns])
        embeddings = F.normalize(torch.as_tensor(embeddings).float(), dim=1)
        if embeddings.shape[0] != len(turns):
            raise ValueError(f"embeddings must hold one row per turn ({len(turns)}), got {embeddings.shape[0]}")
        for turn, emb in zip(turns, embeddings):
            self._rows.append(emb)
            self._turns.append(turn)
            cost = _turn_cost(turn.text)
            self._costs.append(cost)
            self._window_cost += cost
            self.stream_time = turn.t
        if self.window_tokens is not None:
            while self._window_cost > self.window_tokens and self._start < len(self._turns) - 1:
                self._window_cost -= self._costs[self._start]
                self._start += 1
        return 0

    def finish(self) -> int:
        return 0

    def recall(self, query_embedding, *, question: str = "", k: int | None = None) -> Recall:
        from streammem_kernels import cosine_topk

        k = self.k if k is None else k
        q = F.normalize(torch.as_tensor(query_embedding, dtype=torch.float32).reshape(1, -1), dim=1)
        t0 = time.perf_counter()
        units = []
        if self._turns:
            # The window is a view of the newest rows: nothing outside it is read (or validated).
            res = cosine_topk(q, self._rows.rows[self._start:], k, backend=self.backend)
            for i, s in zip(res.ids[0].tolist(), res.scores[0].tolist()):
                i += self._start
                if i >= self._start and s >= self.min_similarity:
                    turn = self._turns[i]
                    units.append(RecalledUnit(-1, i, i, turn.t, turn.speaker, turn.text, s, 1.0, s))
        latency = time.perf_counter() - t0
        return Recall(question, self.stream_time, units, latency, {"total": latency})


# --------------------------------------------------------------------------
# Synthetic STEM-like stream
# --------------------------------------------------------------------------
_ENTITIES = ("Marlow", "Quentin", "Ysolde", "Bertil", "Calla", "Dashiell", "Elowen", "Fenwick", "Greer", "Hollis",
             "Ingrid", "Jasper", "Kestrel", "Linnea", "Magnus", "Nerys", "Orla", "Peregrine", "Rosalind", "Soren",
             "Tamsin", "Ulric", "Vesna", "Wendeline", "Xavi", "Yorick", "Zelda", "Anouk", "Bastian", "Cordelia",
             "Dorian", "Esme", "Fitzroy", "Gideon", "Hester", "Ivo", "Juniper", "Kasimir", "Leopold", "Mireille")
_ATTRIBUTES = {
    "home city": ("Lisbon", "Oslo", "Porto", "Kyoto", "Denver", "Nairobi", "Quito", "Hanoi", "Tallinn", "Valencia",
                  "Adelaide", "Bergen"),
    "car": ("Volvo", "Toyota", "Fiat", "Subaru", "Peugeot", "Skoda", "Mazda", "Renault", "Hyundai", "Lancia"),
    "locker number": tuple(str(n) for n in range(1043, 9999, 811)),
    "manager": ("Abernathy", "Okonkwo", "Lindqvist", "Castellano", "Nakamura", "Petrov", "Delacroix", "Haraldsen"),
    "gym": ("Ironworks", "Pulse", "Summit", "Forge", "Vertex", "Anchor", "Zenith"),
    "dentist": ("Dr Whitlock", "Dr Osei", "Dr Brannigan", "Dr Moreau", "Dr Takahashi", "Dr Eriksen"),
    "birthday month": ("January", "March", "April", "June", "August", "October", "November", "December"),
    "football team": ("Arsenal", "Benfica", "Ajax", "Celtic", "Napoli", "Sevilla", "Feyenoord", "Galatasaray"),
    "phone extension": tuple(str(n) for n in range(214, 990, 61)),
    "flight gate": ("B12", "C7", "D21", "A3", "E15", "F9", "G4"),
    "favourite bakery": ("Crumb", "Larder", "Rye", "Hearth", "Oven Lane", "Bramble"),
    "project codename": ("Halcyon", "Obsidian", "Meridian", "Tesseract", "Basilisk", "Sirocco", "Nimbus"),
}
_TOPICS = {
    "cooking": ("garlic", "pasta", "oven", "sauce", "basil", "dough", "recipe", "skillet"),
    "hiking": ("trail", "boots", "ridge", "summit", "backpack", "map", "blisters", "campsite"),
    "gardening": ("tomatoes", "compost", "seedlings", "soil", "watering", "weeds", "greenhouse", "mulch"),
    "movies": ("film", "director", "sequel", "cinema", "popcorn", "trailer", "actor", "screenplay"),
    "weather": ("rain", "forecast", "sunshine", "wind", "umbrella", "storm", "humidity", "clouds"),
    "music": ("guitar", "concert", "album", "drums", "melody", "playlist", "band", "chorus"),
    "cycling": ("bike", "gears", "helmet", "puncture", "saddle", "hills", "chain", "pedals"),
    "reading": ("novel", "chapter", "library", "author", "bookmark", "poetry", "plot", "paperback"),
    "pets": ("dog", "leash", "kitten", "vet", "treats", "walks", "puppy", "fur"),
    "coffee": ("espresso", "beans", "grinder", "latte", "roast", "barista", "crema", "filter"),
    "chess": ("opening", "bishop", "endgame", "knight", "gambit", "checkmate", "pawn", "rook"),
    "swimming": ("pool", "laps", "goggles", "freestyle", "lane", "diving", "chlorine", "backstroke"),
}
_CHAT = ("{a} with {b}, then {c}.", "Loved the {a}, the {b} and the {c}.", "More {topic}: {a}, {b}, {c}.",
         "{a} before {b}, {c} after.", "Still thinking about {a}, {b} and {c}.", "{topic} again: {a} and {b}.")
_FACT = ("{E}'s {A} is {V}.", "So {E}'s {A} is {V}.", "{E}'s {A} is definitely {V}.")
_ASK = ("What is {E}'s {A}?", "Remind me, what is {E}'s {A}?", "Do you know {E}'s {A}?")
KINDS = ("near", "far", "updated")


@dataclass
class SyntheticDialogue:
    """A generated stream and its ground truth.

    ``items``: turns and questions in stream order.  ``segment_starts``: turn
    indices where a planted segment starts (topic changes, and each fact turn
    with the turn after it: a fact is an aside); ``session_starts`` likewise.
    ``facts``: (turn index, subject, value) of every fact turn.
    """

    items: list
    segment_starts: list[int]
    session_starts: list[int]
    facts: list[tuple[int, str, str]]

    @property
    def turns(self) -> list[Turn]:
        return [x for x in self.items if isinstance(x, Turn)]

    @property
    def questions(self) -> list[Question]:
        return [x for x in self.items if isinstance(x, Question)]


def synthetic_dialogue(turns: int, *, seed: int = 0, subjects: int = 200, fact_every: float = 25.0,
                       new_subject_share: float = 0.6, volatile_share: float = 0.5, questions: int | None = None,
                       near_turns: int = 100, far_turns: int = 500) -> SyntheticDialogue:
    """A deterministic STEM-like dialogue stream with planted facts and questions.

    Sessions of 150-400 turns (3-20 s apart) are separated by 8-16 hour pauses;
    a session is a run of topic segments of 6-16 chatter turns (a topic's
    keywords, lower case).  About one turn in ``fact_every`` is a fact aside
    ("Marlow's home city is Lisbon.", proper nouns or numbers): a new subject
    (entity x attribute, up to ``subjects`` of them) with probability
    ``new_subject_share``, otherwise an update of a volatile subject to a new
    value (a ``volatile_share`` of the subjects change; the others are stated
    once).  Questions (default: one per 25 turns, 20 to 400) are asked at
    random points, cycling through the kinds: ``near`` (a subject stated once,
    within the last ``near_turns`` turns), ``far`` (stated once, at least
    ``far_turns`` turns back) and ``updated`` (stated at least twice: the
    answer is the latest value, the earlier ones are ``superseded``).

    Parameters
    ----------
    turns : int >= 1
    seed : int
        Same seed, same stream (Python's ``random.Random``; no global state).
    """
    for arg, value, low in (("turns", turns, 1), ("subjects", subjects, 1), ("near_turns", near_turns, 2),
                            ("far_turns", far_turns, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{arg} must be an int >= {low}, got {value!r}")
    if not fact_every >= 1:
        raise ValueError(f"fact_every must be >= 1, got {fact_every!r}")
    for arg, value in (("new_subject_share", new_subject_share), ("volatile_share", volatile_share)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{arg} must be in [0, 1], got {value!r}")
    rng = random.Random(seed)
    pool = [(e, a) for e in _ENTITIES for a in _ATTRIBUTES]
    rng.shuffle(pool)
    if subjects > len(pool):
        raise ValueError(f"subjects must be <= {len(pool)}, got {subjects}")
    pool = pool[:subjects]
    volatile = set(range(round(volatile_share * subjects)))
    n_questions = questions if questions is not None else min(400, max(20, turns // 25))
    warm = min(50, turns // 10)
    slots = sorted(rng.sample(range(warm, turns), min(n_questions, turns - warm))) if turns > warm else []
    ask_at = {p: n for n, p in enumerate(slots)}

    items: list = []
    facts: list[tuple[int, str, str]] = []
    versions: dict[int, list[tuple[int, str]]] = {}  # subject -> [(turn index, value)]
    seg_starts: list[int] = []
    sess_starts: list[int] = []
    introduced = 0
    t = 0.0
    index = 0
    asked = 0
    topic = None
    speaker = 0

    def ask(p: int, at: float) -> None:
        nonlocal asked
        for shift in range(len(KINDS)):
            kind = KINDS[(asked + shift) % len(KINDS)]
            ok = []
            for s, vs in versions.items():
                age = p - vs[-1][0]
                if kind == "near" and len(vs) == 1 and 2 <= age <= near_turns:
                    ok.append(s)
                elif kind == "far" and len(vs) == 1 and age >= far_turns:
                    ok.append(s)
                elif kind == "updated" and len(vs) >= 2 and age >= 2:
                    ok.append(s)
            if ok:
                s = rng.choice(sorted(ok))
                e, a = pool[s]
                vs = versions[s]
                items.append(Question(at, rng.choice(_ASK).format(E=e, A=a), vs[-1][1], vs[-1][0], kind,
                                      tuple(i for i, _ in vs[:-1])))
                asked += 1
                return

    while index < turns:
        sess_starts.append(index)
        session_left = rng.randint(150, 400)
        while session_left > 0 and index < turns:
            topic = rng.choice(sorted(set(_TOPICS) - {topic}))
            seg_starts.append(index)
            for _ in range(min(rng.randint(6, 16), session_left)):
                if index >= turns:
                    break
                if index in ask_at:
                    ask(index, t + 0.5)
                t += rng.uniform(3.0, 20.0)
                if rng.random() < 1.0 / fact_every:
                    can_update = [s for s in versions if s in volatile]
                    if introduced < subjects and (rng.random() < new_subject_share or not can_update):
                        s = introduced
                        introduced += 1
                        value = rng.choice(_ATTRIBUTES[pool[s][1]])
                    else:
                        s = rng.choice(can_update)
                        current = versions[s][-1][1]
                        value = rng.choice([v for v in _ATTRIBUTES[pool[s][1]] if v != current])
                    e, a = pool[s]
                    versions.setdefault(s, []).append((index, value))
                    facts.append((index, f"{e}'s {a}", value))
                    items.append(Turn(t, "user", rng.choice(_FACT).format(E=e, A=a, V=value)))
                    if not seg_starts or seg_starts[-1] != index:
                        seg_starts.append(index)
                    seg_starts.append(index + 1)  # the aside ends; the topic resumes
                else:
                    a, b, c = rng.sample(_TOPICS[topic], 3)
                    text = rng.choice(_CHAT).format(a=a, b=b, c=c, topic=topic)
                    items.append(Turn(t, ("user", "assistant")[speaker], text[0].upper() + text[1:]))
                    speaker ^= 1
                index += 1
                session_left -= 1
        t += rng.uniform(8.0, 16.0) * 3600.0
    seg_starts = sorted(set(s for s in seg_starts if s < turns))
    return SyntheticDialogue(items, seg_starts, sess_starts, facts)


# --------------------------------------------------------------------------
# Evaluation: accuracy and latency against the baselines
# --------------------------------------------------------------------------
def recalls_answer(unit: RecalledUnit | None, q: Question) -> bool:
    """Whether a recalled unit answers ``q``: it covers the question's ground-truth turn, or (without one)
    its text holds the ground-truth answer."""
    if unit is None:
        return False
    if q.turn is not None:
        return unit.covers(q.turn)
    return q.answer is not None and q.answer.lower() in unit.text.lower()


def _percentiles(values: Sequence[float]) -> dict:
    if not values:
        return {"p20": None, "p50": None, "p80": None}
    a = np.asarray(values) * 1e3
    return {f"p{p}": round(float(np.percentile(a, p)), 4) for p in (20, 50, 80)}


def evaluate(items: Sequence[Turn | Question], text_encoder, *, config: ProStreamConfig | None = None,
             methods: Sequence[str] = ("prostream", "everything", "recent"),
             turn_embeddings: torch.Tensor | None = None,
             question_embeddings: torch.Tensor | None = None, distiller: Distiller | None = None,
             keep_recalls: bool = False, keep_memories: bool = False) -> dict:
    """Stream ``items`` through each method, asking every question when it comes; score and time the recalls.

    Methods: ``"prostream"`` (:class:`ProStream`), ``"everything"``
    (retrieve-everything), ``"recent"`` (the newest turns within
    ``config.budget`` tokens).  All three get the same embeddings (computed
    once here, or passed), the same ``k`` and ``min_similarity``.  A recall is
    correct when its best turn is the question's ground-truth turn (or states
    its answer); ``hit`` when any returned turn is; ``stale`` when the best
    turn is a superseded version.

    Returns a dict: per method ``accuracy`` / ``hit`` / ``stale`` per question
    kind and overall, recall latency percentiles (ms, question encoding
    excluded), push seconds, stored turns and memory tokens at the end, and
    ``summary`` (ProStream's) -- plus ``recalls`` (per method, per question)
    with ``keep_recalls``, and ``memory`` (the memory object after the stream)
    with ``keep_memories``.
    """
    config = ProStreamConfig() if config is None else config
    unknown = sorted(set(methods) - {"prostream", "everything", "recent"})
    if unknown or not methods:
        raise ValueError(f"methods must be among 'prostream', 'everything', 'recent', got {list(methods)}")
    turns = [x for x in items if isinstance(x, Turn)]
    questions = [x for x in items if isinstance(x, Question)]
    if len(turns) + len(questions) != len(items):
        raise ValueError("items must be Turn and Question objects")
    t0 = time.perf_counter()
    if turn_embeddings is None:
        turn_embeddings = text_encoder.encode([x.text for x in turns]) if turns else torch.zeros(0, text_encoder.dim)
    if question_embeddings is None:
        question_embeddings = (text_encoder.encode([x.question for x in questions]) if questions
                               else torch.zeros(0, text_encoder.dim))
    encode_s = time.perf_counter() - t0
    if turn_embeddings.shape[0] != len(turns) or question_embeddings.shape[0] != len(questions):
        raise ValueError("turn_embeddings / question_embeddings must hold one row per turn / question")

    def build(name):
        if name == "prostream":
            return ProStream(text_encoder, config, distiller=distiller)
        window = None if name == "everything" else config.budget
        return FlatTurnMemory(text_encoder, window_tokens=window, k=config.k, min_similarity=config.min_similarity,
                              backend=config.backend)

    report = {"turns": len(turns), "questions": len(questions), "encode_seconds": round(encode_s, 3), "methods": {}}
    for name in methods:
        memory = build(name)
        rows, push_s, ti, qi = [], 0.0, 0, 0
        pending: list[Turn] = []

        def flush_pending():
            nonlocal pending, ti, push_s
            if pending:
                t1 = time.perf_counter()
                memory.push(pending, turn_embeddings[ti:ti + len(pending)])
                push_s += time.perf_counter() - t1
                ti += len(pending)
                pending = []

        for item in items:
            if isinstance(item, Turn):
                pending.append(item)
                continue
            flush_pending()
            rec = memory.recall(question_embeddings[qi], question=item.question)
            qi += 1
            best = rec.best
            rows.append({"kind": item.kind or "all", "correct": recalls_answer(best, item),
                         "hit": any(recalls_answer(u, item) for u in rec.units),
                         "stale": best is not None and any(best.covers(i) for i in item.superseded),
                         "answered": best is not None, "latency": rec.latency_s, "recall": rec})
        flush_pending()
        t1 = time.perf_counter()
        memory.finish()
        push_s += time.perf_counter() - t1
        by_kind = {}
        for kind in sorted({r["kind"] for r in rows}) + ["all"]:
            sel = [r for r in rows if kind == "all" or r["kind"] == kind]
            by_kind[kind] = {"n": len(sel), **{m: round(sum(r[m] for r in sel) / len(sel), 4) if sel else None
                                               for m in ("correct", "hit", "stale", "answered")}}
        out = {"by_kind": by_kind, "latency_ms": _percentiles([r["latency"] for r in rows]),
               "push_seconds": round(push_s, 3), "push_us_per_turn": round(1e6 * push_s / max(1, len(turns)), 2),
               "stored_turns": memory.stored_turns, "memory_tokens": memory.memory_tokens}
        if name == "prostream":
            out["summary"] = memory.summary()
        if keep_recalls:
            out["recalls"] = [r["recall"] for r in rows]
        if keep_memories:
            out["memory"] = memory
        report["methods"][name] = out
    return report
