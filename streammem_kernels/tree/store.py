"""Cosine memory tree: a growable hierarchical store of L2-normalised embeddings (:class:`CosineTree`).

Storage is a set of flat tensors, never Python node objects:

* ``embeddings (num_nodes, D)`` float32, L2-normalised on insertion (a zero vector stays zero and
  scores 0 against everything);
* ``level (num_nodes,)`` int64: 0 for leaves, ``1 + max(level of children)``;
* ``parent (num_nodes,)`` int64, -1 for the current roots (and removed nodes);
* children in CSR form: node i's children are ``child_idx[child_ptr[i]:child_ptr[i+1]]`` in
  chronological (ascending id) order, written once, when the parent is appended after them;
* ``utility (num_nodes,)`` float32 (default 1) and ``payload (num_nodes,)`` int64 (default -1),
  which the caller maps to its own objects;
* ``alive (num_nodes,)`` bool, the tombstone mask of :meth:`CosineTree.remove`: removed ids leave
  every child run and the roots at once, so no search reaches them;
* optionally (``half_scan=True``, CPU) a float16 copy of ``embeddings``, which the C++ beam search
  scores first (identical results, about half the bytes read).

Every embedding is checked finite and normalised on insertion (and on :meth:`CosineTree.load`), so
a search checks only its queries.  Node ids are append-only and stable until
:meth:`CosineTree.compact`.  ``docs/ops/tree.md`` describes the design (removal and compaction,
the snapshot a search reads, memory).
"""
from __future__ import annotations

import functools
import threading
from typing import Callable

import numpy as np
import torch

from ..runtime.dispatch import TraceHandles
from ..runtime.validate import (as_tensor, check_dtype, check_finite, check_int, check_nonempty, check_rank,
                                resolve_device)
from .persistence import FORMAT, FORMAT_VERSION, read_state, save_state, validate_state
from .reference import FLOAT_INPUTS as _FLOAT_INPUTS
from .reference import INT_INPUTS as _INT_INPUTS
from .reference import MAX_DIM, MAX_NODES, MAX_TABLE, check_size
from .reference import unit_rows as _unit_rows
from .storage import SearchArrays, allocate, half_copy_module, longest_run, removal_closure, write_half_copy

__all__ = ["CosineTree"]

# Every tree's handle: torch.compile's trace of a search takes the tree's snapshot through it (search.py).
TREE_HANDLES = TraceHandles()

