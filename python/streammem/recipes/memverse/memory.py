"""MemVerse as a recipe: a short-term window and a long-term multimodal knowledge graph.

MemVerse (multimodal memory for lifelong agents) keeps three memories; this
recipe builds two of them on the streammem kernels:

* **short-term memory** -- a sliding window of the newest ``window`` chunks of
  the current session, handed whole to every question (the recent context);
* **long-term memory** (:class:`LongTermGraph`) -- a multimodal knowledge
  graph.  Chunks leaving the window are consolidated in batches: an
  *extractor* turns each chunk into entities and relations (head, predicate,
  tail); every entity and every distinct relation is a node with a text
  embedding; a relation node is joined to its head and to its tail (so one hop
  from a relation reaches both arguments and two hops from an entity reach the
  entities it is related to); every node keeps links to the chunks it came
  from.  Adjacency and node -> chunk links are CSR
  (:class:`streammem_kernels.CSRGraph`);
* **parametric memory** -- out of scope.  MemVerse periodically fine-tunes a
  small model on the graph (distilling it into weights); this package provides
  the memory and its retrieval, not training.

A chunk is a video event (motion gate -> frame encoder -> ``EventSegmenter``,
captioned by the ``Captioner``; its labels are its frames' most frequent
labels), a dialogue turn, or any text, each with its text embedding.

**Extraction is the user's model's job.**  Pass any :class:`Extractor`
(``extract(chunk, context) -> Extraction``, e.g. a prompted language model).
The default, :class:`CooccurrenceExtractor`, is deterministic and *not a
model*: its entities are the chunk's labels (frame labels, a turn's speaker
and tags) and names already in the graph that the text spells out; its
relations are co-occurrence in time -- ``appears with`` inside a chunk,
``followed by`` from one chunk's entities to the next chunk's.  It never reads
what the text says.

**Retrieval** (:meth:`LongTermGraph.search`, one batched call per set of
questions):

1. seeds -- cosine top-k over all node embeddings, entities and relations
   alike (``cosine_topk``), and
2. their k-hop neighbourhood (``khop_neighbourhood``; 1 and 2 are
   ``graph_retrieve``), capped per node (``max_fanout``), per hop and per query;
3. ranking -- every listed node ``v``, reached from seed ``s``, scores
   ``cos(q, s) * max(0, cos(q, v))`` (a seed ``cos(q, s)^2``): a node counts
   as much as it matches the question and as the seed whose neighbourhood it
   lies in, so neighbours unrelated to the question score ~0.  The seeds then
   take turns (``ranking="round-robin"``): every seed's best node, then every
   seed's second best, and so on, seeds in cosine order.  Without the turns
   (``ranking="score"``) the entity the question names takes every place --
   for "where does Alice's sister work?" all of Alice's own facts match the
   question better than the sister's job, which only the relation seed
   "Alice has a sister named Yara" leads to (its second turn: two hops on);
4. chunks -- ``neighbourhood_chunks`` over the nodes in that order: the first
   ``chunks`` distinct chunks, at most ``chunks_per_node`` (the newest) from
   each node.

The flat baseline (:meth:`LongTermGraph.search_flat`) is cosine top-k over the
chunk embeddings; ``bench/RESULTS.md`` compares both on a planted-fact
multi-session memory (``streammem.memverse_synthetic``).

**CSR growth.**  Rows list their entries newest first (under ``max_fanout`` a
hub entity follows its newest relations; ``chunks_per_node`` keeps an
entity's newest chunks).  A consolidation batch of ``b`` new entries is merged
into the existing CSR by :func:`extend_csr`: old entries move by the number of
new entries in rows up to theirs, new ones are written in front of each row
-- O(E + b log b), no re-sort of the E old entries (``CSRGraph.from_edges``
would sort everything again; both are measured in RESULTS.md).  Evictions
filter entries in place of order (:func:`compact_csr`), also without a sort.

**Bounded growth** (``budget``): a graph-aware equivalent of
``BoundedMemory``, built on its utility rule (``streammem.bounded.utility``:
u = alpha log(f + 1) + beta exp(-dt / tau), f = times retrieved, dt = stream
time since last retrieved, mentioned or created).  ``BoundedMemory`` itself
manages a ``LongTermMemory`` tree (sibling leaves, k-means centres, parents)
and cannot hold a graph.  When the long-term cost (words of every chunk text
and node text) exceeds the budget, chunks and relations are removed by least
u / cost first (older first among equals) down to ``low_water`` x budget;
entities left with no relation and no chunk go with them (as emptied parents
do in the tree).  A relation outlives the chunks it came from (the fact stays
when the raw memory goes).  ``BoundedMemory``'s merge and novelty steps have
graph counterparts built in: an entity is one node per name, a relation one
node per (head, predicate, tail).

>>> mem = MemVerse(sm.load_text_encoder(), sm.load_frame_encoder())
>>> mem.push_frames(timestamps, frames)          # video -> event chunks
>>> mem.add_turn(12.0, "Ana", "The taxi is waiting at the corner.")
>>> mem.end_session()                            # window -> long-term graph
>>> ctx = mem.ask("Where was the taxi waiting?")  # window + graph chunks, facts, seeds
"""
from __future__ import annotations

import json
import math
import re
import time
from collections import Counter, deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, NamedTuple, Protocol, Sequence, runtime_checkable

import numpy as np
import torch
import torch.nn.functional as F

from ...components.answers import extractive_answer
from ...components.bounded import EvictionReport, utility
from ...checkpoint import atomic_write
from ...checks import check_real
from ...config import PRESETS, SegmenterConfig
from ...models.encoders import encoder_spec, encoders_from_specs
from ...components.gate import MotionGate
from ...components.knowledge import EventSegmenter
from ...components.memory import FrameRecord, LabelCaptioner, records_from_state, records_state

__all__ = [
    "MemVerse",
    "MemVerseConfig",
    "MemVerseContext",
    "MemoryChunk",
    "Extraction",
    "ExtractionContext",
    "Extractor",
    "CooccurrenceExtractor",
    "LongTermGraph",
    "GraphHits",
    "GraphEvictionReport",
    "extend_csr",
    "compact_csr",
    "name_key",
    "interleave",
]

ENTITY, RELATION = 0, 1
RANKINGS = ("round-robin", "score")
MODES = ("graph", "hybrid", "flat")
_WORD = re.compile(r"[a-z0-9]+")
_FORMAT = "streammem.MemVerse"
_VERSION = 1


def name_key(name: str) -> str:
    """The identity of an entity name: lower-case alphanumeric words joined by spaces.

    ``"Car-Mirror"``, ``"car mirror"`` and ``" CAR  MIRROR "`` are one entity.
    """
    return " ".join(_WORD.findall(name.lower()))


