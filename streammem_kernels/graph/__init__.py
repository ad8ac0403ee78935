"""Memory graph: batched k-hop neighbourhood expansion over CSR adjacency (:class:`CSRGraph`), the
chunks a neighbourhood came from, and graph retrieval.

MemVerse keeps long-term memory as a knowledge graph whose entities and relations are both nodes,
each with an embedding; retrieval finds the nodes closest to a question and expands their
neighbourhood.  :func:`khop_neighbourhood` lists, per query, the seeds and then hop by hop the nodes
not listed yet, in a fixed order (the spec: :func:`.reference.expand_reference`), each with its hop,
seed, parent and the CSR entry it came through, in fixed-width ``(B, capacity)`` arrays padded with
-1 (so a batch needs no host synchronisation); :func:`neighbourhood_chunks` gathers the distinct
chunks of a node list through a node -> chunk CSR map; :func:`graph_retrieve` is
:func:`~streammem_kernels.cosine_topk` seeds over the node embeddings, their expansion and
optionally their chunks.  Backends of the expansion: ``torch`` (the reference), ``cpp`` and
``triton``, which return identical integers.  ``docs/ops/graph.md`` describes the order, the caps
and the kernels.
"""
from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np
import torch

from ..runtime.dispatch import Op, call_op, load_native, trace_constant
from ..runtime.native import NativeChecks, view
from ..runtime.validate import as_tensor, check_dtype, check_float, check_int, check_rank, check_values
from ..tree import TopKResult, cosine_topk
from .csr import GRAPH_HANDLES, CSRGraph
from .reference import FLOAT_INPUTS, INT_INPUTS, NO_CAP, expand_reference

__all__ = [
    "CSRGraph",
    "Neighbourhood",
    "SourceChunks",
    "GraphRetrieval",
    "khop_neighbourhood",
    "neighbourhood_chunks",
    "graph_retrieve",
]


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


def _check_lists(queries: int, capacity: int, name: str, most: int) -> None:
    """``ValueError`` naming ``name`` when ``queries x capacity`` result entries exceed :data:`MAX_LIST_ENTRIES`."""
    if queries * capacity > MAX_LIST_ENTRIES:
        raise ValueError(f"{name}={capacity} for {queries} queries asks for {queries * capacity} result entries, more "
                         f"than {MAX_LIST_ENTRIES} (2**28); a result lists at most {most} ids here, so {name} <= "
                         f"{max(most, 1)} suffices")


def _prepare_ids(ids, name: str, upper: int, device: torch.device) -> torch.Tensor:
    """(B, S) int64 ids in [-1, upper), contiguous, on ``device`` (value check device-side on CUDA)."""
    ids = as_tensor(ids, name)
    check_rank(ids, name, (2,), "(B, S)")
    check_dtype(ids, name, INT_INPUTS)
    if ids.shape[0] < 1:
        raise ValueError(f"{name} must hold at least one query row, got shape {tuple(ids.shape)}")
    if ids.device != device:
        raise ValueError(f"{name} must be on the graph's device {device}, got {ids.device}")
    ids = ids.to(torch.int64).contiguous()
    if ids.numel():
        low, high = torch.aminmax(ids)
        check_values((low >= -1) & (high < upper), f"{name} must hold ids in [0, {upper}) or -1 for none")
    return ids


@trace_constant
def _max_degree(handle: str) -> int:
    """``max_degree`` of the graph with this handle, read outside the graph while torch.compile traces
    (on CUDA the first read synchronises; the graph comes by its handle, a constant, as Dynamo
    requires); a CSRGraph is immutable, so a compiled function may keep it."""
    return GRAPH_HANDLES[handle].max_degree


def _reference_width(graph: CSRGraph, fanout: int) -> int:
    """Candidates per frontier node in the torch reference's padded matrix."""
    if fanout == NO_CAP:
        return _max_degree(graph._handle)
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
    fast = GRAPH.run_fast(backend, graph, seeds, hops, capacity, max_fanout, max_frontier)
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
    _check_lists(sources.shape[0], capacity, "capacity", graph.num_rows)
    name = GRAPH.select(backend, graph.device)
    width = _reference_width(graph, fanout) if name == "torch" else 0
    out = call_op(torch.ops.streammem.graph_expand, GRAPH.impls, name, graph._row_ptr, graph._col_idx, sources,
                  graph.num_cols, hops, capacity, fanout, frontier, True, width)
    return Neighbourhood(*out)


