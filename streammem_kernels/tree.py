"""Cosine memory tree: a growable hierarchical store, greedy / beam traversal,
and exact (optionally segmented) cosine top-k.

StreamChat keeps long-term memory as a tree whose leaves are chunks; every g
consecutive nodes of a level get a parent, and a question walks down choosing
at each level the child with the highest cosine similarity (its Algorithm 1).
ProStream walks Scene -> Event -> unit keeping the top 5 scenes, the top 10
events and ranking units by cos(q, v) * utility with a minimum similarity.
VideoAgent retrieves, per query, the most similar frame inside one segment.

Storage (:class:`CosineTree`) is a set of flat tensors, never Python node
objects:

* ``embeddings (num_nodes, D)`` float32, L2-normalised on insertion (a zero
  vector stays zero and scores 0 against everything);
* ``level (num_nodes,)`` int64: 0 for leaves, ``1 + max(level of children)``;
* ``parent (num_nodes,)`` int64, -1 for the current roots (and removed nodes);
* children in CSR form: node i's children are
  ``child_idx[child_ptr[i]:child_ptr[i+1]]`` in chronological (ascending id)
  order.  A parent is always appended after its children, which must be
  current roots, so a node's children are written once, at creation, and stay
  contiguous: ``child_ptr`` grows with the node count, ``child_idx`` with the
  number of edges;
* ``utility (num_nodes,)`` float32 (default 1) and ``payload (num_nodes,)``
  int64 (default -1), which the caller maps to its own objects.

Node ids are append-only and stable until :meth:`CosineTree.compact`.
Removal (:meth:`CosineTree.remove`) keeps this layout: a tombstone mask
``alive (num_nodes,)`` next to ``parent``, and dead ids are filtered out of
every CSR child run at removal time, so the arrays the search kernels see
(``roots``, ``child_ptr``/``child_idx``) never reach a dead node and no
backend needs to know about tombstones.  A removed node takes with it every
ancestor left without a live child (a parent exists to summarise children; a
childless one would end a greedy path on a non-leaf), and the levels of the
surviving ancestors are recomputed, so the live part of the tree is exactly
the tree one would build from the live nodes alone.  Removing a node that
still has live children is an error unless ``cascade=True`` (then its live
descendants go too); removing a non-root child never turns its siblings into
roots.  :meth:`CosineTree.compact` drops the tombstones: it renumbers live
nodes in id order -- which keeps every CSR child run ascending, so children
stay chronological -- and returns the old -> new id map (-1 for removed
nodes); searches give the same results before and after, up to that
renumbering.  Save/load round-trips the tombstone mask.

Scores are ``dot(q / |q|, v / |v|)`` in float32 (a vector whose squared norm
is 0 in float32 is treated as the zero vector).  Every ranking breaks ties
toward the lower node id / key index.

Searches (``tree_search``):

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
in a Triton kernel).  The torch and Triton searches never read a tensor on the
host: every shape comes from host metadata (query and root counts, the
tree's ``height`` and ``max_fanout``, which its mutations maintain, and the
beam widths), so on a GPU a search is a fixed sequence of launches that a CUDA
graph can capture.  Identical embeddings score identically on every backend
(no GEMM decides a ranking: its summation order depends on a row's position),
so ties do go to the lower id.

``cosine_topk(queries, keys, k, ranges=None)`` is exact exhaustive search.
The ``cpp`` backend has two paths and picks one by a fixed rule
(:func:`cosine_topk_uses_blas`): a fused one-pass C++ scan (key norms computed
on the fly, running top-k per query) when there are few queries or the ranges
are narrow, and for large exhaustive batches (``Q >= 8`` and the ranges
covering at least half of the Q x N pairs) blocked ``torch.mm`` GEMMs (the CPU
BLAS) filter the keys for a C++ running top-k, which scores the keys it admits
as the fused scan does.  ``triton`` splits the keys into slices scanned by
separate programs (one query or a block of 16 per program) that keep exact
running top-k sets, merged by a second launch; it validates ranges on the
device and never synchronises.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np
import torch

from ._dispatch import Op, call_op, load_native
from ._utils import (
    as_tensor,
    check_dtype,
    check_finite,
    check_float,
    check_int,
    check_nonempty,
    check_rank,
    check_values,
)

__all__ = [
    "CosineTree",
    "TopKResult",
    "TreePathResult",
    "tree_search",
    "cosine_topk",
    "cosine_topk_uses_blas",
]

_FLOAT_INPUTS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_INT_INPUTS = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
_FORMAT = "streammem.CosineTree"
# Version 2 adds the tombstone mask "alive"; version 1 files (no removals) still load.
_FORMAT_VERSION = 2
# Candidate rows gathered per chunk by the torch reference: bounds the
# (queries x candidates x D) temporary to 16M floats (64 MB).
_GATHER_BUDGET = 1 << 24
# BLAS path of cosine_topk: score block of at most 256K floats (1 MiB) per GEMM, so the
# block stays in L2 between the GEMM writing it and the top-k merge reading it: at
# N = 10^5, Q = 1024, D = 384 this took the call from 0.73 s to 0.60 s on 2 cores
# (16M-float blocks ran the GEMM itself 1.5x slower than 1K-key blocks).
_BLAS_BLOCK_BUDGET = 1 << 18
BLAS_MIN_QUERIES = 8


class TopKResult(NamedTuple):
    """Top-k per query.

    Attributes
    ----------
    ids : (Q, k) int64
        Node ids (tree) or key indices, best first; -1 where fewer qualify.
    scores : (Q, k) float32
        Cosine (or cosine x utility); -inf where ``ids`` is -1.
    """

    ids: torch.Tensor
    scores: torch.Tensor


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


def _check_finite_one_pass(t: torch.Tensor, name: str) -> None:
    """check_finite for float32 CPU tensors: one OpenMP pass in C++, no boolean
    temporary, and one call instead of two torch ops for small query batches
    (falls back to check_finite elsewhere)."""
    mod, _ = load_native("cpu", "tree")
    if mod is None or t.device.type != "cpu" or t.dtype != torch.float32 or not t.is_contiguous():
        check_finite(t, name)
    elif not mod.all_finite(t.numpy().reshape(-1)):
        raise ValueError(f"{name} must be finite, found NaN or Inf")


def _unit_rows(x: torch.Tensor) -> torch.Tensor:
    """Rows scaled to unit L2 norm in float32; zero rows stay zero (never NaN).

    Dividing by the norm clamped to the smallest normal float changes nothing for
    a non-zero row (its norm is at least that, unless every entry is subnormal)
    and gives 0 / tiny = 0 for a zero row: two ops where a masked form needs six,
    which matters for single queries (each torch op costs microseconds).
    """
    x = x.to(torch.float32)
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    return x / norm.clamp_min(torch.finfo(torch.float32).tiny)


# --------------------------------------------------------------------------
# Data structure
# --------------------------------------------------------------------------
class CosineTree:
    """Growable forest of L2-normalised embeddings with CSR children.

    Parameters
    ----------
    dim : int
        Embedding dimension D >= 1.
    capacity : int
        Initial node capacity; storage doubles when full (amortised O(1) append).
    device : torch.device or str
        Where the tensors live (searches run there).

    The tensor properties (``embeddings``, ``level``, ``parent``, ``child_ptr``,
    ``child_idx``, ``utility``, ``payload``, ``alive``, ``roots``) are views of
    the used prefix of the storage: read them, do not write them.  Removed
    nodes keep their rows (``alive`` False, ``parent`` -1, no children, never
    a root) until :meth:`compact`.
    """

    def __init__(self, dim: int, *, capacity: int = 1024, device="cpu"):
        self._dim = check_int(dim, "dim", minimum=1)
        capacity = check_int(capacity, "capacity", minimum=1)
        self._device = torch.device(device)
        self._n = 0
        self._n_edges = 0
        self._n_dead = 0
        # Most children of any node: host metadata the searches pad each level's candidates
        # to (updated by every mutation, so a search never asks the device for it).
        self._max_fanout = 0
        self._alloc_nodes(capacity)
        self._child_idx = torch.empty(capacity, dtype=torch.int64, device=self._device)
        # Current roots per level, in insertion (= ascending id) order; dicts
        # give O(1) removal and ordered iteration for grow()'s "oldest g".
        self._roots_by_level: list[dict[int, None]] = []
        self._roots_cache: torch.Tensor | None = None

    # ---- storage -------------------------------------------------------
    def _alloc_nodes(self, capacity: int) -> None:
        dev = self._device
        self._emb = torch.zeros((capacity, self._dim), dtype=torch.float32, device=dev)
        self._level = torch.zeros(capacity, dtype=torch.int64, device=dev)
        self._parent = torch.full((capacity,), -1, dtype=torch.int64, device=dev)
        self._child_ptr = torch.zeros(capacity + 1, dtype=torch.int64, device=dev)
        self._utility = torch.ones(capacity, dtype=torch.float32, device=dev)
        self._payload = torch.full((capacity,), -1, dtype=torch.int64, device=dev)
        self._alive = torch.ones(capacity, dtype=torch.bool, device=dev)

    def _reserve(self, extra_nodes: int, extra_edges: int) -> None:
        need = self._n + extra_nodes
        cap = self._emb.shape[0]
        if need > cap:
            new_cap = max(need, 2 * cap)
            old = (self._emb, self._level, self._parent, self._utility, self._payload, self._alive, self._child_ptr)
            self._alloc_nodes(new_cap)
            n = self._n
            new = (self._emb, self._level, self._parent, self._utility, self._payload, self._alive, self._child_ptr)
            for dst, src in zip(new[:-1], old[:-1]):
                dst[:n] = src[:n]
            self._child_ptr[: n + 1] = old[-1][: n + 1]  # CSR offsets have one more entry than nodes
        need_e = self._n_edges + extra_edges
        if need_e > self._child_idx.shape[0]:
            grown = torch.empty(max(need_e, 2 * self._child_idx.shape[0]), dtype=torch.int64, device=self._device)
            grown[: self._n_edges] = self._child_idx[: self._n_edges]
            self._child_idx = grown

    def _root_dict(self, level: int) -> dict[int, None]:
        while len(self._roots_by_level) <= level:
            self._roots_by_level.append({})
        return self._roots_by_level[level]

    # ---- read-only views -------------------------------------------------
    @property
    def dim(self) -> int:
        return self._dim

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def num_nodes(self) -> int:
        return self._n

    def __len__(self) -> int:
        return self._n

    @property
    def embeddings(self) -> torch.Tensor:
        """(num_nodes, D) float32, unit rows (or zero rows)."""
        return self._emb[: self._n]

    @property
    def level(self) -> torch.Tensor:
        return self._level[: self._n]

    @property
    def parent(self) -> torch.Tensor:
        return self._parent[: self._n]

    @property
    def child_ptr(self) -> torch.Tensor:
        """(num_nodes + 1,) int64 CSR offsets into ``child_idx``."""
        return self._child_ptr[: self._n + 1]

    @property
    def child_idx(self) -> torch.Tensor:
        return self._child_idx[: self._n_edges]

    @property
    def utility(self) -> torch.Tensor:
        return self._utility[: self._n]

    @property
    def payload(self) -> torch.Tensor:
        return self._payload[: self._n]

    @property
    def alive(self) -> torch.Tensor:
        """(num_nodes,) bool tombstone mask: False for removed nodes."""
        return self._alive[: self._n]

    @property
    def num_live(self) -> int:
        """Nodes not removed (``num_nodes`` counts removed ones until :meth:`compact`)."""
        return self._n - self._n_dead

    @property
    def roots(self) -> torch.Tensor:
        """(R,) int64 current roots in ascending id order (a forest)."""
        if self._roots_cache is None:
            ids = sorted(i for d in self._roots_by_level for i in d)
            self._roots_cache = torch.tensor(ids, dtype=torch.int64, device=self._device)
        return self._roots_cache

    @property
    def max_fanout(self) -> int:
        """Most children of any node (0 when every node is a leaf): the candidates per level
        a search pads to.  Kept by the mutations, so reading it never touches the device."""
        return self._max_fanout

    @property
    def height(self) -> int:
        """Largest level in the tree (0 when every node is a leaf); -1 when empty."""
        for lvl in range(len(self._roots_by_level) - 1, -1, -1):
            if self._roots_by_level[lvl]:
                return lvl
        return -1

    def roots_at(self, level: int) -> list[int]:
        """Current roots of one level, oldest first."""
        if level < 0 or level >= len(self._roots_by_level):
            return []
        return list(self._roots_by_level[level])

    def children(self, node: int) -> torch.Tensor:
        node = self._check_node(node, "node")
        return self._child_idx[self._child_ptr[node] : self._child_ptr[node + 1]]

    def _check_node(self, node, name: str) -> int:
        node = check_int(node, name, minimum=0)
        if node >= self._n:
            raise ValueError(f"{name} must be a node id < num_nodes={self._n}, got {node}")
        return node

    # ---- growth ------------------------------------------------------------
    def _prepare_rows(self, emb, name: str) -> torch.Tensor:
        emb = as_tensor(emb, name)
        check_rank(emb, name, (1, 2), "(D,) or (n, D)")
        check_dtype(emb, name, _FLOAT_INPUTS)
        if emb.dim() == 1:
            emb = emb[None]
        if emb.shape[1] != self._dim:
            raise ValueError(f"{name} must have D={self._dim} columns, got shape {tuple(emb.shape)}")
        check_finite(emb, name)
        return _unit_rows(emb.to(self._device))

    def _prepare_payload(self, payload, n: int) -> torch.Tensor:
        if payload is None:
            return torch.full((n,), -1, dtype=torch.int64, device=self._device)
        if isinstance(payload, (int, np.integer)) and not isinstance(payload, bool):
            payload = [int(payload)]
        payload = as_tensor(payload, "payload")
        check_dtype(payload, "payload", _INT_INPUTS)
        payload = payload.reshape(-1)
        if payload.numel() != n:
            raise ValueError(f"payload must hold one id per new node ({n}), got {payload.numel()}")
        return payload.to(device=self._device, dtype=torch.int64)

    def add_leaves(self, emb, payload=None) -> torch.Tensor:
        """Append leaves (each a new root at level 0).

        Parameters
        ----------
        emb : (n, D) or (D,) float tensor or array
            Embeddings; normalised on insertion, not modified.
        payload : (n,) int, optional
            Caller ids (default -1).

        Returns
        -------
        (n,) int64 ids of the new leaves.
        """
        rows = self._prepare_rows(emb, "emb")
        n = rows.shape[0]
        pay = self._prepare_payload(payload, n)
        self._reserve(n, 0)
        lo, hi = self._n, self._n + n
        self._emb[lo:hi] = rows
        self._level[lo:hi] = 0
        self._parent[lo:hi] = -1
        self._child_ptr[lo + 1 : hi + 1] = self._n_edges
        self._utility[lo:hi] = 1.0
        self._payload[lo:hi] = pay
        self._alive[lo:hi] = True
        self._n = hi
        self._root_dict(0).update(dict.fromkeys(range(lo, hi)))
        self._roots_cache = None
        return torch.arange(lo, hi, dtype=torch.int64, device=self._device)

    def add_parent(self, child_ids, emb, payload=None) -> int:
        """Append one parent over current roots ``child_ids`` (they stop being roots).

        Parameters
        ----------
        child_ids : (m,) int, m >= 1, distinct current roots
        emb : (D,) float embedding of the parent (normalised on insertion)
        payload : int, optional

        Returns
        -------
        int id of the new node, at level ``1 + max(level[child_ids])``.
        """
        children = as_tensor(child_ids, "child_ids")
        check_nonempty(children, "child_ids")
        check_dtype(children, "child_ids", _INT_INPUTS)
        children = children.reshape(-1).to(torch.int64).cpu()
        ids = sorted(int(c) for c in children)
        if len(set(ids)) != len(ids):
            raise ValueError("child_ids must be distinct")
        if ids[0] < 0 or ids[-1] >= self._n:
            raise ValueError(f"child_ids must be node ids in [0, {self._n}), got {ids[0] if ids[0] < 0 else ids[-1]}")
        idx = torch.tensor(ids, device=self._device)
        parents = self._parent[idx].tolist()
        for c, a in zip(ids, self._alive[idx].tolist()):
            if not a:
                raise ValueError(f"child_ids must be live nodes; node {c} was removed")
        for c, p in zip(ids, parents):
            if p != -1:
                raise ValueError(f"child_ids must be current roots; node {c} already has parent {p}")
        rows = self._prepare_rows(emb, "emb")
        if rows.shape[0] != 1:
            raise ValueError(f"emb must be one embedding of shape (D,), got shape {tuple(rows.shape)}")
        pay = self._prepare_payload(payload, 1)
        return int(self._append_parents([ids], rows, pay)[0])

    def _append_parents(self, groups: list[list[int]], rows: torch.Tensor, pay: torch.Tensor) -> torch.Tensor:
        """Append one parent per group (ascending, validated current roots)."""
        p = len(groups)
        sizes = [len(g) for g in groups]
        flat = [c for g in groups for c in g]
        self._reserve(p, len(flat))
        lo, hi = self._n, self._n + p
        flat_t = torch.tensor(flat, dtype=torch.int64, device=self._device)
        child_levels = self._level[flat_t].tolist()
        levels, pos = [], 0
        for s in sizes:
            levels.append(1 + max(child_levels[pos : pos + s]))
            pos += s
        new_ids = torch.arange(lo, hi, dtype=torch.int64, device=self._device)
        self._emb[lo:hi] = rows
        self._level[lo:hi] = torch.tensor(levels, dtype=torch.int64, device=self._device)
        self._parent[lo:hi] = -1
        self._parent[flat_t] = torch.repeat_interleave(new_ids, torch.tensor(sizes, device=self._device))
        e0 = self._n_edges
        self._child_idx[e0 : e0 + len(flat)] = flat_t
        self._child_ptr[lo + 1 : hi + 1] = e0 + torch.cumsum(torch.tensor(sizes, dtype=torch.int64), 0).to(
            self._device
        )
        self._utility[lo:hi] = 1.0
        self._payload[lo:hi] = pay
        self._alive[lo:hi] = True
        self._n, self._n_edges = hi, e0 + len(flat)
        self._max_fanout = max(self._max_fanout, max(sizes))
        for c, lvl in zip(flat, child_levels):
            del self._roots_by_level[lvl][c]
        for node, lvl in zip(range(lo, hi), levels):
            self._root_dict(lvl)[node] = None
        self._roots_cache = None
        return new_ids

    def set_utility(self, ids, values) -> None:
        """Set ``utility[ids] = values`` (values finite; a scalar broadcasts)."""
        ids = as_tensor(ids, "ids")
        check_dtype(ids, "ids", _INT_INPUTS)
        ids = ids.reshape(-1).to(device=self._device, dtype=torch.int64)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self._n):
            raise ValueError(f"ids must be node ids in [0, {self._n})")
        if isinstance(values, (int, float, np.integer, np.floating)) and not isinstance(values, bool):
            values = torch.full((ids.numel(),), float(values))
        values = as_tensor(values, "values")
        check_dtype(values, "values", _FLOAT_INPUTS + _INT_INPUTS)
        values = values.reshape(-1)
        if values.numel() != ids.numel():
            raise ValueError(f"values must hold one value per id ({ids.numel()}), got {values.numel()}")
        values = values.to(torch.float32)
        check_finite(values, "values")
        self._utility[ids] = values.to(self._device)

    def grow(self, group: int, parent_embed: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
        """StreamChat's chronological grouping.

        While some level has at least ``group`` roots, the oldest ``group``
        roots of the lowest such level get a parent whose embedding is
        ``parent_embed(child_ids)`` (a (D,) tensor; default: the normalised
        mean of the children's embeddings).  Call it after every new leaf or
        once after many: the groups (and so the tree) are the same, only the
        interleaving of leaf and parent ids differs.

        Returns
        -------
        (p,) int64 ids of the parents created, in creation order.
        """
        group = check_int(group, "group", minimum=2)
        if parent_embed is not None and not callable(parent_embed):
            raise ValueError(f"parent_embed must be callable or None, got {type(parent_embed).__name__}")
        created = []
        lvl = 0
        # Adding parents at level l only adds roots at levels > l, so sweeping
        # the levels upward once equals the "lowest level first" loop.
        while lvl < len(self._roots_by_level):
            roots = self._roots_by_level[lvl]
            n_groups = len(roots) // group
            if n_groups:
                oldest = list(roots)[: n_groups * group]
                groups = [oldest[i * group : (i + 1) * group] for i in range(n_groups)]
                if parent_embed is None:
                    idx = torch.tensor(oldest, dtype=torch.int64, device=self._device)
                    rows = _unit_rows(self._emb[idx].view(n_groups, group, self._dim).mean(dim=1))
                else:
                    outs = []
                    for g in groups:
                        out = as_tensor(parent_embed(torch.tensor(g, dtype=torch.int64, device=self._device)),
                                        "parent_embed(child_ids)")
                        if out.reshape(-1).shape[0] != self._dim:
                            raise ValueError(
                                f"parent_embed(child_ids) must return a (D,)={self._dim} embedding, "
                                f"got shape {tuple(out.shape)}"
                            )
                        outs.append(out.reshape(-1))
                    rows = self._prepare_rows(torch.stack(outs), "parent_embed(child_ids)")
                pay = torch.full((n_groups,), -1, dtype=torch.int64, device=self._device)
                created.append(self._append_parents(groups, rows, pay))
            lvl += 1
        if not created:
            return torch.empty(0, dtype=torch.int64, device=self._device)
        return torch.cat(created)

    def set_embeddings(self, ids, emb) -> None:
        """Replace the embeddings of live nodes ``ids`` (rows normalised on insertion).

        Parameters
        ----------
        ids : (n,) int, distinct live node ids
        emb : (n, D) or (D,) float tensor or array (one row per id)
        """
        ids = self._prepare_ids(ids, "ids")
        rows = self._prepare_rows(emb, "emb")
        if rows.shape[0] != len(ids):
            raise ValueError(f"emb must hold one row per id ({len(ids)}), got {rows.shape[0]}")
        if ids:
            self._emb[torch.tensor(ids, dtype=torch.int64, device=self._device)] = rows

    def _prepare_ids(self, ids, name: str) -> list[int]:
        """Distinct live node ids as a sorted Python list (ValueError naming ``name`` otherwise)."""
        if isinstance(ids, (int, np.integer)) and not isinstance(ids, bool):
            ids = [int(ids)]
        if isinstance(ids, (list, tuple)) and not ids:
            return []  # an empty Python list would otherwise become a float tensor
        ids = as_tensor(ids, name)
        check_dtype(ids, name, _INT_INPUTS)
        out = sorted(int(i) for i in ids.reshape(-1).tolist())
        if len(set(out)) != len(out):
            raise ValueError(f"{name} must be distinct node ids")
        if out and (out[0] < 0 or out[-1] >= self._n):
            bad = out[0] if out[0] < 0 else out[-1]
            raise ValueError(f"{name} must be node ids in [0, {self._n}), got {bad}")
        if out:
            alive = self._alive[torch.tensor(out, dtype=torch.int64, device=self._device)].tolist()
            dead = [i for i, a in zip(out, alive) if not a]
            if dead:
                raise ValueError(f"{name} must be live node ids; already removed: {dead[:5]}")
        return out

    def remove(self, ids, *, cascade: bool = False) -> torch.Tensor:
        """Remove live nodes (tombstones; ids of the others stay valid until :meth:`compact`).

        Parameters
        ----------
        ids : (n,) int or int
            Distinct live node ids.
        cascade : bool
            Also remove every live descendant of ``ids``.  Without it, a node
            in ``ids`` that still has a live child outside ``ids`` is an error.

        Returns
        -------
        (m,) int64 ascending ids of every node removed: ``ids``, their
        descendants (``cascade``) and each ancestor left without a live child.

        Notes
        -----
        Parents whose children are all removed are removed too, recursively;
        a surviving ancestor's level is recomputed as ``1 + max(level of its
        live children)`` (a root whose level changes moves to that level's
        roots).  Dead ids leave their parents' CSR child runs at once, so every
        search backend only ever sees live nodes.  Cost: O(edges) tensor work
        plus O(removed x depth) Python steps.
        """
        if not isinstance(cascade, bool):
            raise ValueError(f"cascade must be a bool, got {cascade!r}")
        targets = self._prepare_ids(ids, "ids")
        if not targets:
            return torch.empty(0, dtype=torch.int64, device=self._device)
        n = self._n
        ptr = self._child_ptr[: n + 1].tolist()
        kids = self._child_idx[: self._n_edges].tolist()
        parent = self._parent[:n].tolist()
        level = self._level[:n].tolist()
        dead = set(targets)
        # Descendants: CSR runs hold live children only, so a walk reaches live nodes only.
        stack = list(targets)
        while stack:
            node = stack.pop()
            for c in kids[ptr[node] : ptr[node + 1]]:
                if c in dead:
                    continue
                if not cascade:
                    raise ValueError(
                        f"ids must not hold a node with live children unless cascade=True; node {node} "
                        f"has live child {c}"
                    )
                dead.add(c)
                stack.append(c)
        # Ancestors: a parent whose live children are all removed goes too;
        # the others get their level recomputed from the surviving children.
        touched = {parent[i] for i in dead if parent[i] >= 0 and parent[i] not in dead}
        new_level: dict[int, int] = {}
        while touched:
            # Deepest first, so a node's children are settled before it.
            node = min(touched, key=lambda i: level[i])
            touched.discard(node)
            live = [c for c in kids[ptr[node] : ptr[node + 1]] if c not in dead]
            if not live:
                dead.add(node)
            else:
                lvl = 1 + max(new_level.get(c, level[c]) for c in live)
                if lvl == level[node] and node not in new_level:
                    continue
                new_level[node] = lvl
            if parent[node] >= 0 and parent[node] not in dead:
                touched.add(parent[node])
        removed = sorted(dead)
        dev = self._device
        dead_t = torch.tensor(removed, dtype=torch.int64, device=dev)
        self._alive[dead_t] = False
        self._parent[dead_t] = -1
        self._n_dead += len(removed)
        # Filter dead ids out of the CSR: new_ptr[i] = kept edges before the old ptr[i].
        if self._n_edges:
            edges = self._child_idx[: self._n_edges]
            keep = self._alive[edges]
            before = torch.zeros(self._n_edges + 1, dtype=torch.int64, device=dev)
            before[1:] = torch.cumsum(keep.to(torch.int64), 0)
            self._child_ptr[: n + 1] = before[self._child_ptr[: n + 1]]
            kept = edges[keep]
            self._child_idx[: kept.numel()] = kept
            self._n_edges = kept.numel()
            self._max_fanout = _max_run(self._child_ptr[: n + 1])
        for node in removed:
            if parent[node] == -1:
                self._roots_by_level[level[node]].pop(node, None)
        for node, lvl in new_level.items():
            if lvl == level[node]:
                continue
            self._level[node] = lvl
            if parent[node] == -1:
                del self._roots_by_level[level[node]][node]
                merged = self._root_dict(lvl)
                merged[node] = None
                ordered = sorted(merged)
                merged.clear()
                merged.update(dict.fromkeys(ordered))
        while self._roots_by_level and not self._roots_by_level[-1]:
            self._roots_by_level.pop()
        self._roots_cache = None
        return dead_t

    def compact(self) -> torch.Tensor:
        """Drop removed nodes: renumber live nodes in id order (children stay chronological).

        Returns
        -------
        (old num_nodes,) int64 map old id -> new id, -1 for removed nodes.
        Searches return the same results as before, with ids mapped.
        """
        n, dev = self._n, self._device
        alive = self._alive[:n]
        mapping = torch.where(alive, torch.cumsum(alive.to(torch.int64), 0) - 1,
                              torch.full((n,), -1, dtype=torch.int64, device=dev))
        if self._n_dead == 0:
            return mapping
        live = alive.nonzero()[:, 0]
        m = live.numel()
        # Dead nodes have empty child runs, so the live runs are already contiguous in id order.
        ptr = torch.cat([self._child_ptr[live], self._child_ptr[n : n + 1]])
        par = self._parent[live]
        par = torch.where(par >= 0, mapping[par.clamp_min(0)], par)
        for dst, src in ((self._emb, self._emb[live]), (self._level, self._level[live]),
                         (self._utility, self._utility[live]), (self._payload, self._payload[live])):
            dst[:m] = src
        self._parent[:m] = par
        self._child_ptr[: m + 1] = ptr
        self._child_idx[: self._n_edges] = mapping[self._child_idx[: self._n_edges]]
        self._alive[:n] = True
        self._parent[m:n] = -1
        self._n, self._n_dead = m, 0
        remap = mapping.tolist()
        self._roots_by_level = [{remap[i]: None for i in d} for d in self._roots_by_level]
        self._roots_cache = None
        return mapping

    # ---- persistence ---------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "format": _FORMAT,
            "version": _FORMAT_VERSION,
            "dim": self._dim,
            "embeddings": self.embeddings.cpu().clone(),
            "level": self.level.cpu().clone(),
            "parent": self.parent.cpu().clone(),
            "child_ptr": self.child_ptr.cpu().clone(),
            "child_idx": self.child_idx.cpu().clone(),
            "utility": self.utility.cpu().clone(),
            "payload": self.payload.cpu().clone(),
            "alive": self.alive.cpu().clone(),
        }

    def save(self, path) -> None:
        """Write the tree to one file (``torch.save`` of its tensors)."""
        torch.save(self.state_dict(), path)

    @classmethod
    def load(cls, path, *, device="cpu") -> "CosineTree":
        """Read a tree written by :meth:`save`; node ids and tombstones are preserved."""
        state = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(state, dict) or state.get("format") != _FORMAT:
            raise ValueError(f"path does not hold a saved CosineTree: {path}")
        if state.get("version") not in (1, _FORMAT_VERSION):
            raise ValueError(f"unsupported CosineTree format version {state.get('version')}")
        n = state["embeddings"].shape[0]
        n_edges = state["child_idx"].shape[0]
        if "alive" not in state:
            state["alive"] = torch.ones(n, dtype=torch.bool)
        _check_saved_structure(state, n, n_edges, path)
        tree = cls(int(state["dim"]), capacity=max(n, 1), device=device)
        tree._reserve(0, n_edges)
        dev = tree._device
        tree._emb[:n] = state["embeddings"].to(dev, torch.float32)
        tree._level[:n] = state["level"].to(dev)
        tree._parent[:n] = state["parent"].to(dev)
        tree._child_ptr[: n + 1] = state["child_ptr"].to(dev)
        tree._child_idx[:n_edges] = state["child_idx"].to(dev)
        tree._utility[:n] = state["utility"].to(dev)
        tree._payload[:n] = state["payload"].to(dev)
        tree._alive[:n] = state["alive"].to(dev)
        tree._n, tree._n_edges = n, n_edges
        tree._n_dead = int((~state["alive"]).sum())
        tree._max_fanout = _max_run(state["child_ptr"])
        parent = state["parent"].tolist()
        level = state["level"].tolist()
        alive = state["alive"].tolist()
        for node in range(n):
            if parent[node] == -1 and alive[node]:
                tree._root_dict(level[node])[node] = None
        return tree

    def __repr__(self) -> str:
        return (f"CosineTree(dim={self._dim}, num_nodes={self._n}, roots={len(self.roots)}, "
                f"height={self.height}, device={self._device})")


def _max_run(child_ptr: torch.Tensor) -> int:
    """Longest CSR run (most children of a node); a host read, done once per mutation."""
    return int((child_ptr[1:] - child_ptr[:-1]).max()) if child_ptr.numel() > 1 else 0


def _check_saved_structure(state: dict, n: int, n_edges: int, path) -> None:
    """Reject files whose arrays would send the kernels out of bounds."""
    shapes_ok = (
        state["embeddings"].dim() == 2 and state["embeddings"].shape[1] == int(state["dim"])
        and all(state[key].shape == (n,) for key in ("level", "parent", "utility", "payload"))
        and state["child_ptr"].shape == (n + 1,)
        and state["alive"].shape == (n,) and state["alive"].dtype == torch.bool
    )
    ptr, kids, parent = state["child_ptr"], state["child_idx"], state["parent"]
    links_ok = shapes_ok and (
        int(ptr[0]) == 0 and int(ptr[-1]) == n_edges and bool((ptr[1:] >= ptr[:-1]).all())
        and bool(((kids >= 0) & (kids < n)).all()) and bool(((parent >= -1) & (parent < n)).all())
        # Kernels follow child_idx from live roots: a dead id there would be searched.
        and bool(state["alive"][kids].all())
    )
    if not links_ok:
        raise ValueError(f"path holds a CosineTree with inconsistent arrays (shapes or CSR links): {path}")


# --------------------------------------------------------------------------
# Public functions: contract, validation, preparation
# --------------------------------------------------------------------------
def _prepare_queries(queries, dim: int, device: torch.device, name: str = "queries") -> torch.Tensor:
    queries = as_tensor(queries, name)
    check_rank(queries, name, (2,), "(Q, D)")
    check_dtype(queries, name, _FLOAT_INPUTS)
    if queries.shape[0] < 1:
        raise ValueError(f"{name} must hold at least one query, got shape {tuple(queries.shape)}")
    if queries.shape[1] != dim:
        raise ValueError(f"{name} must have D={dim} columns to match, got shape {tuple(queries.shape)}")
    _check_finite_one_pass(queries, name)
    if queries.device != device:
        raise ValueError(f"{name} must be on {device}, got {queries.device}")
    return _unit_rows(queries).contiguous()


def _beam_widths(beam, height: int) -> list[int]:
    """Width per level from the top (index 0 is level ``height``)."""
    if isinstance(beam, (int, np.integer)) and not isinstance(beam, bool):
        widths = [check_int(beam, "beam", minimum=1)]
    elif isinstance(beam, (tuple, list)) and len(beam) > 0:
        widths = [check_int(b, f"beam[{i}]", minimum=1) for i, b in enumerate(beam)]
    else:
        raise ValueError(f"beam must be an int >= 1 or a non-empty tuple of ints >= 1, got {beam!r}")
    return [widths[min(i, len(widths) - 1)] for i in range(max(height, 0))]


def tree_search(tree: CosineTree, queries, *, beam=1, k: int = 1, min_score: float | None = None,
                use_utility: bool = False, from_every_root: bool = False, backend: str = "auto"):
    """Batched greedy or beam descent of a :class:`CosineTree`.

    Parameters
    ----------
    tree : CosineTree
        Non-empty tree; its tensors are not modified.
    queries : (Q, D) float tensor or array
        Normalised internally (zero queries score 0 everywhere).
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

    Returns
    -------
    TreePathResult (greedy) or TopKResult (beam), on the tree's device.
    """
    if not isinstance(tree, CosineTree):
        raise ValueError(f"tree must be a CosineTree, got {type(tree).__name__}")
    if tree.num_live == 0:
        raise ValueError("tree must not be empty (add leaves first; every node was removed otherwise)")
    q = _prepare_queries(queries, tree.dim, tree.device)
    k = check_int(k, "k", minimum=1)
    for flag, name in ((use_utility, "use_utility"), (from_every_root, "from_every_root")):
        if not isinstance(flag, bool):
            raise ValueError(f"{name} must be a bool, got {flag!r}")
    min_val = float("-inf") if min_score is None else check_float(min_score, "min_score")
    height = tree.height
    greedy = isinstance(beam, (int, np.integer)) and not isinstance(beam, bool) and int(beam) == 1
    widths = _beam_widths(beam, height)
    arrays = (tree.embeddings, tree.child_ptr, tree.child_idx, tree.roots)
    if greedy:
        if k != 1 or min_score is not None or use_utility:
            raise ValueError(
                "beam=1 is greedy search (one path, no leaf ranking); k, min_score and use_utility "
                "need beam search: pass beam=(1,) or a wider beam"
            )
        name = TREE_GREEDY.select(backend, tree.device)
        return TreePathResult(*call_op(torch.ops.streammem.tree_greedy, TREE_GREEDY.impls, name, *arrays, q, height,
                                       tree.max_fanout, from_every_root))
    if from_every_root:
        raise ValueError("from_every_root applies to greedy search (beam=1) only")
    name = TREE_BEAM.select(backend, tree.device)
    ids, scores = call_op(torch.ops.streammem.tree_beam, TREE_BEAM.impls, name, *arrays, tree.level, tree.utility, q,
                          list(widths), tree.max_fanout, k, min_val, use_utility)
    return TopKResult(ids, scores)


def _prepare_ranges(ranges, num_queries: int, num_keys: int, device) -> torch.Tensor:
    if ranges is None:
        out = torch.empty((num_queries, 2), dtype=torch.int64, device=device)
        out[:, 0], out[:, 1] = 0, num_keys
        return out
    ranges = as_tensor(ranges, "ranges")
    check_dtype(ranges, "ranges", _INT_INPUTS)
    if ranges.dim() != 2 or ranges.shape != (num_queries, 2):
        raise ValueError(f"ranges must have shape (Q, 2)=({num_queries}, 2), got {tuple(ranges.shape)}")
    ranges = ranges.to(device=device, dtype=torch.int64).contiguous()
    start, end = ranges[:, 0], ranges[:, 1]
    # A host check on CPU; on CUDA a device-side assertion (no synchronisation).
    check_values(((start >= 0) & (end <= num_keys) & (start <= end)).all(),
                 f"ranges must satisfy 0 <= start <= end <= N={num_keys} for every query")
    return ranges


def cosine_topk_uses_blas(num_queries: int, num_keys: int, ranges: torch.Tensor | None = None) -> bool:
    """The rule by which the C++ backend of :func:`cosine_topk` uses the CPU BLAS.

    Blocked ``torch.mm`` + C++ running top-k when ``Q >= 8`` and the ranges
    cover at least half of the Q x N (query, key) pairs; otherwise the fused
    one-pass C++ scan, whose cost is proportional to the pairs in range.
    """
    if num_queries < BLAS_MIN_QUERIES:
        return False
    if ranges is None:
        return True
    covered = int((ranges[:, 1] - ranges[:, 0]).sum())
    return 2 * covered >= num_queries * num_keys


def cosine_topk(queries, keys, k: int, *, ranges=None, backend: str = "auto") -> TopKResult:
    """Exact top-k keys by cosine similarity for every query.

    Parameters
    ----------
    queries : (Q, D) float tensor or array
    keys : (N, D) float tensor or array, N >= 1
        Not normalised beforehand (the kernels divide by the norms); zero keys
        score 0.
    k : int >= 1
        Results per query; positions beyond the keys in range hold -1 / -inf.
    ranges : (Q, 2) int, optional
        Query q only considers ``keys[ranges[q, 0]:ranges[q, 1]]`` (indices
        stay global); ``0 <= start <= end <= N``.
    backend : {"auto", "torch", "cpp", "triton", "cuda"}

    Returns
    -------
    TopKResult with ``ids (Q, k)`` int64 and ``scores (Q, k)`` float32, best
    first, ties toward the lower index.
    """
    keys = as_tensor(keys, "keys")
    check_rank(keys, "keys", (2,), "(N, D)")
    check_dtype(keys, "keys", _FLOAT_INPUTS)
    if keys.shape[0] < 1 or keys.shape[1] < 1:
        raise ValueError(f"keys must hold at least one key of dimension >= 1, got shape {tuple(keys.shape)}")
    keys = keys.to(torch.float32).contiguous()
    _check_finite_one_pass(keys, "keys")
    q = _prepare_queries(queries, keys.shape[1], keys.device)
    k = check_int(k, "k", minimum=1)
    r = _prepare_ranges(ranges, q.shape[0], keys.shape[0], keys.device)
    name = COSINE_TOPK.select(backend, keys.device, k=k, num_keys=keys.shape[0])
    ids, scores = call_op(torch.ops.streammem.cosine_topk, COSINE_TOPK.impls, name, q, keys, k, r)
    return TopKResult(ids, scores)


# --------------------------------------------------------------------------
# Custom ops (work under torch.compile; opcheck-tested)
# --------------------------------------------------------------------------
@torch.library.custom_op("streammem::tree_greedy", mutates_args=())
def tree_greedy(embeddings: torch.Tensor, child_ptr: torch.Tensor, child_idx: torch.Tensor, roots: torch.Tensor,
                queries: torch.Tensor, height: int, fanout: int, from_every_root: bool,
                backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Core greedy descent on prepared input (unit float32 queries).

    ``fanout`` is the tree's ``max_fanout`` (candidates per level, padded).
    Returns path (S, H+1), path_scores (S, H+1), best_node (S,), best_score (S,)
    with S = Q, or (Q, R, H+1) ... with ``from_every_root``.
    """
    return tuple(TREE_GREEDY.impls[backend](embeddings, child_ptr, child_idx, roots, queries, height, fanout,
                                            from_every_root))


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
    """Core beam search; ``widths[i]`` is the beam at level ``height - i``, ``fanout`` the tree's ``max_fanout``."""
    return tuple(TREE_BEAM.impls[backend](embeddings, child_ptr, child_idx, roots, level, utility, queries,
                                          list(widths), fanout, k, min_score, use_utility))


