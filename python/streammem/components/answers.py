"""Answers: the model-free extractive answer, its outcome (answered / not in memory) and calibrated confidence.

``extractive_answer(context)`` is the package's one extractive answer.  Here it
answers a stream's ``Context`` (``StreamMemory.ask``; or the context's dict):
see :func:`extractive_choice`.  A recipe whose memory returns a context of its
own type registers the rule for that type beside the type
(``@extractive_answer.register(RecipeContext)``): ProStream quotes its best
recalled turn, MemVerse its best long-term chunk.  Any callable(context) -> str
passed as ``answer_fn`` replaces it (a language model); answers fill the
dialogue memory.

Every system of the package decides, before it answers, whether what it
retrieved can answer the question at all (``docs/answers.md``):

* :func:`answer_features` describes the *basis* of an answer -- the memory
  text the answer would quote -- by numbers in [0, 1]: ``cosine`` (question
  against the basis, in the text encoder's space), ``grounding`` (share of the
  question's content words the basis spells) and ``names`` (share of the
  question's proper names the basis spells);
* a :class:`Calibration` maps them to a **confidence**: the probability that
  the basis answers the question, a logistic function of the features fitted
  on planted questions with known answers (half answerable, half never in the
  stream), and compares it with a **threshold** chosen on that calibration
  set; below it the outcome is :attr:`Outcome.NOT_IN_MEMORY`.

``abstention_report`` scores the decisions on an evaluation set.
"""
from __future__ import annotations

import enum
import functools
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import numpy as np

from ..checks import check_real
from .memory import caption_text

__all__ = [
    "extractive_answer", "extractive_choice", "choose_basis", "short_term_text", "Outcome", "NOT_IN_MEMORY_ANSWER",
    "content_words", "proper_names", "grounding", "answer_features", "WordVectors", "RELATED_COSINE", "Calibration",
    "calibration_for", "choose_threshold", "AbstentionRow", "abstention_report",
]

# The text an abstaining system gives as its answer (the machine-readable outcome is ``Outcome``).
NOT_IN_MEMORY_ANSWER = "Not in memory."


class Outcome(str, enum.Enum):
    """What a system did with a question: answered it, or said the answer is not in its memory.

    A ``str`` enum, so it compares equal to and serialises as its value
    (``"answered"``, ``"not_in_memory"``: the CLI's JSON writes these).
    """

    ANSWERED = "answered"
    NOT_IN_MEMORY = "not_in_memory"


# --------------------------------------------------------------------------
# Words of a question, and whether a basis spells them
# --------------------------------------------------------------------------
# Function words, question words, the generic nouns and verbs of questions about a memory ("what
# did you see in the video?") and words of position ("in front of the camera"): none of them names
# what the answer is about, and no caption of labels or turn of a dialogue is expected to spell them.
_GENERIC = frozenset("""
a an the this that these those there here it its is are was were be been being am do does did done doing have has
had having what which who whom whose when where why how whether i me my mine myself we us our ours you your yours he
him his she her hers they them their theirs of in on at to from by with without for about into onto over under
between among through during before after above below up down out off near next and or but if then than so as not no
nor yes can could will would shall should may might must any some all every each both either neither much many more
most few less least other another such own same just also only very too again ever never still yet already now right
currently today tell say said know remember recall remind please see saw seen seeing look looked looking watch
watched show shown showed happen happened happening appear appeared occur occurred go went going come came get got
doing thing something anything everything nothing one someone anyone somebody anybody people person kind type sort
video clip stream scene frame camera screen picture image footage memory moment time object together else
front behind left top bottom side middle centre center background foreground
""".split())
_WORD = re.compile(r"[A-Za-z0-9]+(?:'[A-Za-z]+)?")


def _stem(word: str) -> str:
    """Light suffix stripping (possessive, plural, -ed, -ing) so "bicycles" meets "bicycle", "parked" "parking"."""
    w = word.lower()
    if w.endswith("'s") or w.endswith("s'"):
        w = w[:-2]
    w = w.replace("'", "")
    if len(w) > 4 and w.endswith("ies"):
        return w[:-3] + "y"
    if len(w) > 4 and w.endswith(("sses", "shes", "ches", "xes")):
        return w[:-2]
    if len(w) > 3 and w.endswith("s") and not w.endswith(("ss", "us", "is")):
        w = w[:-1]
    if len(w) > 5 and w.endswith("ing"):
        return _restore_e(w[:-3])
    if len(w) > 4 and w.endswith("ed"):
        return _restore_e(w[:-2])
    return w


