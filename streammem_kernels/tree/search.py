"""Greedy and beam search of a :class:`~streammem_kernels.CosineTree`: :func:`tree_search`.

Scores are ``dot(q / |q|, v / |v|)`` in float32 (tree embeddings are unit rows already; a zero
query scores 0 everywhere) and every ranking breaks ties toward the lower node id, by the rules of
:mod:`.reference`, whose :func:`~.reference.greedy_levels` and :func:`~.reference.beam_levels` are
the spec of the two searches.  Backends: ``torch`` (the reference), ``cpp`` (the whole search per
query, OpenMP over queries), ``triton`` (greedy in one launch; beam by levels) and ``cuda`` (greedy
only); every backend returns the same ids, and scores within ``TOLERANCES``.  The tree validated
its embeddings on insertion, so a search checks only its queries.  ``docs/ops/tree.md`` describes
the algorithms, the kernels and the latency path.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
import torch

from .reference import (MAX_RESULTS, MAX_WIDTH, SearchPlan, beam_levels, check_size, tree_search_reference,
                        unit_rows)
from ..runtime.dispatch import Op, call_op, trace_constant
from ..runtime.native import NativeChecks, view
from ..runtime.validate import check_finite, check_float, check_int
from .store import TREE_HANDLES, CosineTree
from .topk import TOLERANCES, TopKResult, _new_tuple, prepare_queries

__all__ = ["TreePathResult", "tree_search"]


class TreePathResult(NamedTuple):
    """Greedy descent(s) of ``tree_search(beam=1)``.

    Shapes are for ``from_every_root=False``; with ``from_every_root=True`` a
    root axis R (roots in ascending id order) follows the query axis.

    Attributes
    ----------
    path : (Q, H+1) int64
        Node ids from the chosen root down to a leaf, padded with -1.
    path_scores : (Q, H+1) float32
        Cosine of each node on the path, padded with -inf.
    best_node : (Q,) int64
        The best-scoring node seen (first on the path among equals).
    best_score : (Q,) float32
    """

    path: torch.Tensor
    path_scores: torch.Tensor
    best_node: torch.Tensor
    best_score: torch.Tensor


# --------------------------------------------------------------------------
# Public function: contract, validation, preparation
# --------------------------------------------------------------------------
def tree_search(tree: CosineTree, queries, *, beam=1, k: int = 1, min_score: float | None = None,
                use_utility: bool = False, from_every_root: bool = False, backend: str = "auto"):
    """Batched greedy or beam descent of a :class:`CosineTree`.

    Parameters
    ----------
    tree : CosineTree
        Non-empty tree; its tensors are not modified.
    queries : (Q, D) float tensor or array
        Finite; normalised internally (zero queries score 0 everywhere).
        Not modified.
    beam : int or tuple of int
        ``1``: greedy (Algorithm 1), returns :class:`TreePathResult`.
        ``b > 1`` or ``(b_1, b_2, ...)``: beam search (widths from the top
        level down, the last repeating), returns :class:`TopKResult`.  Use
        ``(1,)`` for a width-1 beam that returns top-k leaves.
    k : int
        Leaves returned per query (beam search).
    min_score : float, optional
        Leaves with cosine below it are dropped (beam search).
    use_utility : bool
        Rank leaves by cosine x utility (beam search).
    from_every_root : bool
        Greedy only: descend from every root; results get a root axis.
    backend : {"auto", "torch", "cpp", "triton", "cuda"}
        ``cuda`` runs greedy search only.

    Returns
    -------
    TreePathResult (greedy) or TopKResult (beam), on the tree's device.
    """
    fast = TREE_SEARCH.run_fast(backend, tree, queries, beam, k, min_score, use_utility, from_every_root)
    if fast is not None:
        return fast
    return _tree_search_general(tree, queries, beam, k, min_score, use_utility, from_every_root, backend)


def _tree_search_general(tree, queries, beam, k, min_score, use_utility, from_every_root, backend):
    if not isinstance(tree, CosineTree):
        raise ValueError(f"tree must be a CosineTree, got {type(tree).__name__}")
    if torch.compiler.is_compiling():
        _take_snapshot(tree._handle)  # outside the graph: the snapshot is taken under the tree's lock
    snap = tree.search_arrays()  # one consistent snapshot, whatever other threads do to the tree
    if snap.num_live == 0:
        raise ValueError("tree must not be empty (add leaves first; every node was removed otherwise)")
    q = prepare_queries(queries, tree.dim, tree.device, against="the tree's embeddings")
    k = check_int(k, "k", minimum=1)
    if q.shape[0] * k > MAX_RESULTS:
        raise ValueError(f"k must keep Q x k <= {MAX_RESULTS} results, got k={k} for Q={q.shape[0]}")
    for flag, name in ((use_utility, "use_utility"), (from_every_root, "from_every_root")):
        if not isinstance(flag, bool):
            raise ValueError(f"{name} must be a bool, got {flag!r}")
    min_val = float("-inf") if min_score is None else check_float(min_score, "min_score")
    height = snap.height
    greedy = isinstance(beam, (int, np.integer)) and not isinstance(beam, bool) and int(beam) == 1
    widths = _beam_widths(beam, height)
    if greedy and (k != 1 or min_score is not None or use_utility):
        raise ValueError("beam=1 is greedy search (one path, no leaf ranking); k, min_score and use_utility "
                         "need beam search: pass beam=(1,) or a wider beam")
    if not greedy and from_every_root:
        raise ValueError("from_every_root applies to greedy search (beam=1) only")
    embeddings, child_ptr, child_idx, roots, level, utility = snap.tensors
    if from_every_root and q.shape[0] * snap.num_roots * (height + 1) > MAX_RESULTS:
        raise ValueError(f"from_every_root=True would return Q x roots x (height + 1) > {MAX_RESULTS} entries "
                         f"(Q={q.shape[0]}, roots={snap.num_roots}, height={height}): pass fewer queries")
    name = TREE_SEARCH.select(backend, tree.device, inputs={"queries": q, "tree.embeddings": embeddings},
                              greedy=greedy)
    if name != "cpp":  # the C++ kernels check the queries themselves
        check_finite(q, "queries")
    arrays = (embeddings, child_ptr, child_idx, roots)
    if greedy:
        return TreePathResult(*call_op(torch.ops.streammem.tree_greedy, _GREEDY_IMPLS, name, *arrays, q, height,
                                       snap.fanout, from_every_root))
    ids, scores = call_op(torch.ops.streammem.tree_beam, _BEAM_IMPLS, name, *arrays, level, utility, q,
                          list(widths), snap.fanout, k, min_val, use_utility)
    return TopKResult(ids, scores)


@trace_constant
def _take_snapshot(handle: str) -> None:
    """Take the search snapshot (:meth:`CosineTree.search_arrays`) of the tree with this handle while
    torch.compile traces a search, outside the graph (under the tree's lock, which a trace cannot
    take; the tree comes by its handle, a constant, as Dynamo requires).  The traced search then reads
    the snapshot the tree keeps, as graph inputs guarded by the compiled function: a mutation drops
    the snapshot, so the next call compiles again and takes a new one here."""
    TREE_HANDLES[handle].search_arrays()


def _beam_widths(beam, height: int) -> list[int]:
    """Width per level from the top (index 0 is level ``height``)."""
    if isinstance(beam, (int, np.integer)) and not isinstance(beam, bool):
        widths = [check_size(beam, "beam", maximum=MAX_WIDTH)]
    elif isinstance(beam, (tuple, list)) and len(beam) > 0:
        widths = [check_size(b, f"beam[{i}]", maximum=MAX_WIDTH) for i, b in enumerate(beam)]
    else:
        raise ValueError(f"beam must be an int >= 1 or a non-empty tuple of ints >= 1, got {beam!r}")
    return [widths[min(i, len(widths) - 1)] for i in range(max(height, 0))]


# --------------------------------------------------------------------------
# Custom ops (work under torch.compile; opcheck-tested)
# --------------------------------------------------------------------------
def _greedy_body(embeddings, child_ptr, child_idx, roots, queries, height, fanout, from_every_root, backend):
    plan = SearchPlan(True, height, fanout, (), 1, float("-inf"), False, from_every_root)
    return tuple(TREE_SEARCH.impls[backend](embeddings, child_ptr, child_idx, roots, None, None, queries, plan))


def _beam_body(embeddings, child_ptr, child_idx, roots, level, utility, queries, widths, fanout, k, min_score,
               use_utility, backend):
    plan = SearchPlan(False, len(widths), fanout, tuple(widths), k, min_score, use_utility, False)
    return tuple(TREE_SEARCH.impls[backend](embeddings, child_ptr, child_idx, roots, level, utility, queries, plan))


class _Bound:
    """``call_op``'s ``impls`` for one custom op: ``[backend](*args)`` runs ``body(*args, backend)``."""

    def __init__(self, body):
        self.body = body

    def __getitem__(self, backend: str):
        return functools.partial(self.body, backend=backend)


