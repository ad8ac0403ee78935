"""Memory chunks and extraction: what a chunk says as entities and relations (the user's model, or the
deterministic co-occurrence default)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, NamedTuple, Protocol, Sequence, runtime_checkable

import torch

from ...checks import check_int, check_real

__all__ = ["MemoryChunk", "Extraction", "ExtractionContext", "Extractor", "CooccurrenceExtractor", "name_key"]


_WORD = re.compile(r"[a-z0-9]+")


def name_key(name: str) -> str:
    """The identity of an entity name: lower-case alphanumeric words joined by spaces.

    ``"Car-Mirror"``, ``"car mirror"`` and ``" CAR  MIRROR "`` are one entity.
    """
    return " ".join(_WORD.findall(name.lower()))


@dataclass
class MemoryChunk:
    """One unit of raw memory: a video event, a dialogue turn or a text.

    ``labels`` are the names its source attached (a video event's frame
    labels, a turn's tags); ``embedding`` is the (E,) normalised text
    embedding of ``text``; ``first_frame`` / ``last_frame`` are the stream
    positions of a video event's frames (-1 otherwise).
    """

    chunk_id: int
    session: int
    t_start: float
    t_end: float
    modality: str
    text: str
    labels: tuple[str, ...] = ()
    speaker: str | None = None
    first_frame: int = -1
    last_frame: int = -1
    embedding: torch.Tensor | None = None

    def view(self, score: float | None = None) -> dict:
        out = {"chunk": self.chunk_id, "session": self.session, "t_start": round(self.t_start, 3),
               "t_end": round(self.t_end, 3), "modality": self.modality, "text": self.text}
        if self.speaker is not None:
            out["speaker"] = self.speaker
        if self.first_frame >= 0:
            out["frames"] = [self.first_frame, self.last_frame]
        if score is not None:
            out["score"] = round(score, 4)
        return out


class Extraction(NamedTuple):
    """Entities and relations of one chunk.

    ``entities``: the names the chunk mentions; ``relations``: (head,
    predicate, tail) name triples.  The chunk is linked to its entities and
    its relations; a head or tail not listed in ``entities`` becomes an entity
    too but is not linked to the chunk (the relation is: a clip that shows
    Alice's car yields ("Alice", "drives", "minivan") without mentioning Alice).
    """

    entities: tuple[str, ...] = ()
    relations: tuple[tuple[str, str, str], ...] = ()


@dataclass
class ExtractionContext:
    """What an extractor may use besides the chunk.

    ``previous`` is the chunk before it in the same session (None at a
    session's start) and ``previous_entities`` the entities extracted from it;
    ``known(name)`` tells whether the graph (or this batch) has an entity of
    that name.
    """

    previous: MemoryChunk | None
    previous_entities: tuple[str, ...]
    known: Callable[[str], bool]


@runtime_checkable
class Extractor(Protocol):
    """Turns a chunk into entities and relations (a language model's job; see :class:`CooccurrenceExtractor`)."""

    def extract(self, chunk: MemoryChunk, context: ExtractionContext) -> Extraction: ...


class CooccurrenceExtractor:
    """The deterministic default extractor -- labels and co-occurrence in time, *not a model*.

    Entities: the chunk's labels, its speaker, and (``match_known``) names of
    entities already known that the text spells out as whole words (up to
    ``max_words`` words).  Relations: ``(a, "appears with", b)`` for entity
    pairs of the chunk (a < b by name), and ``(a, "followed by", b)`` from the
    previous chunk's entities to this chunk's new ones when the chunks are at
    most ``gap`` seconds apart; at most ``max_pairs`` of each.

    ``statements`` (default on) keeps what a speaker said about each other
    entity of the turn, the way an open information extractor keeps the
    clause as the predicate: ``(speaker, "said " + <the turn's words>,
    entity)``, e.g. ``"Alice: Yara is my sister."`` -> ``("Alice", "said alice
    yara is my sister", "Yara")``; and for a turn followed within ``gap``
    seconds by a chunk without a speaker (a clip), ``(speaker, "said " +
    <the turn's words> + " before", entity)`` for that chunk's entities
    (``"Alice: my new car is parked outside."`` then a clip of a minivan ->
    ``("Alice", "said alice my new car is parked outside before",
    "minivan")``).  The words are the turn's own (lower case, as the memory
    shows it, speaker included), no type is inferred; the relation's text,
    and so its embedding, carries what was said, which a question's
    embedding can match.  A chunk with statements is linked through them
    only: no entities of its own (a person's node would otherwise bring
    whichever turns mention them last), no "appears with" or "followed by"
    relations.  A turn that names no entity but its speaker ("Alice: I am
    so tired.") extracts its speaker and no relation; a clip that no turn
    just before describes gets the co-occurrence entities and relations.  At
    most ``max_pairs`` statements per chunk; ``statements=False`` is the
    plain co-occurrence extractor.  A user's model extracting typed facts ("Alice works at the
    bakery") goes in its place.
    """

    name = "co-occurrence (deterministic default, not a model)"

    def __init__(self, *, gap: float = 10.0, max_pairs: int = 16, match_known: bool = True, max_words: int = 4,
                 statements: bool = True):
        self.gap = check_real(gap, "gap", 0.0)
        self.statements = bool(statements)
        self.max_pairs = check_int(max_pairs, "max_pairs", 0)
        self.match_known = bool(match_known)
        self.max_words = check_int(max_words, "max_words", 1)

    def extract(self, chunk: MemoryChunk, context: ExtractionContext) -> Extraction:
        names: dict[str, str] = {}
        for name in ((chunk.speaker,) if chunk.speaker else ()) + tuple(chunk.labels):
            names.setdefault(name_key(name), name)
        if self.match_known:
            words = _WORD.findall(chunk.text.lower())
            for n in range(self.max_words, 0, -1):
                for i in range(len(words) - n + 1):
                    gram = " ".join(words[i:i + n])
                    if gram not in names and context.known(gram):
                        names[gram] = gram
        names.pop("", None)
        keys = sorted(names)
        with_pairs = [(names[a], "appears with", names[b]) for i, a in enumerate(keys) for b in keys[i + 1:]]
        followed = []
        prev = context.previous
        if prev is not None and chunk.t_start - prev.t_end <= self.gap:
            before = {name_key(p): p for p in context.previous_entities}
            followed = [(before[a], "followed by", names[b]) for a in sorted(before) for b in keys
                        if a != b and a not in names]
        if not self.statements:
            return Extraction(tuple(names[k] for k in keys), tuple(with_pairs[: self.max_pairs] +
                                                                  followed[: self.max_pairs]))
        speaker = name_key(chunk.speaker) if chunk.speaker else ""
        said = [(chunk.speaker, _said(chunk), names[k]) for k in keys if k != speaker] if speaker else []
        if prev is not None and prev.speaker and not chunk.speaker and chunk.t_start - prev.t_end <= self.gap:
            said += [(prev.speaker, _said(prev) + " before", names[k]) for k in keys
                     if k != name_key(prev.speaker)]
        if said:  # linked through what was said only
            return Extraction((), tuple(said[: self.max_pairs]))
        if speaker and keys == [speaker]:  # a turn that names nothing else: its speaker, no relation
            return Extraction((chunk.speaker,), ())
        return Extraction(tuple(names[k] for k in keys), tuple(with_pairs[: self.max_pairs] +
                                                              followed[: self.max_pairs]))


def _said(chunk: MemoryChunk) -> str:
    """A statement's predicate: "said" and the words of the turn as the memory shows it (``"speaker: text"``),
    lower case."""
    return " ".join(["said"] + _WORD.findall(chunk.text.lower()))


def _call_extractor(extractor, chunk: MemoryChunk, context: ExtractionContext) -> Extraction:
    out = extractor.extract(chunk, context) if hasattr(extractor, "extract") else extractor(chunk, context)
    if isinstance(out, Extraction):
        entities, relations = out
    elif isinstance(out, (tuple, list)) and len(out) == 2:
        entities, relations = out
    else:
        raise ValueError(f"the extractor must return an Extraction (entities, relations), got {type(out).__name__}")
    entities = tuple(entities)
    relations = tuple(tuple(r) for r in relations)
    if not all(isinstance(e, str) and name_key(e) for e in entities):
        raise ValueError(f"extractor entities must be names with a letter or digit, got {entities!r}")
    for r in relations:
        if len(r) != 3 or not all(isinstance(x, str) for x in r) or not name_key(r[0]) or not name_key(r[2]) \
                or not r[1].strip():
            raise ValueError(f"extractor relations must be (head, predicate, tail) strings, got {r!r}")
    return Extraction(entities, relations)


_CHUNK_SCALARS = ("chunk_id", "session", "t_start", "t_end", "modality", "text", "speaker", "first_frame",
                  "last_frame")


def _chunks_state(chunks: Sequence[MemoryChunk]) -> dict:
    state = {name: [getattr(c, name) for c in chunks] for name in _CHUNK_SCALARS}
    state["labels"] = [list(c.labels) for c in chunks]
    state["embedding"] = torch.stack([c.embedding for c in chunks]) if chunks else None
    return state


def _chunks_from_state(state: dict) -> list[MemoryChunk]:
    return [MemoryChunk(**{name: state[name][i] for name in _CHUNK_SCALARS}, labels=tuple(state["labels"][i]),
                        embedding=state["embedding"][i].clone()) for i in range(len(state["chunk_id"]))]
