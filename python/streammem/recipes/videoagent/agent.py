"""VideoAgent: long-video question answering by iterative frame retrieval.

VideoAgent (Wang, Zhang, Zohar, Yeung-Levy, ECCV 2024) answers a question
about a long video by looking at few frames, chosen one round at a time:

1. sample N frames uniformly (the paper: N = 5) and caption them (a VLM);
2. the agent (an LLM) answers from the captions and rates its confidence
   (self-reflection, 1-3);
3. while not confident: it names the segments between the frames seen that
   need more information and writes a query for each; CLIP retrieves the most
   similar frame *inside* each segment; the new frames are captioned and added
   (at most 3 rounds);
4. it answers.  The paper reports 54.1 % on EgoSchema with 8.4 frames a
   question on average.

This module is that loop on the package's kernels; the model work is behind
hooks, and every default that stands where a model would is named for what it
is (deterministic, no model):

* **index** (``VideoIndex``): every frame once, in the query space.  The paper
  embeds frames with CLIP.  The default here indexes a frame by the text
  embedding of its EfficientNet-lite0 ImageNet labels (``LabelTextEmbedder``,
  with the package's MiniLM text encoder), a stand-in for a joint image-text
  encoder; any ``(T, E)`` embeddings in the question encoder's space plug in
  (``VideoIndex.from_embeddings``).
* **captioner** (``FrameCaptioner``): a model captioning the frames the agent
  looks at; each looked-at frame counts once in ``frames_used``.  Default: the
  package's ``LabelCaptioner`` (the frame's labels; deterministic, no model).
  Captions are cached per frame across questions, as a deployment would.
* **policy** (``AnswerabilityPolicy``): decides whether the question can be
  answered from what was seen, and which segments to search (with which
  queries).  The paper's LLM self-reflection is the user's hook; the default,
  ``RetrievalConfidencePolicy``, uses retrieval confidence (see there).
* **answerer** (``Answerer``): answers from the captions of the frames seen.
  Default ``CaptionVoteAnswerer``: a deterministic extractive answer (the
  option named by the most relevant captions), not a language model.

The retrieval step is one ``cosine_topk(queries, frame_embeddings, k,
ranges=segments)`` call per round: one query row per segment, each
restricted to its segment's frames, so a round costs one kernel launch
whatever the number of segments; after the first round only the segments
split by the frames just added are searched (an unchanged segment keeps its
best frames for the same query).  ``streammem videoagent`` runs it from the
command line (on a video file, or ``--synthetic`` scored against uniform
sampling).

``PlantedEventVideo`` generates a long synthetic video (as ImageNet labels,
deterministic from a seed) with planted answerable events: short spans where
a cue (an animal) appears with the answer (an object), related distractor
events elsewhere (another animal of the same family with a wrong option), and
multiple-choice questions whose ground truth is the answer and the frames
that hold it; ``evaluate`` scores the agent against uniform sampling at the
same frame budget on it.

>>> agent = VideoAgent.from_video("clip.mp4", load_frame_encoder(), load_text_encoder(), fps=2)
>>> result = agent.ask("What vehicle passes the camera?")
>>> result.answer.text, result.frames_used

Out of scope: the paper's LLM prompting (the policy and answerer hooks take
the user's model).
"""
from __future__ import annotations

import math
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol, Sequence, runtime_checkable

import numpy as np
import torch
import torch.nn.functional as F

from streammem_kernels import TopKResult, cosine_topk

from ...models.encoders import EncodedFrames
from ...components.memory import FrameRecord, LabelCaptioner, caption_text

__all__ = [
    "VideoIndex",
    "LabelTextEmbedder",
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
    "uniform_indices",
    "unobserved_segments",
    "PlantedQuestion",
    "PlantedEventVideo",
    "evaluate",
    "STRATEGIES",
]


