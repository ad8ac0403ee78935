"""Multi-granular distillation: segment and session summaries of turns (extractive by default, or a
model's)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence, runtime_checkable

import torch
import torch.nn.functional as F

__all__ = ["Distillate", "Distiller", "ExtractiveDistiller", "ModelDistiller", "informative_tokens"]


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
