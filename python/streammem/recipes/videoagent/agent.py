"""The VideoAgent loop: the captioner, answerability-policy and answerer hooks with their defaults, and
the agent that retrieves frames round by round."""
from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, Sequence, runtime_checkable

import numpy as np
import torch
import torch.nn.functional as F

from streammem_kernels import TopKResult

from ...checkpoint import StateReader, reader_for
from ...checkpoint import load as load_checkpoint, save as save_checkpoint
from ...components.answers import NOT_IN_MEMORY_ANSWER, Calibration, Outcome, WordVectors
from ...components.memory import FrameRecord, LabelCaptioner, caption_text
from ...components.timeref import TimeReference, in_window, parse_time_reference
from ...io.video import VideoSource
from ...models.encoders import encode_texts
from .calibration import agent_features, default_calibration
from .index import LabelTextEmbedder, VideoIndex, _check_count, uniform_indices, unobserved_segments
from .state import KIND, VERSION as STATE_VERSION, agent_state, read_agent_state

__all__ = [
    "FrameCaptioner",
    "CaptionerAdapter",
    "AgentState",
    "Assessment",
    "AnswerabilityPolicy",
    "RetrievalConfidencePolicy",
    "Answer",
    "Answerer",
    "CaptionVoteAnswerer",
    "RoundLog",
    "AgentResult",
    "VideoAgent",
]


# --------------------------------------------------------------------------
# Hooks: captioner, policy, answerer
# --------------------------------------------------------------------------
@runtime_checkable
class FrameCaptioner(Protocol):
    """Captions the frames the agent looks at: ``caption(records, pixels) -> list[str]``, one per record.

    ``pixels`` is the ``(n, H, W, 3)`` uint8 array of those frames when the
    index kept them (``keep_frames=True``), else None.  A VLM goes here.
    """

    def caption(self, records: Sequence[FrameRecord], pixels: np.ndarray | None) -> list[str]: ...


class CaptionerAdapter:
    """A package ``Captioner`` (``caption_frames(records)``, e.g. ``LabelCaptioner``) as a ``FrameCaptioner``.

    Each frame is captioned on its own (the agent describes frames, not chunks).
    """

    def __init__(self, captioner=None):
        self.captioner = captioner if captioner is not None else LabelCaptioner()
        if not callable(getattr(self.captioner, "caption_frames", None)):
            raise ValueError("captioner must have caption_frames(records, previous) -> str")

    @property
    def name(self) -> str:
        return type(self.captioner).__name__

    def caption(self, records: Sequence[FrameRecord], pixels: np.ndarray | None) -> list[str]:
        return [self.captioner.caption_frames([r], None) for r in records]


def _as_frame_captioner(captioner) -> FrameCaptioner:
    if captioner is None:
        return CaptionerAdapter()
    if callable(getattr(captioner, "caption", None)):
        return captioner
    if callable(getattr(captioner, "caption_frames", None)):
        return CaptionerAdapter(captioner)
    raise ValueError("captioner must have caption(records, pixels) -> list[str] (FrameCaptioner) or "
                     "caption_frames(records, previous) -> str (Captioner)")


@dataclass
class AgentState:
    """What the agent knows at one point of the loop (passed to the policy and the answerer).

    Attributes
    ----------
    question, options : the question and its answer options (None: open question)
    query : (E,) unit question embedding
    observed : sorted frame indices looked at so far
    captions : frame index -> caption, for every observed frame
    relevance : frame index -> cosine(question, frame embedding), for every observed frame
    timestamps : (T,) float64 seconds of every frame of the video
    segments : (S, 2) int64 ``[start, end)`` runs of frames not looked at yet
    candidates : ``TopKResult`` with (S, k) ids / scores, or None
        The question's best frames inside each segment (-1 / -inf past a
        segment's end): this round's ``index.keys.search(ranges=segments)`` output.
        None where no retrieval ran (``answer_frames``: the baselines answer
        from given frames and consult no policy).
    round : 0 for the uniform sample, then one per retrieval round
    frames_left : frames the budget still allows
    """

    question: str
    options: tuple[str, ...] | None
    query: torch.Tensor
    observed: list[int]
    captions: dict[int, str]
    relevance: dict[int, float]
    timestamps: torch.Tensor
    segments: torch.Tensor
    candidates: TopKResult | None
    round: int
    frames_left: int

    @property
    def num_frames(self) -> int:
        return int(self.timestamps.shape[0])

    def best_seen(self) -> float:
        return max(self.relevance.values()) if self.relevance else -math.inf

    def evidence(self, k: int | None = None) -> list[int]:
        """Observed frames by decreasing relevance (ties: earlier frame first), the first ``k``."""
        ranked = sorted(self.observed, key=lambda i: (-self.relevance[i], i))
        return ranked if k is None else ranked[:k]