def _restore_e(stem: str) -> str:
    # "moved" / "moving" -> "move", "arrived" -> "arrive", "placed" -> "place"; "parked" -> "park" stays.
    return stem + "e" if stem.endswith(("v", "c", "z")) or (stem.endswith("g") and stem[-2:-1] == "n"
                                                             and len(stem) > 4) else stem


def content_words(question: str) -> list[str]:
    """The stemmed words of ``question`` that say what it is about (not function words or generic ones).

    ``"Where does Alice's sister work?"`` -> ``["alice", "sister", "work"]``;
    ``"What happened?"`` -> ``[]``.  Order kept, duplicates dropped.
    """
    words = []
    for token in _WORD.findall(question):
        stem = _stem(token)
        if stem and stem not in _GENERIC and token.lower() not in _GENERIC and stem not in words:
            words.append(stem)
    return words


def proper_names(question: str) -> list[str]:
    """Stemmed capitalised words of ``question`` that are not its first word nor generic: the names it asks about.

    ``"What car does Alice drive?"`` -> ``["alice"]``; ``"Was there a Border Terrier?"`` ->
    ``["border", "terrier"]``.
    """
    names = []
    for i, match in enumerate(_WORD.finditer(question)):
        token = match.group(0)
        start = match.start()
        sentence_start = i == 0 or question[:start].rstrip().endswith((".", "?", "!", ":"))
        if token[:1].isupper() and not sentence_start and token.lower() not in _GENERIC:
            stem = _stem(token)
            if stem not in _GENERIC and stem not in names:
                names.append(stem)
    return names


def _spelled(word: str, tokens: set[str]) -> bool:
    # Equal stems, or one a prefix of the other from 4 letters ("taxi" / "taxicab", "park" / "parking").
    if word in tokens:
        return True
    if len(word) >= 4 and any(t.startswith(word) for t in tokens):
        return True
    return any(len(t) >= 4 and word.startswith(t) for t in tokens)


def _tokens(texts: Iterable[str]) -> set[str]:
    return {_stem(t) for text in texts for t in _WORD.findall(caption_text(text))}


def grounding(words: Sequence[str], basis: str | Iterable[str]) -> float:
    """Share of ``words`` (stemmed, e.g. :func:`content_words`) that the basis text(s) spell; 1.0 when none.

    A question with no content word ("What happened at the beginning?") is
    grounded by any basis: nothing in it needs a particular memory.
    """
    if not words:
        return 1.0
    tokens = _tokens([basis] if isinstance(basis, str) else basis)
    return sum(_spelled(w, tokens) for w in words) / len(words)


RELATED_COSINE = 0.5  # a word is related to a basis word whose embedding is at least this close


class WordVectors:
    """Unit embeddings of single words through a text encoder, cached (at most ``capacity`` words).

    ``related(words, basis)`` is the share of ``words`` that the basis spells
    or has a word whose embedding lies within cosine ``RELATED_COSINE`` of
    ("work" and "job"); 1.0 when ``words`` is empty.  Not thread-safe (the cache).
    """

    def __init__(self, text_encoder, capacity: int = 50_000):
        self.text_encoder = text_encoder
        self.capacity = int(capacity)
        self._cache: dict = {}

    def vectors(self, words: Sequence[str]):
        import torch
        import torch.nn.functional as F

        new = [w for w in dict.fromkeys(words) if w not in self._cache]
        if new:
            if len(self._cache) + len(new) > self.capacity:
                self._cache.clear()
            for w, v in zip(new, F.normalize(self.text_encoder.encode(new).float(), dim=1)):
                self._cache[w] = v
        return torch.stack([self._cache[w] for w in words]) if words else None

    def related(self, question_words: Sequence[str], basis: str | Iterable[str]) -> float:
        """Share of ``question_words`` (surface words, lower case) the basis spells (stems, as ``grounding``)
        or has a word within ``RELATED_COSINE`` of; 1.0 when there are none."""
        if not question_words:
            return 1.0
        texts = [basis] if isinstance(basis, str) else list(basis)
        surface = sorted({t.lower().replace("'s", "") for text in texts for t in _WORD.findall(caption_text(text))
                          if t.lower() not in _GENERIC and not t.isdigit()})
        if not surface:
            return 0.0
        stems = {_stem(t) for t in surface}
        exact = [_spelled(_stem(w), stems) for w in question_words]
        if all(exact):
            return 1.0
        similar = (self.vectors(list(question_words)) @ self.vectors(surface).T).max(dim=1).values.tolist()
        return sum(e or s >= RELATED_COSINE for e, s in zip(exact, similar)) / len(question_words)