# --------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------
def check_int(value, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class MemVerseConfig:
    """Every parameter of a :class:`MemVerse` memory.

    Parameters
    ----------
    window : int
        Short-term memory: the newest chunks of the session handed to every question.
    consolidate_every : int
        Chunks that left the window are consolidated into the graph in batches
        of this many (a question or ``end_session`` consolidates the rest first,
        so no chunk is ever out of reach).
    seeds : int
        k of the cosine top-k over node embeddings.
    hops : int
        Neighbourhood depth around the seeds.
    max_fanout, max_frontier : int or None
        Caps of the expansion (entries followed per node; nodes per hop).
    capacity : int
        Nodes listed per question (>= ``seeds``).
    min_score : float or None
        Seeds with a lower cosine are dropped.
    chunks : int
        Long-term chunks returned per question (K).
    chunks_per_node : int or None
        Chunks one node contributes at most (its newest).
    ranking : {"round-robin", "score"}
        Order of the neighbourhood's nodes: by score, with the seeds taking
        turns ("round-robin"), or by score alone (see the module docstring).
    mode : {"graph", "hybrid", "flat"}
        Long-term chunks of :meth:`MemVerse.ask`: the graph's, the flat
        baseline's, or both interleaved (flat first, duplicates skipped).
    facts : int
        Relations reported per question.
    budget : int or None
        Word budget of the long-term memory (None: unbounded).
    alpha, beta, tau, low_water
        Utility rule and hysteresis of the budget: ``BoundedMemory``'s alpha,
        beta and low_water; tau (seconds of stream time) 600 rather than its 60,
        as a multi-session memory spans hours.
    preset : str
        Motion-gate threshold of video input (StreamChat preset name).
    motion_threshold : float or None
        Overrides the preset's threshold (0 keeps every frame).
    motion_size : int or None
        Working resolution of the motion gate.
    segmenter : SegmenterConfig
        Video events (one chunk per event).
    labels_per_chunk : int
        A video chunk's labels: its frames' most frequent labels.
    backend : str
        Kernel backend of every op.
    """

    window: int = 8
    consolidate_every: int = 4
    seeds: int = 4
    hops: int = 2
    max_fanout: int | None = 16
    max_frontier: int | None = None
    capacity: int = 512
    min_score: float | None = None
    chunks: int = 8
    chunks_per_node: int | None = 2
    ranking: str = "round-robin"
    mode: str = "graph"
    facts: int = 8
    budget: int | None = None
    alpha: float = 0.6
    beta: float = 0.4
    tau: float = 600.0
    low_water: float = 0.8
    preset: str = "base"
    motion_threshold: float | None = None
    motion_size: int | None = 224
    segmenter: SegmenterConfig = field(default_factory=SegmenterConfig)
    labels_per_chunk: int = 5
    backend: str = "auto"

    def __post_init__(self):
        for name, low in (("window", 1), ("consolidate_every", 1), ("seeds", 1), ("hops", 0), ("capacity", 1),
                          ("chunks", 1), ("facts", 0), ("labels_per_chunk", 1)):
            object.__setattr__(self, name, check_int(getattr(self, name), name, low))
        for name in ("max_fanout", "max_frontier", "chunks_per_node", "budget", "motion_size"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, check_int(getattr(self, name), name, 1))
        if self.capacity < self.seeds:
            raise ValueError(f"capacity must be >= seeds ({self.seeds}), got {self.capacity}")
        if self.min_score is not None:
            object.__setattr__(self, "min_score", check_real(self.min_score, "min_score", -1.0, 1.0))
        object.__setattr__(self, "alpha", check_real(self.alpha, "alpha"))
        object.__setattr__(self, "beta", check_real(self.beta, "beta"))
        object.__setattr__(self, "tau", check_real(self.tau, "tau", 0.0, open_low=True))
        object.__setattr__(self, "low_water", check_real(self.low_water, "low_water", 0.0, 1.0, open_low=True))
        if self.ranking not in RANKINGS:
            raise ValueError(f"ranking must be one of {RANKINGS}, got {self.ranking!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.preset not in PRESETS:
            raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {self.preset!r}")
        if self.motion_threshold is not None:
            object.__setattr__(self, "motion_threshold",
                               check_real(self.motion_threshold, "motion_threshold", 0.0, 1.0))
        if isinstance(self.segmenter, dict):
            object.__setattr__(self, "segmenter", SegmenterConfig(**self.segmenter))
        if not isinstance(self.segmenter, SegmenterConfig):
            raise ValueError(f"segmenter must be a SegmenterConfig, got {self.segmenter!r}")
        if not isinstance(self.backend, str):
            raise ValueError(f"backend must be a string, got {self.backend!r}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "MemVerseConfig":
        if not isinstance(data, dict):
            raise ValueError(f"data must be a dict from MemVerseConfig.to_dict(), got {type(data).__name__}")
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"data has unknown MemVerseConfig fields {unknown}")
        return cls(**data)


# --------------------------------------------------------------------------
# Chunks and extraction
# --------------------------------------------------------------------------
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
    most ``gap`` seconds apart; at most ``max_pairs`` of each.  It does not
    read what the text says: a user's model extracting typed facts
    ("Alice works at the bakery") goes in its place.
    """

    name = "co-occurrence (deterministic default, not a model)"

    def __init__(self, *, gap: float = 10.0, max_pairs: int = 16, match_known: bool = True, max_words: int = 4):
        self.gap = check_real(gap, "gap", 0.0)
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
        relations = with_pairs[: self.max_pairs] + followed[: self.max_pairs]
        return Extraction(tuple(names[k] for k in keys), tuple(relations))


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


# --------------------------------------------------------------------------
# CSR growth without re-sorting
# --------------------------------------------------------------------------
def extend_csr(row_ptr: torch.Tensor, col_idx: torch.Tensor, num_rows: int, src: torch.Tensor,
               dst: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Add entries ``src[i] -> dst[i]`` to a CSR, in front of each row's old entries, newest first.

    Parameters
    ----------
    row_ptr : (R+1,) int64
    col_idx : (E,) int64
    num_rows : int >= R
        Rows of the result (rows ``R..num_rows-1`` are new).
    src, dst : (b,) int64
        New entries; a later entry counts as newer.

    Returns
    -------
    (row_ptr (num_rows+1,), col_idx (E+b,)): row ``u`` lists its new entries by
    descending position in ``src``, then its old entries in their old order.
    Equal to ``CSRGraph.from_edges`` over all entries with weight = insertion
    order (tested), in O(E + b log b) instead of a sort of E + b entries.
    """
    old_rows = row_ptr.numel() - 1
    if num_rows < old_rows:
        raise ValueError(f"num_rows must be >= the CSR's {old_rows} rows, got {num_rows}")
    device = row_ptr.device
    degree_old = torch.zeros(num_rows, dtype=torch.int64, device=device)
    degree_old[:old_rows] = row_ptr[1:] - row_ptr[:-1]
    added = torch.bincount(src, minlength=num_rows)
    new_ptr = torch.zeros(num_rows + 1, dtype=torch.int64, device=device)
    torch.cumsum(degree_old + added, 0, out=new_ptr[1:])
    out = torch.empty(col_idx.numel() + src.numel(), dtype=torch.int64, device=device)
    # Old entry i of row r lands at new_ptr[r] + added[r] + (i - row_ptr[r]) = i + (added up to and including r).
    added_through = torch.cumsum(added, 0)
    if col_idx.numel():
        row_of = torch.repeat_interleave(torch.arange(old_rows, device=device), degree_old[:old_rows])
        out[torch.arange(col_idx.numel(), device=device) + added_through[row_of]] = col_idx
    if src.numel():
        newest_first = torch.arange(src.numel() - 1, -1, -1, device=device)
        order = newest_first[torch.argsort(src[newest_first], stable=True)]
        rows = src[order]
        rank = torch.arange(src.numel(), device=device) - (added_through - added)[rows]
        out[new_ptr[rows] + rank] = dst[order]
    return new_ptr, out


def compact_csr(row_ptr: torch.Tensor, col_idx: torch.Tensor, row_map: torch.Tensor,
                col_map: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop removed rows and entries, renumber the rest, keep every row's order.

    ``row_map (R,)`` / ``col_map (num_cols,)`` give each row's / target's new id,
    or -1 when removed; new row ids must be increasing.  Returns the new
    ``(row_ptr, col_idx)``.
    """
    num_rows = int((row_map >= 0).sum())
    degree = row_ptr[1:] - row_ptr[:-1]
    row_of = torch.repeat_interleave(torch.arange(row_map.numel(), device=row_ptr.device), degree)
    keep = (row_map[row_of] >= 0) & (col_map[col_idx] >= 0)
    new_rows = row_map[row_of[keep]]
    new_ptr = torch.zeros(num_rows + 1, dtype=torch.int64, device=row_ptr.device)
    torch.cumsum(torch.bincount(new_rows, minlength=num_rows), 0, out=new_ptr[1:])
    return new_ptr, col_map[col_idx[keep]]


class _Column:
    """Append-only tensor rows with amortised doubling (and compaction by a mask)."""

    def __init__(self, dtype: torch.dtype, width: int | None = None):
        self._data = torch.zeros((16,) if width is None else (16, width), dtype=dtype)
        self.n = 0

    def extend(self, values: torch.Tensor) -> None:
        need = self.n + values.shape[0]
        if need > self._data.shape[0]:
            grown = torch.zeros((max(need, 2 * self._data.shape[0]),) + tuple(self._data.shape[1:]),
                                dtype=self._data.dtype)
            grown[: self.n] = self._data[: self.n]
            self._data = grown
        self._data[self.n:need] = values
        self.n = need

    @property
    def values(self) -> torch.Tensor:
        return self._data[: self.n]

    def keep(self, mask: torch.Tensor) -> None:
        self._data = self.values[mask]  # a new tensor of exactly the kept rows; the next extend regrows it
        self.n = self._data.shape[0]

    def load(self, values: torch.Tensor) -> None:
        self.n = 0
        self.extend(values)


# --------------------------------------------------------------------------
# The long-term graph
# --------------------------------------------------------------------------
class GraphHits(NamedTuple):
    """Result of :meth:`LongTermGraph.search` for Q questions (tensors, ``-1`` / ``-inf`` padded).

    Attributes
    ----------
    seeds, seed_scores : (Q, k)
        Seed nodes by cosine, best first.
    nodes, node_scores, node_hops : (Q, C)
        The neighbourhood's nodes in rank order (see the module docstring), their
        scores and breadth-first distance from the seeds; C is the longest
        list of the batch (at most ``capacity``).
    chunks, chunk_scores, chunk_nodes : (Q, K)
        Chunk rows (``LongTermGraph.chunks[row]``) in rank order, the score of
        the node that brought each, and that node.
    truncated : (Q,) bool
        The expansion filled ``capacity`` (a larger one would list more nodes).
    timings : dict
        Seconds of the top-k + expansion, the ranking and the chunk gather.
    """

    seeds: torch.Tensor
    seed_scores: torch.Tensor
    nodes: torch.Tensor
    node_scores: torch.Tensor
    node_hops: torch.Tensor
    chunks: torch.Tensor
    chunk_scores: torch.Tensor
    chunk_nodes: torch.Tensor
    truncated: torch.Tensor
    timings: dict


@dataclass
class GraphEvictionReport(EvictionReport):
    """One budget round of the graph (costs in words): chunks, relations and orphaned entities removed."""

    chunks: int = 0
    relations: int = 0
    entities: int = 0


class LongTermGraph:
    """Entities, relations and chunks with embeddings; adjacency and chunk links as CSR.

    Parameters
    ----------
    dim : int
        Embedding width (the text encoder's).
    backend : str
        Kernel backend of the searches.

    Node ids are dense (``0..num_nodes-1``, entities and relations
    interleaved in creation order) and change only when an eviction compacts
    them; chunk rows likewise (``chunks[row].chunk_id`` is the stable id).
    Change the graph through :meth:`consolidate` and :meth:`evict` only: each
    keeps tables, embeddings and both CSRs equal in the same call.
    """

    def __init__(self, dim: int, *, backend: str = "auto"):
        self.dim = check_int(dim, "dim", 1)
        self.backend = backend
        self.texts: list[str] = []  # entity name, or "head predicate tail"
        self.predicates: list[str] = []  # "" for entities
        self._emb = _Column(torch.float32, self.dim)
        self._kind = _Column(torch.int8)
        self._head = _Column(torch.int64)
        self._tail = _Column(torch.int64)
        self._access = _Column(torch.int64)
        self._last = _Column(torch.float64)
        self._created = _Column(torch.float64)
        self._cost = _Column(torch.int64)
        self._entity_ids: dict[str, int] = {}
        self._relation_ids: dict[tuple[int, str, int], int] = {}
        self.chunks: list[MemoryChunk] = []
        self._chunk_emb = _Column(torch.float32, self.dim)
        self._chunk_access = _Column(torch.int64)
        self._chunk_last = _Column(torch.float64)
        self._chunk_cost = _Column(torch.int64)
        self._adj = (torch.zeros(1, dtype=torch.int64), torch.zeros(0, dtype=torch.int64))
        self._map = (torch.zeros(1, dtype=torch.int64), torch.zeros(0, dtype=torch.int64))
        self.graph = None  # CSRGraph over the nodes
        self.chunk_map = None  # CSRGraph node -> chunk rows
        self.timings: Counter = Counter()

    # ---- sizes and lookups ---------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return len(self.texts)

    @property
    def num_entities(self) -> int:
        return len(self._entity_ids)

    @property
    def num_relations(self) -> int:
        return len(self._relation_ids)

    @property
    def num_chunks(self) -> int:
        return len(self.chunks)

    @property
    def num_edges(self) -> int:
        return int(self._adj[1].numel())

    @property
    def embeddings(self) -> torch.Tensor:
        """(num_nodes, dim) normalised node embeddings (a view: do not modify)."""
        return self._emb.values

    @property
    def chunk_embeddings(self) -> torch.Tensor:
        """(num_chunks, dim) normalised chunk embeddings (a view: do not modify)."""
        return self._chunk_emb.values

    @property
    def kinds(self) -> torch.Tensor:
        """(num_nodes,) int8: 0 entity, 1 relation."""
        return self._kind.values

    def entity_id(self, name: str) -> int | None:
        return self._entity_ids.get(name_key(name))

    def has_entity(self, name: str) -> bool:
        return name_key(name) in self._entity_ids

    def relation_id(self, head: str, predicate: str, tail: str) -> int | None:
        h, t = self.entity_id(head), self.entity_id(tail)
        if h is None or t is None:
            return None
        return self._relation_ids.get((h, _predicate_key(predicate), t))

    def node_chunks(self, node: int) -> list[int]:
        """Chunk rows of a node, newest first."""
        ptr, col = self._map
        return col[ptr[node]:ptr[node + 1]].tolist()

    def neighbours(self, node: int) -> list[int]:
        """Adjacent nodes, newest first (a relation: head, then tail)."""
        ptr, col = self._adj
        return col[ptr[node]:ptr[node + 1]].tolist()

    def cost(self) -> int:
        """Words of every node text and chunk text (what the budget counts)."""
        return int(self._cost.values.sum()) + int(self._chunk_cost.values.sum())

    # ---- growth --------------------------------------------------------------
    def consolidate(self, chunks: Sequence[MemoryChunk], extractions: Sequence[Extraction],
                    embed: Callable[[list[str]], torch.Tensor], now: float) -> dict:
        """Write chunks and their extractions into the graph (one CSR extension for the batch).

        New entities and relations are embedded with one ``embed(texts)`` call
        ((n, dim) float); nodes mentioned again get their recency refreshed.
        Returns counts of what was added.
        """
        if len(chunks) != len(extractions):
            raise ValueError(f"chunks and extractions must have the same length, got {len(chunks)} and "
                             f"{len(extractions)}")
        for c in chunks:
            if not isinstance(c, MemoryChunk) or c.embedding is None or tuple(c.embedding.shape) != (self.dim,):
                raise ValueError(f"chunks must be MemoryChunks carrying a ({self.dim},) embedding, got {c!r:.80}")
        t0 = time.perf_counter()
        embed_before = self.timings["embed"]
        first_node, first_row = self.num_nodes, self.num_chunks
        new_texts, new_kind, new_head, new_tail, new_pred = [], [], [], [], []
        new_entities: dict[str, int] = {}
        new_relations: dict[tuple[int, str, int], int] = {}
        edges: list[tuple[int, int]] = []
        links: list[tuple[int, int]] = []
        touched: list[int] = []

        def entity(name: str) -> int:
            key = name_key(name)
            node = self._entity_ids.get(key, new_entities.get(key))
            if node is None:
                node = new_entities[key] = first_node + len(new_texts)
                new_texts.append(" ".join(name.split()))
                new_kind.append(ENTITY)
                new_head.append(-1)
                new_tail.append(-1)
                new_pred.append("")
            return node

        for offset, (chunk, ext) in enumerate(zip(chunks, extractions)):
            row = first_row + offset
            nodes = [entity(e) for e in ext.entities]
            for head, predicate, tail in ext.relations:
                h, t = entity(head), entity(tail)
                key = (h, _predicate_key(predicate), t)
                rel = self._relation_ids.get(key, new_relations.get(key))
                if rel is None:
                    rel = new_relations[key] = first_node + len(new_texts)
                    new_texts.append(f"{self._text(h, new_texts, first_node)} {key[1]} "
                                     f"{self._text(t, new_texts, first_node)}")
                    new_kind.append(RELATION)
                    new_head.append(h)
                    new_tail.append(t)
                    new_pred.append(key[1])
                    # extend_csr lists each row newest first, so a relation's row reads head, then tail.
                    edges += [(h, rel), (t, rel), (rel, t), (rel, h)] if t != h else [(h, rel), (rel, h)]
                nodes.append(rel)
                touched += [h, t]
            for node in dict.fromkeys(nodes):  # what the chunk mentions: its entities and its relations
                links.append((node, row))
            touched += nodes
        # Embeddings first: a failing encoder leaves the graph as it was.
        self._append_nodes(new_texts, new_kind, new_head, new_tail, new_pred, embed, now)
        self._entity_ids.update(new_entities)
        self._relation_ids.update(new_relations)
        self._append_chunks(chunks)
        t1 = time.perf_counter()
        self._extend(edges, links)
        t2 = time.perf_counter()
        if touched:
            ids = torch.tensor(sorted(set(touched)), dtype=torch.int64)
            last = self._last.values
            last[ids] = torch.clamp(last[ids], min=float(now))
        self.timings["consolidate_tables"] += t1 - t0 - (self.timings["embed"] - embed_before)
        self.timings["consolidate_csr"] += t2 - t1
        return {"chunks": len(chunks), "entities": new_kind.count(ENTITY), "relations": new_kind.count(RELATION),
                "edges": len(edges), "links": len(links)}

    def _text(self, node: int, new_texts: list[str], first_node: int) -> str:
        return self.texts[node] if node < first_node else new_texts[node - first_node]

    def _append_nodes(self, texts, kinds, heads, tails, predicates, embed, now: float) -> None:
        if not texts:
            return
        t0 = time.perf_counter()
        emb = torch.as_tensor(embed(list(texts)))
        self.timings["embed"] += time.perf_counter() - t0
        if emb.shape != (len(texts), self.dim) or not emb.is_floating_point():
            raise ValueError(f"embed must return a float ({len(texts)}, {self.dim}) tensor, got "
                             f"{tuple(emb.shape)} {emb.dtype}")
        if not bool(torch.isfinite(emb).all()):
            raise ValueError("embed returned non-finite values")
        self.texts += texts
        self.predicates += predicates
        n = len(texts)
        self._emb.extend(F.normalize(emb.float(), dim=1))
        self._kind.extend(torch.tensor(kinds, dtype=torch.int8))
        self._head.extend(torch.tensor(heads, dtype=torch.int64))
        self._tail.extend(torch.tensor(tails, dtype=torch.int64))
        self._access.extend(torch.zeros(n, dtype=torch.int64))
        self._last.extend(torch.full((n,), float(now), dtype=torch.float64))
        self._created.extend(torch.full((n,), float(now), dtype=torch.float64))
        self._cost.extend(torch.tensor([max(1, len(t.split())) for t in texts], dtype=torch.int64))

    def _append_chunks(self, chunks: Sequence[MemoryChunk]) -> None:
        if not chunks:
            return
        self.chunks += list(chunks)
        self._chunk_emb.extend(F.normalize(torch.stack([c.embedding.float() for c in chunks]), dim=1))
        self._chunk_access.extend(torch.zeros(len(chunks), dtype=torch.int64))
        self._chunk_last.extend(torch.tensor([c.t_end for c in chunks], dtype=torch.float64))
        self._chunk_cost.extend(torch.tensor([max(1, len(c.text.split())) for c in chunks], dtype=torch.int64))

    def _extend(self, edges: list[tuple[int, int]], links: list[tuple[int, int]]) -> None:
        def pairs(items):
            t = torch.tensor(items, dtype=torch.int64).reshape(-1, 2)
            return t[:, 0].contiguous(), t[:, 1].contiguous()

        self._adj = extend_csr(*self._adj, self.num_nodes, *pairs(edges))
        self._map = extend_csr(*self._map, self.num_nodes, *pairs(links))
        self._commit()

    def _commit(self) -> None:
        from streammem_kernels import CSRGraph

        self.graph = CSRGraph(*self._adj)
        self.chunk_map = CSRGraph(*self._map, num_cols=self.num_chunks)

    # ---- retrieval -------------------------------------------------------------
    def search(self, queries: torch.Tensor, *, seeds: int = 4, hops: int = 2, capacity: int = 512,
               max_fanout: int | None = 16, max_frontier: int | None = None, min_score: float | None = None,
               chunks: int = 8, chunks_per_node: int | None = 2, ranking: str = "round-robin") -> GraphHits:
        """Seeds, neighbourhood, ranking and chunks for Q questions (see the module docstring).

        Parameters
        ----------
        queries : (Q, dim) float tensor
            Question embeddings (normalised here).
        seeds, hops, capacity, max_fanout, max_frontier, min_score, chunks, chunks_per_node, ranking
            As in :class:`MemVerseConfig`.

        Returns
        -------
        GraphHits
        """
        from streammem_kernels import graph_retrieve, neighbourhood_chunks

        q = _check_queries(queries, self.dim)
        if ranking not in RANKINGS:
            raise ValueError(f"ranking must be one of {RANKINGS}, got {ranking!r}")
        num_q = q.shape[0]
        if self.num_nodes == 0:
            return _empty_hits(num_q, seeds, capacity, chunks)
        t0 = time.perf_counter()
        emb = self.embeddings
        res = graph_retrieve(q, emb, self.graph, k=min(seeds, self.num_nodes), hops=hops, capacity=capacity,
                             max_fanout=max_fanout, max_frontier=max_frontier, min_score=min_score,
                             backend=self.backend)
        t1 = time.perf_counter()
        near = res.neighbourhood
        # Entries are packed at the front: work on the widest list, not the capacity (small tensors also
        # stay under torch's parallel grain, so no thread pool waits on a loaded machine).
        width = max(1, int(near.count.max()))
        near = near._replace(nodes=near.nodes[:, :width], seed=near.seed[:, :width], hop=near.hop[:, :width])
        valid = near.nodes >= 0
        # Rank and score of the seed each entry was reached from (entries carry the seed's id).
        from_seed = (near.seed[:, :, None] == res.seeds[:, None, :]) & valid[:, :, None]
        seed_score = torch.where(from_seed, res.seed_scores[:, None, :], -math.inf).amax(-1)
        match = _row_cosines(emb, near.nodes.clamp_min(0), q)
        score = seed_score.clamp_min(0.0) * match.clamp_min(0.0)
        score = torch.where(valid, score, -math.inf)
        order = torch.argsort(score, dim=1, descending=True, stable=True)
        if ranking == "round-robin":
            order = _round_robin(order, from_seed.int().argmax(-1), valid, res.seeds.shape[1])
        nodes = near.nodes.gather(1, order)
        node_scores = score.gather(1, order)
        node_hops = near.hop.gather(1, order)
        t2 = time.perf_counter()
        if self.num_chunks:
            got = neighbourhood_chunks(nodes, self.chunk_map, capacity=chunks, max_per_node=chunks_per_node,
                                       backend=self.backend)
            chunk_rows, chunk_nodes = got.chunks, got.node
            at = (chunk_nodes[:, :, None] == nodes[:, None, :]) & (chunk_nodes[:, :, None] >= 0)
            chunk_scores = torch.where(at, node_scores[:, None, :], -math.inf).amax(-1)
        else:
            chunk_rows = chunk_nodes = torch.full((num_q, chunks), -1, dtype=torch.int64)
            chunk_scores = torch.full((num_q, chunks), -math.inf)
        t3 = time.perf_counter()
        timings = {"seeds_and_expansion": t1 - t0, "rank": t2 - t1, "chunks": t3 - t2}
        return GraphHits(res.seeds, res.seed_scores, nodes, node_scores.float(), node_hops, chunk_rows,
                         chunk_scores.float(), chunk_nodes, near.truncated, timings)

    def search_flat(self, queries: torch.Tensor, chunks: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
        """The baseline: cosine top-k over chunk embeddings; (rows, scores) (Q, chunks), -1 / -inf padded."""
        from streammem_kernels import cosine_topk

        q = _check_queries(queries, self.dim)
        if self.num_chunks == 0:
            return (torch.full((q.shape[0], chunks), -1, dtype=torch.int64),
                    torch.full((q.shape[0], chunks), -math.inf))
        res = cosine_topk(q, self.chunk_embeddings, chunks, backend=self.backend)
        return res.ids, res.scores

    def touch(self, nodes: torch.Tensor, chunk_rows: torch.Tensor, now: float) -> None:
        """Count a retrieval of these nodes and chunks (ids, ``-1`` ignored): the utility's f and dt."""
        for ids, access, last in ((nodes, self._access, self._last), (chunk_rows, self._chunk_access,
                                                                      self._chunk_last)):
            ids = torch.unique(ids[ids >= 0])
            if ids.numel():
                access.values[ids] += 1
                last.values[ids] = torch.clamp(last.values[ids], min=float(now))

    # ---- bounded growth ------------------------------------------------------
    def evict(self, budget: int, now: float, *, alpha: float = 0.6, beta: float = 0.4, tau: float = 600.0,
              low_water: float = 0.8) -> GraphEvictionReport | None:
        """Bring the cost within ``budget`` if it is over (see the module docstring); None: nothing to do."""
        total = self.cost()
        if total <= budget:
            return None
        t0 = time.perf_counter()
        relations = (self.kinds == RELATION).nonzero()[:, 0]
        rows = torch.arange(self.num_chunks)
        u_rel = utility(self._access.values[relations], self._last.values[relations], now, alpha=alpha, beta=beta,
                        tau=tau)
        u_chunk = utility(self._chunk_access.values, self._chunk_last.values, now, alpha=alpha, beta=beta, tau=tau)
        cost = torch.cat([self._chunk_cost.values, self._cost.values[relations]])
        ratio = torch.cat([u_chunk, u_rel]) / cost.to(torch.float64)
        created = torch.cat([self._chunk_last.values.new_tensor([c.t_end for c in self.chunks]),
                             self._created.values[relations]])
        # Least utility per word first; older first among equals (stable sorts, least significant key first).
        order = torch.argsort(created, stable=True)
        order = order[torch.argsort(ratio[order], stable=True)]
        freed = torch.cumsum(cost[order], 0)
        target = low_water * budget
        count = int(torch.searchsorted(freed.to(torch.float64), total - target))
        doomed = order[: count + 1]
        chunk_keep = torch.ones(self.num_chunks, dtype=torch.bool)
        chunk_keep[doomed[doomed < rows.numel()]] = False
        node_keep = torch.ones(self.num_nodes, dtype=torch.bool)
        node_keep[relations[doomed[doomed >= rows.numel()] - rows.numel()]] = False
        report = GraphEvictionReport(cost_before=total)
        report.chunks = int((~chunk_keep).sum())
        report.relations = int((~node_keep).sum())
        report.entities = self._remove(node_keep, chunk_keep)
        report.cost_after = self.cost()
        self.timings["evict"] += time.perf_counter() - t0
        return report

    def _remove(self, node_keep: torch.Tensor, chunk_keep: torch.Tensor) -> int:
        """Remove nodes and chunks (and the entities this orphans); returns the entities removed."""
        adj_ptr, adj_col = self._adj
        map_ptr, map_col = self._map
        # An entity stays while a kept relation or a kept chunk links to it.
        owner = torch.repeat_interleave(torch.arange(self.num_nodes), adj_ptr[1:] - adj_ptr[:-1])
        live_edges = torch.bincount(owner[node_keep[adj_col]], minlength=self.num_nodes)
        owner = torch.repeat_interleave(torch.arange(self.num_nodes), map_ptr[1:] - map_ptr[:-1])
        live_links = torch.bincount(owner[chunk_keep[map_col]], minlength=self.num_nodes)
        entities = self.kinds == ENTITY
        orphaned = entities & node_keep & (live_edges == 0) & (live_links == 0)
        node_keep = node_keep & ~orphaned
        node_map = torch.where(node_keep, torch.cumsum(node_keep, 0) - 1, -1)
        chunk_map = torch.where(chunk_keep, torch.cumsum(chunk_keep, 0) - 1, -1)
        self._adj = compact_csr(adj_ptr, adj_col, node_map, node_map)
        self._map = compact_csr(map_ptr, map_col, node_map, chunk_map)
        for col in (self._emb, self._kind, self._access, self._last, self._created, self._cost):
            col.keep(node_keep)
        for col in (self._head, self._tail):
            col.keep(node_keep)
            ids = col.values
            ids[ids >= 0] = node_map[ids[ids >= 0]]
        keep = node_keep.tolist()
        self.texts = [t for t, k in zip(self.texts, keep) if k]
        self.predicates = [p for p, k in zip(self.predicates, keep) if k]
        for col in (self._chunk_emb, self._chunk_access, self._chunk_last, self._chunk_cost):
            col.keep(chunk_keep)
        self.chunks = [c for c, k in zip(self.chunks, chunk_keep.tolist()) if k]
        new_id = node_map.tolist()
        self._entity_ids = {key: new_id[v] for key, v in self._entity_ids.items() if new_id[v] >= 0}
        self._relation_ids = {(new_id[h], p, new_id[t]): new_id[v] for (h, p, t), v in self._relation_ids.items()
                              if new_id[v] >= 0}
        self._commit()
        return int(orphaned.sum())

    def _rebuild_keys(self) -> None:
        kinds, heads, tails = self.kinds.tolist(), self._head.values.tolist(), self._tail.values.tolist()
        self._entity_ids = {name_key(t): i for i, (t, k) in enumerate(zip(self.texts, kinds)) if k == ENTITY}
        self._relation_ids = {(heads[i], self.predicates[i], tails[i]): i for i, k in enumerate(kinds)
                              if k == RELATION}

    # ---- checkpoints -----------------------------------------------------------
    def state_dict(self) -> dict:
        """Tables, embeddings, statistics and both CSRs (``torch.load(weights_only=True)`` reads it)."""
        return {
            "dim": self.dim,
            "texts": list(self.texts), "predicates": list(self.predicates),
            "embedding": self._emb.values.clone(), "kind": self._kind.values.clone(),
            "head": self._head.values.clone(), "tail": self._tail.values.clone(),
            "access": self._access.values.clone(), "last": self._last.values.clone(),
            "created": self._created.values.clone(), "cost": self._cost.values.clone(),
            "chunks": _chunks_state(self.chunks),
            "chunk_access": self._chunk_access.values.clone(), "chunk_last": self._chunk_last.values.clone(),
            "adjacency": [t.clone() for t in self._adj], "chunk_links": [t.clone() for t in self._map],
            "timings": dict(self.timings),
        }

    def load_state_dict(self, state: dict) -> None:
        if int(state["dim"]) != self.dim:
            raise ValueError(f"state holds a {state['dim']}-d graph, this graph is {self.dim}-d")
        self.texts, self.predicates = list(state["texts"]), list(state["predicates"])
        for col, key in ((self._emb, "embedding"), (self._kind, "kind"), (self._head, "head"), (self._tail, "tail"),
                         (self._access, "access"), (self._last, "last"), (self._created, "created"),
                         (self._cost, "cost"), (self._chunk_access, "chunk_access"),
                         (self._chunk_last, "chunk_last")):
            col.load(state[key])
        self.chunks = _chunks_from_state(state["chunks"])
        self._chunk_emb.load(torch.stack([c.embedding for c in self.chunks]) if self.chunks
                             else torch.zeros(0, self.dim))
        self._chunk_cost.load(torch.tensor([max(1, len(c.text.split())) for c in self.chunks], dtype=torch.int64))
        self._adj = tuple(state["adjacency"])
        self._map = tuple(state["chunk_links"])
        self.timings = Counter(state.get("timings", {}))
        self._rebuild_keys()
        self._commit()


def _predicate_key(predicate: str) -> str:
    return " ".join(predicate.lower().split())


def _check_queries(queries, dim: int) -> torch.Tensor:
    q = torch.as_tensor(queries)
    if q.dim() == 1:
        q = q[None]
    if q.dim() != 2 or q.shape[1] != dim or q.shape[0] < 1 or not q.is_floating_point():
        raise ValueError(f"queries must be a float (Q, {dim}) tensor with Q >= 1, got {tuple(q.shape)} {q.dtype}")
    if not bool(torch.isfinite(q).all()):
        raise ValueError("queries must be finite")
    return F.normalize(q.float(), dim=1).contiguous()


def _row_cosines(emb: torch.Tensor, ids: torch.Tensor, q: torch.Tensor, block: int = 16) -> torch.Tensor:
    """(Q, C) dot products of each query with the rows ``emb[ids[q]]`` (in blocks of queries, to bound memory)."""
    out = torch.empty(ids.shape, dtype=torch.float32)
    for start in range(0, ids.shape[0], block):
        rows = emb[ids[start:start + block]]
        out[start:start + block] = torch.bmm(rows, q[start:start + block, :, None])[..., 0]
    return out


def interleave(first: Sequence, second: Sequence, k: int) -> list:
    """Alternate two ranked lists of ``(chunk row, ...)`` tuples (``first`` leads), skipping rows already
    taken, up to ``k`` items: the ``hybrid`` mode (flat, then graph)."""
    out, seen = [], set()
    for pair in zip(first, second):
        for item in pair:
            if item[0] not in seen and len(out) < k:
                seen.add(item[0])
                out.append(item)
    longer = first if len(first) > len(second) else second
    for item in longer[min(len(first), len(second)):]:
        if item[0] not in seen and len(out) < k:
            seen.add(item[0])
            out.append(item)
    return out


def _round_robin(order: torch.Tensor, seed_rank: torch.Tensor, valid: torch.Tensor, num_seeds: int) -> torch.Tensor:
    """Reorder (Q, C) positions ``order`` (best first) so seeds take turns: every seed's best entry, then
    every seed's second best, ..., seeds in rank order; invalid entries stay last."""
    rank = seed_rank.gather(1, order)
    by_seed = torch.argsort(rank, dim=1, stable=True)  # grouped by seed, best first inside a group
    grouped = rank.gather(1, by_seed)
    counts = torch.zeros(order.shape[0], num_seeds, dtype=torch.int64).scatter_add_(1, grouped,
                                                                                    torch.ones_like(grouped))
    start = torch.cumsum(counts, 1) - counts
    turn = torch.empty_like(grouped)
    turn.scatter_(1, by_seed, torch.arange(order.shape[1]).expand_as(grouped) - start.gather(1, grouped))
    key = turn * (num_seeds + 1) + rank
    key = torch.where(valid.gather(1, order), key, torch.iinfo(torch.int64).max)
    return order.gather(1, torch.argsort(key, dim=1, stable=True))


def _empty_hits(num_q: int, seeds: int, capacity: int, chunks: int) -> GraphHits:
    def ids(w):
        return torch.full((num_q, w), -1, dtype=torch.int64)

    def scores(w):
        return torch.full((num_q, w), -math.inf)

    return GraphHits(ids(seeds), scores(seeds), ids(capacity), scores(capacity), ids(capacity), ids(chunks),
                     scores(chunks), ids(chunks), torch.zeros(num_q, dtype=torch.bool), {})


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


# --------------------------------------------------------------------------
# The recipe
# --------------------------------------------------------------------------
@dataclass
class MemVerseContext:
    """What one question retrieved.

    ``short_term``: the window's chunks in time order (with their cosine);
    ``chunks``: long-term chunks by rank, each with the node that brought it;
    ``facts``: the best-ranked relations; ``seeds``: the nodes the search
    started from.  ``timings`` in seconds.
    """

    question: str
    stream_time: float | None
    short_term: list[dict]
    chunks: list[dict]
    facts: list[dict]
    seeds: list[dict]
    timings: dict
    answer: str | None = None

    def to_dict(self) -> dict:
        return {"question": self.question, "stream_time": self.stream_time, "short_term": self.short_term,
                "chunks": self.chunks, "facts": self.facts, "seeds": self.seeds,
                "timings_ms": {k: round(1e3 * v, 3) for k, v in self.timings.items()}, "answer": self.answer}


@extractive_answer.register(MemVerseContext)
def _extractive_memverse(context: MemVerseContext) -> str:
    """MemVerse's model-free answer: the best long-term chunk's text (and its best fact)."""
    if not context.chunks:
        return "Nothing in long-term memory matches."
    best = context.chunks[0]
    fact = f" [fact: {context.facts[0]['fact']}]" if context.facts else ""
    return f"{best['text']} (session {best['session']}, {best['t_start']:.1f}-{best['t_end']:.1f}s){fact}"


class MemVerse:
    """MemVerse's short-term window and long-term knowledge graph, fed by video, dialogue and text.

    Parameters
    ----------
    text_encoder : TextEncoder
        Embeds chunk texts, node names and questions.
    frame_encoder : FrameEncoder, optional
        Needed by :meth:`push_frames` (labels feed the extractor).
    config : MemVerseConfig, optional
    extractor : Extractor or callable(chunk, context) -> Extraction, optional
        Default :class:`CooccurrenceExtractor` (deterministic, not a model).
    captioner : Captioner, optional
        Captions video events (default ``LabelCaptioner``).
    answer_fn : callable(MemVerseContext) -> str, optional
        Turns a context into an answer (a user's model); none by default.

    Single-threaded.  Timestamps are seconds on one clock for the whole
    memory (non-decreasing across sessions: the budget's recency uses them).
    """

    def __init__(self, text_encoder, frame_encoder=None, *, config: MemVerseConfig | None = None, extractor=None,
                 captioner=None, answer_fn: Callable | None = None):
        if text_encoder is None:
            raise ValueError("text_encoder is required (chunks, entities and questions are embedded with it)")
        config = MemVerseConfig() if config is None else config
        if not isinstance(config, MemVerseConfig):
            raise ValueError(f"config must be a MemVerseConfig, got {config!r}")
        if extractor is not None and not (hasattr(extractor, "extract") or callable(extractor)):
            raise ValueError("extractor must have .extract(chunk, context) or be a callable(chunk, context)")
        self.config = config
        self.text_encoder = text_encoder
        self.frame_encoder = frame_encoder
        self.extractor = extractor if extractor is not None else CooccurrenceExtractor()
        self.captioner = captioner if captioner is not None else LabelCaptioner()
        self.answer_fn = answer_fn
        self.graph = LongTermGraph(int(text_encoder.dim), backend=config.backend)
        self.window: deque[MemoryChunk] = deque()
        self.pending: list[MemoryChunk] = []
        self.session = 0
        self.stream_time: float | None = None
        self._next_chunk = 0
        self._last_consolidated: tuple[MemoryChunk, tuple[str, ...]] | None = None
        self.evictions: list[GraphEvictionReport] = []
        self.questions = 0
        self.timings: Counter = Counter()
        self.frames_seen = 0  # video frames pushed, every session
        self._new_video_front()

    # ---- video front end -------------------------------------------------------
    def _new_video_front(self) -> None:
        cfg = self.config
        threshold = PRESETS[cfg.preset].threshold if cfg.motion_threshold is None else cfg.motion_threshold
        self.gate = MotionGate(threshold, size=cfg.motion_size, backend=cfg.backend)
        seg = cfg.segmenter
        self.events = EventSegmenter(self.text_encoder, self.captioner, window=seg.window, tau=seg.tau,
                                     min_depth=seg.min_depth, max_event=seg.max_event, drift=seg.drift,
                                     backend=cfg.backend)
        self._open: list[FrameRecord] = []  # frames pushed to the segmenter and not yet in a closed event
        self._open_first = 0  # segmenter index of _open[0]

    def push_frames(self, timestamps, frames) -> list[MemoryChunk]:
        """Gate, encode and segment video frames; returns the chunks of the events they closed.

        Parameters
        ----------
        timestamps : float or (n,) sequence of float
            Seconds, non-decreasing.
        frames : (n, H, W, 3) or (H, W, 3) uint8 RGB
        """
        from ...stream.memory import StreamMemory

        if self.frame_encoder is None:
            raise ValueError("this MemVerse has no frame_encoder; pass one to push video frames")
        frames = np.asarray(frames) if not isinstance(frames, torch.Tensor) else frames
        if frames.ndim == 3:
            frames = frames[None]
        if frames.ndim != 4 or frames.shape[0] < 1 or frames.shape[-1] != 3 or frames.dtype not in (np.uint8,
                                                                                                      torch.uint8):
            raise ValueError(f"frames must be uint8 of shape (n, H, W, 3) or (H, W, 3), got {frames.dtype} "
                             f"{tuple(frames.shape)}")
        times = self._check_times(timestamps, frames.shape[0])
        t0 = time.perf_counter()
        _, kept = self.gate.push(frames)
        rows = [i for i, k in enumerate(kept) if k]
        indices = list(range(self.frames_seen, self.frames_seen + frames.shape[0]))
        self.frames_seen += frames.shape[0]
        t1 = time.perf_counter()
        out = []
        if rows:
            encoded = self.frame_encoder.encode(frames[rows])
            t2 = time.perf_counter()
            for record in StreamMemory.records([indices[i] for i in rows], [times[i] for i in rows], encoded):
                self._open.append(record)
                out += [self._video_chunk(e) for e in self.events.push(record)]
            self.timings["frame_encode"] += t2 - t1
            self.timings["segment"] += time.perf_counter() - t2
        self.timings["motion_gate"] += t1 - t0
        self._advance(times[-1])
        return out

    def end_video(self) -> list[MemoryChunk]:
        """Close the open video event (end of a clip); returns its chunk(s)."""
        return [self._video_chunk(e) for e in self.events.flush()]

    def _video_chunk(self, entry) -> MemoryChunk:
        n = entry.last_frame - entry.first_frame + 1
        start = entry.first_frame - self._open_first
        frames, self._open = self._open[start:start + n], self._open[start + n:]
        self._open_first = entry.last_frame + 1
        counts = Counter(label for f in frames for label in f.labels)
        labels = tuple(name for name, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
                       [: self.config.labels_per_chunk])
        chunk = MemoryChunk(self._new_chunk_id(), self.session, entry.t_start, entry.t_end, "video", entry.caption,
                            labels, None, frames[0].index, frames[-1].index, entry.embedding.float())
        self._push(chunk)
        return chunk

    # ---- dialogue and text --------------------------------------------------------
    def add_turn(self, timestamp: float, speaker: str, text: str, labels: Sequence[str] = ()) -> MemoryChunk:
        """One dialogue turn (embedded as ``"speaker: text"``)."""
        return self.add_texts([timestamp], [text], speakers=[speaker], labels=[labels], modality="dialogue")[0]

    def add_texts(self, timestamps, texts: Sequence[str], *, speakers: Sequence[str | None] | None = None,
                  labels: Sequence[Sequence[str]] | None = None, modality: str = "text") -> list[MemoryChunk]:
        """Several text chunks at once (one encoder call), in order.

        ``speakers`` (dialogue turns) and ``labels`` (names attached to each
        text, e.g. an upstream tagger's) are optional, one entry per text.
        """
        if isinstance(texts, str) or not all(isinstance(t, str) and t.strip() for t in texts):
            raise ValueError("texts must be a sequence of non-empty strings")
        texts = [str(t) for t in texts]
        n = len(texts)
        if n == 0:
            return []
        speakers = [None] * n if speakers is None else list(speakers)
        labels = [()] * n if labels is None else [tuple(x) for x in labels]
        if len(speakers) != n or len(labels) != n:
            raise ValueError(f"speakers and labels must hold one entry per text ({n}), got {len(speakers)} and "
                             f"{len(labels)}")
        if not all(s is None or (isinstance(s, str) and s.strip()) for s in speakers):
            raise ValueError("speakers must be non-empty strings or None")
        if not all(isinstance(x, str) for ls in labels for x in ls):
            raise ValueError("labels must be sequences of strings")
        speakers = [None if x is None else str(x) for x in speakers]
        labels = [tuple(str(x) for x in ls) for ls in labels]  # plain str (numpy's would not load weights_only)
        if not isinstance(modality, str) or not modality:
            raise ValueError(f"modality must be a non-empty string, got {modality!r}")
        times = self._check_times(timestamps, n)
        t0 = time.perf_counter()
        shown = [t if s is None else f"{s}: {t}" for s, t in zip(speakers, texts)]
        emb = F.normalize(self.text_encoder.encode(shown).float(), dim=1)
        self.timings["text_encode"] += time.perf_counter() - t0
        out = []
        for i in range(n):
            chunk = MemoryChunk(self._new_chunk_id(), self.session, times[i], times[i], modality, shown[i],
                                labels[i], speakers[i], embedding=emb[i].clone())
            self._push(chunk)
            out.append(chunk)
        self._advance(times[-1])
        return out

    # ---- short-term -> long-term ----------------------------------------------------
    def _new_chunk_id(self) -> int:
        self._next_chunk += 1
        return self._next_chunk - 1

    def _push(self, chunk: MemoryChunk) -> None:
        self.window.append(chunk)
        while len(self.window) > self.config.window:
            self.pending.append(self.window.popleft())
        if len(self.pending) >= self.config.consolidate_every:
            self.consolidate()

    def consolidate(self, *, everything: bool = False) -> dict | None:
        """Write the chunks that left the window (``everything``: the window too) into the graph."""
        batch = self.pending + (list(self.window) if everything else [])
        self.pending = []
        if everything:
            self.window.clear()
        if not batch:
            return None
        t0 = time.perf_counter()
        batch_names: set[str] = set()
        extractions = []
        previous = self._last_consolidated
        for chunk in batch:
            if previous is not None and previous[0].session != chunk.session:
                previous = None
            context = ExtractionContext(previous[0] if previous else None, previous[1] if previous else (),
                                        lambda name: name_key(name) in batch_names or self.graph.has_entity(name))
            ext = _call_extractor(self.extractor, chunk, context)
            extractions.append(ext)
            names = ext.entities + tuple(x for h, _, t in ext.relations for x in (h, t))
            batch_names.update(name_key(x) for x in names)
            previous = (chunk, ext.entities)
        self._last_consolidated = previous
        t1 = time.perf_counter()
        now = max(c.t_end for c in batch)
        added = self.graph.consolidate(batch, extractions, self._embed, now)
        t2 = time.perf_counter()
        self.timings["extract"] += t1 - t0
        self.timings["consolidate"] += t2 - t1
        if self.config.budget is not None:
            self.enforce_budget()
        return added

    def enforce_budget(self) -> GraphEvictionReport | None:
        cfg = self.config
        if cfg.budget is None or self.stream_time is None:
            return None
        t0 = time.perf_counter()
        report = self.graph.evict(cfg.budget, self.stream_time, alpha=cfg.alpha, beta=cfg.beta, tau=cfg.tau,
                                  low_water=cfg.low_water)
        self.timings["budget"] += time.perf_counter() - t0
        if report is not None:
            self.evictions.append(report)
        return report

    def end_session(self) -> dict | None:
        """Close the open video event, consolidate the window into the graph and start a new session."""
        self.end_video()
        added = self.consolidate(everything=True)
        self.session += 1
        self._last_consolidated = None
        self._new_video_front()
        return added

    def _embed(self, texts: list[str]) -> torch.Tensor:
        t0 = time.perf_counter()
        out = self.text_encoder.encode(texts)
        self.timings["text_encode"] += time.perf_counter() - t0
        return out

    def _check_times(self, timestamps, n: int) -> list[float]:
        times = [timestamps] if np.ndim(timestamps) == 0 else list(np.asarray(timestamps, np.float64).reshape(-1))
        if len(times) != n:
            raise ValueError(f"timestamps must hold one time per item ({n}), got {len(times)}")
        times = [float(t) for t in times]
        if not all(math.isfinite(t) for t in times):
            raise ValueError("timestamps must be finite")
        previous = -math.inf if self.stream_time is None else self.stream_time
        for t in times:
            if t < previous:
                raise ValueError(f"timestamps must not decrease, got {t} after {previous}")
            previous = t
        return times

    def _advance(self, t: float) -> None:
        self.stream_time = t if self.stream_time is None else max(self.stream_time, t)

    # ---- questions --------------------------------------------------------------------
    def encode_questions(self, questions: Sequence[str]) -> torch.Tensor:
        """(Q, E) normalised question embeddings."""
        if isinstance(questions, str) or not questions or not all(isinstance(q, str) and q.strip()
                                                                  for q in questions):
            raise ValueError("questions must be a non-empty sequence of non-empty strings")
        return F.normalize(self.text_encoder.encode(list(questions)).float(), dim=1)

    def search(self, query_embeddings: torch.Tensor, *, update_access: bool = False) -> GraphHits:
        """Long-term graph search for Q embedded questions (consolidates pending chunks first)."""
        if self.pending:
            self.consolidate()
        cfg = self.config
        hits = self.graph.search(query_embeddings, seeds=cfg.seeds, hops=cfg.hops, capacity=cfg.capacity,
                                 max_fanout=cfg.max_fanout, max_frontier=cfg.max_frontier, min_score=cfg.min_score,
                                 chunks=cfg.chunks, chunks_per_node=cfg.chunks_per_node, ranking=cfg.ranking)
        if update_access and self.stream_time is not None:
            self.graph.touch(torch.cat([hits.chunk_nodes, hits.seeds], 1), hits.chunks, self.stream_time)
        return hits

    def search_flat(self, query_embeddings: torch.Tensor, chunks: int | None = None):
        """The baseline over the same long-term chunks: (rows, scores) of a cosine top-k."""
        if self.pending:
            self.consolidate()
        return self.graph.search_flat(query_embeddings, self.config.chunks if chunks is None else chunks)

    def ask(self, question: str, *, answer: bool = True) -> MemVerseContext:
        """The short-term window, the graph's chunks, facts and seeds for a question; answered by ``answer_fn``."""
        t0 = time.perf_counter()
        q = self.encode_questions([question])
        t1 = time.perf_counter()
        hits = self.search(q, update_access=True)
        g = self.graph
        short = [c.view(float(c.embedding @ q[0])) for c in self.window]
        graph_chunks = [(row, score, g.texts[node]) for row, score, node in
                        zip(hits.chunks[0].tolist(), hits.chunk_scores[0].tolist(), hits.chunk_nodes[0].tolist())
                        if row >= 0]
        ranked = graph_chunks
        if self.config.mode != "graph":
            t2 = time.perf_counter()
            rows, scores = self.search_flat(q)
            flat = [(row, score, "flat cosine") for row, score in zip(rows[0].tolist(), scores[0].tolist())
                    if row >= 0]
            ranked = flat if self.config.mode == "flat" else interleave(flat, graph_chunks, self.config.chunks)
            hits.timings["flat"] = time.perf_counter() - t2
        chunks = []
        for row, score, via in ranked:
            view = g.chunks[row].view(score)
            view["via"] = via
            chunks.append(view)
        kinds = g.kinds
        facts, seeds = [], []
        for node, score, hop in zip(hits.nodes[0].tolist(), hits.node_scores[0].tolist(),
                                    hits.node_hops[0].tolist()):
            if node >= 0 and len(facts) < self.config.facts and int(kinds[node]) == RELATION:
                facts.append({"fact": g.texts[node], "score": round(score, 4), "hop": hop})
        for node, score in zip(hits.seeds[0].tolist(), hits.seed_scores[0].tolist()):
            if node >= 0:
                seeds.append({"node": g.texts[node], "kind": "relation" if int(kinds[node]) else "entity",
                              "score": round(score, 4)})
        timings = {"question_encode": t1 - t0, **hits.timings, "total": time.perf_counter() - t0}
        self.questions += 1
        ctx = MemVerseContext(question, self.stream_time, short, chunks, facts, seeds, timings)
        if answer and self.answer_fn is not None:
            ctx.answer = self.answer_fn(ctx)
        return ctx

    # ---- reporting and checkpoints --------------------------------------------------------
    def summary(self) -> dict:
        g = self.graph
        out = {"session": self.session, "stream_time": self.stream_time, "frames_seen": self.frames_seen,
               "short_term_chunks": len(self.window), "pending_chunks": len(self.pending),
               "long_term_chunks": g.num_chunks, "entities": g.num_entities, "relations": g.num_relations,
               "graph_entries": g.num_edges, "cost_words": g.cost(), "questions": self.questions,
               "extractor": getattr(self.extractor, "name", type(self.extractor).__name__),
               "component_seconds": {k: round(v, 4) for k, v in sorted((self.timings + g.timings).items())}}
        if self.config.budget is not None:
            out["budget"] = {"budget": self.config.budget, "rounds": len(self.evictions),
                             "chunks_removed": sum(r.chunks for r in self.evictions),
                             "relations_removed": sum(r.relations for r in self.evictions),
                             "entities_removed": sum(r.entities for r in self.evictions)}
        return out

    def state_dict(self) -> dict:
        """The whole memory (window, pending chunks, graph, video front end, counters); models are not state.

        An open video event is kept (frames and segmenter state), so pushing
        continues exactly where it stopped.
        """
        last = self._last_consolidated
        return {
            "format": _FORMAT, "version": _VERSION, "config": self.config.to_dict(),
            "encoders": {"text": encoder_spec(self.text_encoder), "text_dim": int(self.text_encoder.dim),
                         "frame": encoder_spec(self.frame_encoder)},
            "session": self.session, "stream_time": self.stream_time, "next_chunk": self._next_chunk,
            "questions": self.questions, "frames_seen": self.frames_seen,
            "window": _chunks_state(list(self.window)), "pending": _chunks_state(self.pending),
            "last_consolidated": None if last is None else {"chunk": _chunks_state([last[0]]),
                                                            "entities": list(last[1])},
            "graph": self.graph.state_dict(),
            "gate": self.gate.state_dict(), "events": self.events.state_dict(),
            "open": records_state(self._open), "open_first": self._open_first,
            "evictions": [asdict(r) for r in self.evictions], "timings": dict(self.timings),
        }

    def load_state_dict(self, state: dict) -> None:
        if not isinstance(state, dict) or state.get("format") != _FORMAT:
            raise ValueError("state is not a MemVerse state_dict")
        if state.get("version") != _VERSION:
            raise ValueError(f"unsupported MemVerse state version {state.get('version')!r} (this is {_VERSION})")
        if MemVerseConfig.from_dict(state["config"]) != self.config:
            raise ValueError("state was saved with another MemVerseConfig")
        if int(state["encoders"]["text_dim"]) != int(self.text_encoder.dim):
            raise ValueError(f"state was saved with a {state['encoders']['text_dim']}-d text encoder, this memory "
                             f"has {self.text_encoder.dim}-d")
        self._new_video_front()
        self.session, self.stream_time = int(state["session"]), state["stream_time"]
        self._next_chunk, self.questions = int(state["next_chunk"]), int(state["questions"])
        self.window = deque(_chunks_from_state(state["window"]))
        self.pending = _chunks_from_state(state["pending"])
        last = state["last_consolidated"]
        self._last_consolidated = None if last is None else (_chunks_from_state(last["chunk"])[0],
                                                             tuple(last["entities"]))
        self.graph.load_state_dict(state["graph"])
        self.gate.load_state_dict(state["gate"])
        self.events.load_state_dict(state["events"])
        self._open, self._open_first = records_from_state(state["open"]), int(state["open_first"])
        self.frames_seen = int(state["frames_seen"])
        self.evictions = [GraphEvictionReport(**r) for r in state["evictions"]]
        self.timings = Counter(state["timings"])

    def save(self, directory) -> Path:
        """``state.pt`` (``torch.load(weights_only=True)``) and a readable ``memverse.json`` in ``directory``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        state = self.state_dict()
        info = {"format": _FORMAT, "version": _VERSION, "config": state["config"], "encoders": state["encoders"],
                "summary": self.summary()}
        atomic_write(directory / "memverse.json", lambda fh: fh.write(json.dumps(info, indent=1).encode()))
        atomic_write(directory / "state.pt", lambda fh: torch.save(state, fh))
        return directory

    @classmethod
    def load(cls, directory, text_encoder=None, frame_encoder=None, **hooks) -> "MemVerse":
        """A memory saved with :meth:`save`; encoders not passed are rebuilt from their saved spec.

        ``hooks``: ``extractor``, ``captioner``, ``answer_fn`` (code, not state).
        """
        path = Path(directory) / "state.pt"
        if not path.is_file():
            raise FileNotFoundError(f"no saved MemVerse in {directory} (missing state.pt)")
        state = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(state, dict) or state.get("format") != _FORMAT:
            raise ValueError(f"{path} is not a saved MemVerse")
        frame_encoder, text_encoder = encoders_from_specs(state["encoders"], frame_encoder, text_encoder)
        memory = cls(text_encoder, frame_encoder, config=MemVerseConfig.from_dict(state["config"]), **hooks)
        memory.load_state_dict(state)
        return memory