def _writer(method):
    """Run a mutating method under the tree's lock (writers are serialised)."""
    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return locked


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
    half_scan : bool
        Keep a float16 copy of the embeddings (the "scan copy", +50% of the embedding table's
        memory, see :attr:`nbytes`) for the C++ beam search: it scores every level on the copy,
        then scores again exactly, in float32, only the nodes an error bound cannot rule out of
        the exact selection, so results are identical (ids, scores and tie order) to the search
        without the copy while reading about half the bytes.  CPU trees only (``ValueError`` on
        another device) and it needs the C++ module ``streammem_kernels._cpu_tree``.  Only the
        beam search of :func:`~streammem_kernels.tree_search`'s fast path (plain float32 CPU
        queries) reads it, and only on x86-64 CPUs with F16C, AVX2 and FMA (x86-64-v3); greedy
        search, the other backends and other CPUs ignore it (same results, float32 speed).
        Maintained by every writer, not saved (:meth:`load` takes the same flag).

    The tensor properties (``embeddings``, ``level``, ``parent``, ``child_ptr``,
    ``child_idx``, ``utility``, ``payload``, ``alive``, ``roots``) are views of
    the used prefix of the storage: read them, do not write them.  Removed
    nodes keep their rows (``alive`` False, ``parent`` -1, no children, never
    a root) until :meth:`compact`.

    Thread safety: any number of threads may search while others mutate.
    Writers (``add_leaves``, ``add_parent``, ``grow``, ``remove``, ``compact``,
    ``set_utility``, ``set_embeddings``, ``state_dict``/``save``) are
    serialised by a per-tree lock.  A search reads one consistent snapshot
    (:meth:`search_arrays`, taken under the lock, then read without it): it
    sees the tree as it was before or after each mutation, never in between,
    and stays in bounds -- appends write beyond the snapshot's prefix,
    reallocations leave the old tensors to the snapshots that hold them, and
    ``remove``/``compact`` rewrite copies of the arrays they change.  The one
    exception: ``set_utility``/``set_embeddings`` write values in place (the
    embeddings' scan copy too), so a search running at that moment may see
    some of the new values (never an out-of-bounds read).  The tensor properties are views taken without the
    lock; for a consistent multi-array read while writers run, use
    :meth:`search_arrays` (``.tensors``) or :meth:`state_dict`.
    """

    def __init__(self, dim: int, *, capacity: int = 1024, device="cpu", half_scan: bool = False):
        self._dim = check_size(dim, "dim", maximum=MAX_DIM)
        capacity = check_size(capacity, "capacity", maximum=MAX_NODES)
        if capacity * self._dim > MAX_TABLE:
            raise ValueError(f"capacity x dim must be <= {MAX_TABLE} floats, got capacity={capacity} x dim={dim}")
        self._device = resolve_device(device)
        if not isinstance(half_scan, bool):
            raise ValueError(f"half_scan must be a bool, got {half_scan!r}")
        if half_scan:
            if self._device.type != "cpu":
                raise ValueError(f"half_scan=True needs a CPU tree (the copy serves the C++ beam search), got "
                                 f"device {self._device}")
            half_copy_module()  # ValueError now, not at the first insertion, when the C++ module is missing
        self._half_scan = half_scan
        # Upper bounds on the largest embedding norm and on the largest distance of an embedding to
        # its scan copy, over every row ever written (they only grow: still bounds after removals).
        self._scan_bounds = (0.0, 0.0)
        self._n = 0
        self._n_edges = 0
        self._n_dead = 0
        # Most children of any node: host metadata the searches pad each level's candidates
        # to (updated by every mutation, so a search never asks the device for it).
        self._max_fanout = 0
        self._alloc_nodes(capacity)
        self._child_idx = allocate((capacity,), torch.int64, None, self._device)
        # Current roots per level, in insertion (= ascending id) order; dicts
        # give O(1) removal and ordered iteration for grow()'s "oldest g".
        self._roots_by_level: list[dict[int, None]] = []
        self._roots_cache: torch.Tensor | None = None
        self._search_arrays: SearchArrays | None = None
        # Writers hold it for their whole duration; readers only while taking a snapshot.
        self._lock = threading.RLock()
        self._handle = TREE_HANDLES.register(self)  # for torch.compile's trace (search.py)

    # ---- storage -------------------------------------------------------
    def _invalidate(self) -> None:
        """Forget what is derived from the structure (the roots, the search kernels' pointers):
        every mutation that adds, removes or renumbers nodes or edges, or reallocates, calls this."""
        self._roots_cache = None
        self._search_arrays = None

    def search_arrays(self) -> SearchArrays:
        """A consistent snapshot of the arrays a search reads (cached until the next mutation).

        ``set_utility`` and ``set_embeddings`` write in place and keep it valid (their values
        reach snapshots already taken).
        """
        a = self._search_arrays
        if a is None:
            with self._lock:
                a = self._search_arrays
                if a is None:
                    n, e = self._n, self._n_edges
                    tensors = (self._emb[:n], self._child_ptr[: n + 1], self._child_idx[:e], self._roots_locked(),
                               self._level[:n], self._utility[:n])
                    scan = None if self._scan is None else (self._scan[:n], *self._scan_bounds)
                    a = self._search_arrays = SearchArrays(tensors, self._dim, self._height_locked(),
                                                           self._max_fanout, n - self._n_dead, scan)
        return a

    def _copy_on_write(self, *names: str) -> None:
        """Replace storage tensors by copies before rewriting them in place, so that snapshots
        taken earlier (:meth:`search_arrays`, searches running in other threads) keep theirs."""
        for name in names:
            old = getattr(self, name)
            new = allocate(tuple(old.shape), old.dtype, None, old.device)  # huge pages, as allocated
            new.copy_(old)
            setattr(self, name, new)
        self._invalidate()

    def _write_scan(self, lo: int, hi: int) -> None:
        """Copy embedding rows [lo, hi) into the scan copy (when the tree keeps one)."""
        if self._scan is not None and hi > lo:
            self._raise_scan_bounds(write_half_copy(self._emb[lo:hi], self._scan[lo:hi]))

    def _raise_scan_bounds(self, bounds: tuple) -> None:
        norm, err = max(self._scan_bounds[0], bounds[0]), max(self._scan_bounds[1], bounds[1])
        if (norm, err) != self._scan_bounds:
            self._scan_bounds = (norm, err)
            self._search_arrays = None  # the snapshot carries the bounds

    def _alloc_nodes(self, capacity: int) -> None:
        dev = self._device
        self._emb = allocate((capacity, self._dim), torch.float32, 0, dev)
        self._scan = allocate((capacity, self._dim), torch.float16, None, dev) if self._half_scan else None
        self._level = allocate((capacity,), torch.int64, 0, dev)
        self._parent = torch.full((capacity,), -1, dtype=torch.int64, device=dev)
        self._child_ptr = allocate((capacity + 1,), torch.int64, 0, dev)
        self._utility = torch.ones(capacity, dtype=torch.float32, device=dev)
        self._payload = torch.full((capacity,), -1, dtype=torch.int64, device=dev)
        self._alive = torch.ones(capacity, dtype=torch.bool, device=dev)

    def _reserve(self, extra_nodes: int, extra_edges: int) -> None:
        need = self._n + extra_nodes
        cap = self._emb.shape[0]
        if need > cap:
            new_cap = max(need, 2 * cap)
            old = (self._emb, self._level, self._parent, self._utility, self._payload, self._alive, self._child_ptr)
            old_scan = self._scan
            self._alloc_nodes(new_cap)
            n = self._n
            new = (self._emb, self._level, self._parent, self._utility, self._payload, self._alive, self._child_ptr)
            for dst, src in zip(new[:-1], old[:-1]):
                dst[:n] = src[:n]
            if old_scan is not None:
                self._scan[:n] = old_scan[:n]
            self._child_ptr[: n + 1] = old[-1][: n + 1]  # CSR offsets have one more entry than nodes
        need_e = self._n_edges + extra_edges
        if need_e > self._child_idx.shape[0]:
            grown = allocate((max(need_e, 2 * self._child_idx.shape[0]),), torch.int64, None, self._device)
            grown[: self._n_edges] = self._child_idx[: self._n_edges]
            self._child_idx = grown
        self._invalidate()

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

    @property
    def half_scan(self) -> bool:
        """Whether the tree keeps a half-precision scan copy of its embeddings (see the class)."""
        return self._half_scan

    @property
    def nbytes(self) -> int:
        """Bytes of the tree's storage tensors, allocated capacity included (the scan copy too)."""
        with self._lock:
            tensors = (self._emb, self._scan, self._level, self._parent, self._child_ptr, self._child_idx,
                       self._utility, self._payload, self._alive)
            return sum(t.numel() * t.element_size() for t in tensors if t is not None)

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
        roots = self._roots_cache
        if roots is None:
            with self._lock:
                roots = self._roots_locked()
        return roots

    def _roots_locked(self) -> torch.Tensor:
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
        with self._lock:
            return self._height_locked()

    def _height_locked(self) -> int:
        for lvl in range(len(self._roots_by_level) - 1, -1, -1):
            if self._roots_by_level[lvl]:
                return lvl
        return -1

    def roots_at(self, level: int) -> list[int]:
        """Current roots of one level, oldest first."""
        with self._lock:
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

    @_writer
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
        self._write_scan(lo, hi)
        self._level[lo:hi] = 0
        self._parent[lo:hi] = -1
        self._child_ptr[lo + 1 : hi + 1] = self._n_edges
        self._utility[lo:hi] = 1.0
        self._payload[lo:hi] = pay
        self._alive[lo:hi] = True
        self._n = hi
        self._root_dict(0).update(dict.fromkeys(range(lo, hi)))
        self._invalidate()
        return torch.arange(lo, hi, dtype=torch.int64, device=self._device)

    @_writer
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
        self._write_scan(lo, hi)
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
        self._invalidate()
        return new_ids

    @_writer
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

    @_writer
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

    @_writer
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
            idx = torch.tensor(ids, dtype=torch.int64, device=self._device)
            self._emb[idx] = rows
            if self._scan is not None:
                copy = torch.empty(rows.shape, dtype=torch.float16)
                rows = rows.contiguous()
                self._raise_scan_bounds(write_half_copy(rows, copy))
                self._scan[idx] = copy

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

    @_writer
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
        removed, new_level = removal_closure(targets, ptr, kids, parent, level, cascade)
        dev = self._device
        # Snapshots of running searches keep the old CSR and levels.
        self._copy_on_write("_child_ptr", "_child_idx", "_level")
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
            self._max_fanout = longest_run(self._child_ptr[: n + 1])
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
        self._invalidate()
        return dead_t

    @_writer
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
        self._copy_on_write("_emb", "_level", "_parent", "_child_ptr", "_child_idx", "_utility", "_payload",
                            "_alive", *(("_scan",) if self._scan is not None else ()))
        alive = self._alive[:n]
        live = alive.nonzero()[:, 0]
        m = live.numel()
        # Dead nodes have empty child runs, so the live runs are already contiguous in id order.
        ptr = torch.cat([self._child_ptr[live], self._child_ptr[n : n + 1]])
        par = self._parent[live]
        par = torch.where(par >= 0, mapping[par.clamp_min(0)], par)
        for dst, src in ((self._emb, self._emb[live]), (self._level, self._level[live]),
                         (self._utility, self._utility[live]), (self._payload, self._payload[live])):
            dst[:m] = src
        if self._scan is not None:  # rows move, values do not: the bounds still hold
            self._scan[:m] = self._scan[live]
        self._parent[:m] = par
        self._child_ptr[: m + 1] = ptr
        self._child_idx[: self._n_edges] = mapping[self._child_idx[: self._n_edges]]
        self._alive[:n] = True
        self._parent[m:n] = -1
        self._n, self._n_dead = m, 0
        remap = mapping.tolist()
        self._roots_by_level = [{remap[i]: None for i in d} for d in self._roots_by_level]
        self._invalidate()
        return mapping

    # ---- persistence ---------------------------------------------------------
    @_writer
    def state_dict(self) -> dict:
        return {
            "format": FORMAT,
            "version": FORMAT_VERSION,
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
        """Write the tree to one file of the checkpoint format (:mod:`streammem_kernels.checkpoint`): a
        versioned header, a SHA-256 of the payload, written atomically (a crash leaves the old file or
        the new one, never a part)."""
        save_state(path, self.state_dict())

    @classmethod
    def load(cls, path, *, device="cpu", half_scan: bool = False) -> "CosineTree":
        """Read a tree written by :meth:`save`; node ids and tombstones are preserved.

        ``half_scan`` builds the half-precision scan copy (see :class:`CosineTree`; the file
        never holds it).

        Every malformed file raises one ``ValueError`` naming the path and what is wrong: a
        missing, empty, truncated or damaged file (the checksum covers every byte), a file of
        another kind, a plain ``torch.save`` file from before the checkpoint format, and any
        state :meth:`from_state_dict` refuses.
        """
        return cls._from_arrays(read_state(path), device, half_scan)

    @classmethod
    def from_state_dict(cls, state, *, device="cpu", half_scan: bool = False) -> "CosineTree":
        """A tree from :meth:`state_dict` output (or a ``checkpoint.StateReader`` of one, nested in
        another object's checkpoint), validated before anything is trusted: ``ValueError`` naming the
        field for wrong dtypes, shapes or non-contiguous arrays, non-finite or non-unit embeddings,
        CSR offsets or ids out of range, a parent before its child (a cycle), child runs that
        disagree with ``parent`` or hold removed nodes, and levels other than ``1 + max(level of
        children)``."""
        return cls._from_arrays(validate_state(state), device, half_scan)

    @classmethod
    def _from_arrays(cls, state: dict, device, half_scan: bool) -> "CosineTree":
        n = state["embeddings"].shape[0]
        n_edges = state["child_idx"].shape[0]
        tree = cls(state["dim"], capacity=max(n, 1), device=device, half_scan=half_scan)
        tree._reserve(0, n_edges)
        dev = tree._device
        tree._emb[:n] = state["embeddings"].to(dev, torch.float32)
        tree._write_scan(0, n)
        tree._level[:n] = state["level"].to(dev)
        tree._parent[:n] = state["parent"].to(dev)
        tree._child_ptr[: n + 1] = state["child_ptr"].to(dev)
        tree._child_idx[:n_edges] = state["child_idx"].to(dev)
        tree._utility[:n] = state["utility"].to(dev)
        tree._payload[:n] = state["payload"].to(dev)
        tree._alive[:n] = state["alive"].to(dev)
        tree._n, tree._n_edges = n, n_edges
        tree._n_dead = int((~state["alive"]).sum())
        tree._max_fanout = longest_run(state["child_ptr"])
        parent = state["parent"].tolist()
        level = state["level"].tolist()
        alive = state["alive"].tolist()
        for node in range(n):
            if parent[node] == -1 and alive[node]:
                tree._root_dict(level[node])[node] = None
        tree._invalidate()
        return tree

    def __getstate__(self) -> dict:
        """Copy/pickle support: everything but the lock and the search snapshot."""
        with self._lock:
            state = self.__dict__.copy()
        del state["_lock"]
        state["_search_arrays"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        state = {"_half_scan": False, "_scan": None, "_scan_bounds": (0.0, 0.0), **state}  # pickles from before
        self.__dict__.update(state)
        self._lock = threading.RLock()
        self._handle = TREE_HANDLES.register(self)

    def __repr__(self) -> str:
        return (f"CosineTree(dim={self._dim}, num_nodes={self._n}, roots={len(self.roots)}, "
                f"height={self.height}, device={self._device})")