def answer_features(question: str, basis: str | Iterable[str], cosine: float, *,
                    word_vectors: WordVectors | None = None) -> dict[str, float]:
    """The features every :class:`Calibration` reads: ``cosine``, ``grounding`` and ``names``, each in [0, 1].

    Parameters
    ----------
    question : str
        The question as retrieval ranks it (a time reference removed:
        ``TimeReference.question``).
    basis : str or iterable of str
        The memory text(s) the answer rests on (a caption, a turn, a chunk and
        the relation that led to it).
    cosine : float
        Cosine between the question's and the basis's embeddings; clipped to
        [0, 1].  A question with no content words gets 1 (and grounding,
        names and related are 1 too): any basis answers it.
    word_vectors : WordVectors, optional
        Adds ``related``: the share of the question's content words other than
        its names that the basis spells or has a close word for (its text
        encoder's word embeddings: "work" is related to "job").
    """
    if not isinstance(question, str):
        raise ValueError(f"question must be a str, got {type(question).__name__}")
    if not math.isfinite(cosine):
        raise ValueError(f"cosine must be finite, got {cosine!r}")
    texts = [basis] if isinstance(basis, str) else list(basis)
    words, names = content_words(question), proper_names(question)
    # A question with no content words of its own ("What happened at the beginning?") asks for whatever
    # the basis holds: any basis answers it, so every feature is 1 (its cosine measures nothing).
    features = {"cosine": min(1.0, max(0.0, float(cosine))) if words else 1.0, "grounding": grounding(words, texts),
                "names": grounding(names, texts)}
    if word_vectors is not None:
        surface = [t.lower().replace("'s", "") for t in _WORD.findall(question)]
        others = list(dict.fromkeys(t for t in surface if _stem(t) in words and _stem(t) not in names))
        features["related"] = word_vectors.related(others, texts)
    return features


