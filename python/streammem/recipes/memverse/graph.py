"""The long-term knowledge graph: entities, relations and chunks with embeddings, CSR adjacency and chunk
links, retrieval by seeds and k-hop expansion, and eviction within a word budget."""
from __future__ import annotations

import math
import sys
from array import array
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

import torch
import torch.nn.functional as F
from streammem_kernels import CosineIndex

from ...checks import check_int
from ...components.bounded import EvictionReport, utility
from .config import RANKINGS
from .extraction import Extraction, MemoryChunk, _chunks_from_state, _chunks_state, name_key
from .tables import Column, HandleList, Handles, compact_csr, extend_csr, least_useful, row_counts

__all__ = [
    "LongTermGraph",
    "GraphHits",
    "GraphEvictionReport",
    "interleave",
    "ENTITY",
    "RELATION",
]


ENTITY, RELATION = 0, 1


# Node texts embedded (and added to the node index) at once: bounds the embeddings held besides the
# index to EMBED_BLOCK x dim floats (96 MB at D = 384) when a bulk consolidation adds millions of nodes.
EMBED_BLOCK = 1 << 16
# The scan copies a graph's indexes may keep (CosineIndex's half_scan / int8_scan): each answers exactly as
# the float32 scan, reading fewer bytes for more memory (the int8 copy: a quarter of the bytes, +25 %).
SCAN_COPIES = {"int8": {"int8_scan": True}, "float16": {"half_scan": True}, "none": {}}
# A bulk batch (more than one EMBED_BLOCK of rows) first reserves the index rows it needs plus this share
# of the total as room for later batches: one allocation, instead of doubling a multi-GB table on the way.
BULK_HEADROOM = 1 / 64


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
    scan_copy : {"int8", "float16", "none"}
        The copy of the embeddings the C++ scan of both indexes reads first (``SCAN_COPIES``): the
        results are the float32 scan's, bit for bit, whichever; "int8" reads a quarter of the bytes for
        +25 % of the embeddings' memory, "float16" half for +50 %, "none" keeps no copy.

    Node ids are dense (``0..num_nodes-1``, entities and relations
    interleaved in creation order) and change only when an eviction compacts
    them; chunk rows likewise (``chunks[row].chunk_id`` is the stable id).
    Change the graph through :meth:`consolidate` and :meth:`evict` only: each
    keeps tables, embeddings and both CSRs equal in the same call.

    Node and chunk embeddings live in two :class:`streammem_kernels.CosineIndex`
    (normalised and checked once, when added; a question's seeds and the flat
    baseline search them without touching the rows again), keyed by stable
    handles (``Handles``) that an eviction never renumbers: it removes the
    evicted rows from the indexes and the name maps, and rewrites only the
    dense-id tables and the CSRs.

    ``texts``, ``predicates`` (by node id) and ``chunks`` (by chunk row) are read-only sequences
    (``HandleList``: index, slice, iterate, compare with a list) stored by handle, so an eviction drops
    the removed items instead of rebuilding a list of every kept one.
    """

    def __init__(self, dim: int, *, backend: str = "auto", scan_copy: str = "int8"):
        self.dim = check_int(dim, "dim", 1)
        self.backend = backend
        if scan_copy not in SCAN_COPIES:
            raise ValueError(f"scan_copy must be one of {sorted(SCAN_COPIES)}, got {scan_copy!r}")
        self.scan_copy = scan_copy
        self._nodes = self._index()  # node embeddings, ids = node handles
        self._node_handles = Handles()
        # By node id, stored by handle (an eviction drops the removed texts, never rebuilds the lists).
        self.texts = HandleList(self._node_handles)  # entity name, or "head predicate tail"
        self.predicates = HandleList(self._node_handles)  # "" for entities
        self._kind = Column(torch.int8)
        self._head = Column(torch.int64)
        self._tail = Column(torch.int64)
        self._access = Column(torch.int64)
        self._last = Column(torch.float64)
        self._created = Column(torch.float64)
        self._cost = Column(torch.int64)
        self._entity_ids: dict[str, int] = {}  # name key -> node handle
        self._relation_ids: dict[tuple[int, str, int], int] = {}  # (head handle, predicate, tail handle) -> handle
        self._chunk_keys = self._index()  # chunk embeddings, ids = chunk handles
        self._chunk_handles = Handles()
        self.chunks = HandleList(self._chunk_handles)  # MemoryChunks by chunk row
        self._chunk_access = Column(torch.int64)
        self._chunk_last = Column(torch.float64)
        self._chunk_cost = Column(torch.int64)
        self._chunk_time = Column(torch.float64)  # t_end: the eviction's age among equals
        self._adj = (torch.zeros(1, dtype=torch.int64), torch.zeros(0, dtype=torch.int64))
        self._map = (torch.zeros(1, dtype=torch.int64), torch.zeros(0, dtype=torch.int64))
        self.graph = None  # CSRGraph over the nodes
        self.chunk_map = None  # CSRGraph node -> chunk rows
        self.timings: Counter = Counter()

    def _index(self) -> CosineIndex:
        return CosineIndex(self.dim, **SCAN_COPIES[self.scan_copy])

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
        """(num_nodes, dim) normalised node embeddings, by node id (read it, do not modify it)."""
        return self._nodes.keys

    @property
    def chunk_embeddings(self) -> torch.Tensor:
        """(num_chunks, dim) normalised chunk embeddings, by chunk row (read it, do not modify it)."""
        return self._chunk_keys.keys

    @property
    def kinds(self) -> torch.Tensor:
        """(num_nodes,) int8: 0 entity, 1 relation."""
        return self._kind.values

    def _node(self, handle: int | None) -> int | None:
        return None if handle is None else int(self._node_handles.dense[handle])

    def entity_id(self, name: str) -> int | None:
        return self._node(self._entity_ids.get(name_key(name)))

    def has_entity(self, name: str) -> bool:
        return name_key(name) in self._entity_ids

    def relation_id(self, head: str, predicate: str, tail: str) -> int | None:
        h, t = self._entity_ids.get(name_key(head)), self._entity_ids.get(name_key(tail))
        if h is None or t is None:
            return None
        return self._node(self._relation_ids.get((h, _predicate_key(predicate), t)))

    def relation_ends(self, node: int) -> tuple[int, int]:
        """(head, tail) node ids of a relation node; (-1, -1) for an entity."""
        return int(self._head.values[node]), int(self._tail.values[node])

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
        # New nodes get the next handles in creation order: handle = first_handle + (node - first_node).
        first_handle = self._node_handles.issued
        dense_of = self._node_handles.dense
        new_texts, new_kind, new_head, new_tail, new_pred = [], [], [], [], []
        new_entities: dict[str, int] = {}
        new_relations: dict[tuple[int, str, int], int] = {}
        # Flat (source, target) pairs and node ids as int64 arrays: a bulk batch of 10^6 relations lists ~4 * 10^6
        # edges, which as a list of tuples would hold ~0.5 GB of Python objects besides the graph.
        edges, links, touched = array("q"), array("q"), array("q")

        def handle_of(node: int) -> int:
            return int(self._node_handles.handle[node]) if node < first_node else first_handle + node - first_node

        def entity(name: str) -> int:
            key = name_key(name)
            handle = self._entity_ids.get(key)
            if handle is not None:
                return int(dense_of[handle])
            node = new_entities.get(key)
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
                key = (handle_of(h), _predicate_key(predicate), handle_of(t))
                known = self._relation_ids.get(key)
                rel = int(dense_of[known]) if known is not None else new_relations.get(key)
                if rel is None:
                    rel = new_relations[key] = first_node + len(new_texts)
                    new_texts.append(f"{self._text(h, new_texts, first_node)} {key[1]} "
                                     f"{self._text(t, new_texts, first_node)}")
                    new_kind.append(RELATION)
                    new_head.append(h)
                    new_tail.append(t)
                    new_pred.append(key[1])
                    # extend_csr lists each row newest first, so a relation's row reads head, then tail.
                    edges.extend((h, rel, t, rel, rel, t, rel, h) if t != h else (h, rel, rel, h))
                nodes.append(rel)
                touched.extend((h, t))
            for node in dict.fromkeys(nodes):  # what the chunk mentions: its entities and its relations
                links.extend((node, row))
            touched.extend(nodes)
        # Embeddings first: a failing encoder leaves the graph as it was.
        self._append_nodes(new_texts, new_kind, new_head, new_tail, new_pred, embed, now)
        for known, new in ((self._entity_ids, new_entities), (self._relation_ids, new_relations)):
            if first_handle == first_node:  # handle = node (no eviction yet): no second dict of a bulk batch
                known.update(new)
            else:
                known.update({key: first_handle + node - first_node for key, node in new.items()})
        self._append_chunks(chunks)
        t1 = time.perf_counter()
        self._extend(edges, links)
        t2 = time.perf_counter()
        if touched:
            ids = torch.unique(_int64(touched))
            last = self._last.values
            last[ids] = torch.clamp(last[ids], min=float(now))
        self.timings["consolidate_tables"] += t1 - t0 - (self.timings["embed"] - embed_before)
        self.timings["consolidate_csr"] += t2 - t1
        return {"chunks": len(chunks), "entities": new_kind.count(ENTITY), "relations": new_kind.count(RELATION),
                "edges": len(edges) // 2, "links": len(links) // 2}

    def _text(self, node: int, new_texts: list[str], first_node: int) -> str:
        return self.texts[node] if node < first_node else new_texts[node - first_node]

    def _append_nodes(self, texts, kinds, heads, tails, predicates, embed, now: float) -> None:
        if not texts:
            return
        n = len(texts)
        # The new nodes' handles are the next n (issued below, once every embedding is in).
        first = self._node_handles.issued
        done = 0
        _reserve_bulk(self._nodes, n)
        try:
            for lo in range(0, n, EMBED_BLOCK):
                block = list(texts[lo:lo + EMBED_BLOCK])
                t0 = time.perf_counter()
                emb = torch.as_tensor(embed(block))
                self.timings["embed"] += time.perf_counter() - t0
                if emb.shape != (len(block), self.dim) or not emb.is_floating_point():
                    raise ValueError(f"embed must return a float ({len(block)}, {self.dim}) tensor, got "
                                     f"{tuple(emb.shape)} {emb.dtype}")
                if not bool(torch.isfinite(emb).all()):
                    raise ValueError("embed returned non-finite values")
                self._nodes.add(emb.detach().float(), ids=torch.arange(first + lo, first + lo + len(block)))
                done = lo + len(block)
        except BaseException:
            if done:  # a failing encoder leaves the graph as it was
                self._nodes.remove(torch.arange(first, first + done))
            raise
        self._node_handles.issue(n)
        self.texts.extend(texts)
        self.predicates.extend(predicates)
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
        handles = torch.from_numpy(self._chunk_handles.issue(len(chunks)))
        _reserve_bulk(self._chunk_keys, len(chunks))
        # In blocks: the stacked rows held besides the index stay EMBED_BLOCK x dim floats.
        done = 0
        try:
            for lo in range(0, len(chunks), EMBED_BLOCK):
                block = chunks[lo:lo + EMBED_BLOCK]
                self._chunk_keys.add(torch.stack([c.embedding.detach().float() for c in block]),
                                     ids=handles[lo:lo + len(block)])
                done = lo + len(block)
        except BaseException:
            if done:  # as one add: a failing block leaves the index as it was
                self._chunk_keys.remove(handles[:done])
            raise
        self.chunks.extend(chunks)
        self._chunk_access.extend(torch.zeros(len(chunks), dtype=torch.int64))
        self._chunk_last.extend(torch.tensor([c.t_end for c in chunks], dtype=torch.float64))
        self._chunk_cost.extend(torch.tensor([max(1, len(c.text.split())) for c in chunks], dtype=torch.int64))
        self._chunk_time.extend(torch.tensor([c.t_end for c in chunks], dtype=torch.float64))

    def _extend(self, edges: array, links: array) -> None:
        def pairs(items):
            t = _int64(items).reshape(-1, 2)
            return t[:, 0].contiguous(), t[:, 1].contiguous()

        self._adj = extend_csr(*self._adj, self.num_nodes, *pairs(edges))
        self._map = extend_csr(*self._map, self.num_nodes, *pairs(links))
        self._commit()

    def _commit(self) -> None:
        from streammem_kernels import CSRGraph

        self.graph = CSRGraph(*self._adj)
        self.chunk_map = CSRGraph(*self._map, num_cols=self.num_chunks)

    # ---- retrieval -------------------------------------------------------------
    def seeds(self, queries: torch.Tensor, k: int, min_score: float | None = None):
        """(node ids, cosines) (Q, k) of the ``k`` nodes nearest each normalised query (entities and
        relations alike, ties toward the older node; ``-1`` / ``-inf`` where fewer exist or score below
        ``min_score``): the node index's exact search."""
        top = self._nodes.search(queries, k, backend=self.backend)
        seeds = self._node_handles.dense_of(top.ids)
        scores = top.scores
        if min_score is not None:
            low = scores < min_score
            seeds = torch.where(low, torch.full_like(seeds, -1), seeds)
            scores = torch.where(low, torch.full_like(scores, -math.inf), scores)
        return seeds, scores

    def search(self, queries: torch.Tensor, *, seeds: int = 4, hops: int = 2, capacity: int = 512,
               max_fanout: int | None = 64, max_frontier: int | None = None, min_score: float | None = None,
               chunks: int = 8, chunks_per_node: int | None = 2, ranking: str = "round-robin",
               bridges: torch.Tensor | None = None) -> GraphHits:
        """Seeds, neighbourhood, ranking and chunks for Q questions (see the module docstring).

        Parameters
        ----------
        queries : (Q, dim) float tensor
            Question embeddings (normalised here).
        seeds, hops, capacity, max_fanout, max_frontier, min_score, chunks, chunks_per_node, ranking
            As in :class:`MemVerseConfig`.
        bridges : (Q, b) int tensor, optional
            Relation nodes each question was resolved through (``hops.resolve_possessives``; ``-1``
            padded): they lead the ranked nodes (score 1, hop 0), so their chunks come first.

        Returns
        -------
        GraphHits
        """
        from streammem_kernels import khop_neighbourhood, neighbourhood_chunks

        q = _check_queries(queries, self.dim)
        if ranking not in RANKINGS:
            raise ValueError(f"ranking must be one of {RANKINGS}, got {ranking!r}")
        num_q = q.shape[0]
        if self.num_nodes == 0:
            return _empty_hits(num_q, seeds, capacity, chunks)
        t0 = time.perf_counter()
        seed_ids, seed_scores = self.seeds(q, min(seeds, self.num_nodes), min_score)
        near = khop_neighbourhood(self.graph, seed_ids, hops, capacity=capacity, max_fanout=max_fanout,
                                  max_frontier=max_frontier, backend=self.backend)
        t1 = time.perf_counter()
        # Entries are packed at the front: work on the widest list, not the capacity (small tensors also
        # stay under torch's parallel grain, so no thread pool waits on a loaded machine).
        width = max(1, int(near.count.max()))
        near = near._replace(nodes=near.nodes[:, :width], seed=near.seed[:, :width], hop=near.hop[:, :width])
        valid = near.nodes >= 0
        # Rank and score of the seed each entry was reached from (entries carry the seed's id).
        from_seed = (near.seed[:, :, None] == seed_ids[:, None, :]) & valid[:, :, None]
        seed_score = torch.where(from_seed, seed_scores[:, None, :], -math.inf).amax(-1)
        match = self._cosines(near.nodes, q)
        score = seed_score.clamp_min(0.0) * match.clamp_min(0.0)
        score = torch.where(valid, score, -math.inf)
        order = torch.argsort(score, dim=1, descending=True, stable=True)
        if ranking == "round-robin":
            order = _round_robin(order, from_seed.int().argmax(-1), valid, seed_ids.shape[1])
        nodes = near.nodes.gather(1, order)
        node_scores = score.gather(1, order)
        node_hops = near.hop.gather(1, order)
        if bridges is not None:
            bridges = self._check_bridges(bridges, num_q)
            nodes = torch.cat([bridges, nodes], 1)
            node_scores = torch.cat([torch.where(bridges >= 0, 1.0, -math.inf).to(node_scores.dtype),
                                     node_scores], 1)
            node_hops = torch.cat([torch.where(bridges >= 0, 0, -1).to(node_hops.dtype), node_hops], 1)
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
        return GraphHits(seed_ids, seed_scores, nodes, node_scores.float(), node_hops, chunk_rows,
                         chunk_scores.float(), chunk_nodes, near.truncated, timings)

    def _check_bridges(self, bridges, num_q: int) -> torch.Tensor:
        bridges = torch.as_tensor(bridges)
        if bridges.dim() != 2 or bridges.shape[0] != num_q or bridges.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"bridges must be an int ({num_q}, b) tensor of relation node ids, got "
                             f"{tuple(bridges.shape)} {bridges.dtype}")
        bridges = bridges.long()
        listed = bridges[bridges >= 0]
        if bool((bridges < -1).any()) or bool((listed >= self.num_nodes).any()) or \
                bool((self.kinds[listed] != RELATION).any()):
            raise ValueError(f"bridges must be relation node ids (below {self.num_nodes}) or -1")
        return bridges

    def _cosines(self, nodes: torch.Tensor, q: torch.Tensor, block: int = 16) -> torch.Tensor:
        """(Q, C) dot products of each query with the embeddings of its nodes (``-1`` entries: any value),
        in blocks of queries to bound memory."""
        out = torch.empty(nodes.shape, dtype=torch.float32)
        handles = self._node_handles.handles_of(nodes.clamp_min(0))
        for start in range(0, nodes.shape[0], block):
            rows = self._nodes.reconstruct(handles[start:start + block])
            out[start:start + block] = torch.bmm(rows, q[start:start + block, :, None])[..., 0]
        return out

    def search_flat(self, queries: torch.Tensor, chunks: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
        """The baseline: cosine top-k over chunk embeddings; (rows, scores) (Q, chunks), -1 / -inf padded."""
        q = _check_queries(queries, self.dim)
        if self.num_chunks == 0:
            return (torch.full((q.shape[0], chunks), -1, dtype=torch.int64),
                    torch.full((q.shape[0], chunks), -math.inf))
        res = self._chunk_keys.search(q, chunks, backend=self.backend)
        return self._chunk_handles.dense_of(res.ids), res.scores

    def seed_relations(self, seeds: torch.Tensor, limit: int | None = None) -> list[list[tuple[int, int, int]]]:
        """LightRAG's relation listing of a local query: every relation touching the seeds, ranked.

        For each row of ``seeds`` (Q, k) node ids (``-1`` ignored): the relations adjacent to its entity
        seeds (a relation seed lists itself), each once, as ``(relation node, rank, weight)`` ordered
        by ``rank`` then ``weight``, both descending -- LightRAG's ``(edge_degree, weight)`` sort:
        ``rank`` is the sum of the degrees of the relation's head and tail (a degree: the relations
        touching an entity; LightRAG merges the relations of one entity pair into one edge, here
        each predicate is its own relation), ``weight`` the chunks that stated the relation (where
        LightRAG sums the strengths its extractor gave).  Equal keys keep the order first met: seeds in
        their order, each seed's relations newest first (LightRAG's sort is stable too).  At most
        ``limit`` per row (None: all).
        """
        seeds = torch.as_tensor(seeds)
        if seeds.dim() != 2:
            raise ValueError(f"seeds must be a (Q, k) tensor of node ids, got shape {tuple(seeds.shape)}")
        if limit is not None:
            limit = check_int(limit, "limit", 0)
        ptr, col = self._adj
        map_ptr = self._map[0]
        kinds = self.kinds
        out = []
        for row in seeds.tolist():
            listed: dict[int, None] = {}
            for seed in row:
                if seed < 0:
                    continue
                if seed >= self.num_nodes:
                    raise ValueError(f"seeds must be node ids below {self.num_nodes} (or -1), got {seed}")
                if int(kinds[seed]) == RELATION:
                    listed.setdefault(seed)
                else:
                    listed.update(dict.fromkeys(col[ptr[seed]:ptr[seed + 1]].tolist()))
            rels = torch.tensor(list(listed), dtype=torch.int64)
            heads, tails = self._head.values[rels], self._tail.values[rels]
            degree = ptr[1:] - ptr[:-1]
            rank = degree[heads] + degree[tails]
            weight = map_ptr[rels + 1] - map_ptr[rels]
            entries = sorted(zip(rels.tolist(), rank.tolist(), weight.tolist()), key=lambda e: (e[1], e[2]),
                             reverse=True)  # stable, as LightRAG's: equal keys keep the order first met
            out.append(entries if limit is None else entries[:limit])
        return out

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
        num_rows = self.num_chunks
        u_rel = utility(self._access.values[relations], self._last.values[relations], now, alpha=alpha, beta=beta,
                        tau=tau)
        u_chunk = utility(self._chunk_access.values, self._chunk_last.values, now, alpha=alpha, beta=beta, tau=tau)
        cost = torch.cat([self._chunk_cost.values, self._cost.values[relations]])
        ratio = torch.cat([u_chunk, u_rel]) / cost.to(torch.float64)
        created = torch.cat([self._chunk_time.values, self._created.values[relations]])
        # Least utility per word first; older first among equals.
        doomed = least_useful(ratio, created, cost, total - low_water * budget)
        chunk_keep = torch.ones(num_rows, dtype=torch.bool)
        chunk_keep[doomed[doomed < num_rows]] = False
        node_keep = torch.ones(self.num_nodes, dtype=torch.bool)
        node_keep[relations[doomed[doomed >= num_rows] - num_rows]] = False
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
        live_edges = row_counts(adj_ptr, node_keep[adj_col])
        live_links = row_counts(map_ptr, chunk_keep[map_col])
        entities = self.kinds == ENTITY
        orphaned = entities & node_keep & (live_edges == 0) & (live_links == 0)
        node_keep = node_keep & ~orphaned
        # The name maps and the indexes lose exactly the removed entries (keys computed before renumbering).
        gone = (~node_keep).nonzero()[:, 0]
        handle = self._node_handles.handle
        gone_handles = handle[gone.numpy()]
        heads = handle[self._head.values[gone].clamp_min(0).numpy()].tolist()
        tails = handle[self._tail.values[gone].clamp_min(0).numpy()].tolist()
        for text, predicate, kind, head, tail in zip(self.texts.of_handles(gone_handles),
                                                     self.predicates.of_handles(gone_handles),
                                                     self.kinds[gone].tolist(), heads, tails):
            if kind == ENTITY:
                del self._entity_ids[name_key(text)]
            else:
                del self._relation_ids[(head, predicate, tail)]
        if gone.numel():
            self._nodes.remove(torch.from_numpy(gone_handles))
            self.texts.drop(gone_handles)
            self.predicates.drop(gone_handles)
        gone_rows = ~chunk_keep
        if bool(gone_rows.any()):
            gone_chunks = self._chunk_handles.handle[gone_rows.numpy()]
            self._chunk_keys.remove(torch.from_numpy(gone_chunks))
            self.chunks.drop(gone_chunks)
        self._node_handles.keep(node_keep.numpy())
        self._chunk_handles.keep(chunk_keep.numpy())
        node_rows, chunk_rows = node_keep.nonzero()[:, 0], chunk_keep.nonzero()[:, 0]
        node_map = torch.where(node_keep, torch.cumsum(node_keep, 0) - 1, -1)
        chunk_map = torch.where(chunk_keep, torch.cumsum(chunk_keep, 0) - 1, -1)
        self._adj = compact_csr(adj_ptr, adj_col, node_map, node_map)
        self._map = compact_csr(map_ptr, map_col, node_map, chunk_map)
        for col in (self._kind, self._access, self._last, self._created, self._cost):
            col.keep(node_rows)
        for col in (self._head, self._tail):
            col.keep(node_rows)
            ids = col.values
            ids.copy_(torch.where(ids >= 0, node_map[ids.clamp_min(0)], ids))
        for col in (self._chunk_access, self._chunk_last, self._chunk_cost, self._chunk_time):
            col.keep(chunk_rows)
        self._commit()
        return int(orphaned.sum())

    def _rebuild_keys(self) -> None:
        """Name maps of a loaded graph (handle = node id)."""
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
            "embedding": self._nodes.keys.clone(), "kind": self._kind.values.clone(),
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
        n = len(state["texts"])
        self._node_handles.reset(n)
        self.texts = HandleList(self._node_handles, state["texts"])
        self.predicates = HandleList(self._node_handles, state["predicates"])
        for col, key in ((self._kind, "kind"), (self._head, "head"), (self._tail, "tail"),
                         (self._access, "access"), (self._last, "last"), (self._created, "created"),
                         (self._cost, "cost"), (self._chunk_access, "chunk_access"),
                         (self._chunk_last, "chunk_last")):
            col.load(state[key])
        # The saved node rows are the index's own unit rows: stored as they are, so searches answer as before.
        self._nodes = CosineIndex.from_state_dict(
            {"dim": self.dim, "keys": state["embedding"].float(), "ids": torch.arange(n), "next_id": n},
            path="MemVerse state 'graph.embedding'", **SCAN_COPIES[self.scan_copy])
        chunks = _chunks_from_state(state["chunks"])
        self._chunk_keys = self._index()
        self._chunk_handles = Handles()
        self._chunk_handles.issue(len(chunks))
        self.chunks = HandleList(self._chunk_handles, chunks)
        if self.chunks:
            self._chunk_keys.add(torch.stack([c.embedding.float() for c in self.chunks]))
        self._chunk_cost.load(torch.tensor([max(1, len(c.text.split())) for c in self.chunks], dtype=torch.int64))
        self._chunk_time.load(torch.tensor([c.t_end for c in self.chunks], dtype=torch.float64))
        self._adj = tuple(state["adjacency"])
        self._map = tuple(state["chunk_links"])
        self.timings = Counter(state.get("timings", {}))
        self._rebuild_keys()
        self._commit()


def _int64(items: array) -> torch.Tensor:
    """A flat int64 array ("q") as a tensor (a copy: the array may grow again)."""
    return torch.frombuffer(items, dtype=torch.int64).clone() if len(items) else torch.zeros(0, dtype=torch.int64)


def _reserve_bulk(index: CosineIndex, count: int) -> None:
    """Before a bulk add to ``index`` (more than one EMBED_BLOCK of rows): room for them plus BULK_HEADROOM of
    the total, in one allocation."""
    if count > EMBED_BLOCK:
        index.reserve(count + int((len(index) + count) * BULK_HEADROOM))


def _predicate_key(predicate: str) -> str:
    # Interned: a graph holds a handful of predicates, each named by up to millions of relations.
    return sys.intern(" ".join(predicate.lower().split()))


def _check_queries(queries, dim: int) -> torch.Tensor:
    q = torch.as_tensor(queries)
    if q.dim() == 1:
        q = q[None]
    if q.dim() != 2 or q.shape[1] != dim or q.shape[0] < 1 or not q.is_floating_point():
        raise ValueError(f"queries must be a float (Q, {dim}) tensor with Q >= 1, got {tuple(q.shape)} {q.dtype}")
    if not bool(torch.isfinite(q).all()):
        raise ValueError("queries must be finite")
    return F.normalize(q.float(), dim=1).contiguous()


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
