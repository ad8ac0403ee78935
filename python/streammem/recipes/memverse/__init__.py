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
   alike (a ``CosineIndex`` of the node embeddings, normalised once when a
   node is added: ``graph_retrieve``'s seeds without normalising every node
   per question), and
2. their k-hop neighbourhood (``khop_neighbourhood``), capped per node
   (``max_fanout``), per hop and per query;
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

**Possessive hops** (``hops.resolve_possessives``, ``config.resolve_possessives``):
in graph and hybrid modes a question's "X's R" is first resolved through the
relation of X that the phrase names, and the graph is asked the question about
the entity at its other end ("Where does Alice's sister work?" -> "Where does
Yara work?"), the relation's chunks first (the hybrid's flat half is asked
the rewritten question too; the flat mode never resolves).

The flat baseline (:meth:`LongTermGraph.search_flat`) is cosine top-k over the
chunk embeddings; ``bench/bench_memverse.py`` compares both on a planted-fact
multi-session memory (``synthetic.PlantedFactMemory``, scored by ``evaluation.hit_rates``).

**CSR growth.**  Rows list their entries newest first (under ``max_fanout`` a
hub entity follows its newest relations; ``chunks_per_node`` keeps an
entity's newest chunks).  A consolidation batch of ``b`` new entries is merged
into the existing CSR by :func:`extend_csr`: old entries move by the number of
new entries in rows up to theirs, new ones are written in front of each row
-- O(E + b log b), no re-sort of the E old entries (``CSRGraph.from_edges``
would sort everything again; both are measured in bench/bench_memverse.py).  Evictions
filter entries in place of order (:func:`compact_csr`), also without a sort.

**Bounded growth** (``budget``): a graph-aware equivalent of
``BoundedMemory``, built on its utility rule (``streammem.components.bounded.utility``:
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
from .config import MODES, RANKINGS, MemVerseConfig
from .evaluation import hit_rates
from .extraction import CooccurrenceExtractor, Extraction, ExtractionContext, Extractor, MemoryChunk, name_key
from .graph import ENTITY, RELATION, GraphEvictionReport, GraphHits, LongTermGraph, interleave
from .hops import Resolution, resolve_possessives
from .memory import MemVerse, MemVerseContext
from .synthetic import GroundTruthExtractor, PlantedFactMemory, PlantedItem, PlantedQuestion
from .tables import compact_csr, extend_csr

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
    "Resolution",
    "resolve_possessives",
    "ENTITY",
    "RELATION",
    "RANKINGS",
    "MODES",
    "PlantedItem",
    "PlantedQuestion",
    "PlantedFactMemory",
    "GroundTruthExtractor",
    "hit_rates",
]
