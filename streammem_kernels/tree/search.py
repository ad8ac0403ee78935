"""Greedy and beam traversal of a :class:`~streammem_kernels.CosineTree`: ``tree_search``.

StreamChat answers a question by walking its memory tree down, choosing at
each level the child with the highest cosine similarity (its Algorithm 1);
ProStream walks Scene -> Event -> unit keeping the top 5 scenes, the top 10
events and ranking units by cos(q, v) * utility with a minimum similarity.

Scores are ``dot(q / |q|, v / |v|)`` in float32 (tree embeddings are unit rows
already; a zero query scores 0 everywhere), and every ranking breaks ties
toward the lower node id (:mod:`streammem_kernels.tree.scoring`).

* ``beam=1`` -- greedy, Algorithm 1: score all roots, take the best, then score
  only that node's children and take the best, down to a leaf.  Returns the
  path (root first, padded with -1 to ``height + 1``), the score of each node
  on it (padded with -inf) and the best node seen with its score (the running
  best starts at -inf, so all-negative similarities still return a node).
  ``from_every_root=True`` descends from every root (the released StreamChat
  code) and returns one path per root.
* ``beam=b`` (int > 1) or ``beam=(b_1, b_2, ...)`` -- level-synchronous beam
  search from the top level ``H`` down: the pool at level ``l`` is the roots of
  level ``l`` plus the level-``l`` children of the nodes kept above; the
  ``b`` best of the pool by cosine are kept (``b_1`` at level ``H``, ``b_2`` at
  ``H - 1``, ...; the last width repeats for deeper levels) and their children
  expanded.  The leaves reached are ranked by cosine, or cosine x utility with
  ``use_utility=True``; leaves whose cosine is below ``min_score`` are dropped;
  the top ``k`` come back, padded with -1 / -inf.  The beam is global per
  level (ProStream's "10 events per scene" is ``b_2 = 10 * b_1`` here), so the
  cost per query is O(depth x beam x branching), independent of the number
  of leaves.

Backends: ``torch`` (the reference: padded candidate matrices, gathered rows,
one level at a time), ``cpp`` (the whole search per query in C++, OpenMP over
queries), ``triton`` (greedy: the whole descent in one kernel launch; beam:
the reference's level loop with the gather-and-dot of each level's candidates
in a Triton kernel), ``cuda`` (greedy only: one block per query, the whole
path in one launch, csrc/cuda/tree.cu).  The torch and Triton searches never
read a tensor on the host: every shape comes from host metadata (query and
root counts, the tree's ``height`` and ``max_fanout``, which its mutations
maintain, and the beam widths), so on a GPU a search is a fixed sequence of
launches that a CUDA graph can capture.  Identical embeddings score
identically on every backend (no GEMM decides a ranking), so ties do go to
the lower id.

Per-call cost.  The tree validated its embeddings on insertion, so a search
checks only its queries.  For float32 C-contiguous CPU queries on the C++
backend, ``tree_search`` makes one native call (``search_tensors``) on the
query tensor itself and the snapshot's ``TreeView`` (the tree's pointers and
sizes, made once per snapshot, which keeps the snapshot's tensors alive): it
reads the query's attributes through the CPython API, checks the scalar
arguments, checks (``ValueError`` on NaN/Inf) and normalises the queries,
searches and returns the result tensors, or declines (None) whatever the
general path must convert or explain.  No torch op and no per-argument
Python check runs on that path.

Half-precision scan copy.  A tree built with ``CosineTree(..., half_scan=True)``
keeps a float16 copy of its embeddings; the fast path's beam search scores each
level on it, then scores exactly (float32, as without the copy) only the nodes
an error bound cannot rule out of the exact selection, so it returns the same
ids and scores while reading about half the bytes (csrc/cpu/tree.cpp,
``beam_into``).  Greedy search and the general path ignore the copy.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
import torch

from .scoring import MAX_RESULTS, MAX_WIDTH, check_size, dot_rows, topk_low_id, unit_rows
from ..runtime.dispatch import Op, call_op
from ..runtime.validate import check_finite, check_float, check_int
from .store import CosineTree
from .topk import TOLERANCES, TopKResult, _new_tuple, prepare_queries

__all__ = ["TreePathResult", "tree_search"]

_is_compiling = torch.compiler.is_compiling

# Candidate rows gathered per chunk by the torch reference: bounds the
# (queries x candidates x D) temporary to 16M floats (64 MB).
_GATHER_BUDGET = 1 << 24


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
    if type(tree) is CosineTree:
        mod = TREE_SEARCH.cpp_module(backend)
        if mod is not None and not _is_compiling():
            snap = tree.search_arrays()
            view = snap.native
            if view is None:
                view = _tree_view(snap, mod)
            if view is not False:
                out = mod.search_tensors(view, queries, beam, k, min_score, use_utility, from_every_root)
                if out is not None:
                    return _new_tuple(TreePathResult if len(out) == 4 else TopKResult, out)
    return _tree_search_general(tree, queries, beam, k, min_score, use_utility, from_every_root, backend)


def _tree_view(snap, mod):
    """Make the C++ backend's ``TreeView`` of a CPU snapshot (once per snapshot: it is kept as
    ``snap.native``), or False for a snapshot of a tree on another device.

    ``mod.search_tensors(view, queries, beam, k, min_score, use_utility, from_every_root)`` is the
    fast path of :func:`tree_search`: for plain float32 C-contiguous CPU queries and arguments the
    general path would accept unchanged, it reads the queries in place, checks them (``ValueError``
    on NaN/Inf), runs the search and returns the result tensors; for anything else it returns None
    and the general path validates, explains and dispatches.
    """
    if not snap.tensors[0].is_cpu:
        snap.native = False  # a GPU tree: its snapshots never get a view
        return False
    # The snapshot's tensors are prefixes of contiguous storage (search_arrays).  Two threads
    # may both build one: the views are equal and either is kept.
    view = snap.native = mod.TreeView(snap.embeddings, snap.dim, snap.child_ptr, snap.child_idx, snap.roots,
                                      snap.num_roots, snap.level, snap.utility, snap.height, snap.num_live,
                                      MAX_RESULTS, MAX_WIDTH, (snap.tensors, snap.scan_tensor), scan=snap.scan,
                                      scan_norm=snap.scan_norm, scan_err=snap.scan_err)
    return view


def _tree_search_general(tree, queries, beam, k, min_score, use_utility, from_every_root, backend):
    if not isinstance(tree, CosineTree):
        raise ValueError(f"tree must be a CosineTree, got {type(tree).__name__}")
    snap = tree.search_arrays()  # one consistent snapshot, whatever other threads do to the tree
    if snap.num_live == 0:
        raise ValueError("tree must not be empty (add leaves first; every node was removed otherwise)")
    q = prepare_queries(queries, tree.dim, tree.device)
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
class SearchPlan(NamedTuple):
    """What one search does, fixed by host values: every backend takes
    ``impl(embeddings, child_ptr, child_idx, roots, level, utility, queries, plan)``.

    ``widths[i]`` is the beam at level ``height - i`` (beam search); ``fanout`` the tree's
    ``max_fanout`` (candidates per node, padded); ``level`` and ``utility`` are None for greedy
    search.  Queries are float32, contiguous and finite, of any norm (each backend normalises).
    """

    greedy: bool
    height: int
    fanout: int
    widths: tuple
    k: int
    min_score: float
    use_utility: bool
    from_every_root: bool


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
    """Core greedy descent (see :class:`SearchPlan` for the inputs).

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
    """Core beam search (see :class:`SearchPlan`) -> ids (Q, k), scores (Q, k)."""
    return _beam_body(embeddings, child_ptr, child_idx, roots, level, utility, queries, widths, fanout, k,
                      min_score, use_utility, backend)