_GREEDY_IMPLS, _BEAM_IMPLS = _Bound(_greedy_body), _Bound(_beam_body)


# Greedy and beam search are two custom ops because they return different tuples; both run
# TREE_SEARCH's backends.
@torch.library.custom_op("streammem::tree_greedy", mutates_args=())
def tree_greedy(embeddings: torch.Tensor, child_ptr: torch.Tensor, child_idx: torch.Tensor, roots: torch.Tensor,
                queries: torch.Tensor, height: int, fanout: int, from_every_root: bool,
                backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``torch.ops.streammem.tree_greedy`` (its schema: docs/compile.md).

    Core greedy descent (see :class:`SearchPlan` for the inputs).

    Returns path (S, H+1), path_scores (S, H+1), best_node (S,), best_score (S,)
    with S = Q, or (Q, R, H+1) ... with ``from_every_root``.
    """
    return _greedy_body(embeddings, child_ptr, child_idx, roots, queries, height, fanout, from_every_root, backend)


@tree_greedy.register_fake
def _(embeddings, child_ptr, child_idx, roots, queries, height, fanout, from_every_root, backend):
    lead = (queries.shape[0], roots.shape[0]) if from_every_root else (queries.shape[0],)
    return (
        queries.new_empty(lead + (height + 1,), dtype=torch.int64),
        queries.new_empty(lead + (height + 1,), dtype=torch.float32),
        queries.new_empty(lead, dtype=torch.int64),
        queries.new_empty(lead, dtype=torch.float32),
    )


@torch.library.custom_op("streammem::tree_beam", mutates_args=())
def tree_beam(embeddings: torch.Tensor, child_ptr: torch.Tensor, child_idx: torch.Tensor, roots: torch.Tensor,
              level: torch.Tensor, utility: torch.Tensor, queries: torch.Tensor, widths: list[int], fanout: int,
              k: int, min_score: float, use_utility: bool, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.ops.streammem.tree_beam`` (its schema: docs/compile.md).

    Core beam search (see :class:`SearchPlan`) -> ids (Q, k), scores (Q, k)."""
    return _beam_body(embeddings, child_ptr, child_idx, roots, level, utility, queries, widths, fanout, k,
                      min_score, use_utility, backend)


@tree_beam.register_fake
def _(embeddings, child_ptr, child_idx, roots, level, utility, queries, widths, fanout, k, min_score, use_utility,
      backend):
    q = queries.shape[0]
    return queries.new_empty((q, k), dtype=torch.int64), queries.new_empty((q, k), dtype=torch.float32)


# --------------------------------------------------------------------------
# Backend: C++ (csrc/cpu/tree/search.cpp), and the latency path TREE_SEARCH declares
# --------------------------------------------------------------------------
_QUERY_CHECKS = NativeChecks("queries must be finite, found NaN or Inf")

_TENSOR, _F32, _STRIDED, _INF = torch.Tensor, torch.float32, torch.strided, float("inf")
_FLOAT_MAX = 2**1023  # ints below it convert to float without overflow (the others take the general path)
# Results allocated through numpy (about 0.7 us against 1.4 for torch.empty with a shape and a dtype),
# handed to the kernel by the array's own DLPack capsule (0.08 us against 0.22 for a tensor's).
_from_numpy, _np_empty, _NP_F32, _NP_I64 = torch.from_numpy, np.empty, np.float32, np.int64
# (beam, height) -> the widths _beam_widths derives, for beams of plain ints (the latency path's);
# bounded, since a caller may pass any number of distinct beams.
_WIDTHS: dict = {}
_WIDTHS_KEPT = 64


def _snapshot_views(snap):
    """The C++ backend's views of a CPU snapshot's tensors, made once per snapshot (kept as
    ``snap.native``): (greedy's, beam's, the scan copy's or None); False for a tree on another device.
    The views keep the snapshot's tensors alive; two threads may both make them, either is kept."""
    if not snap.tensors[0].is_cpu:
        snap.native = False
        return False
    emb, child_ptr, child_idx, roots, level, utility = (view(t) for t in snap.tensors)
    scan = None if snap.scan_tensor is None else view(snap.scan_tensor)
    views = snap.native = ((emb, child_ptr, child_idx, roots), (emb, child_ptr, child_idx, roots, level, utility),
                           scan)
    return views


def _plain_widths(beam, height: int):
    """The view of the widths of a beam of plain ints (an int > 1, or a non-empty tuple of ints) within
    the bounds, derived by _beam_widths once per (beam, height); None for any other beam."""
    if type(beam) is int:
        if not 1 < beam <= MAX_WIDTH:
            return None
    elif type(beam) is tuple and beam:
        for width in beam:
            if type(width) is not int or not 1 <= width <= MAX_WIDTH:
                return None
    else:
        return None
    key = (beam, height)
    widths = _WIDTHS.get(key)
    if widths is None:
        if len(_WIDTHS) >= _WIDTHS_KEPT:
            _WIDTHS.clear()
        widths = _WIDTHS[key] = view(torch.tensor(_beam_widths(beam, height), dtype=torch.int64))
    return widths


def _tree_search_fast(mod, tree, queries, beam, k, min_score, use_utility, from_every_root):
    """tree_search of plain float32 CPU queries with arguments the general path takes as they are
    (plain ints, floats and bools within bounds): one native call, which also checks the queries."""
    if not (type(tree) is CosineTree and type(queries) is _TENSOR and type(k) is int
            and (use_utility is False or use_utility is True) and (from_every_root is False or from_every_root is True)
            and queries.dtype is _F32 and queries.is_cpu and not queries.requires_grad and queries.layout is _STRIDED
            and queries.is_contiguous()):
        return None
    snap = tree.search_arrays()
    views = snap.native
    if views is None:
        views = _snapshot_views(snap)
    shape = queries.shape
    if not (views and len(shape) == 2 and shape[1] == snap.dim and shape[0] >= 1 and snap.num_live >= 1):
        return None
    num_q, height = shape[0], snap.height
    if type(beam) is int and beam == 1:
        if k != 1 or min_score is not None or use_utility:
            return None
        if from_every_root:
            if num_q * snap.num_roots * (height + 1) > MAX_RESULTS:
                return None
            lead = (num_q, snap.num_roots)
        else:
            lead = (num_q,)
        full = lead + (height + 1,)
        path, path_scores = _np_empty(full, _NP_I64), _np_empty(full, _NP_F32)
        best_node, best_score = _np_empty(lead, _NP_I64), _np_empty(lead, _NP_F32)
        status = mod.greedy(*views[0], view(queries), from_every_root, path.__dlpack__(), path_scores.__dlpack__(),
                            best_node.__dlpack__(), best_score.__dlpack__())
        if status:
            _QUERY_CHECKS.raise_for(status)
        return _new_tuple(TreePathResult, (_from_numpy(path), _from_numpy(path_scores), _from_numpy(best_node),
                                           _from_numpy(best_score)))
    if from_every_root or not 1 <= k <= MAX_RESULTS // num_q:
        return None
    if min_score is None:
        min_val = -_INF
    elif type(min_score) is float and -_INF < min_score < _INF:
        min_val = min_score
    elif type(min_score) is int and -_FLOAT_MAX < min_score < _FLOAT_MAX:
        min_val = float(min_score)
    else:
        return None
    widths = _plain_widths(beam, height)
    if widths is None:
        return None
    ids, scores = _np_empty((num_q, k), _NP_I64), _np_empty((num_q, k), _NP_F32)
    status = mod.beam(*views[1], view(queries), widths, min_val, use_utility, ids.__dlpack__(), scores.__dlpack__(),
                      views[2], snap.scan_norm, snap.scan_err)
    if status:
        _QUERY_CHECKS.raise_for(status)
    return _new_tuple(TopKResult, (_from_numpy(ids), _from_numpy(scores)))


def _search_cpp(embeddings, child_ptr, child_idx, roots, level, utility, queries, plan: SearchPlan):
    mod = TREE_SEARCH.cpp_module("cpp")
    tree = tuple(view(t.contiguous()) for t in (embeddings, child_ptr, child_idx, roots))
    num_q = queries.shape[0]
    if plan.greedy:
        lead = (num_q, roots.shape[0]) if plan.from_every_root else (num_q,)
        full = lead + (plan.height + 1,)
        path, path_scores = torch.empty(full, dtype=torch.int64), torch.empty(full, dtype=torch.float32)
        best_node, best_score = torch.empty(lead, dtype=torch.int64), torch.empty(lead, dtype=torch.float32)
        _QUERY_CHECKS.raise_for(mod.greedy(*tree, view(queries), bool(plan.from_every_root), view(path),
                                           view(path_scores), view(best_node), view(best_score)))
        return path, path_scores, best_node, best_score
    ids = torch.empty((num_q, plan.k), dtype=torch.int64)
    scores = torch.empty((num_q, plan.k), dtype=torch.float32)
    _QUERY_CHECKS.raise_for(mod.beam(*tree, view(level.contiguous()), view(utility.contiguous()), view(queries),
                                     view(torch.tensor(plan.widths, dtype=torch.int64)), float(plan.min_score),
                                     bool(plan.use_utility),
                                     view(ids), view(scores), None, 0.0, 0.0))
    return ids, scores


# --------------------------------------------------------------------------
# Backend: Triton (_triton.py): greedy in one launch, beam by levels
# --------------------------------------------------------------------------
def _score_candidates_triton(queries, embeddings, cand):
    from ._triton import gather_dot_triton

    return gather_dot_triton(queries, embeddings, cand.contiguous())


def _search_triton(embeddings, child_ptr, child_idx, roots, level, utility, queries, plan: SearchPlan):
    unit = unit_rows(queries)
    if not plan.greedy:
        return beam_levels(embeddings, child_ptr, child_idx, roots, level, utility, unit, plan.widths, plan.fanout,
                           plan.k, plan.min_score, plan.use_utility, _score_candidates_triton)
    from ._triton import greedy_triton

    out = greedy_triton(embeddings, child_ptr, child_idx, roots, unit, plan.height, plan.from_every_root)
    if plan.from_every_root:
        lead = (queries.shape[0], roots.shape[0])
        return tuple(t.view(lead + t.shape[1:]) for t in out)
    return out


# --------------------------------------------------------------------------
# Backend: CUDA (csrc/cuda/tree.cu): greedy descent, one block per query, one launch
# --------------------------------------------------------------------------
def _search_cuda(embeddings, child_ptr, child_idx, roots, level, utility, queries, plan: SearchPlan):
    if not plan.greedy:
        raise RuntimeError("tree_search: the CUDA backend runs greedy search only (dispatch never sends beam here)")
    from ._cuda import greedy_cuda

    return greedy_cuda(embeddings, child_ptr, child_idx, roots, unit_rows(queries), plan.height, plan.from_every_root)


def _cuda_reasons(device, greedy: bool = True, **_) -> list[str]:
    return [] if greedy else ["the CUDA backend runs greedy search (beam=1) only; beam search runs on triton"]


TREE_SEARCH = Op(
    "tree_search",
    {"torch": tree_search_reference, "cpp": _search_cpp, "triton": _search_triton, "cuda": _search_cuda},
    extra_reasons={"cuda": _cuda_reasons},
    tolerances=TOLERANCES,
    native="tree",
    fast=_tree_search_fast,
)