# --------------------------------------------------------------------------
# Calibration: features -> confidence -> outcome
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class Calibration:
    """Confidence = sigmoid(bias + sum_i weight_i * feature_i); answered iff confidence >= threshold.

    The confidence is a calibrated probability that the retrieved basis
    answers the question: a logistic regression (Platt scaling) of "the answer
    the system would give is right" on the answer's features, fitted on a
    calibration set of planted questions with known answers, as many whose
    answer was never in the stream as answerable ones (so the probability
    holds for that even prior).  ``threshold`` is chosen on the same set by
    :meth:`fit`; ``fitted_on`` says on what (the command that reproduces it).

    Parameters
    ----------
    weights : mapping of feature name -> float
    bias : float
    threshold : float in [0, 1]
        0 never abstains; above 1 is refused.
    fitted_on : str
    """

    weights: Mapping[str, float]
    bias: float
    threshold: float
    fitted_on: str = ""
    _names: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        if not isinstance(self.weights, Mapping) or not self.weights:
            raise ValueError(f"weights must be a non-empty mapping of feature name -> float, got {self.weights!r}")
        weights = {str(k): check_real(v, f"weights[{k!r}]") for k, v in self.weights.items()}
        object.__setattr__(self, "weights", weights)
        object.__setattr__(self, "bias", check_real(self.bias, "bias"))
        object.__setattr__(self, "threshold", check_real(self.threshold, "threshold", 0.0, 1.0))
        if not isinstance(self.fitted_on, str):
            raise ValueError(f"fitted_on must be a str, got {type(self.fitted_on).__name__}")
        object.__setattr__(self, "_names", tuple(weights))

    @property
    def features(self) -> tuple[str, ...]:
        """The feature names it reads, in order."""
        return self._names

    def confidence(self, features: Mapping[str, float]) -> float:
        """P(the basis answers the question) for one answer's ``features``; ValueError naming a missing one."""
        missing = [n for n in self._names if n not in features]
        if missing:
            raise ValueError(f"features lack {missing} (this calibration reads {list(self._names)})")
        z = self.bias + sum(self.weights[n] * float(features[n]) for n in self._names)
        return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))

    def outcome(self, confidence: float) -> Outcome:
        """ANSWERED when ``confidence >= threshold``, else NOT_IN_MEMORY."""
        return Outcome.ANSWERED if confidence >= self.threshold else Outcome.NOT_IN_MEMORY

    def decide(self, features: Mapping[str, float]) -> tuple[float, Outcome]:
        """(confidence, outcome) of one answer's features."""
        c = self.confidence(features)
        return c, self.outcome(c)

    def with_threshold(self, threshold: float) -> "Calibration":
        """The same fit with another threshold (0: never abstain)."""
        return Calibration(self.weights, self.bias, threshold, self.fitted_on)

    def to_dict(self) -> dict:
        return {"weights": dict(self.weights), "bias": self.bias, "threshold": self.threshold,
                "fitted_on": self.fitted_on}

    @classmethod
    def from_dict(cls, data: dict) -> "Calibration":
        if not isinstance(data, dict) or not {"weights", "bias", "threshold"} <= set(data):
            raise ValueError(f"data must be a dict from Calibration.to_dict(), got {data!r:.80}")
        return cls(data["weights"], data["bias"], data["threshold"], data.get("fitted_on", ""))

    @classmethod
    def fit(cls, rows: Sequence["AbstentionRow"], *, features: Sequence[str] | None = None,
            max_false_answer: float = 0.02, l2: float = 1e-4, fitted_on: str = "") -> "Calibration":
        """Fit the logistic map and choose the threshold on a calibration set.

        Parameters
        ----------
        rows : sequence of AbstentionRow
            Each planted question's features, whether it was answerable, and
            whether the answer the system gives without abstaining is right.
            The label is ``answerable and correct``.
        features : sequence of str, optional
            The feature names to use (default: every name of the first row, in order).
        max_false_answer : float in [0, 1]
            At most this share of the calibration set's unanswerable questions
            may be answered; within it the threshold answers the most right
            answers (:func:`choose_threshold`).  Default 0.02: below the 0.05
            the package promises, a margin for the sampling error of a
            calibration set of a few hundred questions.
        l2 : float >= 0
            Ridge penalty on the weights (not the bias), per row.

        Weights come from Newton's method on the penalised log-likelihood
        (deterministic; numpy float64), constrained to be >= 0: a feature
        whose weight would be negative gets 0 and the others are refitted, so
        the confidence never falls as a feature grows.
        """
        rows = list(rows)
        if not rows or not all(isinstance(r, AbstentionRow) for r in rows):
            raise ValueError("rows must be a non-empty sequence of AbstentionRow")
        max_false_answer = check_real(max_false_answer, "max_false_answer", 0.0, 1.0)
        l2 = check_real(l2, "l2", 0.0)
        names = tuple(rows[0].features) if features is None else tuple(features)
        if not names:
            raise ValueError("features must name at least one feature")
        for i, r in enumerate(rows):
            missing = [n for n in names if n not in r.features]
            if missing:
                raise ValueError(f"rows[{i}].features lacks {missing}")
        x = np.array([[float(r.features[n]) for n in names] for r in rows], dtype=np.float64)
        y = np.array([r.answerable and r.correct for r in rows], dtype=np.float64)
        if not np.isfinite(x).all():
            raise ValueError("rows hold non-finite feature values")
        # Monotone in every feature (more similarity or grounding never lowers the confidence): a feature
        # whose weight comes out negative is dropped (weight 0) and the rest refitted.
        active = list(range(len(names)))
        while True:
            beta = _logistic_fit(x[:, active], y, l2)
            negative = [i for i, w in zip(active, beta[1:]) if w < 0]
            if not negative:
                break
            active = [i for i in active if i not in negative]
        weights = dict.fromkeys(names, 0.0)
        weights.update({names[i]: float(w) for i, w in zip(active, beta[1:])})
        calibration = cls(weights, float(beta[0]), 0.0, fitted_on)
        confidences = [calibration.confidence(r.features) for r in rows]
        threshold = choose_threshold(confidences, [r.answerable for r in rows], max_false_answer,
                                     [r.correct for r in rows])
        return calibration.with_threshold(threshold)


def calibration_for(table: Mapping[str, Calibration], text_encoder, default: str = "all-MiniLM-L6-v2") -> Calibration:
    """The calibration of ``table`` fitted for ``text_encoder`` (by its ``name``); ``table[default]`` for an
    encoder it has none for (re-calibrate with :meth:`Calibration.fit` for another encoder)."""
    name = getattr(text_encoder, "name", None)
    return table[name] if name in table else table[default]