@tree_beam.register_fake
def _(embeddings, child_ptr, child_idx, roots, level, utility, queries, widths, fanout, k, min_score, use_utility,
      backend):
    q = queries.shape[0]
    return queries.new_empty((q, k), dtype=torch.int64), queries.new_empty((q, k), dtype=torch.float32)


# --------------------------------------------------------------------------
# Backend: torch reference (the spec)
# --------------------------------------------------------------------------
# Every shape below is fixed by host metadata (number of queries and roots, the tree's
# height and max_fanout, the beam widths), never by tensor values: the reference runs on
# a GPU without synchronising, and the Triton beam search shares its level loop.
def _score_candidates_torch(queries: torch.Tensor, embeddings: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
    """scores[s, c] = queries[s] . embeddings[cand[s, c]]; -inf where cand < 0."""
    s_rows, c = cand.shape
    out = torch.full((s_rows, c), float("-inf"), dtype=torch.float32, device=queries.device)
    chunk = max(1, _GATHER_BUDGET // max(1, c * embeddings.shape[1]))  # bounds the (chunk, C, D) gather
    for lo in range(0, s_rows if c else 0, chunk):
        ids = cand[lo : lo + chunk]
        dots = dot_rows(queries[lo : lo + chunk], embeddings[ids.clamp_min(0)])
        out[lo : lo + chunk] = torch.where(ids >= 0, dots, out[lo : lo + chunk])
    return out


def _children_of(nodes: torch.Tensor, child_ptr: torch.Tensor, child_idx: torch.Tensor, fanout: int) -> torch.Tensor:
    """(S, B * fanout) children of nodes (S, B), each node's run padded with -1 to ``fanout``
    (-1 entries of ``nodes`` have none), in order."""
    s_rows = nodes.shape[0]
    if fanout == 0 or child_idx.numel() == 0:
        return torch.full((s_rows, 0), -1, dtype=torch.int64, device=nodes.device)
    flat = nodes.reshape(-1)
    safe = flat.clamp_min(0)
    start = child_ptr[safe]
    count = torch.where(flat >= 0, child_ptr[safe + 1] - start, torch.zeros_like(start))
    offs = torch.arange(fanout, device=nodes.device)
    valid = offs[None, :] < count[:, None]
    pos = (start[:, None] + offs[None, :]).clamp_max(child_idx.numel() - 1)
    kids = torch.where(valid, child_idx[pos], torch.full_like(pos, -1))
    return kids.reshape(s_rows, -1)


def _pack_left(ids: torch.Tensor, width: int) -> torch.Tensor:
    """The first ``width`` columns after moving valid (>= 0) ids to the front of each row, in order."""
    order = torch.argsort((ids < 0).to(torch.int8), dim=1, stable=True)[:, :width]
    return ids.gather(1, order)


def _greedy_levels(embeddings, child_ptr, child_idx, roots, queries, height, fanout, from_every_root, score_fn):
    """Greedy descent of unit queries, one level per step; ``score_fn(queries, emb, cand)`` scores candidates."""
    num_q, num_r = queries.shape[0], roots.shape[0]
    dev = queries.device
    root_scores = score_fn(queries, embeddings, roots.expand(num_q, num_r).contiguous())
    if from_every_root:
        query_of = torch.arange(num_q, device=dev).repeat_interleave(num_r)
        cur = roots.repeat(num_q)
        cur_score = root_scores.reshape(-1)
    else:
        query_of = torch.arange(num_q, device=dev)
        best = torch.argmax(root_scores, dim=1)  # first maximum: the lowest root id
        cur = roots[best]
        cur_score = root_scores.gather(1, best[:, None])[:, 0]
    rows = cur.shape[0]
    path = torch.full((rows, height + 1), -1, dtype=torch.int64, device=dev)
    path_scores = torch.full((rows, height + 1), float("-inf"), dtype=torch.float32, device=dev)
    path[:, 0], path_scores[:, 0] = cur, cur_score
    row_queries = queries[query_of]
    for step in range(1, height + 1):  # height >= 1 implies fanout >= 1
        kids = _children_of(cur[:, None], child_ptr, child_idx, fanout)
        active = kids[:, 0] >= 0  # a row below a leaf (or already past one) stays -1
        scores = score_fn(row_queries, embeddings, kids)
        best = torch.argmax(scores, dim=1)
        nxt = kids.gather(1, best[:, None])[:, 0]
        nxt_score = scores.gather(1, best[:, None])[:, 0]
        path[:, step] = torch.where(active, nxt, path[:, step])
        path_scores[:, step] = torch.where(active, nxt_score, path_scores[:, step])
        cur = torch.where(active, nxt, torch.full_like(nxt, -1))
    best_pos = torch.argmax(path_scores, dim=1)  # running best from -inf, strict '>': first maximum
    best_node = path.gather(1, best_pos[:, None])[:, 0]
    best_score = path_scores.gather(1, best_pos[:, None])[:, 0]
    if from_every_root:
        shape = (num_q, num_r)
        return (path.view(*shape, -1), path_scores.view(*shape, -1), best_node.view(shape), best_score.view(shape))
    return path, path_scores, best_node, best_score


def _beam_levels(embeddings, child_ptr, child_idx, roots, level, utility, queries, widths, fanout, k, min_score,
                 use_utility, score_fn):
    """Level-synchronous beam search of unit queries; ``score_fn`` scores padded candidate ids.

    ``pending`` holds the nodes discovered and not yet expanded (-1: none): the
    roots, then the children of every node kept so far.  Each level adds at
    most ``width x fanout`` of them, and they are distinct nodes, so its width
    is bounded before the search: ``min(num_nodes, roots + fanout x sum of
    widths so far)``.
    """
    num_q, num_nodes = queries.shape[0], embeddings.shape[0]
    height = len(widths)
    pending = roots.expand(num_q, roots.shape[0])
    for step, width in enumerate(widths):
        lvl = height - step
        at_level = (pending >= 0) & (level[pending.clamp_min(0)] == lvl)
        pool = torch.where(at_level, pending, torch.full_like(pending, -1))
        kept, _ = topk_low_id(pool, score_fn(queries, embeddings, pool), min(width, pool.shape[1]))
        rest = torch.where(at_level, torch.full_like(pending, -1), pending)
        bound = min(num_nodes, pending.shape[1] + kept.shape[1] * fanout)
        pending = _pack_left(torch.cat([rest, _children_of(kept, child_ptr, child_idx, fanout)], 1), bound)
    cos = score_fn(queries, embeddings, pending)
    rank = cos * utility[pending.clamp_min(0)] if use_utility else cos
    rank = torch.where((pending >= 0) & (cos >= min_score), rank, torch.full_like(rank, float("-inf")))
    return topk_low_id(pending, rank, k)


def _search_torch(embeddings, child_ptr, child_idx, roots, level, utility, queries, plan: SearchPlan):
    unit = unit_rows(queries)
    if plan.greedy:
        return _greedy_levels(embeddings, child_ptr, child_idx, roots, unit, plan.height, plan.fanout,
                              plan.from_every_root, _score_candidates_torch)
    return _beam_levels(embeddings, child_ptr, child_idx, roots, level, utility, unit, plan.widths, plan.fanout,
                        plan.k, plan.min_score, plan.use_utility, _score_candidates_torch)


# --------------------------------------------------------------------------
# Backend: C++ (csrc/cpu/tree.cpp): the whole search per query, OpenMP over queries
# --------------------------------------------------------------------------
def _search_cpp(embeddings, child_ptr, child_idx, roots, level, utility, queries, plan: SearchPlan):
    mod = TREE_SEARCH.cpp_module("cpp")
    embeddings, child_ptr, child_idx, roots = (t.contiguous() for t in (embeddings, child_ptr, child_idx, roots))
    tree = (embeddings.data_ptr(), embeddings.shape[1], child_ptr.data_ptr(), child_idx.data_ptr(), roots.data_ptr(),
            roots.shape[0])
    if plan.greedy:
        out = mod.greedy(*tree, queries.data_ptr(), queries.shape[0], int(plan.height), bool(plan.from_every_root))
        return tuple(torch.from_numpy(a) for a in out)
    level, utility = level.contiguous(), utility.contiguous()
    ids, scores = mod.beam(*tree, level.data_ptr(), utility.data_ptr(), queries.data_ptr(), queries.shape[0],
                           [int(w) for w in plan.widths], int(plan.k), float(plan.min_score), bool(plan.use_utility))
    return torch.from_numpy(ids), torch.from_numpy(scores)


# --------------------------------------------------------------------------
# Backend: Triton (streammem_kernels/_tree_triton.py): greedy in one launch, beam by levels
# --------------------------------------------------------------------------
def _score_candidates_triton(queries, embeddings, cand):
    from ._triton import gather_dot_triton

    return gather_dot_triton(queries, embeddings, cand.contiguous())


def _search_triton(embeddings, child_ptr, child_idx, roots, level, utility, queries, plan: SearchPlan):
    unit = unit_rows(queries)
    if not plan.greedy:
        return _beam_levels(embeddings, child_ptr, child_idx, roots, level, utility, unit, plan.widths, plan.fanout,
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
    {"torch": _search_torch, "cpp": _search_cpp, "triton": _search_triton, "cuda": _search_cuda},
    extra_reasons={"cuda": _cuda_reasons},
    tolerances=TOLERANCES,
    native="tree",
)