@dataclass
class Assessment:
    """A policy's verdict on one state.

    ``answerable``: stop and answer.  Otherwise ``segments`` (rows of
    ``state.segments``, most needed first) are searched, with ``queries``
    (one text per chosen segment, embedded by the agent's query encoder) or,
    when None, the question itself.  ``confidence`` is reported, not used.
    """

    answerable: bool
    confidence: float
    segments: Sequence[int] = ()
    queries: Sequence[str] | None = None
    note: str = ""


@runtime_checkable
class AnswerabilityPolicy(Protocol):
    """``assess(state) -> Assessment``: can the question be answered yet, and if not, where to look."""

    def assess(self, state: AgentState) -> Assessment: ...


class RetrievalConfidencePolicy:
    """Default policy: answerable when nothing unseen is about as relevant as the best frame seen.

    Retrieval confidence is ``best_seen - best_unseen``: the cosine between
    the question and the most relevant frame looked at, minus the best
    cosine retrieval can still find in any unseen segment (this round's
    ``state.candidates``).  The question is answerable when the confidence is
    at least ``margin``: every unseen frame is clearly less relevant than the
    evidence in hand.  Otherwise the segments that need more information are
    those whose best unseen frame scores within ``margin`` of the best seen
    frame or above it (they may hold the answer, or corroborate it), most
    relevant first, at most ``max_segments`` per round; the query is the
    question.

    Deterministic and model-free: it stands where the paper's LLM
    self-reflection stands, and judges relevance only, never whether the
    captions seen actually answer the question (a model policy does that).
    """

    name = "retrieval-confidence"

    def __init__(self, margin: float = 0.05, max_segments: int = 4):
        # The CLI's defaults (cli/videoagent.py add_arguments) read these two values from here.
        if not (isinstance(margin, (int, float)) and math.isfinite(margin) and margin >= 0):
            raise ValueError(f"margin must be a finite float >= 0, got {margin!r}")
        self.margin = float(margin)
        self.max_segments = _check_count(max_segments, "max_segments", 1)

    def assess(self, state: AgentState) -> Assessment:
        best = state.candidates.scores[:, 0] if state.segments.shape[0] else torch.zeros(0)
        best_unseen = float(best.max()) if best.numel() else -math.inf
        seen = state.best_seen()
        confidence = seen - best_unseen
        if confidence >= self.margin:
            return Assessment(True, confidence, note="no unseen frame within the margin of the best frame seen")
        need = torch.nonzero(best > seen - self.margin).flatten()
        # Most relevant segment first; ties toward the earlier segment (stable sort).
        order = torch.argsort(best[need], descending=True, stable=True)
        chosen = need[order][: self.max_segments].tolist()
        return Assessment(False, confidence, chosen, None,
                          note=f"{len(need)} segment(s) hold frames within the margin of the best seen")


@dataclass
class Answer:
    """An answer and where it came from.

    ``option``: index into the question's options (None for an open question
    or no option); ``evidence``: the frames the answer rests on, most relevant
    first; ``supported``: whether the evidence named the answer (False: a
    fallback); ``source`` names what produced it (the default says it is
    deterministic and not a model).

    The agent's decision on it (an answerer leaves the defaults):
    ``confidence`` in [0, 1], the calibrated probability that the answer is
    right given its basis (``VideoAgent.calibration``; ``features`` are what
    it read); ``outcome`` ``Outcome.ANSWERED`` or ``Outcome.NOT_IN_MEMORY``.
    Not in memory: ``text`` is ``NOT_IN_MEMORY_ANSWER`` and ``option`` None,
    and ``candidate`` / ``candidate_option`` keep what the answerer said.
    """

    text: str
    option: int | None
    evidence: list[int]
    supported: bool
    source: str
    outcome: Outcome = Outcome.ANSWERED
    confidence: float = math.nan
    features: dict = field(default_factory=dict)
    candidate: str | None = None
    candidate_option: int | None = None

    def to_dict(self) -> dict:
        return {"text": self.text, "option": self.option, "evidence": list(self.evidence),
                "supported": self.supported, "source": self.source, "outcome": Outcome(self.outcome).value,
                "confidence": None if math.isnan(self.confidence) else round(self.confidence, 4),
                "features": {k: round(v, 4) for k, v in self.features.items()},
                "candidate": self.candidate, "candidate_option": self.candidate_option}