def _logistic_fit(x: np.ndarray, y: np.ndarray, l2: float, iterations: int = 100) -> np.ndarray:
    """(bias, weights...) of a ridge-penalised logistic regression by Newton's method."""
    n, d = x.shape
    a = np.hstack([np.ones((n, 1)), x])
    beta = np.zeros(d + 1)
    penalty = np.full(d + 1, l2 * n)
    penalty[0] = 0.0
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-np.clip(a @ beta, -60, 60)))
        grad = a.T @ (p - y) + penalty * beta
        hess = (a * (p * (1 - p))[:, None]).T @ a + np.diag(penalty) + 1e-9 * np.eye(d + 1)
        step = np.linalg.solve(hess, grad)
        beta -= step
        if np.abs(step).max() < 1e-10:
            break
    return beta


def choose_threshold(confidences: Sequence[float], answerable: Sequence[bool], max_false_answer: float,
                     correct: Sequence[bool] | None = None) -> float:
    """The threshold of a calibration set: answered iff confidence >= it.

    Among the thresholds that answer at most ``max_false_answer`` of the
    unanswerable questions, the one that answers the most right answers
    (``correct``; default: every answerable question counts as right), then
    the fewest unanswerable questions, then the fewest wrong answers; it is
    placed halfway between the lowest confidence it answers and the highest it
    does not (4 decimals), so that both sides keep a margin.  0.0 when nothing
    is unanswerable.
    """
    conf = [float(c) for c in confidences]
    answerable = [bool(a) for a in answerable]
    correct = answerable if correct is None else [bool(a and c) for a, c in zip(answerable, correct)]
    n_neg = sum(not a for a in answerable)
    if n_neg == 0:
        return 0.0
    allowed = int(math.floor(max_false_answer * n_neg + 1e-9))
    levels = sorted(set(conf)) + [math.inf]
    best, best_key = math.inf, None
    for t in levels:
        false = sum(c >= t and not a for c, a in zip(conf, answerable))
        if false > allowed:
            continue
        right = sum(c >= t and ok for c, ok in zip(conf, correct))
        wrong = sum(c >= t and a and not ok for c, a, ok in zip(conf, answerable, correct))
        key = (-right, false, wrong)
        if best_key is None or key <= best_key:  # ties: the higher threshold (fewer rows answered)
            best, best_key = t, key
    below = max((c for c in conf if c < best), default=0.0)
    threshold = 1.0 if best == math.inf else (best + below) / 2.0
    return min(1.0, math.floor(threshold * 1e4 + 0.5) / 1e4)


@dataclass(frozen=True)
class AbstentionRow:
    """One planted question as a calibration or evaluation set sees it.

    ``answerable``: its answer was in the stream; ``correct``: the answer the
    system gives (ignoring the outcome) is right (always False when not
    answerable); ``correct_before``: the answer the system gave before
    abstention existed was right (for "today's accuracy"; default ``correct``);
    ``outcome`` / ``confidence``: what the system decided.
    """

    features: Mapping[str, float]
    answerable: bool
    correct: bool
    outcome: Outcome = Outcome.ANSWERED
    confidence: float = math.nan
    correct_before: bool | None = None
    kind: str = ""


def abstention_report(rows: Sequence[AbstentionRow]) -> dict:
    """Score abstention decisions on an evaluation set.

    Returns ``answerable`` / ``unanswerable`` (counts), ``accuracy_before``
    (share of answerable questions answered right without abstention: today's
    accuracy), ``accuracy`` (answered and right), ``retained`` (accuracy /
    accuracy_before), ``false_answer_rate`` (share of unanswerable questions
    answered), ``abstained_answerable`` (share of answerable questions
    abstained on), ``by_kind`` (accuracy per ``kind`` of the answerable rows) and ``by_kind_before``.
    """
    rows = list(rows)
    pos = [r for r in rows if r.answerable]
    neg = [r for r in rows if not r.answerable]

    def share(part, whole):
        return part / whole if whole else math.nan

    before = sum(bool(r.correct if r.correct_before is None else r.correct_before) for r in pos)
    after = sum(bool(r.correct) and r.outcome == Outcome.ANSWERED for r in pos)
    kinds = Counter(r.kind for r in pos)
    was_right = [bool(r.correct if r.correct_before is None else r.correct_before) for r in pos]
    return {
        "answerable": len(pos), "unanswerable": len(neg),
        "accuracy_before": share(before, len(pos)), "accuracy": share(after, len(pos)),
        "retained": share(after, before),
        "false_answer_rate": share(sum(r.outcome == Outcome.ANSWERED for r in neg), len(neg)),
        "abstained_answerable": share(sum(r.outcome == Outcome.NOT_IN_MEMORY for r in pos), len(pos)),
        "by_kind": {k: share(sum(bool(r.correct) and r.outcome == Outcome.ANSWERED for r in pos if r.kind == k), n)
                    for k, n in sorted(kinds.items())},
        "by_kind_before": {k: share(sum(w for w, r in zip(was_right, pos) if r.kind == k), n)
                           for k, n in sorted(kinds.items())},
    }


