"""Memory graph: CSR adjacency, batched k-hop neighbourhood expansion, graph retrieval.

MemVerse keeps long-term memory as a multimodal knowledge graph: entities and
relations extracted from captions and dialogue, each with an embedding.
Retrieval finds the entities and relations closest to a question and expands
their neighbourhood to collect the facts around them and the memory chunks
they came from.  This module holds the kernels for that; building the graph
(entity extraction, merging, bounded growth) and the parametric memory
(fine-tuning a model on the graph, out of scope for this package) belong to
the recipe that uses them.

Storage (:class:`CSRGraph`) is compressed sparse rows, never Python node
objects:

* ``row_ptr (R+1,)`` int64, ``row_ptr[0] == 0``, non-decreasing,
  ``row_ptr[R] == E``; row ``u``'s entries are
  ``col_idx[row_ptr[u]:row_ptr[u+1]]``;
* ``col_idx (E,)`` int64 targets in ``[0, num_cols)``; self-loops and repeated
  entries are allowed (a repeated target is listed once by the expansion);
* ``edge_ids (E,)`` int64 (graphs built by :meth:`CSRGraph.from_edges`): the
  index in the caller's edge list of each CSR entry, so that per-edge data
  (relation type, weight, embedding) is read as ``edge_type[graph.edge_ids]``.

Entities and relations are both nodes: a relation instance (head, relation,
tail) is a node joined to its head and to its tail, so cosine top-k over the
node embeddings finds entities and relations alike, one hop from a relation
reaches both its arguments, and two hops from an entity reach the entities it
is related to.  The same CSR form maps nodes to the memory chunks they came
from (``R`` = nodes, ``num_cols`` = chunks).

**Row order is priority.**  With ``max_fanout=f`` the expansion follows the
first ``f`` entries of each row, in row order.  :meth:`CSRGraph.from_edges`
writes every row by edge weight descending, then target id ascending (then
input order), so the cap keeps the strongest edges and, without weights, the
lowest ids; a caller building CSR by hand decides the priority by the order it
writes.

Expansion (:func:`khop_neighbourhood`), per query ``b``, appends to one list in
a fixed order -- a level-synchronous breadth-first search:

* hop 0: the distinct seeds ``seeds[b]`` in column order (``-1`` entries are
  skipped), each its own seed;
* hop ``h = 1..hops``: for each node ``u`` of hop ``h-1`` in list order, the
  first ``max_fanout`` entries of ``u``'s row in row order; an entry whose
  target ``v`` is not listed yet appends ``v`` with hop ``h``, ``seed`` = the
  seed ``u`` came from, ``parent = u`` and ``edge`` = the entry's position in
  ``col_idx``;
* ``max_frontier`` caps the nodes a hop ``h >= 1`` appends: once the hop holds
  that many, its other candidates are dropped (and may still be reached at the
  next hop, with the next hop number); the seeds are not capped by it;
* ``capacity`` caps the whole list: the query stops when it is full.
  ``truncated[b]`` is true when a larger capacity would have returned more
  nodes (a node the other caps admit was turned away by a full list).

So a node is listed once, at its breadth-first distance from the seeds over
the edges the caps follow; each hop's nodes come grouped by seed, in seed
order, so a node that several seeds reach at that distance is credited to the
first of them; ``hop`` is non-decreasing along a list.  The output is fixed-width and padded -- ``(B, capacity)`` arrays with
``-1`` after ``count[b]`` entries -- so a batch needs no host synchronisation
on a GPU: every capacity is an argument.

:func:`neighbourhood_chunks` gathers, per query, the distinct chunks of a
node list (the expansion's ``nodes``) through a node -> chunk CSR, in list
order then row order, capped at ``capacity`` per query.

:func:`graph_retrieve` is the retrieval: :func:`~streammem_kernels.cosine_topk`
seeds over the node embeddings (optionally only those scoring at least
``min_score``), their expansion, and optionally their chunks.

Backends of the expansion: ``torch`` (the reference: per hop, a padded
candidate matrix, deduplicated by sorting), ``cpp`` (a breadth-first search
per query in C++, OpenMP over queries, a visited bitmap per thread),
``triton`` (one program per query runs every hop in one launch; visited
bitmap per query, candidates deduplicated inside each block, see
``_graph_triton.py``).  All three return identical integers.  The ``torch``
backend without ``max_fanout`` pads candidates to the graph's largest degree,
which a :class:`CSRGraph` on CUDA reads once (one synchronisation, then cached);
every other path, and the Triton backend always, runs without host
synchronisation.  On CPU, an expansion with int64 C-contiguous seeds and the
C++ backend is one native call that reads the graph and the seeds in place;
so is a :func:`graph_retrieve` of float32 C-contiguous queries (``Q < 8``)
and embeddings without a chunk map: the seed top-k (the scan of
:func:`~streammem_kernels.cosine_topk`'s C++ backend, reached by address),
``min_score`` and the expansion in one call.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from ..runtime.dispatch import Op, call_op, load_native
from ..runtime.validate import as_tensor, check_dtype, check_finite, check_float, check_int, check_rank, check_values
from ..tree.topk import _FAST_MAX_K, BLAS_MIN_QUERIES, COSINE_TOPK, TopKResult, _new_tuple, cosine_topk

__all__ = [
    "CSRGraph",
    "Neighbourhood",
    "SourceChunks",
    "GraphRetrieval",
    "khop_neighbourhood",
    "neighbourhood_chunks",
    "graph_retrieve",
]

_INT_INPUTS = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
_FLOAT_INPUTS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
# "No cap" for max_fanout / max_frontier; capacities must stay below it (the kernels count in int32).
NO_CAP = 2**31 - 1
# Sorts after every id (the reference's padding key).
_ABSENT = torch.iinfo(torch.int64).max
_from_numpy = torch.from_numpy
_is_compiling = torch.compiler.is_compiling
# The address of tree.cpp's top-k behind its C signature (read once; the module is never unloaded).
_TOPK_INTO: list[int] = []


# --------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------
class Neighbourhood(NamedTuple):
    """Batched k-hop neighbourhoods, in the expansion's order (see the module docstring).

    Attributes
    ----------
    nodes : (B, C) int64
        Node ids, seeds first, then hop by hop; ``-1`` after ``count[b]``.
    hop : (B, C) int64
        Breadth-first distance from the seeds (0 for a seed); ``-1`` padding.
    seed : (B, C) int64
        The seed node each entry was reached from (itself for a seed); ``-1`` padding.
    parent : (B, C) int64
        The node of the previous hop it was reached from; ``-1`` for seeds and padding.
    edge : (B, C) int64
        Position in ``col_idx`` of the entry it was reached through (map to the
        caller's edges with ``graph.edge_ids``); ``-1`` for seeds and padding.
    count : (B,) int64
        Entries listed per query.
    truncated : (B,) bool
        True when a larger ``capacity`` would have listed more nodes.
    """

    nodes: torch.Tensor
    hop: torch.Tensor
    seed: torch.Tensor
    parent: torch.Tensor
    edge: torch.Tensor
    count: torch.Tensor
    truncated: torch.Tensor


class SourceChunks(NamedTuple):
    """The distinct chunks a node list came from, per query.

    Attributes
    ----------
    chunks : (B, C) int64
        Chunk ids in list order (the order of the nodes, then of each node's
        chunk row); ``-1`` after ``count[b]``.
    node : (B, C) int64
        The first node of the list that maps to each chunk; ``-1`` padding.
    count : (B,) int64
    truncated : (B,) bool
        True when a larger ``capacity`` would have listed more chunks.
    """

    chunks: torch.Tensor
    node: torch.Tensor
    count: torch.Tensor
    truncated: torch.Tensor


class GraphRetrieval(NamedTuple):
    """Result of :func:`graph_retrieve`.

    Attributes
    ----------
    seeds : (Q, k) int64
        Seed node ids by cosine, best first; ``-1`` where fewer nodes exist or
        score below ``min_score``.
    seed_scores : (Q, k) float32
        Their cosine similarity; ``-inf`` where ``seeds`` is ``-1``.
    neighbourhood : Neighbourhood
        The expansion of the seeds (``B = Q``).
    chunks : SourceChunks or None
        The chunks of the neighbourhood's nodes, when a chunk map was given.
    """

    seeds: torch.Tensor
    seed_scores: torch.Tensor
    neighbourhood: Neighbourhood
    chunks: SourceChunks | None


# --------------------------------------------------------------------------
# Storage
# --------------------------------------------------------------------------
def _index_vector(x, name: str, device=None) -> torch.Tensor:
    t = as_tensor(x, name)
    check_rank(t, name, (1,), "(n,)")
    check_dtype(t, name, _INT_INPUTS)
    if device is not None and t.device != torch.device(device):
        raise ValueError(f"{name} must be on {device}, got {t.device}")
    return t.to(torch.int64).contiguous()


class CSRGraph:
    """Compressed sparse row adjacency, validated once at construction.

    Parameters
    ----------
    row_ptr : (R+1,) int tensor or array
        ``row_ptr[0] == 0``, non-decreasing, ``row_ptr[R] == E``.
    col_idx : (E,) int tensor or array
        Targets in ``[0, num_cols)``, on ``row_ptr``'s device.  Each row's
        order is its priority under ``max_fanout`` (see the module docstring).
    num_cols : int, optional
        Size of the target id space (default ``R``: a graph over R nodes).
        A node -> chunk map has ``num_cols`` = the number of chunks.

    The tensors are converted to contiguous int64 (a copy only when they are
    not already) and must not be modified afterwards.  On CUDA tensors the
    value checks are device-side assertions (no synchronisation).  A graph is
    immutable after construction, so any number of threads may query it at
    once.
    """

    def __init__(self, row_ptr, col_idx, *, num_cols: int | None = None):
        row_ptr = as_tensor(row_ptr, "row_ptr")
        check_rank(row_ptr, "row_ptr", (1,), "(R+1,)")
        check_dtype(row_ptr, "row_ptr", _INT_INPUTS)
        if row_ptr.numel() < 1:
            raise ValueError("row_ptr must have shape (R+1,) with R >= 0, got an empty tensor")
        col_idx = _index_vector(col_idx, "col_idx", row_ptr.device)
        row_ptr = row_ptr.to(torch.int64).contiguous()
        num_rows = row_ptr.numel() - 1
        num_cols = num_rows if num_cols is None else check_int(num_cols, "num_cols", minimum=0)
        num_edges = col_idx.numel()
        if num_rows >= NO_CAP or num_cols >= NO_CAP:
            raise ValueError(f"a CSRGraph holds fewer than 2**31 - 1 rows and columns, got {num_rows} x {num_cols}")
        steps = row_ptr[1:] - row_ptr[:-1]
        check_values((row_ptr[0] == 0) & (row_ptr[-1] == num_edges),
                     f"row_ptr must start at 0 and end at len(col_idx)={num_edges}")
        if num_rows:
            check_values(steps.min() >= 0, "row_ptr must be non-decreasing")
        if num_edges:
            low, high = torch.aminmax(col_idx)
            check_values((low >= 0) & (high < num_cols), f"col_idx must hold ids in [0, num_cols={num_cols})")
        self._init(row_ptr, col_idx, num_cols, None)
        if row_ptr.device.type == "cpu":  # free here; on CUDA it would synchronise, so it waits until needed
            self._max_degree = int(steps.max()) if num_rows else 0

    def _init(self, row_ptr, col_idx, num_cols, edge_ids):
        self._row_ptr, self._col_idx, self._num_cols, self._edge_ids = row_ptr, col_idx, num_cols, edge_ids
        self._max_degree: int | None = None

    @classmethod
    def from_edges(cls, src, dst, num_rows: int, *, num_cols: int | None = None, weight=None,
                   symmetric: bool = False) -> "CSRGraph":
        """Build CSR from an edge list, each row in priority order.

        Parameters
        ----------
        src, dst : (E,) int tensor or array
            Edge ``i`` goes from ``src[i]`` in ``[0, num_rows)`` to ``dst[i]``
            in ``[0, num_cols)``.  Repeated edges and self-loops are kept.
        num_rows : int
        num_cols : int, optional
            Default ``num_rows``.
        weight : (E,) float, optional
            Finite edge weights: each row is ordered by weight descending, then
            target ascending, then input order (without weights: target
            ascending, then input order).
        symmetric : bool
            Also add every edge reversed (``dst -> src``; a self-loop once),
            for an undirected graph; needs ``num_cols == num_rows``.

        Returns
        -------
        CSRGraph whose ``edge_ids`` give, for each CSR entry, the index ``i``
        of its input edge (a reversed copy has its original's index).
        Building synchronises once on CUDA tensors (it drops reversed
        self-loops by boolean indexing); searches never do.
        """
        num_rows = check_int(num_rows, "num_rows", minimum=0)
        num_cols = num_rows if num_cols is None else check_int(num_cols, "num_cols", minimum=0)
        if num_rows >= NO_CAP or num_cols >= NO_CAP:
            raise ValueError(f"a CSRGraph holds fewer than 2**31 - 1 rows and columns, got {num_rows} x {num_cols}")
        src = _index_vector(src, "src")
        dst = _index_vector(dst, "dst", src.device)
        if dst.numel() != src.numel():
            raise ValueError(f"src and dst must have the same length, got {src.numel()} and {dst.numel()}")
        if not isinstance(symmetric, bool):
            raise ValueError(f"symmetric must be a bool, got {symmetric!r}")
        if symmetric and num_cols != num_rows:
            raise ValueError(f"symmetric=True needs num_cols == num_rows, got {num_cols} != {num_rows}")
        if src.numel():
            check_values((src.min() >= 0) & (src.max() < num_rows), f"src must hold ids in [0, num_rows={num_rows})")
            check_values((dst.min() >= 0) & (dst.max() < num_cols), f"dst must hold ids in [0, num_cols={num_cols})")
        ids = torch.arange(src.numel(), device=src.device)
        if weight is not None:
            weight = as_tensor(weight, "weight")
            check_rank(weight, "weight", (1,), "(E,)")
            check_dtype(weight, "weight", _FLOAT_INPUTS)
            if weight.numel() != src.numel() or weight.device != src.device:
                raise ValueError(f"weight must be an (E,)=({src.numel()},) tensor on {src.device}, "
                                 f"got shape {tuple(weight.shape)} on {weight.device}")
            check_finite(weight, "weight")
            weight = weight.to(torch.float64)
        if symmetric:
            back = src != dst
            src, dst, ids = torch.cat([src, dst[back]]), torch.cat([dst, src[back]]), torch.cat([ids, ids[back]])
            if weight is not None:
                weight = torch.cat([weight, weight[back]])
        # Stable sorts from the least significant key: target, then weight, then row.
        order = torch.argsort(dst, stable=True)
        if weight is not None:
            order = order[torch.argsort(weight[order], descending=True, stable=True)]
        order = order[torch.argsort(src[order], stable=True)]
        degree = torch.bincount(src, minlength=num_rows)
        row_ptr = torch.zeros(num_rows + 1, dtype=torch.int64, device=src.device)
        row_ptr[1:] = torch.cumsum(degree, 0)
        graph = cls.__new__(cls)
        graph._init(row_ptr, dst[order].contiguous(), num_cols, ids[order].contiguous())
        if src.device.type == "cpu":
            graph._max_degree = int(degree.max()) if num_rows else 0
        return graph

    # ---- read-only views -------------------------------------------------
    @property
    def row_ptr(self) -> torch.Tensor:
        """(R+1,) int64 row offsets into ``col_idx``."""
        return self._row_ptr

    @property
    def col_idx(self) -> torch.Tensor:
        """(E,) int64 targets, each row in priority order."""
        return self._col_idx

    @property
    def edge_ids(self) -> torch.Tensor | None:
        """(E,) int64 input-edge index of each CSR entry (graphs from :meth:`from_edges`), else None."""
        return self._edge_ids

    @property
    def num_rows(self) -> int:
        return self._row_ptr.numel() - 1

    @property
    def num_cols(self) -> int:
        return self._num_cols

    @property
    def num_edges(self) -> int:
        return self._col_idx.numel()

    @property
    def device(self) -> torch.device:
        return self._row_ptr.device

    @property
    def max_degree(self) -> int:
        """Largest row length (0 for a graph without rows); read once, then cached (one sync on CUDA)."""
        if self._max_degree is None:
            steps = self._row_ptr[1:] - self._row_ptr[:-1]
            self._max_degree = int(steps.max()) if steps.numel() else 0
        return self._max_degree

    def to(self, device) -> "CSRGraph":
        """A copy on ``device``."""
        graph = CSRGraph.__new__(CSRGraph)
        ids = None if self._edge_ids is None else self._edge_ids.to(device)
        graph._init(self._row_ptr.to(device), self._col_idx.to(device), self._num_cols, ids)
        graph._max_degree = self._max_degree
        return graph

    def __repr__(self) -> str:
        return (f"CSRGraph(num_rows={self.num_rows}, num_cols={self.num_cols}, num_edges={self.num_edges}, "
                f"device={self.device})")


# --------------------------------------------------------------------------
# Public functions
# --------------------------------------------------------------------------
def _check_graph(graph, name: str) -> CSRGraph:
    if not isinstance(graph, CSRGraph):
        raise ValueError(f"{name} must be a CSRGraph, got {type(graph).__name__}")
    return graph


def _check_cap(value, name: str) -> int:
    if value is None:
        return NO_CAP
    value = check_int(value, name, minimum=1)
    return min(value, NO_CAP)


def _check_capacity(value, name: str) -> int:
    value = check_int(value, name, minimum=1)
    if value >= NO_CAP:
        raise ValueError(f"{name} must be < 2**31 - 1, got {value}")
    return value


def _prepare_ids(ids, name: str, upper: int, device: torch.device) -> torch.Tensor:
    """(B, S) int64 ids in [-1, upper), contiguous, on ``device`` (value check device-side on CUDA)."""
    ids = as_tensor(ids, name)
    check_rank(ids, name, (2,), "(B, S)")
    check_dtype(ids, name, _INT_INPUTS)
    if ids.shape[0] < 1:
        raise ValueError(f"{name} must hold at least one query row, got shape {tuple(ids.shape)}")
    if ids.device != device:
        raise ValueError(f"{name} must be on the graph's device {device}, got {ids.device}")
    ids = ids.to(torch.int64).contiguous()
    if ids.numel():
        low, high = torch.aminmax(ids)
        check_values((low >= -1) & (high < upper), f"{name} must hold ids in [0, {upper}) or -1 for none")
    return ids


def _reference_width(graph: CSRGraph, fanout: int) -> int:
    """Candidates per frontier node in the torch reference's padded matrix."""
    if fanout == NO_CAP:
        return graph.max_degree
    return fanout if graph._max_degree is None else min(fanout, graph._max_degree)


def khop_neighbourhood(graph: CSRGraph, seeds, hops: int, *, capacity: int, max_fanout: int | None = None,
                       max_frontier: int | None = None, backend: str = "auto") -> Neighbourhood:
    """Batched k-hop neighbourhoods of seed sets, in a fixed-width padded form.

    Parameters
    ----------
    graph : CSRGraph
        Square (``num_cols == num_rows``): a graph over its N nodes.
    seeds : (B, S) int tensor or array
        Seed node ids per query, in priority order (a top-k's best first);
        ``-1`` entries are skipped, repeats are listed once.  On the graph's
        device.  ``B >= 1``, ``S >= 0``.
    hops : int >= 0
        Expansion depth (0 lists the distinct seeds only).
    capacity : int >= 1
        Entries per query (the width C of every output).
    max_fanout : int >= 1, optional
        Entries of each node's row followed per hop (the first ones, in row
        order); default all.
    max_frontier : int >= 1, optional
        Nodes a hop appends at most (per query); default no cap.
    backend : {"auto", "torch", "cpp", "triton"}

    Returns
    -------
    Neighbourhood of ``(B, capacity)`` arrays (and ``count``,
    ``truncated (B,)``) on the graph's device; the order and caps are those of
    the module docstring.
    """
    fast = _khop_fast(graph, seeds, hops, capacity, max_fanout, max_frontier, backend)
    if fast is not None:
        return fast
    graph = _check_graph(graph, "graph")
    if graph.num_cols != graph.num_rows:
        raise ValueError(f"graph must be square for a k-hop expansion (num_cols == num_rows), got "
                         f"{graph.num_rows} x {graph.num_cols}; a node -> chunk map goes to neighbourhood_chunks")
    # Each hop that does not end the expansion lists at least one new node, so hops beyond the node count
    # cannot change the result: clamped, so a huge value neither loops for ages nor overflows native ints.
    hops = min(check_int(hops, "hops", minimum=0), graph.num_rows)
    capacity = _check_capacity(capacity, "capacity")
    fanout = _check_cap(max_fanout, "max_fanout")
    frontier = _check_cap(max_frontier, "max_frontier")
    sources = _prepare_ids(seeds, "seeds", graph.num_rows, graph.device)
    name = GRAPH.select(backend, graph.device)
    width = _reference_width(graph, fanout) if name == "torch" else 0
    out = call_op(torch.ops.streammem.graph_expand, GRAPH.impls, name, graph.row_ptr, graph.col_idx, sources,
                  graph.num_cols, hops, capacity, fanout, frontier, True, width)
    return Neighbourhood(*out)


def _khop_fast(graph, seeds, hops, capacity, max_fanout, max_frontier, backend) -> Neighbourhood | None:
    """The common CPU call (int64 C-contiguous seeds, plain int caps, C++ backend) in one native call
    that reads the graph and the seeds in place and checks the seed ids itself.  None: not this case
    (the general path handles it and raises its errors)."""
    if not (type(graph) is CSRGraph and type(seeds) is torch.Tensor and type(hops) is int and type(capacity) is int
            and (max_fanout is None or type(max_fanout) is int) and (max_frontier is None or type(max_frontier) is int)
            and seeds.dtype is torch.int64 and seeds.is_cpu and seeds.layout is torch.strided
            and seeds.is_contiguous() and graph._row_ptr.is_cpu):
        return None
    shape = seeds.shape
    num_rows = graph._row_ptr.shape[0] - 1
    fanout = NO_CAP if max_fanout is None else max_fanout
    frontier = NO_CAP if max_frontier is None else max_frontier
    if not (len(shape) == 2 and shape[0] >= 1 and graph._num_cols == num_rows and hops >= 0
            and 1 <= capacity < NO_CAP and fanout >= 1 and frontier >= 1):
        return None
    mod = GRAPH.cpp_module(backend)
    if mod is None or _is_compiling():
        return None
    out = mod.expand_ptr(graph._row_ptr.data_ptr(), num_rows, graph._col_idx.data_ptr(), seeds.data_ptr(), shape[0],
                         shape[1], num_rows, min(hops, num_rows), capacity, min(fanout, NO_CAP),
                         min(frontier, NO_CAP))
    return None if out is None else Neighbourhood(*map(_from_numpy, out))


def neighbourhood_chunks(nodes, chunk_map: CSRGraph, *, capacity: int, max_per_node: int | None = None,
                         backend: str = "auto") -> SourceChunks:
    """The distinct chunks each query's nodes came from, through a node -> chunk CSR map.

    Parameters
    ----------
    nodes : (B, C) int tensor or array
        Node ids per query in priority order (a :class:`Neighbourhood`'s
        ``nodes``); ``-1`` entries are skipped.  On the map's device.
    chunk_map : CSRGraph
        Row ``u`` lists the chunks node ``u`` came from (``num_rows`` = nodes,
        ``num_cols`` = chunks), e.g.
        ``CSRGraph.from_edges(node_ids, chunk_ids, num_nodes, num_cols=num_chunks)``.
    capacity : int >= 1
        Chunks per query (the output width).
    max_per_node : int >= 1, optional
        Entries of each node's chunk row followed (the first ones); default all.
    backend : {"auto", "torch", "cpp", "triton"}

    Returns
    -------
    SourceChunks: ``chunks (B, capacity)`` distinct chunk ids in order of first
    appearance (nodes in list order, each node's row in row order), the node
    that contributed each, ``count (B,)`` and ``truncated (B,)``.
    """
    chunk_map = _check_graph(chunk_map, "chunk_map")
    capacity = _check_capacity(capacity, "capacity")
    fanout = _check_cap(max_per_node, "max_per_node")
    sources = _prepare_ids(nodes, "nodes", chunk_map.num_rows, chunk_map.device)
    name = GRAPH.select(backend, chunk_map.device)
    width = _reference_width(chunk_map, fanout) if name == "torch" else 0
    chunks, _, _, node, _, count, truncated = call_op(
        torch.ops.streammem.graph_expand, GRAPH.impls, name, chunk_map.row_ptr, chunk_map.col_idx, sources,
        chunk_map.num_cols, 1, capacity, fanout, NO_CAP, False, width)
    return SourceChunks(chunks, node, count, truncated)


def graph_retrieve(queries, node_embeddings, graph: CSRGraph, *, k: int, hops: int, capacity: int,
                   max_fanout: int | None = None, max_frontier: int | None = None, min_score: float | None = None,
                   chunk_map: CSRGraph | None = None, chunk_capacity: int | None = None,
                   backend: str = "auto") -> GraphRetrieval:
    """Cosine top-k seeds over the node embeddings, then their k-hop neighbourhood (and its chunks).

    Parameters
    ----------
    queries : (Q, D) float tensor or array
    node_embeddings : (N, D) float tensor or array
        One row per graph node (entities and relations alike), on the graph's
        device; not normalised beforehand (zero rows score 0).
    graph : CSRGraph
        Square, ``num_rows == N``.
    k : int >= 1
        Seeds per query (:func:`~streammem_kernels.cosine_topk`).
    hops, capacity, max_fanout, max_frontier
        As in :func:`khop_neighbourhood`.
    min_score : float, optional
        Seeds scoring below it are dropped (``-1``) before the expansion.
    chunk_map : CSRGraph, optional
        Node -> chunk map (``num_rows == N``); when given, the result carries
        the neighbourhood's chunks (:func:`neighbourhood_chunks`).
    chunk_capacity : int >= 1, optional
        Chunks per query (default ``capacity``).
    backend : {"auto", "torch", "cpp", "triton"}
        Used for the top-k and the expansion alike.

    Returns
    -------
    GraphRetrieval on the graph's device.
    """
    if chunk_map is None and chunk_capacity is None:
        fast = _retrieve_fast(queries, node_embeddings, graph, k, hops, capacity, max_fanout, max_frontier, min_score,
                              backend)
        if fast is not None:
            return fast
    graph = _check_graph(graph, "graph")
    emb = as_tensor(node_embeddings, "node_embeddings")
    check_rank(emb, "node_embeddings", (2,), "(N, D)")
    if emb.shape[0] != graph.num_rows:
        raise ValueError(f"node_embeddings must have one row per graph node (N={graph.num_rows}), "
                         f"got shape {tuple(emb.shape)}")
    if emb.device != graph.device:
        raise ValueError(f"node_embeddings must be on the graph's device {graph.device}, got {emb.device}")
    if chunk_map is not None:
        _check_graph(chunk_map, "chunk_map")
        if chunk_map.num_rows != graph.num_rows:
            raise ValueError(f"chunk_map must have one row per graph node (N={graph.num_rows}), "
                             f"got {chunk_map.num_rows} rows")
        chunk_capacity = capacity if chunk_capacity is None else chunk_capacity
    elif chunk_capacity is not None:
        raise ValueError("chunk_capacity needs a chunk_map")
    top: TopKResult = cosine_topk(queries, emb, k, backend=backend)
    seeds = top.ids
    if min_score is not None:
        seeds = torch.where(top.scores >= check_float(min_score, "min_score"), seeds, torch.full_like(seeds, -1))
    near = khop_neighbourhood(graph, seeds, hops, capacity=capacity, max_fanout=max_fanout,
                              max_frontier=max_frontier, backend=backend)
    chunks = None
    if chunk_map is not None:
        chunks = neighbourhood_chunks(near.nodes, chunk_map, capacity=chunk_capacity, backend=backend)
    # cosine_topk already scores its -1 ids -inf; only min_score adds -1 seeds with finite scores.
    scores = top.scores if min_score is None else torch.where(seeds >= 0, top.scores,
                                                              torch.full_like(top.scores, float("-inf")))
    return GraphRetrieval(seeds, scores, near, chunks)


def _retrieve_fast(queries, node_embeddings, graph, k, hops, capacity, max_fanout, max_frontier, min_score,
                   backend) -> GraphRetrieval | None:
    """The common CPU call (plain float32 queries and embeddings, int caps, no chunk map, the C++
    backend for the top-k and the expansion) in one native call: the seed top-k (the same scan as
    cosine_topk's), min_score and the expansion, with the tensors read and value-checked in C++.
    None: not this case (the general path handles it and raises its errors)."""
    if not (type(graph) is CSRGraph and type(hops) is int and type(capacity) is int
            and (max_fanout is None or type(max_fanout) is int) and (max_frontier is None or type(max_frontier) is int)
            and (min_score is None or type(min_score) is float) and graph._row_ptr.is_cpu):
        return None
    num_rows = graph._row_ptr.shape[0] - 1
    fanout = NO_CAP if max_fanout is None else max_fanout
    frontier = NO_CAP if max_frontier is None else max_frontier
    if not (graph._num_cols == num_rows and hops >= 0 and 1 <= capacity < NO_CAP and fanout >= 1 and frontier >= 1
            and (min_score is None or math.isfinite(min_score))):
        return None
    mod, tree_mod = GRAPH.cpp_module(backend), COSINE_TOPK.cpp_module(backend)
    if mod is None or tree_mod is None or _is_compiling():
        return None
    if not _TOPK_INTO:
        _TOPK_INTO.append(tree_mod.topk_into_address())
    out = mod.retrieve(queries, node_embeddings, k, _TOPK_INTO[0], graph._row_ptr.data_ptr(), num_rows,
                       graph._col_idx.data_ptr(), min(hops, num_rows), capacity, min(fanout, NO_CAP),
                       min(frontier, NO_CAP), min_score is not None, 0.0 if min_score is None else min_score,
                       BLAS_MIN_QUERIES, _FAST_MAX_K)
    if out is None:
        return None
    return _new_tuple(GraphRetrieval, (out[0], out[1], _new_tuple(Neighbourhood, out[2:]), None))


# --------------------------------------------------------------------------
# Custom op (works under torch.compile; opcheck-tested)
# --------------------------------------------------------------------------
@torch.library.custom_op("streammem::graph_expand", mutates_args=())
def graph_expand(row_ptr: torch.Tensor, col_idx: torch.Tensor, sources: torch.Tensor, num_cols: int, hops: int,
                 capacity: int, max_fanout: int, max_frontier: int, keep_sources: bool, width: int,
                 backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                        torch.Tensor, torch.Tensor]:
    """Core expansion on prepared input (int64 contiguous CSR and sources, caps as ints; ``NO_CAP`` = none).

    Returns nodes, hop, seed, parent, edge (B, capacity) int64, count (B,) int64, truncated (B,) bool.
    ``width`` is the torch reference's candidates per frontier node (other backends ignore it).
    """
    return tuple(GRAPH.impls[backend](row_ptr, col_idx, sources, num_cols, hops, capacity, max_fanout, max_frontier,
                                      keep_sources, width))


@graph_expand.register_fake
def _(row_ptr, col_idx, sources, num_cols, hops, capacity, max_fanout, max_frontier, keep_sources, width, backend):
    num_q = sources.shape[0]
    lists = [sources.new_empty((num_q, capacity), dtype=torch.int64) for _ in range(5)]
    return (*lists, sources.new_empty((num_q,), dtype=torch.int64), sources.new_empty((num_q,), dtype=torch.bool))


# --------------------------------------------------------------------------
# Backend: torch reference (the spec)
# --------------------------------------------------------------------------
# Every shape below is fixed by host metadata (B, S, capacity, the caps, ``width``), never by
# tensor values, so the reference runs on a GPU without synchronising.
def _first_occurrences(key: torch.Tensor) -> torch.Tensor:
    """(B, W) bool: True where ``key[b, j]`` does not appear in ``key[b, :j]``."""
    order = torch.argsort(key, dim=1, stable=True)
    in_order = key.gather(1, order)
    first_in_order = torch.ones_like(in_order, dtype=torch.bool)
    first_in_order[:, 1:] = in_order[:, 1:] != in_order[:, :-1]
    return torch.empty_like(first_in_order).scatter_(1, order, first_in_order)


def _row_entries(row_ptr, col_idx, frontier, width):
    """Targets and CSR positions (B, W * width) of the first ``width`` row entries of each frontier node,
    frontier order then row order (-1 where a row is shorter or the frontier entry is -1)."""
    num_q, num_f = frontier.shape
    present = frontier >= 0
    u = frontier.clamp_min(0)
    start = row_ptr[u]
    length = torch.where(present, row_ptr[u + 1] - start, torch.zeros_like(start))
    offset = torch.arange(width, device=frontier.device)
    inside = offset < length[..., None]
    edge = torch.where(inside, start[..., None] + offset, -1).reshape(num_q, num_f * width)
    if col_idx.numel() == 0:
        return torch.full_like(edge, -1), edge
    target = torch.where(edge >= 0, col_idx[edge.clamp_min(0)], -1)
    return target, edge


def _expand_torch(row_ptr, col_idx, sources, num_cols, hops, capacity, max_fanout, max_frontier, keep_sources,
                  width):
    num_q, num_src = sources.shape
    device = sources.device
    # nodes, hop, seed, parent, edge; column `capacity` is a sink for the writes of rejected candidates.
    lists = torch.full((5, num_q, capacity + 1), -1, dtype=torch.int64, device=device)
    count = torch.zeros(num_q, dtype=torch.int64, device=device)
    truncated = torch.zeros(num_q, dtype=torch.bool, device=device)
    width = min(width, max_fanout)

    def admit(target, seed, parent, edge, hop, frontier_cap):
        """Append, row by row in column order, the targets not listed yet (first occurrences only)."""
        nonlocal count, truncated
        key = torch.where(target >= 0, target, _ABSENT)
        listed = torch.sort(torch.where(lists[0, :, :capacity] >= 0, lists[0, :, :capacity], _ABSENT), 1).values
        at = torch.searchsorted(listed, key).clamp_max(capacity - 1)
        new = (target >= 0) & (listed.gather(1, at) != key) & _first_occurrences(key)
        rank = torch.cumsum(new, 1) - 1
        room_capacity = capacity - count
        room = room_capacity.clamp_max(frontier_cap)
        take = new & (rank < room[:, None])
        dest = torch.where(take, count[:, None] + rank, capacity)
        for field, values in zip(lists, (target, torch.full_like(target, hop), seed, parent, edge)):
            field.scatter_(1, dest, values)
        n_new = new.sum(1)
        # Truncated: the capacity, not the frontier cap, turned a new node away.
        truncated = truncated | ((n_new > room) & (room_capacity < frontier_cap))
        count = count + torch.minimum(n_new, room)

    def listed_between(lo, hi, w):
        """(B, w) nodes and seeds at list positions [lo, hi) per query, -1 padded."""
        pos = lo[:, None] + torch.arange(w, device=device)
        inside = pos < hi[:, None]
        pos = pos.clamp_max(capacity)
        return (torch.where(inside, lists[0].gather(1, pos), -1), torch.where(inside, lists[2].gather(1, pos), -1))

    if keep_sources:
        none = torch.full_like(sources, -1)
        admit(sources, sources, none, none, 0, NO_CAP)
        frontier, frontier_seed = listed_between(torch.zeros_like(count), count, min(num_src, capacity))
    else:
        frontier, frontier_seed = sources, sources
    for hop in range(1, hops + 1 if row_ptr.numel() > 1 else 1):  # a graph without rows has no entries
        target, edge = _row_entries(row_ptr, col_idx, frontier, width)
        parent = torch.where(target >= 0, frontier.repeat_interleave(width, 1), -1)
        seed = torch.where(target >= 0, frontier_seed.repeat_interleave(width, 1), -1)
        before = count
        admit(target, seed, parent, edge, hop, max_frontier)
        # A hop appends at most max_frontier nodes, capacity in all, and one per candidate.
        frontier, frontier_seed = listed_between(before, count, min(max_frontier, capacity, target.shape[1]))
    nodes, hop, seed, parent, edge = lists[:, :, :capacity]
    return nodes, hop, seed, parent, edge, count, truncated


# --------------------------------------------------------------------------
# Backend: C++ (csrc/cpu/graph.cpp)
# --------------------------------------------------------------------------
def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().contiguous().numpy()


def _expand_cpp(row_ptr, col_idx, sources, num_cols, hops, capacity, max_fanout, max_frontier, keep_sources,
                width):
    mod, _ = load_native("cpu", "graph")
    out = mod.expand(_np(row_ptr), _np(col_idx), _np(sources), int(num_cols), int(hops), int(capacity),
                     int(max_fanout), int(max_frontier), bool(keep_sources))
    return tuple(torch.from_numpy(a) for a in out)


# --------------------------------------------------------------------------
# Backend: Triton (streammem_kernels/_graph_triton.py)
# --------------------------------------------------------------------------
def _expand_triton(row_ptr, col_idx, sources, num_cols, hops, capacity, max_fanout, max_frontier, keep_sources,
                   width):
    from ._triton import expand_triton

    return expand_triton(row_ptr, col_idx, sources, num_cols, hops, capacity, max_fanout, max_frontier, keep_sources)


_EXACT = {dtype: (0.0, 0.0) for dtype in _INT_INPUTS}
# graph_retrieve's seed scores come from cosine_topk on float32-converted embeddings: the same
# float32 dot products summed in a different order, whatever the input dtype.
_SEED_SCORES = {dtype: (2e-5, 1e-5) for dtype in _FLOAT_INPUTS}

GRAPH = Op(
    "graph",
    {"torch": _expand_torch, "cpp": _expand_cpp, "triton": _expand_triton},
    tolerances={backend: {**_EXACT, **_SEED_SCORES} for backend in ("torch", "cpp", "triton")},
)