@runtime_checkable
class Answerer(Protocol):
    """``answer(state) -> Answer`` from the captions of the observed frames (an LLM goes here)."""

    def answer(self, state: AgentState) -> Answer: ...


class CaptionVoteAnswerer:
    """Default answerer, deterministic and not a language model: the option the most relevant captions name.

    The ``evidence`` most relevant observed frames (cosine to the question)
    vote: each adds its relevance to every option its caption mentions
    (whole words, case-insensitive); the option with the largest total wins,
    ties toward the lower option.  When no evidence caption names any option,
    the answer falls back to the option whose text embedding is closest to
    the most relevant caption's (``supported=False``).  An open question
    (no options) is answered with the most relevant caption itself.
    """

    source = "caption vote (deterministic default, not a language model)"

    def __init__(self, text_encoder=None, *, evidence: int = 3):
        self.text_encoder = text_encoder
        self.evidence = _check_count(evidence, "evidence", 1)

    @staticmethod
    def mentions(caption: str, option: str) -> bool:
        return re.search(r"(?<!\w)" + re.escape(option.strip()) + r"(?!\w)", caption, re.IGNORECASE) is not None

    def answer(self, state: AgentState) -> Answer:
        ranked = state.evidence(self.evidence)
        if not ranked:
            return Answer("I have not seen any frame.", None, [], False, self.source)
        top_caption = state.captions[ranked[0]]
        if not state.options:
            t = float(state.timestamps[ranked[0]])
            return Answer(f"At {t:.1f} s: {caption_text(top_caption)}", None, ranked, True, self.source)
        votes = [0.0] * len(state.options)
        voters: list[int] = []
        for i in ranked:
            for j, option in enumerate(state.options):
                if self.mentions(state.captions[i], option):
                    votes[j] += max(state.relevance[i], 0.0) + 1e-6  # a mention counts even at cosine 0
                    if i not in voters:
                        voters.append(i)
        if voters:
            best = max(range(len(votes)), key=lambda j: (votes[j], -j))
            return Answer(state.options[best], best, voters, True, self.source)
        if self.text_encoder is None:
            return Answer(state.options[0], 0, ranked[:1], False, self.source)
        vectors = F.normalize(encode_texts(self.text_encoder, [top_caption, *state.options]), dim=1)
        best = int(torch.argmax(vectors[1:] @ vectors[0]))
        return Answer(state.options[best], best, ranked[:1], False, self.source)


# --------------------------------------------------------------------------
# The loop
# --------------------------------------------------------------------------
@dataclass
class RoundLog:
    """One assessment: frames seen before it, the verdict, the segments searched and the frames added."""

    round: int
    frames_seen: int
    confidence: float
    answerable: bool
    segments: list[tuple[int, int]]
    added: list[tuple[int, float]]
    note: str = ""

    def to_dict(self) -> dict:
        return {"round": self.round, "frames_seen": self.frames_seen,
                "confidence": None if not math.isfinite(self.confidence) else round(self.confidence, 4),
                "answerable": self.answerable, "segments": [list(s) for s in self.segments],
                "added": [[i, round(s, 4)] for i, s in self.added], "note": self.note}