# --------------------------------------------------------------------------
# The extractive answer of a stream context
# --------------------------------------------------------------------------
def _field(context, name, default=None):
    return context.get(name, default) if isinstance(context, dict) else getattr(context, name, default)


def _top_labels(frames: list[dict], top: int = 3) -> str:
    counts = Counter(label for f in frames for label in f.get("labels", ()))
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    return ", ".join(name for name, _ in ranked) if ranked else "scene"


def extractive_choice(context) -> tuple[str, str]:
    """(source, answer) of a stream context's model-free answer; source is short_term, tree, knowledge or none.

    A context whose outcome is not in memory answers ``NOT_IN_MEMORY_ANSWER``
    (source none).  A context that carries its basis (``StreamMemory`` fills
    ``basis``: the evidence it chose, time references applied) quotes it.
    Otherwise: a question about the present (instantaneity S_t > 0.5, or no
    tree and no event yet) is answered from the short-term frames, the newest
    the memory holds; any other from the best-matching tree node or
    knowledge-base event (highest cosine: the tree's best node, the injected
    events and the knowledge base's best event ``knowledge_best``).  Works on
    a ``Context`` or its dict.
    """
    outcome = _field(context, "outcome")
    if outcome is not None and Outcome(outcome) == Outcome.NOT_IN_MEMORY:
        return "none", NOT_IN_MEMORY_ANSWER
    basis = _field(context, "basis")
    if basis:
        source = basis["source"]
        if source == "short_term":
            return source, f"Now ({basis['t_start']:.1f}-{basis['t_end']:.1f} s) I see: {basis['text']}"
        return source, f"At {basis['t_start']:.1f}-{basis['t_end']:.1f} s I saw: {basis['text']}"
    source, item = choose_basis(context)
    if source == "none":
        return "none", "I have not seen anything yet."
    if source == "short_term":
        return source, f"Now ({item[0]['t']:.1f}-{item[-1]['t']:.1f} s) I see: {_top_labels(item)}"
    return source, f"At {item['t_start']:.1f}-{item['t_end']:.1f} s I saw: {caption_text(item['caption'])}"


def choose_basis(context) -> tuple[str, object]:
    """(source, evidence) the extractive answer of a stream context rests on, by the rule of
    :func:`extractive_choice`: the short-term frames (a list of frame dicts), the best tree node or the best
    knowledge event (a dict), or ("none", None)."""
    short = _field(context, "short_term") or []
    best = _field(context, "tree_best")
    knowledge = list(_field(context, "knowledge") or [])
    best_event = _field(context, "knowledge_best")
    if best_event is not None:
        knowledge.append(best_event)
    s_t = float((_field(context, "injection") or {}).get("s_t", 0.0))
    if short and (s_t > 0.5 or (best is None and not knowledge)):
        return "short_term", short
    candidates = []
    if best is not None:
        candidates.append((best.get("score", 0.0), "tree", best))
    candidates.extend((k.get("score", 0.0), "knowledge", k) for k in knowledge)
    if not candidates:
        return "none", None
    _, source, item = max(candidates, key=lambda c: c[0])
    return source, item


def short_term_text(frames: list[dict]) -> str:
    """What the short-term frames show, as the extractive answer names it: their most frequent labels."""
    return _top_labels(frames)


@functools.singledispatch
def extractive_answer(context) -> str | None:
    """A model-free answer to the question of ``context``, quoted from the memory's best evidence.

    A stream ``Context`` (or its dict): the answer of :func:`extractive_choice`.
    A recipe's context: the rule its recipe registers for that type.
    """
    return extractive_choice(context)[1]