def neighbourhood_chunks(nodes, chunk_map: CSRGraph, *, capacity: int, max_per_node: int | None = None,
                         backend: str = "auto", capacity_name: str = "capacity") -> SourceChunks:
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
    capacity_name : str
        The name errors about ``capacity`` give it (a caller's own argument's).

    Returns
    -------
    SourceChunks: ``chunks (B, capacity)`` distinct chunk ids in order of first
    appearance (nodes in list order, each node's row in row order), the node
    that contributed each, ``count (B,)`` and ``truncated (B,)``.
    """
    chunk_map = _check_graph(chunk_map, "chunk_map")
    capacity = _check_capacity(capacity, capacity_name)
    fanout = _check_cap(max_per_node, "max_per_node")
    sources = _prepare_ids(nodes, "nodes", chunk_map.num_rows, chunk_map.device)
    _check_lists(sources.shape[0], capacity, capacity_name, chunk_map.num_cols)
    name = GRAPH.select(backend, chunk_map.device)
    width = _reference_width(chunk_map, fanout) if name == "torch" else 0
    chunks, _, _, node, _, count, truncated = call_op(
        torch.ops.streammem.graph_expand, GRAPH.impls, name, chunk_map._row_ptr, chunk_map._col_idx, sources,
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
        fast = GRAPH_RETRIEVE.run_fast(backend, queries, node_embeddings, graph, k, hops, capacity, max_fanout,
                                       max_frontier, min_score)
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
    chunk_capacity_default = chunk_capacity is None
    if chunk_map is not None:
        _check_graph(chunk_map, "chunk_map")
        if chunk_map.num_rows != graph.num_rows:
            raise ValueError(f"chunk_map must have one row per graph node (N={graph.num_rows}), "
                             f"got {chunk_map.num_rows} rows")
        chunk_capacity = capacity if chunk_capacity is None else _check_capacity(chunk_capacity, "chunk_capacity")
    elif chunk_capacity is not None:
        raise ValueError("chunk_capacity needs a chunk_map")
    try:
        top: TopKResult = cosine_topk(queries, emb, k, backend=backend)
    except ValueError as exc:  # its own argument names: the caller passed node_embeddings as keys
        raise ValueError(re.sub(r"\bkeys\b", "node_embeddings", str(exc))) from None
    seeds = top.ids
    if min_score is not None:
        seeds = torch.where(top.scores >= check_float(min_score, "min_score"), seeds, torch.full_like(seeds, -1))
    near = khop_neighbourhood(graph, seeds, hops, capacity=capacity, max_fanout=max_fanout,
                              max_frontier=max_frontier, backend=backend)
    chunks = None
    if chunk_map is not None:
        chunks = neighbourhood_chunks(near.nodes, chunk_map, capacity=chunk_capacity, backend=backend,
                                      capacity_name="capacity" if chunk_capacity_default else "chunk_capacity")
    # cosine_topk already scores its -1 ids -inf; only min_score adds -1 seeds with finite scores.
    scores = top.scores if min_score is None else torch.where(seeds >= 0, top.scores,
                                                              torch.full_like(top.scores, float("-inf")))
    return GraphRetrieval(seeds, scores, near, chunks)


# --------------------------------------------------------------------------
# Custom op (works under torch.compile; opcheck-tested)
# --------------------------------------------------------------------------
@torch.library.custom_op("streammem::graph_expand", mutates_args=())
def graph_expand(row_ptr: torch.Tensor, col_idx: torch.Tensor, sources: torch.Tensor, num_cols: int, hops: int,
                 capacity: int, max_fanout: int, max_frontier: int, keep_sources: bool, width: int,
                 backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                        torch.Tensor, torch.Tensor]:
    """``torch.ops.streammem.graph_expand`` (its schema: docs/compile.md).

    Core expansion on prepared input (int64 contiguous CSR and sources, caps as ints; ``NO_CAP`` = none).

    Returns nodes, hop, seed, parent, edge (B, capacity) int64, count (B,) int64, truncated (B,) bool.
    ``width`` is the torch reference's candidates per frontier node (other backends ignore it).
    """
    out = tuple(GRAPH.impls[backend](row_ptr, col_idx, sources, num_cols, hops, capacity, max_fanout, max_frontier,
                                     keep_sources, width))
    if backend != "cpp":  # the torch and Triton lists are views of one table, and an op's outputs may not alias
        out = tuple(t.clone() for t in out[:5]) + out[5:]
    return out


@graph_expand.register_fake
def _(row_ptr, col_idx, sources, num_cols, hops, capacity, max_fanout, max_frontier, keep_sources, width, backend):
    num_q = sources.shape[0]
    lists = [sources.new_empty((num_q, capacity), dtype=torch.int64) for _ in range(5)]
    return (*lists, sources.new_empty((num_q,), dtype=torch.int64), sources.new_empty((num_q,), dtype=torch.bool))


# --------------------------------------------------------------------------
# Backend: C++ (csrc/cpu/graph.cpp), and the latency paths GRAPH and GRAPH_RETRIEVE declare
# --------------------------------------------------------------------------
_IDS_RANGE = "{name} must hold ids in [0, {upper}) or -1 for none"
_EXPAND_CHECKS = NativeChecks(_IDS_RANGE)
# graph_retrieve's seeds come from cosine_topk's scan: its checks, with its messages.
_RETRIEVE_CHECKS = NativeChecks("queries must be finite, found NaN or Inf",
                                "node_embeddings must be finite, found NaN or Inf")
# The entries of a call's (B, capacity) results (five int64 arrays): beyond this (10 GiB of results) a
# capacity is a mistake, stopped with a ValueError before any allocation.  A neighbourhood lists at most
# the graph's node (or chunk) count, so capacity <= that count always suffices.
MAX_LIST_ENTRIES = 1 << 28

_TENSOR, _F32, _I64, _STRIDED, _INF = torch.Tensor, torch.float32, torch.int64, torch.strided, float("inf")
# Results allocated through numpy (about 0.7 us against 1.4 for torch.empty with a shape and a dtype),
# handed to the kernel by the array's own DLPack capsule (0.08 us against 0.22 for a tensor's); the bool
# flags likewise where numpy exports bool arrays (1.25 on), else by torch's capsule.
_from_numpy, _np_empty, _NP_F32, _NP_I64, _NP_BOOL = torch.from_numpy, np.empty, np.float32, np.int64, np.bool_
_NUMPY_BOOL_DLPACK = np.lib.NumpyVersion(np.__version__) >= "1.25.0"

# Builds a NamedTuple without its Python-level __new__.
_new_tuple = tuple.__new__
# graph_retrieve's fused call runs cosine_topk's one-pass scan, which cosine_topk itself runs for
# fewer than 8 queries (from 8 up its C++ backend filters with BLAS GEMMs, faster on large batches:
# those take the general path); the seeds it allocates per query are bounded likewise.
_FUSED_MAX_QUERIES = 8
_FUSED_MAX_SEEDS = 1 << 20


def _graph_views(graph: CSRGraph):
    """(row_ptr's view, col_idx's view, R) of a square CPU graph for the C++ backend, made once per graph;
    False for any other graph (on another device, or a node -> chunk map)."""
    views = graph._native
    if views is None:
        row_ptr = graph._row_ptr
        num_rows = row_ptr.shape[0] - 1
        square = row_ptr.is_cpu and graph._num_cols == num_rows
        views = graph._native = (view(row_ptr), view(graph._col_idx), num_rows) if square else False
    return views


def _khop_fast(mod, graph, seeds, hops, capacity, max_fanout, max_frontier):
    """khop_neighbourhood of int64 C-contiguous CPU seeds with plain int caps: one native call that
    reads the graph and the seeds in place and checks the seed ids."""
    if not (type(graph) is CSRGraph and type(seeds) is _TENSOR and type(hops) is int and type(capacity) is int
            and seeds.dtype is _I64 and seeds.is_cpu and seeds.layout is _STRIDED and seeds.is_contiguous()
            and hops >= 0 and 1 <= capacity < NO_CAP):
        return None
    views = graph._native
    if views is None:
        views = _graph_views(graph)
    shape = seeds.shape
    if not (views and len(shape) == 2 and shape[0] >= 1):
        return None
    if max_fanout is None:
        fanout = NO_CAP
    elif type(max_fanout) is int and max_fanout >= 1:
        fanout = min(max_fanout, NO_CAP)
    else:
        return None
    if max_frontier is None:
        frontier = NO_CAP
    elif type(max_frontier) is int and max_frontier >= 1:
        frontier = min(max_frontier, NO_CAP)
    else:
        return None
    row_ptr, col_idx, num_rows = views
    num_q = shape[0]
    if num_q * capacity > MAX_LIST_ENTRIES:
        return None  # the checked path says why
    lists = (num_q, capacity)
    nodes, hop, seed, parent, edge = (_np_empty(lists, _NP_I64), _np_empty(lists, _NP_I64), _np_empty(lists, _NP_I64),
                                      _np_empty(lists, _NP_I64), _np_empty(lists, _NP_I64))
    count, flags = _np_empty(num_q, _NP_I64), _np_empty(num_q, _NP_BOOL)
    truncated = _from_numpy(flags)
    status = mod.expand(row_ptr, col_idx, view(seeds), num_rows, min(hops, num_rows), fanout, frontier, True,
                        nodes.__dlpack__(), hop.__dlpack__(), seed.__dlpack__(), parent.__dlpack__(),
                        edge.__dlpack__(), count.__dlpack__(),
                        flags.__dlpack__() if _NUMPY_BOOL_DLPACK else view(truncated))
    if status:
        _EXPAND_CHECKS.raise_for(status, name="seeds", upper=num_rows)
    return _new_tuple(Neighbourhood, (_from_numpy(nodes), _from_numpy(hop), _from_numpy(seed), _from_numpy(parent),
                                      _from_numpy(edge), _from_numpy(count), truncated))


def _retrieve_fast(mod, queries, node_embeddings, graph, k, hops, capacity, max_fanout, max_frontier, min_score):
    """graph_retrieve of plain float32 CPU queries (fewer than 8) and node embeddings, plain int caps and
    no chunk map: one native call, the seed top-k (cosine_topk's scan), min_score and the expansion,
    which also checks the values."""
    if not (type(graph) is CSRGraph and type(queries) is _TENSOR and type(node_embeddings) is _TENSOR
            and type(k) is int and type(hops) is int and type(capacity) is int and queries.dtype is _F32
            and node_embeddings.dtype is _F32 and queries.is_cpu and node_embeddings.is_cpu
            and not (queries.requires_grad or node_embeddings.requires_grad) and queries.layout is _STRIDED
            and node_embeddings.layout is _STRIDED and queries.is_contiguous() and node_embeddings.is_contiguous()
            and hops >= 0 and 1 <= capacity < NO_CAP and 1 <= k <= _FUSED_MAX_SEEDS):
        return None
    views = graph._native
    if views is None:
        views = _graph_views(graph)
    q_shape, e_shape = queries.shape, node_embeddings.shape
    if not (views and len(q_shape) == 2 and len(e_shape) == 2 and 1 <= q_shape[0] < _FUSED_MAX_QUERIES
            and e_shape[0] == views[2] >= 1 and e_shape[1] >= 1 and q_shape[1] == e_shape[1]):
        return None
    if min_score is None:
        threshold = -_INF
    elif type(min_score) is float and -_INF < min_score < _INF:
        threshold = min_score
    else:
        return None
    if max_fanout is None:
        fanout = NO_CAP
    elif type(max_fanout) is int and max_fanout >= 1:
        fanout = min(max_fanout, NO_CAP)
    else:
        return None
    if max_frontier is None:
        frontier = NO_CAP
    elif type(max_frontier) is int and max_frontier >= 1:
        frontier = min(max_frontier, NO_CAP)
    else:
        return None
    row_ptr, col_idx, num_rows = views
    num_q = q_shape[0]
    if num_q * capacity > MAX_LIST_ENTRIES:
        return None  # the checked path says why
    seeds, seed_scores = _np_empty((num_q, k), _NP_I64), _np_empty((num_q, k), _NP_F32)
    lists = (num_q, capacity)
    nodes, hop, seed, parent, edge = (_np_empty(lists, _NP_I64), _np_empty(lists, _NP_I64), _np_empty(lists, _NP_I64),
                                      _np_empty(lists, _NP_I64), _np_empty(lists, _NP_I64))
    count, flags = _np_empty(num_q, _NP_I64), _np_empty(num_q, _NP_BOOL)
    truncated = _from_numpy(flags)
    status = mod.retrieve(view(queries), view(node_embeddings), row_ptr, col_idx, min(hops, num_rows), fanout,
                          frontier, threshold, seeds.__dlpack__(), seed_scores.__dlpack__(), nodes.__dlpack__(),
                          hop.__dlpack__(), seed.__dlpack__(), parent.__dlpack__(), edge.__dlpack__(),
                          count.__dlpack__(),
                          flags.__dlpack__() if _NUMPY_BOOL_DLPACK else view(truncated))
    if status:
        _RETRIEVE_CHECKS.raise_for(status)
    near = _new_tuple(Neighbourhood, (_from_numpy(nodes), _from_numpy(hop), _from_numpy(seed), _from_numpy(parent),
                                      _from_numpy(edge), _from_numpy(count), truncated))
    return _new_tuple(GraphRetrieval, (_from_numpy(seeds), _from_numpy(seed_scores), near, None))


def _expand_cpp(row_ptr, col_idx, sources, num_cols, hops, capacity, max_fanout, max_frontier, keep_sources,
                width):
    mod, _ = load_native("cpu", "graph")
    num_q = sources.shape[0]
    lists = [torch.empty((num_q, capacity), dtype=torch.int64) for _ in range(5)]
    count = torch.empty(num_q, dtype=torch.int64)
    truncated = torch.empty(num_q, dtype=torch.bool)
    status = mod.expand(view(row_ptr), view(col_idx), view(sources), int(num_cols), int(hops), int(max_fanout),
                        int(max_frontier), bool(keep_sources), *map(view, lists), view(count), view(truncated))
    _EXPAND_CHECKS.raise_for(status, name="sources", upper=row_ptr.shape[0] - 1)
    return (*lists, count, truncated)


# --------------------------------------------------------------------------
# Backend: Triton (_triton.py)
# --------------------------------------------------------------------------
def _expand_triton(row_ptr, col_idx, sources, num_cols, hops, capacity, max_fanout, max_frontier, keep_sources,
                   width):
    from ._triton import expand_triton

    return expand_triton(row_ptr, col_idx, sources, num_cols, hops, capacity, max_fanout, max_frontier, keep_sources)


_EXACT = {dtype: (0.0, 0.0) for dtype in INT_INPUTS}
# graph_retrieve's seed scores come from cosine_topk on float32-converted embeddings: the same
# float32 dot products summed in a different order, whatever the input dtype.
_SEED_SCORES = {dtype: (2e-5, 1e-5) for dtype in FLOAT_INPUTS}

_TOLERANCES = {backend: {**_EXACT, **_SEED_SCORES} for backend in ("torch", "cpp", "triton")}
GRAPH = Op("graph", {"torch": expand_reference, "cpp": _expand_cpp, "triton": _expand_triton}, tolerances=_TOLERANCES,
           fast=_khop_fast)
# graph_retrieve's table: the expansion's backends (its general path calls cosine_topk and
# khop_neighbourhood, which dispatch on their own tables) and its latency path, the seed top-k and the
# expansion in one call of _cpu_graph.
GRAPH_RETRIEVE = Op("graph", GRAPH.impls, tolerances=_TOLERANCES, fast=_retrieve_fast)