@dataclass
class AgentResult:
    """What one question cost and produced.

    ``frames``: the frames looked at, in the order the agent took them
    (uniform sample first); ``frames_used`` = ``len(frames)`` (the paper's
    "frames per question"); ``stop``: "answerable", "budget", "max_rounds",
    "exhausted" (every frame seen), "no_segments" (the policy named none) or
    "not_in_window" (the question's time reference holds no frame, or its
    anchor was not found); ``timings`` in seconds (question encoding,
    retrieval, captioning, policy, answer, total); ``time_reference`` the
    question's time reference with its window (seconds and frames), or None.
    ``outcome`` / ``confidence`` are the answer's.
    """

    question: str
    options: tuple[str, ...] | None
    answer: Answer
    frames: list[int]
    timestamps: list[float]
    captions: dict[int, str]
    rounds: list[RoundLog]
    stop: str
    strategy: str
    timings: dict = field(default_factory=dict)
    time_reference: dict | None = None

    @property
    def frames_used(self) -> int:
        return len(self.frames)

    @property
    def outcome(self) -> Outcome:
        return self.answer.outcome

    @property
    def confidence(self) -> float:
        return self.answer.confidence

    def to_dict(self) -> dict:
        return {"question": self.question, "options": None if self.options is None else list(self.options),
                "strategy": self.strategy, "answer": self.answer.to_dict(), "frames_used": self.frames_used,
                "frames": [{"frame": i, "t": round(t, 3), "caption": self.captions[i]}
                           for i, t in zip(self.frames, self.timestamps)],
                "rounds": [r.to_dict() for r in self.rounds], "stop": self.stop,
                "outcome": Outcome(self.answer.outcome).value,
                "confidence": None if math.isnan(self.answer.confidence) else round(self.answer.confidence, 4),
                "time_reference": self.time_reference,
                "timings_ms": {k: round(1e3 * v, 3) for k, v in self.timings.items()}}