# --------------------------------------------------------------------------
# Frame positions
# --------------------------------------------------------------------------
def _check_count(value, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def uniform_indices(num_frames: int, n: int) -> list[int]:
    """``n`` frame indices spread uniformly over ``num_frames``: the centre of each of n equal parts.

    ``floor((i + 0.5) * num_frames / n)`` for i < n, so the first and last
    parts are sampled as densely as the middle; every frame when
    ``n >= num_frames``.
    """
    num_frames = _check_count(num_frames, "num_frames", 1)
    n = _check_count(n, "n", 1)
    if n >= num_frames:
        return list(range(num_frames))
    return [int((2 * i + 1) * num_frames // (2 * n)) for i in range(n)]


def unobserved_segments(observed: Iterable[int], num_frames: int) -> torch.Tensor:
    """(S, 2) int64 ``[start, end)`` runs of frames not in ``observed``, in time order.

    The segments between consecutive observed frames, plus the ones before the
    first and after the last; empty runs are left out.
    """
    num_frames = _check_count(num_frames, "num_frames", 1)
    seen = sorted(set(int(i) for i in observed))
    if seen and (seen[0] < 0 or seen[-1] >= num_frames):
        raise ValueError(f"observed frames must lie in [0, {num_frames}), got {seen[0]}..{seen[-1]}")
    bounds = [-1] + seen + [num_frames]
    runs = [(a + 1, b) for a, b in zip(bounds, bounds[1:]) if b > a + 1]
    return torch.tensor(runs, dtype=torch.int64).reshape(-1, 2)


# --------------------------------------------------------------------------
# The index: every frame once, in the question encoder's space
# --------------------------------------------------------------------------
class LabelTextEmbedder:
    """Frames to the text space: the text embedding of each frame's classifier labels.

    A stand-in for a joint image-text encoder (the paper's CLIP): a frame
    labelled ``("taxicab", "minivan", "car mirror")`` is indexed as the text
    ``"taxicab, minivan, car mirror"`` through ``text_encoder``, so questions
    embedded by the same encoder retrieve it.  Identical label sets are
    embedded once.  Frames without labels embed ``empty_text``.
    """

    def __init__(self, text_encoder, *, empty_text: str = "scene"):
        if text_encoder is None or not callable(getattr(text_encoder, "encode", None)):
            raise ValueError("text_encoder must have encode(texts) -> (n, dim) tensor")
        self.text_encoder = text_encoder
        self.empty_text = str(empty_text)
        self.dim = int(text_encoder.dim)

    def text_of(self, labels: Sequence[str]) -> str:
        return ", ".join(labels) if labels else self.empty_text

    def __call__(self, encoded: EncodedFrames) -> torch.Tensor:
        texts = [self.text_of(labels) for labels in encoded.labels]
        if len(texts) != encoded.features.shape[0]:
            raise ValueError("LabelTextEmbedder needs one label tuple per frame (a frame encoder with a classifier)")
        unique = list(dict.fromkeys(texts))
        row_of = {text: row for row, text in enumerate(unique)}
        vectors = self.text_encoder.encode(unique).float() if unique else torch.zeros(0, self.dim)
        return vectors[torch.tensor([row_of[t] for t in texts], dtype=torch.long)].contiguous()


@dataclass
class VideoIndex:
    """Every frame of a video once: times, query-space embeddings, labels, optional features and pixels.

    Attributes
    ----------
    timestamps : (T,) float64 tensor, non-decreasing seconds
    embeddings : (T, E) float32 tensor
        What retrieval ranks (``cosine_topk``); in the question encoder's space.
    labels : list of T tuples of str
        The frame encoder's labels (empty tuples when it has none).
    features : (T, D) float32 tensor, optional
        The frame encoder's features (captioners receive them in ``FrameRecord``).
    frames : (T, H, W, 3) uint8 array, optional
        The pixels, kept only when asked (``keep_frames=True``) for a captioner
        that looks at images.
    """

    timestamps: torch.Tensor
    embeddings: torch.Tensor
    labels: list
    features: torch.Tensor | None = None
    frames: np.ndarray | None = None

    def __post_init__(self):
        t = torch.as_tensor(self.timestamps, dtype=torch.float64).reshape(-1)
        e = torch.as_tensor(self.embeddings)
        if e.dim() != 2 or e.shape[0] < 1 or e.shape[1] < 1 or not e.is_floating_point():
            raise ValueError(f"embeddings must be a float (T, E) tensor with T, E >= 1, got "
                             f"{tuple(e.shape)} {e.dtype}")
        if t.shape[0] != e.shape[0]:
            raise ValueError(f"timestamps must hold one time per frame ({e.shape[0]}), got {t.shape[0]}")
        if not bool(torch.isfinite(t).all()) or (t.numel() > 1 and bool((t[1:] < t[:-1]).any())):
            raise ValueError("timestamps must be finite and non-decreasing")
        e = e.float().contiguous()
        if not bool(torch.isfinite(e).all()):
            raise ValueError("embeddings must be finite")
        labels = [()] * e.shape[0] if self.labels is None else [tuple(str(x) for x in lab) for lab in self.labels]
        if len(labels) != e.shape[0]:
            raise ValueError(f"labels must hold one tuple per frame ({e.shape[0]}), got {len(labels)}")
        if self.features is not None:
            f = torch.as_tensor(self.features).float()
            if f.dim() != 2 or f.shape[0] != e.shape[0]:
                raise ValueError(f"features must be (T, D) with T = {e.shape[0]}, got {tuple(f.shape)}")
            self.features = f
        if self.frames is not None:
            frames = np.asarray(self.frames)
            if frames.ndim != 4 or frames.shape[0] != e.shape[0] or frames.shape[-1] != 3 or frames.dtype != np.uint8:
                raise ValueError(f"frames must be uint8 (T, H, W, 3) with T = {e.shape[0]}, got {frames.dtype} "
                                 f"{frames.shape}")
            self.frames = frames
        self.timestamps, self.embeddings, self.labels = t, e, labels
        self.unit = F.normalize(e, dim=1)  # relevance of frames already seen: one small product per round

    def __len__(self) -> int:
        return self.embeddings.shape[0]

    @property
    def dim(self) -> int:
        return self.embeddings.shape[1]

    def record(self, index: int) -> FrameRecord:
        """The frame as a ``FrameRecord`` (what ``Captioner``s take)."""
        feature = self.features[index] if self.features is not None else torch.zeros(0)
        return FrameRecord(int(index), float(self.timestamps[index]), feature, self.labels[index])

    # ---- builders --------------------------------------------------------
    @classmethod
    def from_embeddings(cls, timestamps, embeddings, labels=None, *, features=None, frames=None) -> "VideoIndex":
        """An index from embeddings already in the question encoder's space (e.g. CLIP image features)."""
        return cls(timestamps, embeddings, labels, features, frames)

    @classmethod
    def from_encoded(cls, timestamps, encoded: EncodedFrames, embedder: Callable[[EncodedFrames], torch.Tensor],
                     *, frames=None) -> "VideoIndex":
        """An index from a frame encoder's output and an embedder into the query space (``LabelTextEmbedder``)."""
        embeddings = embedder(encoded)
        labels = encoded.labels if encoded.labels else None
        return cls(timestamps, embeddings, labels, encoded.features, frames)

    @classmethod
    def from_labels(cls, timestamps, labels: Sequence[Sequence[str]], embedder) -> "VideoIndex":
        """An index of label-only frames (synthetic video): ``embedder`` maps them to the query space."""
        labels = [tuple(lab) for lab in labels]
        encoded = EncodedFrames(torch.zeros(len(labels), 0), labels)
        return cls(timestamps, embedder(encoded), labels)

    @classmethod
    def from_frames(cls, timestamps, frames, frame_encoder, embedder, *, batch: int = 64,
                    keep_frames: bool = False) -> "VideoIndex":
        """Encode every frame of ``(timestamps, frames)`` pairs (an iterable, e.g. a ``VideoSource``).

        ``timestamps`` may be None when ``frames`` yields ``(t, frame)`` pairs.
        Frames are encoded ``batch`` at a time, so memory holds one batch of
        pixels (plus all of them with ``keep_frames``).
        """
        batch = _check_count(batch, "batch", 1)
        pairs = frames if timestamps is None else zip(timestamps, frames)
        times: list[float] = []
        feats, labels, kept, pending = [], [], [], []

        def flush():
            if pending:
                out = frame_encoder.encode(np.stack(pending))
                feats.append(out.features.float())
                labels.extend(out.labels if out.labels else [()] * len(pending))
                if keep_frames:
                    kept.extend(pending)
                pending.clear()

        for t, frame in pairs:
            times.append(float(t))
            pending.append(np.asarray(frame))
            if len(pending) == batch:
                flush()
        flush()
        if not times:
            raise ValueError("the video yielded no frames")
        encoded = EncodedFrames(torch.cat(feats), labels)
        return cls.from_encoded(times, encoded, embedder, frames=np.stack(kept) if keep_frames else None)


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
        segment's end): this round's ``cosine_topk(ranges=segments)`` output.
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
        # The CLI's defaults (cli.py add_videoagent_command) read these two values from here.
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
    """

    text: str
    option: int | None
    evidence: list[int]
    supported: bool
    source: str

    def to_dict(self) -> dict:
        return {"text": self.text, "option": self.option, "evidence": list(self.evidence),
                "supported": self.supported, "source": self.source}


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
        vectors = F.normalize(self.text_encoder.encode([top_caption, *state.options]).float(), dim=1)
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
    "exhausted" (every frame seen) or "no_segments" (the policy named none);
    ``timings`` in seconds (question encoding, retrieval, captioning, policy,
    answer, total).
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

    @property
    def frames_used(self) -> int:
        return len(self.frames)

    def to_dict(self) -> dict:
        return {"question": self.question, "options": None if self.options is None else list(self.options),
                "strategy": self.strategy, "answer": self.answer.to_dict(), "frames_used": self.frames_used,
                "frames": [{"frame": i, "t": round(t, 3), "caption": self.captions[i]}
                           for i, t in zip(self.frames, self.timestamps)],
                "rounds": [r.to_dict() for r in self.rounds], "stop": self.stop,
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
        ``cosine_topk`` backend.

    Not thread-safe (the caption cache is shared by questions).
    """

    def __init__(self, index: VideoIndex, query_encoder, *, captioner=None, policy: AnswerabilityPolicy | None = None,
                 answerer: Answerer | None = None, initial: int = 5, budget: int = 16, max_rounds: int = 3,
                 frames_per_segment: int = 1, backend: str = "auto"):
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
        self._captions: dict[int, str] = {}
        self.captions_computed = 0

    @classmethod
    def from_video(cls, source, frame_encoder, text_encoder, *, fps: float | None = None, size: int | None = 320,
                   keep_frames: bool = False, **kwargs) -> "VideoAgent":
        """Decode ``source`` (a path; ``VideoSource``), index every frame (labels through ``text_encoder``)."""
        from ...io.video import VideoSource

        video = VideoSource(source, fps=fps, size=size)
        index = VideoIndex.from_frames(None, video, frame_encoder, LabelTextEmbedder(text_encoder),
                                       keep_frames=keep_frames)
        return cls(index, text_encoder, **kwargs)

    # ---- stages --------------------------------------------------------------
    def encode_queries(self, texts: Sequence[str]) -> torch.Tensor:
        """(n, E) unit embeddings of question / query texts, on the index's device."""
        out = self.query_encoder.encode(list(texts)).float()
        if out.dim() != 2 or out.shape != (len(texts), self.index.dim):
            raise ValueError(f"query_encoder returned {tuple(out.shape)}, expected ({len(texts)}, {self.index.dim})")
        return F.normalize(out, dim=1).to(self.index.embeddings.device)

    def retrieve(self, queries: torch.Tensor, segments: torch.Tensor, k: int | None = None) -> TopKResult:
        """Row s: the best ``k`` frames of ``segments[s]`` for ``queries[s]``; one ``cosine_topk`` call.

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
        return cosine_topk(queries, self.index.embeddings, k, ranges=segments.to(self.index.embeddings.device),
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
               searched: dict | None = None) -> AgentState:
        """The state after looking at ``observed``.

        ``searched`` maps a segment ``(start, end)`` to its row of candidates
        from an earlier round of the same question: only segments that are new
        (split by the frames just added) are retrieved, in one ``cosine_topk``
        call, since an unchanged segment's best frames for the same query are
        unchanged.  None: no retrieval (``candidates`` None).
        """
        seen = sorted(observed)
        t0 = time.perf_counter()
        segments = unobserved_segments(seen, len(self.index))
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
    def ask(self, question: str, options: Sequence[str] | None = None, *, budget: int | None = None) -> AgentResult:
        """Answer ``question`` with the iterative loop; at most ``budget`` frames looked at."""
        options = self._check_question(question, options)
        budget = self._budget(budget)
        timings: dict[str, float] = {}
        t_start = time.perf_counter()
        q = self.encode_queries([question])[0]
        timings["question_encode"] = time.perf_counter() - t_start

        order = uniform_indices(len(self.index), min(self.initial, budget))
        self._timed(timings, "caption", self.caption, order)
        observed = set(order)
        searched: dict = {}  # (start, end) -> (ids, scores) of the question's best frames in that segment
        rounds: list[RoundLog] = []
        stop = None
        for round_ in range(self.max_rounds + 1):
            state = self._state(question, options, q, observed, round_, budget - len(order), timings,
                                searched=searched)
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
        return self._result(question, options, answer, order, rounds, stop, "iterative", timings)

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
        return self._result(question, options, answer, frames, [], "given", strategy, timings)

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
        top = cosine_topk(q[None], self.index.embeddings, budget, backend=self.backend)
        return self.answer_frames(question, [i for i in top.ids[0].tolist() if i >= 0], options,
                                  strategy="retrieve-once")

    @staticmethod
    def _timed(timings: dict, key: str, fn, *args):
        t0 = time.perf_counter()
        out = fn(*args)
        timings[key] = timings.get(key, 0.0) + time.perf_counter() - t0
        return out

    def _result(self, question, options, answer, frames, rounds, stop, strategy, timings) -> AgentResult:
        if not isinstance(answer, Answer):
            raise ValueError(f"answerer must return an Answer, got {type(answer).__name__}")
        return AgentResult(question, options, answer, list(frames),
                           [float(self.index.timestamps[i]) for i in frames],
                           {i: self._captions[i] for i in frames}, rounds, stop, strategy, timings)


# --------------------------------------------------------------------------
# A synthetic long video with planted answerable events
# --------------------------------------------------------------------------
# Every name below is an ImageNet-1k class (EfficientNet-lite0's label set), so the
# synthetic frames carry labels the real frame encoder could emit.
SCENES: dict[str, tuple[str, ...]] = {
    "kitchen": ("refrigerator", "microwave oven", "dining table", "toaster", "stove", "sink", "coffee mug",
                "tea cup", "dishwasher"),
    "street": ("taxicab", "traffic light", "minivan", "parking meter", "traffic or street sign", "trolleybus",
               "school bus", "tram", "mountain bike"),
    "office": ("desk", "desktop computer", "computer keyboard", "computer mouse", "monitor", "printer",
               "filing cabinet", "wall clock", "folding chair"),
    "living room": ("couch", "table lamp", "bookcase", "lampshade", "vase", "china cabinet", "candle",
                    "rocking chair", "quilt"),
    "park": ("park bench", "lakeshore", "valley", "fountain", "tent", "picket fence", "patio", "stone wall",
             "split-rail fence"),
    "bathroom": ("bathtub", "shower curtain", "toilet seat", "medicine cabinet", "toilet paper", "washing machine",
                 "window shade", "soap dispenser", "paper towel"),
}
# Cues come in families of related classes: a question's distractor events show
# another member of its cue's family, which retrieval confuses with the cue.
CUE_FAMILIES: dict[str, tuple[str, ...]] = {
    "terriers": ("Border Terrier", "Irish Terrier", "Norfolk Terrier", "Yorkshire Terrier", "Cairn Terrier",
                 "Airedale Terrier", "Scottish Terrier", "Boston Terrier", "Lakeland Terrier"),
    "retrievers": ("Flat-Coated Retriever", "Curly-coated Retriever", "Golden Retriever", "Labrador Retriever",
                   "Chesapeake Bay Retriever"),
    "spaniels": ("Clumber Spaniel", "English Springer Spaniel", "Welsh Springer Spaniel", "Cocker Spaniel",
                 "Sussex Spaniel", "Irish Water Spaniel"),
    "hounds": ("Basset Hound", "Beagle", "Bloodhound", "Afghan Hound", "Ibizan Hound", "Otterhound"),
    "sheepdogs": ("Old English Sheepdog", "Shetland Sheepdog", "collie", "Border Collie", "Australian Kelpie"),
    "cats": ("tabby cat", "Persian cat", "Siamese cat", "Egyptian Mau"),
    "big cats": ("cougar", "lynx", "leopard", "snow leopard", "jaguar", "lion", "tiger", "cheetah"),
    "bears": ("brown bear", "American black bear", "polar bear", "sloth bear"),
    "wild dogs": ("grey wolf", "red fox", "kit fox", "Arctic fox", "grey fox", "coyote"),
    "small birds": ("goldfinch", "house finch", "brambling", "junco", "indigo bunting", "American robin"),
    "parrots": ("african grey parrot", "macaw", "sulphur-crested cockatoo", "lorikeet"),
    "snakes": ("garter snake", "water snake", "vine snake", "kingsnake", "boa constrictor", "green mamba"),
    "lizards": ("green iguana", "Carolina anole", "agama", "chameleon", "Komodo dragon"),
    "crabs": ("Dungeness crab", "rock crab", "fiddler crab", "red king crab", "hermit crab"),
}
OBJECTS: tuple[str, ...] = (
    "tennis ball", "basketball", "baseball", "golf ball", "ping-pong ball", "croquet ball", "rugby ball",
    "soccer ball", "volleyball ball", "teddy bear", "umbrella", "backpack", "sunglasses", "water bottle", "pillow",
    "balloon", "acoustic guitar", "violin", "drum", "cowboy hat", "mobile phone", "comic book", "shopping basket",
    "frying pan", "whistle", "harmonica", "sombrero", "bow tie", "wallet", "binoculars", "banjo", "accordion",
    "football helmet", "dumbbell", "hair dryer", "sleeping bag", "wooden spoon", "screwdriver", "hammer",
    "power drill", "teapot", "pineapple",
)
TEMPLATES: tuple[str, ...] = (
    "What was next to the {cue}?",
    "Which object appeared together with the {cue}?",
    "What did the {cue} have with it?",
)


@dataclass
class PlantedQuestion:
    """A multiple-choice question about one planted event, with its ground truth.

    ``span``: the event's ``[start, end)`` frames; ``answer_frames``: the frames
    of the span whose labels show the answer (the frames that hold it);
    ``distractor_spans``: events of related cues with wrong options.
    """

    question: str
    options: tuple[str, ...]
    answer: int
    cue: str
    span: tuple[int, int]
    answer_frames: tuple[int, ...]
    distractor_spans: tuple[tuple[int, int], ...]

    @property
    def answer_text(self) -> str:
        return self.options[self.answer]


class PlantedEventVideo:
    """A long video as per-frame ImageNet labels, with planted answerable events; deterministic from ``seed``.

    Background: scenes (``SCENES``) of ``scene_frames`` frames, each frame
    three distinct labels of its scene.  Per question, a true event of
    ``event_frames`` frames where a cue (an animal from ``CUE_FAMILIES``)
    appears with the answer (an object from ``OBJECTS``), and ``distractors``
    events elsewhere where another animal of the same family appears with a
    wrong option.  Like a classifier's top-3, an event frame shows its animal
    with probability ``p_cue`` and its object with ``p_object`` (in random
    label slots, the scene filling the rest), and the animal shown is another
    member of its family with probability ``p_confuse`` (the classifier
    confusing related classes: a distractor frame can carry the question's
    cue); the middle frame shows the event's own animal and object, so every
    question is answerable.  Events never overlap or touch, and no cue appears
    in two questions.  Options: the answer, the distractors' objects and
    random other objects (``options`` in all), in random order.

    Parameters
    ----------
    num_frames : int
    questions : int
    fps : float
        Timestamps are ``i / fps``.
    event_frames : (int, int)
        Inclusive range of event lengths.
    distractors : int
    options : int
        Must be at least ``1 + distractors``.
    p_cue, p_object, p_confuse : float in [0, 1]
    scene_frames : (int, int)
        Inclusive range of background scene lengths.
    seed : int
    """

    def __init__(self, num_frames: int = 3600, questions: int = 20, *, fps: float = 1.0,
                 event_frames: tuple[int, int] = (2, 5), distractors: int = 2, options: int = 5,
                 p_cue: float = 0.75, p_object: float = 0.75, p_confuse: float = 0.2,
                 scene_frames: tuple[int, int] = (30, 150),
                 seed: int = 0):
        self.num_frames = _check_count(num_frames, "num_frames", 1)
        n_questions = _check_count(questions, "questions", 1)
        self.distractors = _check_count(distractors, "distractors", 0)
        self.n_options = _check_count(options, "options", 2)
        if self.n_options < 1 + self.distractors:
            raise ValueError(f"options must be >= 1 + distractors = {1 + self.distractors}, got {options}")
        if self.n_options > len(OBJECTS):
            raise ValueError(f"options must be <= {len(OBJECTS)} (the object vocabulary), got {options}")
        lo, hi = (_check_count(x, "event_frames", 1) for x in event_frames)
        s_lo, s_hi = (_check_count(x, "scene_frames", 1) for x in scene_frames)
        if lo > hi or s_lo > s_hi:
            raise ValueError("event_frames and scene_frames must be (low, high) with low <= high")
        for name, p in (("p_cue", p_cue), ("p_object", p_object), ("p_confuse", p_confuse)):
            if not (isinstance(p, (int, float)) and 0.0 <= p <= 1.0):
                raise ValueError(f"{name} must be a probability in [0, 1], got {p!r}")
        if not (isinstance(fps, (int, float)) and math.isfinite(fps) and fps > 0):
            raise ValueError(f"fps must be > 0, got {fps!r}")
        per_family = [len(c) // (1 + self.distractors) for c in CUE_FAMILIES.values()]
        if n_questions > sum(per_family):
            raise ValueError(f"questions must be <= {sum(per_family)} with {self.distractors} distractors "
                             "(each question uses 1 + distractors cues of one family)")
        n_events = n_questions * (1 + self.distractors)
        if n_events * (hi + 1) > self.num_frames // 2:
            raise ValueError(f"{n_events} events of up to {hi} frames do not fit in half of {num_frames} frames; "
                             "use a longer video or fewer questions")
        self.fps = float(fps)
        self.seed = int(seed)
        rng = np.random.default_rng(seed)

        # Background scenes.
        scene_names = list(SCENES)
        self.scene_of = np.zeros(self.num_frames, dtype=np.int64)
        pos, previous = 0, -1
        while pos < self.num_frames:
            scene = int(rng.integers(len(scene_names)))
            if scene == previous:
                scene = (scene + 1) % len(scene_names)
            length = int(rng.integers(s_lo, s_hi + 1))
            self.scene_of[pos:pos + length] = scene
            pos, previous = pos + length, scene
        labels = [self._scene_labels(rng, scene_names[s]) for s in self.scene_of]

        # Cues: per question one family, its cue and distractor cues, none reused.
        free = {name: list(rng.permutation(len(cues))) for name, cues in CUE_FAMILIES.items()}
        families = [name for name, count in zip(CUE_FAMILIES, per_family) for _ in range(count)]
        families = [families[i] for i in rng.permutation(len(families))[:n_questions]]

        # Event positions: non-overlapping, at least one background frame between events.
        lengths = rng.integers(lo, hi + 1, size=n_events)
        spans = self._place(rng, lengths)
        self.questions: list[PlantedQuestion] = []
        for qi, family in enumerate(families):
            cues = [CUE_FAMILIES[family][free[family].pop()] for _ in range(1 + self.distractors)]
            objects = [OBJECTS[i] for i in rng.permutation(len(OBJECTS))[: self.n_options]]
            own = spans[qi * (1 + self.distractors):(qi + 1) * (1 + self.distractors)]
            for (start, end), cue, obj in zip(own, cues, objects):
                others = [c for c in CUE_FAMILIES[family] if c != cue]
                self._plant(rng, labels, start, end, cue, others, obj, p_cue, p_object, p_confuse)
            order = list(rng.permutation(self.n_options))
            options = tuple(objects[i] for i in order)
            true_start, true_end = own[0]
            self.questions.append(PlantedQuestion(
                question=TEMPLATES[int(rng.integers(len(TEMPLATES)))].format(cue=cues[0]),
                options=options, answer=order.index(0), cue=cues[0], span=(true_start, true_end),
                answer_frames=tuple(i for i in range(true_start, true_end) if objects[0] in labels[i]),
                distractor_spans=tuple(own[1:])))
        self.labels: list[tuple[str, ...]] = labels
        self.timestamps = np.arange(self.num_frames, dtype=np.float64) / self.fps

    @staticmethod
    def _scene_labels(rng, scene: str) -> tuple[str, ...]:
        names = SCENES[scene]
        return tuple(names[i] for i in rng.choice(len(names), size=3, replace=False))

    def _place(self, rng, lengths) -> list[tuple[int, int]]:
        taken = np.zeros(self.num_frames + 2, dtype=bool)  # one guard frame either side
        spans = []
        for length in lengths:
            for _ in range(10_000):
                start = int(rng.integers(1, self.num_frames - length))
                if not taken[start - 1:start + length + 1].any():
                    break
            else:  # pragma: no cover - the size check above leaves at least half of the video free
                raise RuntimeError("could not place the planted events")
            taken[start:start + length] = True
            spans.append((start, start + int(length)))
        return spans

    @staticmethod
    def _plant(rng, labels, start, end, cue, others, obj, p_cue, p_object, p_confuse) -> None:
        middle = (start + end - 1) // 2
        for i in range(start, end):
            frame = list(labels[i])
            slots = list(rng.permutation(3))
            if i == middle:
                frame[slots[0]] = cue
            elif rng.random() < p_cue:
                frame[slots[0]] = others[int(rng.integers(len(others)))] if rng.random() < p_confuse else cue
            if i == middle or rng.random() < p_object:
                frame[slots[1]] = obj
            labels[i] = tuple(frame)

    def __len__(self) -> int:
        return self.num_frames

    def index(self, text_encoder) -> VideoIndex:
        """The video indexed like a real one: each frame's labels through ``LabelTextEmbedder(text_encoder)``."""
        return VideoIndex.from_labels(self.timestamps, self.labels, LabelTextEmbedder(text_encoder))


STRATEGIES = ("iterative", "uniform", "retrieve-once")


def evaluate(agent: VideoAgent, video: PlantedEventVideo, strategy: str = "iterative", budget: int | None = None,
             *, questions: Sequence[PlantedQuestion] | None = None) -> dict:
    """Score a strategy on a planted video's questions at a frame budget.

    ``strategy``: "iterative" (``agent.ask``), "uniform" (``ask_uniform``:
    ``budget`` frames spread evenly) or "retrieve-once" (``ask_retrieve_once``:
    the ``budget`` frames most similar to the question).  The caption cache is
    cleared before every question, so each pays for its own captions.

    Returns accuracy (the answer is the right option), evidence_hit (a frame
    holding the answer was looked at), answer_in_span (the answer's best
    evidence frame lies in the true event), supported (the evidence named an
    option), frames_used (mean), stops (counts), latency_ms (p20 / p50 / p80)
    and the per-question results.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    ask = {"iterative": agent.ask, "uniform": agent.ask_uniform, "retrieve-once": agent.ask_retrieve_once}[strategy]
    questions = video.questions if questions is None else list(questions)
    results, correct, hit, in_span, supported, frames, latency = [], 0, 0, 0, 0, [], []
    stops: Counter = Counter()
    for pq in questions:
        agent.clear_captions()
        res = ask(pq.question, pq.options, budget=budget)
        results.append(res)
        correct += res.answer.option == pq.answer
        hit += bool(set(res.frames) & set(pq.answer_frames))
        top = res.answer.evidence[0] if res.answer.evidence else -1
        in_span += pq.span[0] <= top < pq.span[1]
        supported += res.answer.supported
        frames.append(res.frames_used)
        latency.append(1e3 * res.timings["total"])
        stops[res.stop] += 1
    n = max(1, len(questions))
    p20, p50, p80 = (float(np.percentile(latency, p)) if latency else math.nan for p in (20, 50, 80))
    return {"strategy": strategy, "budget": agent._budget(budget), "questions": len(questions),
            "accuracy": correct / n, "evidence_hit": hit / n, "answer_in_span": in_span / n,
            "supported": supported / n, "frames_used": float(np.mean(frames)) if frames else math.nan,
            "stops": dict(stops), "latency_ms": (p20, p50, p80), "results": results}