@tree_beam.register_fake
def _(embeddings, child_ptr, child_idx, roots, level, utility, queries, widths, fanout, k, min_score, use_utility,
      backend):
    q = queries.shape[0]
    return queries.new_empty((q, k), dtype=torch.int64), queries.new_empty((q, k), dtype=torch.float32)


@torch.library.custom_op("streammem::cosine_topk", mutates_args=())
def cosine_topk_op(queries: torch.Tensor, keys: torch.Tensor, k: int, ranges: torch.Tensor,
                   backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Core exact top-k: unit float32 queries (Q, D), raw float32 keys (N, D), ranges (Q, 2)."""
    return tuple(COSINE_TOPK.impls[backend](queries, keys, k, ranges))


@cosine_topk_op.register_fake
def _(queries, keys, k, ranges, backend):
    q = queries.shape[0]
    return queries.new_empty((q, k), dtype=torch.int64), queries.new_empty((q, k), dtype=torch.float32)


# --------------------------------------------------------------------------
# Backend: torch reference (the spec)
# --------------------------------------------------------------------------
# Every shape below is fixed by host metadata (number of queries and roots, the tree's
# height and max_fanout, the beam widths), never by tensor values: the reference runs on
# a GPU without synchronising, and the Triton beam search shares its level loop.
def _dot_rows(queries: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """dots[s, c] = queries[s] . rows[s, c] for queries (S, D) and rows (S, C, D).

    A product summed along D, not a GEMM: a GEMM's summation order depends on
    where a row falls in its tiles, so two identical rows could score an ulp
    apart and the tie rule (lower id first) would not hold.
    """
    return (rows * queries[:, None, :]).sum(-1)


def _score_candidates_torch(queries: torch.Tensor, embeddings: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
    """scores[s, c] = queries[s] . embeddings[cand[s, c]]; -inf where cand < 0."""
    s_rows, c = cand.shape
    out = torch.full((s_rows, c), float("-inf"), dtype=torch.float32, device=queries.device)
    chunk = max(1, _GATHER_BUDGET // max(1, c * embeddings.shape[1]))  # bounds the (chunk, C, D) gather
    for lo in range(0, s_rows if c else 0, chunk):
        ids = cand[lo : lo + chunk]
        dots = _dot_rows(queries[lo : lo + chunk], embeddings[ids.clamp_min(0)])
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


def _topk_low_id(ids: torch.Tensor, scores: torch.Tensor, k: int):
    """Top-k of each row by (score desc, id asc); -inf scores count as absent."""
    s_rows = ids.shape[0]
    key = torch.where(ids >= 0, ids, torch.full_like(ids, torch.iinfo(torch.int64).max))
    by_id = torch.argsort(key, dim=1, stable=True)
    ids, scores = ids.gather(1, by_id), scores.gather(1, by_id)
    order = torch.argsort(scores, dim=1, descending=True, stable=True)[:, :k]
    top_ids, top_scores = ids.gather(1, order), scores.gather(1, order)
    top_ids = torch.where(torch.isfinite(top_scores), top_ids, torch.full_like(top_ids, -1))
    if top_ids.shape[1] < k:
        pad = k - top_ids.shape[1]
        top_ids = torch.cat([top_ids, top_ids.new_full((s_rows, pad), -1)], 1)
        top_scores = torch.cat([top_scores, top_scores.new_full((s_rows, pad), float("-inf"))], 1)
    return top_ids, top_scores


def _greedy_levels(embeddings, child_ptr, child_idx, roots, queries, height, fanout, from_every_root, score_fn):
    """Greedy descent, one level per step; ``score_fn(queries, emb, cand)`` scores candidates."""
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
    """Level-synchronous beam search; ``score_fn`` scores padded candidate ids.

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
        kept, _ = _topk_low_id(pool, score_fn(queries, embeddings, pool), min(width, pool.shape[1]))
        rest = torch.where(at_level, torch.full_like(pending, -1), pending)
        bound = min(num_nodes, pending.shape[1] + kept.shape[1] * fanout)
        pending = _pack_left(torch.cat([rest, _children_of(kept, child_ptr, child_idx, fanout)], 1), bound)
    cos = score_fn(queries, embeddings, pending)
    rank = cos * utility[pending.clamp_min(0)] if use_utility else cos
    rank = torch.where((pending >= 0) & (cos >= min_score), rank, torch.full_like(rank, float("-inf")))
    return _topk_low_id(pending, rank, k)


def _greedy_torch(embeddings, child_ptr, child_idx, roots, queries, height, fanout, from_every_root):
    return _greedy_levels(embeddings, child_ptr, child_idx, roots, queries, height, fanout, from_every_root,
                          _score_candidates_torch)


def _beam_torch(embeddings, child_ptr, child_idx, roots, level, utility, queries, widths, fanout, k, min_score,
                use_utility):
    return _beam_levels(embeddings, child_ptr, child_idx, roots, level, utility, queries, widths, fanout, k,
                        min_score, use_utility, _score_candidates_torch)


def _cosine_topk_torch(queries, keys, k, ranges):
    num_q, num_k = queries.shape[0], keys.shape[0]
    unit = _unit_rows(keys)
    scores = torch.empty((num_q, num_k), dtype=torch.float32, device=keys.device)
    chunk = max(1, _GATHER_BUDGET // (num_q * keys.shape[1]))  # bounds the (Q, chunk, D) product
    for lo in range(0, num_k, chunk):
        scores[:, lo : lo + chunk] = _dot_rows(queries, unit[None, lo : lo + chunk].expand(num_q, -1, -1))
    idx = torch.arange(num_k, device=keys.device)
    inside = (idx[None, :] >= ranges[:, :1]) & (idx[None, :] < ranges[:, 1:])
    scores = torch.where(inside, scores, torch.full_like(scores, float("-inf")))
    return _topk_low_id(idx.expand_as(scores), scores, k)


# --------------------------------------------------------------------------
# Backend: C++ (csrc/cpu/tree.cpp)
# --------------------------------------------------------------------------
def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().contiguous().numpy()


def _greedy_cpp(embeddings, child_ptr, child_idx, roots, queries, height, fanout, from_every_root):
    mod, _ = load_native("cpu", "tree")
    out = mod.greedy(_np(embeddings), _np(child_ptr), _np(child_idx), _np(roots), _np(queries), int(height),
                     bool(from_every_root))
    lead = (queries.shape[0], roots.shape[0]) if from_every_root else (queries.shape[0],)
    return tuple(torch.from_numpy(a).reshape(lead + a.shape[1:]) for a in out)


def _beam_cpp(embeddings, child_ptr, child_idx, roots, level, utility, queries, widths, fanout, k, min_score,
              use_utility):
    mod, _ = load_native("cpu", "tree")
    ids, scores = mod.beam(_np(embeddings), _np(child_ptr), _np(child_idx), _np(roots), _np(level), _np(utility),
                           _np(queries), np.asarray(widths, dtype=np.int64), int(k), float(min_score),
                           bool(use_utility))
    return torch.from_numpy(ids), torch.from_numpy(scores)


def _cosine_topk_cpp_fused(queries, keys, k, ranges):
    mod, _ = load_native("cpu", "tree")
    ids, scores = mod.cosine_topk(_np(queries), _np(keys), int(k), _np(ranges))
    return torch.from_numpy(ids), torch.from_numpy(scores)


def _cosine_topk_cpp_blas(queries, keys, k, ranges):
    """Blocked torch.mm (CPU BLAS) score blocks filtered by a C++ running top-k, which scores
    the keys it admits exactly as the fused scan does (the same ranking, ties included)."""
    mod, _ = load_native("cpu", "tree")
    num_q, num_k = queries.shape[0], keys.shape[0]
    ids = np.full((num_q, k), -1, dtype=np.int64)
    scores = np.full((num_q, k), -np.inf, dtype=np.float32)
    block = min(num_k, max(256, _BLAS_BLOCK_BUDGET // num_q))
    ranges_np, queries_np, keys_np = _np(ranges), _np(queries), _np(keys)
    norms = mod.row_norms(keys_np)
    buf = torch.empty((num_q, block), dtype=queries.dtype)  # one score block, reused (cache-resident output)
    for lo in range(0, num_k, block):
        hi = min(num_k, lo + block)
        dots = torch.mm(queries, keys[lo:hi].T, out=buf) if hi - lo == block else torch.mm(queries, keys[lo:hi].T)
        mod.topk_merge(dots.numpy(), norms[lo:hi], queries_np, keys_np[lo:hi], lo, ranges_np, ids, scores)
    return torch.from_numpy(ids), torch.from_numpy(scores)


def _cosine_topk_cpp(queries, keys, k, ranges):
    if cosine_topk_uses_blas(queries.shape[0], keys.shape[0], ranges):
        return _cosine_topk_cpp_blas(queries, keys, k, ranges)
    return _cosine_topk_cpp_fused(queries, keys, k, ranges)


# --------------------------------------------------------------------------
# Backend: Triton (streammem_kernels/_tree_triton.py)
# --------------------------------------------------------------------------
# Limits of the Triton top-k: its running top-k (min(k, N) rounded up to a power of two)
# lives in registers, and a key index in 31 bits of the packed (score, index) int.
TRITON_TOPK_MAX_K = 1024
TRITON_TOPK_MAX_KEYS = 2**31 - 1


def _score_candidates_triton(queries, embeddings, cand):
    from ._tree_triton import gather_dot_triton

    return gather_dot_triton(queries, embeddings, cand.contiguous())


def _greedy_triton(embeddings, child_ptr, child_idx, roots, queries, height, fanout, from_every_root):
    from ._tree_triton import greedy_triton

    out = greedy_triton(embeddings, child_ptr, child_idx, roots, queries, height, from_every_root)
    if from_every_root:
        lead = (queries.shape[0], roots.shape[0])
        return tuple(t.view(lead + t.shape[1:]) for t in out)
    return out


def _beam_triton(embeddings, child_ptr, child_idx, roots, level, utility, queries, widths, fanout, k, min_score,
                 use_utility):
    return _beam_levels(embeddings, child_ptr, child_idx, roots, level, utility, queries, widths, fanout, k,
                        min_score, use_utility, _score_candidates_triton)


# --------------------------------------------------------------------------
# Backend: CUDA (csrc/cuda/tree.cu): greedy descent, one block per query, one launch
# --------------------------------------------------------------------------
def _greedy_cuda(embeddings, child_ptr, child_idx, roots, queries, height, fanout, from_every_root):
    from ._tree_cuda import greedy_cuda

    return greedy_cuda(embeddings, child_ptr, child_idx, roots, queries, height, from_every_root)


def _cosine_topk_triton(queries, keys, k, ranges):
    from ._tree_triton import cosine_topk_triton

    return cosine_topk_triton(queries, keys, k, ranges)


def _cosine_topk_triton_reasons(device, k: int = 1, num_keys: int = 1, **_) -> list[str]:
    reasons = []
    if min(k, num_keys) > TRITON_TOPK_MAX_K:
        reasons.append(f"the Triton top-k keeps at most k={TRITON_TOPK_MAX_K} results per query, got k={k}")
    if num_keys > TRITON_TOPK_MAX_KEYS:
        reasons.append(f"the Triton top-k indexes at most {TRITON_TOPK_MAX_KEYS} keys, got N={num_keys}")
    return reasons


# Scores against the reference's (unit rows dotted in float32), per query dtype: queries
# are converted to float32 first, so every dtype gets the float32 figure (a dot product of
# unit vectors summed in a different order).  Ids must match exactly.
_SCORE_TOLERANCES = {dtype: (2e-5, 0.0) for dtype in _FLOAT_INPUTS}
_TOLERANCES = {"torch": {dtype: (0.0, 0.0) for dtype in _FLOAT_INPUTS}, "cpp": _SCORE_TOLERANCES,
               "triton": _SCORE_TOLERANCES, "cuda": _SCORE_TOLERANCES}

# tree_search dispatches greedy and beam search separately: greedy has a CUDA kernel (pointer
# chasing in one launch), beam search runs on Triton on a GPU.
TREE_GREEDY = Op("tree", {"torch": _greedy_torch, "cpp": _greedy_cpp, "triton": _greedy_triton,
                          "cuda": _greedy_cuda}, tolerances=_TOLERANCES)
TREE_BEAM = Op("tree", {"torch": _beam_torch, "cpp": _beam_cpp, "triton": _beam_triton}, tolerances=_TOLERANCES)
TREE_SEARCH = TREE_GREEDY  # kept for callers of the earlier single-Op API

COSINE_TOPK = Op(
    "tree",
    {"torch": _cosine_topk_torch, "cpp": _cosine_topk_cpp, "triton": _cosine_topk_triton},
    extra_reasons={"triton": _cosine_topk_triton_reasons},
    tolerances=_TOLERANCES,
)