class VideoAgent:
    """The VideoAgent loop over one indexed video (see the module docstring).

    Parameters
    ----------
    index : VideoIndex
    query_encoder : TextEncoder
        Embeds questions (and policy queries) into the index's space; with the
        default ``LabelTextEmbedder`` index, the text encoder that built it.
    captioner : FrameCaptioner or Captioner, optional
        Default ``LabelCaptioner`` (labels; deterministic, no model).
    policy : AnswerabilityPolicy, optional
        Default ``RetrievalConfidencePolicy()``.
    answerer : Answerer, optional
        Default ``CaptionVoteAnswerer(query_encoder)`` (deterministic, no model).
    initial : int
        Frames sampled uniformly before the first assessment (the paper: 5).
    budget : int
        Most frames looked at per question (``ask(budget=...)`` overrides).
    max_rounds : int
        Most retrieval rounds (the paper: 3).
    frames_per_segment : int
        Frames retrieved in each searched segment per round (the paper: 1).
    backend : str
        Backend of the frame index's searches (``CosineIndex.search``).
    calibration : Calibration, optional
        Decides each answer's confidence and outcome (``calibration.agent_features``);
        default ``calibration.default_calibration(query_encoder)``.

    A question with a time reference ("at 20 s", "at the beginning", "before
    the car arrived", ``components.timeref``) is answered from the frames of
    its window only: the uniform sample and every retrieval round stay inside
    it ("before X" / "after X": X is the frame most similar to X's text, if
    its caption confirms it by the calibration, else "not in memory").

    Not thread-safe (the caption cache is shared by questions).
    """

    def __init__(self, index: VideoIndex, query_encoder, *, captioner=None, policy: AnswerabilityPolicy | None = None,
                 answerer: Answerer | None = None, initial: int = 5, budget: int = 16, max_rounds: int = 3,
                 frames_per_segment: int = 1, backend: str = "auto", calibration: Calibration | None = None):
        if not isinstance(index, VideoIndex):
            raise ValueError(f"index must be a VideoIndex, got {type(index).__name__}")
        if query_encoder is None or not callable(getattr(query_encoder, "encode", None)):
            raise ValueError("query_encoder must have encode(texts) -> (n, dim) tensor")
        if int(getattr(query_encoder, "dim", index.dim)) != index.dim:
            raise ValueError(f"query_encoder embeds {query_encoder.dim}-d vectors but the index holds "
                             f"{index.dim}-d frame embeddings; they must share one space")
        if policy is not None and not callable(getattr(policy, "assess", None)):
            raise ValueError("policy must have assess(state) -> Assessment")
        if answerer is not None and not callable(getattr(answerer, "answer", None)):
            raise ValueError("answerer must have answer(state) -> Answer")
        self.index = index
        self.query_encoder = query_encoder
        self.captioner = _as_frame_captioner(captioner)
        self.policy = policy if policy is not None else RetrievalConfidencePolicy()
        self.answerer = answerer if answerer is not None else CaptionVoteAnswerer(query_encoder)
        self.initial = _check_count(initial, "initial", 1)
        self.budget = _check_count(budget, "budget", 1)
        self.max_rounds = _check_count(max_rounds, "max_rounds", 0)
        self.frames_per_segment = _check_count(frames_per_segment, "frames_per_segment", 1)
        self.backend = backend
        if calibration is not None and not isinstance(calibration, Calibration):
            raise ValueError(f"calibration must be a Calibration or None, got {type(calibration).__name__}")
        self.calibration = calibration if calibration is not None else default_calibration(query_encoder)
        self.word_vectors = WordVectors(query_encoder)  # the ``related`` feature of answers
        self._captions: dict[int, str] = {}
        self.captions_computed = 0

    @classmethod
    def from_video(cls, source, frame_encoder, text_encoder, *, fps: float | None = None, size: int | None = 320,
                   keep_frames: bool = False, **kwargs) -> "VideoAgent":
        """Decode ``source`` (a path; ``VideoSource``), index every frame (labels through ``text_encoder``)."""
        video = VideoSource(source, fps=fps, size=size)
        index = VideoIndex.from_frames(None, video, frame_encoder, LabelTextEmbedder(text_encoder),
                                       keep_frames=keep_frames)
        return cls(index, text_encoder, **kwargs)

    # ---- checkpoints ---------------------------------------------------------
    def state_dict(self) -> dict:
        """The index, the caption cache and the loop's settings (``state.agent_state``); the hooks and
        the query encoder are not state."""
        return agent_state(self, self._captions)

    def save(self, path) -> Path:
        """Write the agent to ``path`` (one checkpoint file, ``streammem.checkpoint``: a header, a
        SHA-256 of the payload, atomic replacement)."""
        return save_checkpoint(path, KIND, self.state_dict(), version=STATE_VERSION)

    @classmethod
    def load(cls, path, query_encoder, **hooks) -> "VideoAgent":
        """An agent saved with :meth:`save`; pass the same query encoder and the hooks (``captioner``,
        ``policy``, ``answerer``, ``calibration``).  A missing, damaged or foreign file, or a state
        with an invalid field, is one ``ValueError`` naming the file (and the field)."""
        state, _ = load_checkpoint(path, KIND, versions=(STATE_VERSION,))
        return cls.from_state_dict(StateReader(path, KIND, state), query_encoder, **hooks)

    @classmethod
    def from_state_dict(cls, state, query_encoder, **hooks) -> "VideoAgent":
        """An agent from :meth:`state_dict` output (a dict or a ``StateReader``), every field checked."""
        reader = reader_for(state, KIND)
        dim = getattr(query_encoder, "dim", None)
        got = read_agent_state(reader, None if dim is None else int(dim))
        index = reader.restore("index", lambda: VideoIndex(**got["index"]))
        settings = {name: got[name] for name in ("initial", "budget", "max_rounds", "frames_per_segment",
                                                 "backend")}
        agent = reader.restore("settings", lambda: cls(index, query_encoder, **settings, **hooks))
        agent._captions = dict(got["captions"])
        agent.captions_computed = got["captions_computed"]
        return agent

    # ---- stages --------------------------------------------------------------
    def encode_queries(self, texts: Sequence[str]) -> torch.Tensor:
        """(n, E) unit embeddings of question / query texts, on the index's device."""
        out = encode_texts(self.query_encoder, texts)
        if out.dim() != 2 or out.shape != (len(texts), self.index.dim):
            raise ValueError(f"query_encoder returned {tuple(out.shape)}, expected ({len(texts)}, {self.index.dim})")
        return F.normalize(out, dim=1).to(self.index.embeddings.device)

    def retrieve(self, queries: torch.Tensor, segments: torch.Tensor, k: int | None = None) -> TopKResult:
        """Row s: the best ``k`` frames of ``segments[s]`` for ``queries[s]``; one search of the frame index.

        ``queries`` (S, E) or (E,) (the same query for every segment),
        ``segments`` (S, 2) ``[start, end)``.  Ids are frame indices; -1 / -inf
        past a segment's end.
        """
        k = self.frames_per_segment if k is None else _check_count(k, "k", 1)
        segments = torch.as_tensor(segments, dtype=torch.int64).reshape(-1, 2)
        if segments.shape[0] == 0:
            return TopKResult(torch.zeros(0, k, dtype=torch.int64), torch.zeros(0, k))
        if queries.dim() == 1:
            queries = queries[None].expand(segments.shape[0], -1)
        return self.index.keys.search(queries, k, ranges=segments.to(self.index.embeddings.device),
                                      backend=self.backend)

    def caption(self, frames: Sequence[int]) -> list[str]:
        """Captions of ``frames`` (cached; new ones through the captioner in one call)."""
        new = [i for i in dict.fromkeys(int(f) for f in frames) if i not in self._captions]
        if new:
            pixels = self.index.frames[new] if self.index.frames is not None else None
            texts = self.captioner.caption([self.index.record(i) for i in new], pixels)
            if len(texts) != len(new) or not all(isinstance(t, str) for t in texts):
                raise ValueError(f"captioner returned {len(texts)} captions for {len(new)} frames "
                                 "(expected one str per frame)")
            self._captions.update(zip(new, texts))
            self.captions_computed += len(new)
        return [self._captions[int(f)] for f in frames]

    def clear_captions(self) -> None:
        self._captions.clear()

    def _state(self, question, options, q, observed, round_, frames_left, timings, *,
               searched: dict | None = None, window: tuple[int, int] | None = None) -> AgentState:
        """The state after looking at ``observed``.

        ``window``: the ``[start, end)`` frames of the question's time
        reference; unobserved segments are clipped to it.

        ``searched`` maps a segment ``(start, end)`` to its row of candidates
        from an earlier round of the same question: only segments that are new
        (split by the frames just added) are retrieved, in one search of the frame
        index, since an unchanged segment's best frames for the same query are
        unchanged.  None: no retrieval (``candidates`` None).
        """
        seen = sorted(observed)
        t0 = time.perf_counter()
        segments = unobserved_segments(seen, len(self.index))
        if window is not None and segments.shape[0]:
            segments = torch.stack([segments[:, 0].clamp(min=window[0]), segments[:, 1].clamp(max=window[1])], 1)
            segments = segments[segments[:, 0] < segments[:, 1]].reshape(-1, 2)
        candidates = None
        if searched is not None:
            keys = [tuple(row) for row in segments.tolist()]
            new = [row for row, key in enumerate(keys) if key not in searched]
            if new:
                found = self.retrieve(q, segments[new])
                searched.update(zip((keys[row] for row in new), zip(found.ids, found.scores)))
            k = self.frames_per_segment
            ids = torch.stack([searched[key][0] for key in keys]) if keys else torch.zeros(0, k, dtype=torch.int64)
            scores = torch.stack([searched[key][1] for key in keys]) if keys else torch.zeros(0, k)
            candidates = TopKResult(ids, scores)
        rel = (self.index.unit[torch.tensor(seen, dtype=torch.long, device=q.device)] @ q).tolist() if seen else []
        timings["retrieve"] = timings.get("retrieve", 0.0) + time.perf_counter() - t0
        return AgentState(question, options, q, seen, {i: self._captions[i] for i in seen}, dict(zip(seen, rel)),
                          self.index.timestamps, segments, candidates, round_, frames_left)

    @staticmethod
    def _check_question(question, options):
        if not isinstance(question, str) or not question.strip():
            raise ValueError("question must be a non-empty string")
        if options is None:
            return None
        if isinstance(options, str) or not all(isinstance(o, str) and o.strip() for o in options) or not options:
            raise ValueError("options must be a non-empty sequence of non-empty strings, or None")
        return tuple(options)

    def _budget(self, budget) -> int:
        return min(self.budget if budget is None else _check_count(budget, "budget", 1), len(self.index))

    # ---- questions -----------------------------------------------------------
    def ask(self, question: str, options: Sequence[str] | None = None, *, budget: int | None = None,
            time_references: bool = True) -> AgentResult:
        """Answer ``question`` with the iterative loop; at most ``budget`` frames looked at.

        The answer carries its confidence and outcome (``Answer``); a time
        reference restricts every frame looked at to its window (class
        docstring) unless ``time_references`` is False (the whole video, as if
        the question named no time).
        """
        options = self._check_question(question, options)
        budget = self._budget(budget)
        timings: dict[str, float] = {}
        t_start = time.perf_counter()
        q = self.encode_queries([question])[0]
        timings["question_encode"] = time.perf_counter() - t_start
        ref = parse_time_reference(question) if time_references else None
        window, reference = (None, None) if ref is None else self._window(ref, timings)
        if ref is not None and window is None:
            return self._not_in_window(question, options, reference, timings, t_start)
        lo, hi = (0, len(self.index)) if window is None else window
        budget = min(budget, hi - lo)

        order = [lo + i for i in uniform_indices(hi - lo, min(self.initial, budget))]
        self._timed(timings, "caption", self.caption, order)
        observed = set(order)
        searched: dict = {}  # (start, end) -> (ids, scores) of the question's best frames in that segment
        rounds: list[RoundLog] = []
        stop = None
        for round_ in range(self.max_rounds + 1):
            state = self._state(question, options, q, observed, round_, budget - len(order), timings,
                                searched=searched, window=window)
            if state.segments.shape[0] == 0:
                rounds.append(RoundLog(round_, len(order), math.inf, True, [], [], "every frame seen"))
                stop = "exhausted"
                break
            verdict = self._timed(timings, "policy", self.policy.assess, state)
            log = RoundLog(round_, len(order), float(verdict.confidence), bool(verdict.answerable), [], [],
                           verdict.note)
            rounds.append(log)
            if verdict.answerable:
                stop = "answerable"
                break
            if state.frames_left <= 0:
                stop = "budget"
                break
            if round_ == self.max_rounds:
                stop = "max_rounds"
                break
            added = self._search(state, verdict, timings)
            log.segments = [tuple(state.segments[s].tolist()) for s in verdict.segments]
            log.added = added
            if not added:
                stop = "no_segments"
                break
            new = [i for i, _ in added]
            self._timed(timings, "caption", self.caption, new)
            order.extend(new)
            observed.update(new)
        # Every exit above leaves `state` describing exactly the frames in `order`.
        answer = self._timed(timings, "answer", self.answerer.answer, state)
        timings["total"] = time.perf_counter() - t_start
        return self._result(question, options, answer, order, rounds, stop, "iterative", timings, state=state,
                            ref=ref, reference=reference)

    def _window(self, ref: TimeReference, timings: dict) -> tuple[tuple[int, int] | None, dict]:
        """([start, end) frames of a time reference's window, or None when it holds no frame), its description."""
        t0 = time.perf_counter()
        times = self.index.timestamps
        start, now = float(times[0]), float(times[-1])
        reference = ref.to_dict()
        anchor_span = None
        if ref.anchor is not None:
            a = self.encode_queries([ref.anchor])[0]
            top = self.index.keys.search(a[None], 1, backend=self.backend)
            frame, score = int(top.ids[0, 0]), float(top.scores[0, 0])
            caption = self.caption([frame])[0]
            conf, outcome = self.calibration.decide(agent_features(ref.anchor, [caption], score, True,
                                                                   self.word_vectors))
            reference["anchor_match"] = {"frame": frame, "t": round(float(times[frame]), 3), "caption": caption,
                                         "confidence": round(conf, 4)}
            if outcome != Outcome.ANSWERED:
                reference["reason"] = "the anchor is not in memory"
                timings["time_reference"] = time.perf_counter() - t0
                return None, reference
            anchor_span = (float(times[frame]), float(times[frame]))
        lo, hi = ref.window(stream_start=start, now=now, anchor_span=anchor_span)
        reference["window"] = [round(lo, 3), round(hi, 3)]
        inside = in_window(ref, times, times, stream_start=start, now=now, anchor_span=anchor_span).nonzero()[:, 0]
        timings["time_reference"] = time.perf_counter() - t0
        if inside.numel() == 0:
            reference["reason"] = "no frame in that span"
            return None, reference
        frames = (int(inside[0]), int(inside[-1]) + 1)  # times are sorted: the window's frames are one run
        reference["frames"] = list(frames)
        return frames, reference

    def _not_in_window(self, question, options, reference, timings, t_start) -> AgentResult:
        answer = Answer(NOT_IN_MEMORY_ANSWER, None, [], False, self.answerer_source, Outcome.NOT_IN_MEMORY, 0.0)
        timings["total"] = time.perf_counter() - t_start
        return AgentResult(question, options, answer, [], [], {}, [], "not_in_window", "iterative", timings,
                           reference)

    @property
    def answerer_source(self) -> str:
        return getattr(self.answerer, "source", type(self.answerer).__name__)

    def _search(self, state: AgentState, verdict: Assessment, timings: dict) -> list[tuple[int, float]]:
        """Retrieve inside the segments the policy chose; returns (frame, score) pairs within the budget."""
        chosen = [int(s) for s in verdict.segments]
        if any(s < 0 or s >= state.segments.shape[0] for s in chosen) or len(set(chosen)) != len(chosen):
            raise ValueError(f"policy chose segments {chosen}; expected distinct rows of the "
                             f"{state.segments.shape[0]} segments")
        if not chosen:
            return []
        t0 = time.perf_counter()
        if verdict.queries is not None:
            if len(verdict.queries) != len(chosen):
                raise ValueError(f"policy gave {len(verdict.queries)} queries for {len(chosen)} segments")
            found = self.retrieve(self.encode_queries(verdict.queries), state.segments[chosen])
        else:
            rows = torch.tensor(chosen, dtype=torch.long)
            found = TopKResult(state.candidates.ids[rows], state.candidates.scores[rows])
        timings["retrieve"] = timings.get("retrieve", 0.0) + time.perf_counter() - t0
        # Segment by segment in the policy's order, each segment's frames best first, up to the budget.
        added, taken = [], set(state.observed)
        for ids, scores in zip(found.ids.tolist(), found.scores.tolist()):
            for i, s in zip(ids, scores):
                if i >= 0 and i not in taken and len(added) < state.frames_left:
                    added.append((i, s))
                    taken.add(i)
        return added

    def answer_frames(self, question: str, frames: Sequence[int], options: Sequence[str] | None = None, *,
                      strategy: str = "given") -> AgentResult:
        """Answer from a given set of frames (no loop): the baselines use it with the same captioner and answerer."""
        options = self._check_question(question, options)
        frames = list(dict.fromkeys(int(f) for f in frames))
        if any(f < 0 or f >= len(self.index) for f in frames):
            raise ValueError(f"frames must lie in [0, {len(self.index)})")
        timings: dict[str, float] = {}
        t_start = time.perf_counter()
        q = self.encode_queries([question])[0]
        timings["question_encode"] = time.perf_counter() - t_start
        self._timed(timings, "caption", self.caption, frames)
        final = self._state(question, options, q, set(frames), 0, 0, timings)
        answer = self._timed(timings, "answer", self.answerer.answer, final)
        timings["total"] = time.perf_counter() - t_start
        return self._result(question, options, answer, frames, [], "given", strategy, timings, state=final,
                            ref=parse_time_reference(question))

    def ask_uniform(self, question: str, options: Sequence[str] | None = None, *,
                    budget: int | None = None) -> AgentResult:
        """Baseline: ``budget`` frames sampled uniformly, the same captioner and answerer."""
        budget = self._budget(budget)
        return self.answer_frames(question, uniform_indices(len(self.index), budget), options, strategy="uniform")

    def ask_retrieve_once(self, question: str, options: Sequence[str] | None = None, *,
                          budget: int | None = None) -> AgentResult:
        """Baseline: the ``budget`` frames most similar to the question over the whole video, in one retrieval."""
        budget = self._budget(budget)
        q = self.encode_queries([question])[0]
        top = self.index.keys.search(q[None], budget, backend=self.backend)
        return self.answer_frames(question, [i for i in top.ids[0].tolist() if i >= 0], options,
                                  strategy="retrieve-once")

    @staticmethod
    def _timed(timings: dict, key: str, fn, *args):
        t0 = time.perf_counter()
        out = fn(*args)
        timings[key] = timings.get(key, 0.0) + time.perf_counter() - t0
        return out

    def _result(self, question, options, answer, frames, rounds, stop, strategy, timings, *, state: AgentState,
                ref: TimeReference | None, reference: dict | None = None) -> AgentResult:
        if not isinstance(answer, Answer):
            raise ValueError(f"answerer must return an Answer, got {type(answer).__name__}")
        self._decide(answer, state, ref.question if ref is not None else question)
        return AgentResult(question, options, answer, list(frames),
                           [float(self.index.timestamps[i]) for i in frames],
                           {i: self._captions[i] for i in frames}, rounds, stop, strategy, timings, reference)

    def _decide(self, answer: Answer, state: AgentState, question: str) -> None:
        """Set the answer's features, confidence and outcome from its basis: the captions of its evidence and of
        the three observed frames most relevant to the question (what the answer was chosen among)."""
        basis = [i for i in dict.fromkeys(list(answer.evidence) + state.evidence(3)) if i in state.captions]
        if not basis:
            answer.features, answer.confidence, answer.outcome = {}, 0.0, Outcome.NOT_IN_MEMORY
        else:
            answer.features = agent_features(question, [state.captions[i] for i in basis],
                                             max(state.relevance[i] for i in basis), answer.supported,
                                             self.word_vectors)
            answer.confidence, answer.outcome = self.calibration.decide(answer.features)
        if answer.outcome != Outcome.ANSWERED:
            answer.candidate, answer.candidate_option = answer.text, answer.option
            answer.text, answer.option = NOT_IN_MEMORY_ANSWER, None
