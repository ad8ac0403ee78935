"""Exact cosine top-k over prepared keys, shaped like faiss's ``IndexFlatIP`` with ids: :class:`CosineIndex`.

:func:`~streammem_kernels.cosine_topk` is stateless: every call checks and normalises every key
(the squared norms in its scan, or a norms pass before its GEMMs).  An index does that once per
key, when it is added: it stores the key's unit row (:func:`~.reference.unit_rows`, float32, on the
index's device) and what the backends derive from it (the norm the C++ scan divides by, the power
of two the Triton kernel scales by, optionally a float16 copy), so a search reads the rows and
nothing else.  A search returns what ``cosine_topk(queries, index.keys, k)`` returns, positions
mapped to ids: bit for bit on the C++ backend (it scores the prepared rows with cosine_topk's own
dot products and divisions) and the Triton backend (cosine_topk's kernel with the kept scales); the
torch reference scores the stored rows without normalising them again (the same ids, scores within
a few ulps).

Removal leaves tombstones that every search skips; the rows are compacted away (in place, order
kept) once they are a fifth of the storage, when an ``add`` needs their room (instead of growing the
storage), or by :meth:`CosineIndex.compact`.  The file format is
the shared checkpoint (:mod:`streammem_kernels.checkpoint`).  ``docs/ops/tree.md`` describes the
design and the benchmark against faiss.
"""
from __future__ import annotations

import numpy as np
import torch

from .. import checkpoint
from ..runtime.dispatch import Op, call_op, load_native
from ..runtime.native import NativeChecks, view
from ..runtime.validate import as_tensor, check_dtype, check_finite, check_int, check_rank, resolve_device
from .reference import (FLOAT_INPUTS, INT_INPUTS, MAX_DIM, MAX_NODES, MAX_RESULTS, MAX_TABLE, check_size,
                        index_topk_reference, pow2_row_scale, unit_rows)
from .locking import SharedLock, writer
from .storage import allocate, half_copy_module, write_half_copy, write_int8_copy
from .topk import (BLAS_MIN_QUERIES, SCORE_TOLERANCES, TRITON_TOPK_MAX_K, TRITON_TOPK_MAX_KEYS, TopKResult,
                   cosine_topk_uses_blas, held_ranges, prepare_queries)

__all__ = ["CosineIndex"]

# Checkpoint kind and state layout version of CosineIndex.save.
CHECKPOINT_KIND = "CosineIndex"
STATE_VERSION = 1
# |norm - 1| allowed of a loaded unit row (as CosineTree.load: a few ulps of normalisation pass, a
# corrupted exponent or sign does not).
UNIT_TOLERANCE = 1e-4
# Tombstones are compacted away once they are at least this share of the stored rows (so the
# storage holds at most 1 / (1 - share) times the live rows, and each removed row is moved over
# at most 1 / share times on average).
COMPACT_SHARE = 0.2
# Rows normalised by the torch path of add, or moved by compact, at once: bounds the temporaries
# to 16M floats (64 MB).
_ROW_BUDGET = 1 << 24

_FAST_MAX_K = MAX_RESULTS // BLAS_MIN_QUERIES
_QUERIES_FINITE = "queries must be finite, found NaN or Inf"
_RANGES_INSIDE = "ranges must satisfy 0 <= start <= end for every query"
_INDEX_CHECKS = NativeChecks(_QUERIES_FINITE, _RANGES_INSIDE)
_QUERY_CHECKS = NativeChecks(_QUERIES_FINITE)
_BLAS_BLOCK_BUDGET = 1 << 18  # as cosine_topk's BLAS path: score blocks of at most 1 MiB
_TENSOR, _F32, _STRIDED = torch.Tensor, torch.float32, torch.strided
_from_numpy, _np_empty, _NP_F32, _NP_I64 = torch.from_numpy, np.empty, np.float32, np.int64
_new_tuple = tuple.__new__


class CosineIndex:
    """An exact cosine index: ``add`` vectors with ids, ``search`` the ``k`` best per query, ``remove`` ids.

    Parameters
    ----------
    dim : int
        Vector dimension D >= 1.
    device : torch.device or str
        Where the prepared keys live and searches run (``"cpu"``, ``"cuda"``).
    half_scan : bool
        Also keep a float16 copy of the keys (+50 % of the keys' memory, see :attr:`nbytes`) that the
        C++ scan reads first: it scores every key on the copy and reads the float32 row only of the
        keys an error bound cannot rule out of the top-k, so results are identical (ids, scores, tie
        order) while reading about half the bytes.  CPU indexes only (``ValueError`` on another
        device) and it needs the C++ module ``streammem_kernels._cpu_tree``; only the one-pass scan
        (fewer than 8 queries, or ranges covering less than half of the keys) on x86-64 CPUs with
        F16C, AVX2 and FMA reads it (elsewhere: same results, float32 speed).
    int8_scan : bool
        Instead, an int8 copy (D codes and a float32 scale per key: +25 % of the keys' memory) read as
        ``half_scan``'s, a quarter of the float32 bytes; its error bound covers the quantisation of keys
        and query and the float rounding (``csrc/cpu/tree/int8_scan.cpp``), so results are identical.
        Same conditions (D <= 65,536), on any CPU (AVX-512 VNNI, AVX2 or a portable kernel).
    capacity : int
        Rows allocated at first (storage doubles when full).

    Keys are normalised once, when added (:func:`~streammem_kernels.tree.reference.unit_rows`: a
    zero vector stays zero and scores 0 against everything), checked finite, and stored in insertion
    order; searches never read the caller's tensors again, and nothing given to the index is
    modified.  Ids are non-negative int64 labels (default: consecutive, from one past the largest id
    ever added), distinct among the keys held; ``-1`` in results means "no key".

    ``search(queries, k)`` equals ``cosine_topk(queries, index.keys, k)`` with positions mapped to
    ``index.ids`` (ties toward the earlier-added key): bit for bit on the C++ and Triton backends,
    scores within ``TOLERANCES`` on the torch reference, which does not normalise the stored rows
    again.

    Thread safety: any number of threads may search at once; ``add``, ``remove``, ``compact`` (and
    a Triton search that compacts first) wait for running searches and hold the index alone.
    """

    def __init__(self, dim: int, *, device="cpu", half_scan: bool = False, int8_scan: bool = False,
                 capacity: int = 1024):
        self._dim = check_size(dim, "dim", maximum=MAX_DIM)
        capacity = check_size(capacity, "capacity", maximum=MAX_NODES)
        if capacity * self._dim > MAX_TABLE:
            raise ValueError(f"capacity x dim must be <= {MAX_TABLE} floats, got capacity={capacity} x dim={dim}")
        self._device = resolve_device(device)
        for name, value in (("half_scan", half_scan), ("int8_scan", int8_scan)):
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be a bool, got {value!r}")
            if value:
                if self._device.type != "cpu":
                    raise ValueError(f"{name}=True needs a CPU index (the copy serves the C++ scan), got device "
                                     f"{self._device}")
                half_copy_module(name)  # ValueError now, not at the first add, when the C++ module is missing
        if half_scan and int8_scan:
            raise ValueError("half_scan and int8_scan are exclusive: the scan reads one copy")
        self._half_scan, self._int8_scan = half_scan, int8_scan
        self._n = 0  # rows stored, removed ones included until compacted
        self._dead = 0
        self._next_id = 0
        self._identity = True  # ids[:n] == arange(n): a result's rows are its ids
        self._ascending = True  # ids[:n] strictly ascending (ranges and id look-ups by binary search)
        self._sorted = None  # (sorted ids, their rows) of a non-ascending index, until the next write
        # Bounds the scan copy's prefilter reads (half_scan.cpp, index.cpp): the largest key norm, the
        # largest distance of a key to its copy, the largest |1 / norm - 1| of a non-zero key.
        self._scan_bounds = (0.0, 0.0)
        self._norm_slack = 0.0
        self._native_norms = True  # every stored norm is the C++ scan's own (row_norms)
        self._views = None  # the C++ latency path's views of the stored prefixes, until the next write
        self._lock = SharedLock()
        self._allocate(capacity)

    # ---- storage ------------------------------------------------------------
    def _allocate(self, capacity: int) -> None:
        dev, dim = self._device, self._dim
        self._keys = allocate((capacity, dim), torch.float32, None, dev)
        self._norms = torch.empty(capacity, dtype=torch.float32, device=dev)
        self._scale = torch.empty(capacity, dtype=torch.float32, device=dev)
        self._ids = torch.empty(capacity, dtype=torch.int64, device=dev)
        self._alive = torch.ones(capacity, dtype=torch.bool, device=dev)
        self._half = allocate((capacity, dim), torch.float16, None, dev) if self._half_scan else None
        self._codes = allocate((capacity, dim), torch.int8, None, dev) if self._int8_scan else None
        self._code_scale = torch.empty(capacity, dtype=torch.float32, device=dev) if self._int8_scan else None

    def _reserve(self, extra: int, exact: bool = False) -> None:
        """Room for ``extra`` more rows: compacting the tombstones when that makes room, else growing the
        storage to twice its rows (or exactly to the rows needed, ``exact``) in one allocation."""
        need = self._n + extra
        capacity = self._keys.shape[0]
        if need <= capacity:
            return
        if self._dead and need - self._dead <= capacity:
            # The removed rows make room: compacting in place moves the live rows once, where growing
            # would allocate and copy the whole table (3 GB at 2 * 10^6 keys of D = 384).
            self._compact()
            return
        if need * self._dim > MAX_TABLE or need > MAX_NODES:
            raise ValueError(f"the index would hold {need} keys of dim {self._dim}: more than {MAX_NODES} keys or "
                             f"{MAX_TABLE} floats")
        old = self._tables()
        self._allocate(need if exact else max(need, 2 * capacity))
        n = self._n
        for dst, src in zip(self._tables(), old):
            if src is not None:
                dst[:n] = src[:n]
        self._views = None

    def _tables(self) -> tuple:
        """Every per-row table (None for a scan copy not kept)."""
        return (self._keys, self._norms, self._scale, self._ids, self._alive, self._half, self._codes,
                self._code_scale)

    def _invalidate(self) -> None:
        self._views = None
        self._sorted = None

    # ---- read-only views ------------------------------------------------------
    @property
    def dim(self) -> int:
        return self._dim

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def half_scan(self) -> bool:
        """Whether the index keeps a float16 copy of its keys for the C++ scan (see the class)."""
        return self._half_scan

    @property
    def int8_scan(self) -> bool:
        """Whether the index keeps an int8 copy of its keys for the C++ scan (see the class)."""
        return self._int8_scan

    def __len__(self) -> int:
        return self._n - self._dead

    @property
    def ntotal(self) -> int:
        """Keys held (faiss's name for ``len(index)``)."""
        return len(self)

    @property
    def nbytes(self) -> int:
        """Bytes of the index's storage, allocated capacity and the scan copy included."""
        return sum(t.numel() * t.element_size() for t in self._tables() if t is not None)

    @property
    def keys(self) -> torch.Tensor:
        """(len, D) float32 unit rows held, in insertion order: a view of the storage when nothing removed
        awaits compaction (read it, do not write it), a copy otherwise."""
        self._lock.acquire_read()
        try:
            return self._live(self._keys)
        finally:
            self._lock.release_read()

    @property
    def ids(self) -> torch.Tensor:
        """(len,) int64 ids of :attr:`keys`, in insertion order."""
        self._lock.acquire_read()
        try:
            return self._live(self._ids)
        finally:
            self._lock.release_read()

    def _live(self, table: torch.Tensor) -> torch.Tensor:
        if not self._dead:
            return table[: self._n]
        return table[: self._n][self._alive[: self._n]]

    def __repr__(self) -> str:
        return (f"CosineIndex(dim={self._dim}, ntotal={len(self)}, device={self._device}"
                + (", half_scan=True" if self._half_scan else "") + (", int8_scan=True" if self._int8_scan else "")
                + ")")

    # ---- ids ----------------------------------------------------------------
    def _rows_of(self, ids: torch.Tensor) -> torch.Tensor:
        """Storage rows of ``ids`` (int64 on the index's device), -1 where an id is not held."""
        n = self._n
        if n == 0 or ids.numel() == 0:
            return torch.full_like(ids, -1)
        if self._identity:
            rows = torch.where((ids >= 0) & (ids < n), ids, torch.full_like(ids, -1))
        else:
            if self._ascending:
                stored, order = self._ids[:n], None
            else:
                if self._sorted is None:
                    stored, order = torch.sort(self._ids[:n], stable=True)
                    self._sorted = (stored, order)
                stored, order = self._sorted
            at = torch.searchsorted(stored, ids.contiguous()).clamp_max(n - 1)  # strided ids: torch warns
            hit = stored[at] == ids
            rows = at if order is None else order[at]
            rows = torch.where(hit, rows, torch.full_like(rows, -1))
        if self._dead:
            rows = torch.where(rows >= 0, torch.where(self._alive[rows.clamp_min(0)], rows, -1), rows)
        return rows

    def _check_ids(self, ids, name: str, count: int | None = None) -> torch.Tensor:
        """Distinct non-negative int64 ids on the index's device (ValueError naming ``name`` otherwise)."""
        if isinstance(ids, (int, np.integer)) and not isinstance(ids, bool):
            ids = [int(ids)]
        if isinstance(ids, (list, tuple)) and not ids:
            ids = torch.empty(0, dtype=torch.int64)
        ids = as_tensor(ids, name)
        check_dtype(ids, name, INT_INPUTS)
        check_rank(ids, name, (1,), "(n,)")
        if count is not None and ids.shape[0] != count:
            raise ValueError(f"{name} must hold one id per vector ({count}), got {ids.shape[0]}")
        ids = ids.to(device=self._device, dtype=torch.int64)
        if ids.numel():
            if bool((ids < 0).any()):
                raise ValueError(f"{name} must be non-negative (-1 marks 'no key' in results), got "
                                 f"{int(ids.min())}")
            if torch.unique(ids).numel() != ids.numel():
                raise ValueError(f"{name} must be distinct")
        return ids

    # ---- writers --------------------------------------------------------------
    @writer
    def add(self, vectors, ids=None) -> torch.Tensor:
        """Add vectors (normalised and checked here, once) under ``ids``.

        Parameters
        ----------
        vectors : (n, D) float tensor or array
            Finite; any device (copied to the index's).  ``n = 0`` adds nothing.
        ids : (n,) int, optional
            Distinct non-negative ids not held by the index; default the next ``n`` consecutive ids
            (from one past the largest id ever added).

        Returns
        -------
        (n,) int64 ids of the added keys, on the index's device.  A failed call adds nothing.
        """
        rows = as_tensor(vectors, "vectors")
        check_rank(rows, "vectors", (2,), "(n, D)")
        check_dtype(rows, "vectors", FLOAT_INPUTS)
        if rows.shape[1] != self._dim:
            raise ValueError(f"vectors must have D={self._dim} columns, got shape {tuple(rows.shape)}")
        count = rows.shape[0]
        if ids is None:
            new_ids = torch.arange(self._next_id, self._next_id + count, dtype=torch.int64, device=self._device)
        else:
            new_ids = self._check_ids(ids, "ids", count)
            if count and bool((self._rows_of(new_ids) >= 0).any()):
                held = new_ids[self._rows_of(new_ids) >= 0]
                raise ValueError(f"ids must not be held by the index already, got {held[:5].tolist()}")
        if count == 0:
            return new_ids
        module = self._norm_module()
        if module is None:
            check_finite(rows, "vectors")
        if ids is not None and self._dead and bool((self._rows_of_stored(new_ids) >= 0).any()):
            self._compact()  # an id removed but still stored: its tombstone goes first
        self._reserve(count)
        lo, hi = self._n, self._n + count
        if module is not None:
            # One pass per row in C++: the unit row, its norm as the scan computes it, its Triton scale.
            src = rows.detach().to(device="cpu", dtype=torch.float32).contiguous()
            status = module.index_prepare(view(src), view(self._keys[lo:hi]), view(self._norms[lo:hi]),
                                          view(self._scale[lo:hi]))
            if status:
                raise ValueError("vectors must be finite, found NaN or Inf")
        else:
            step = max(1, _ROW_BUDGET // self._dim)
            for start in range(0, count, step):
                unit = unit_rows(rows[start : start + step].detach().to(self._device))
                self._keys[lo + start : lo + start + unit.shape[0]] = unit
            self._derive(lo, hi, None)
        self._commit(lo, hi, new_ids)
        return new_ids

    def _rows_of_stored(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows of ``ids`` among every stored row, removed ones included (-1: not stored)."""
        dead, self._dead = self._dead, 0
        try:
            return self._rows_of(ids)
        finally:
            self._dead = dead

    def _derive(self, lo: int, hi: int, module) -> None:
        """Norms and Triton scales of stored unit rows [lo, hi) (the C++ scan's norms when ``module``)."""
        keys = self._keys[lo:hi]
        if module is not None:
            module.row_norms(view(keys), view(self._norms[lo:hi]))
        else:
            self._norms[lo:hi] = torch.linalg.vector_norm(keys, dim=1)
            self._native_norms = False
        self._scale[lo:hi] = pow2_row_scale(keys).reshape(-1)

    def _commit(self, lo: int, hi: int, ids: torch.Tensor) -> None:
        """Make stored rows [lo, hi) (keys, norms, scales written) keys of the index under ``ids``."""
        self._ids[lo:hi] = ids
        self._alive[lo:hi] = True
        if self._half is not None:
            bounds = write_half_copy(self._keys[lo:hi], self._half[lo:hi])
            self._scan_bounds = (max(self._scan_bounds[0], bounds[0]), max(self._scan_bounds[1], bounds[1]))
        if self._codes is not None:
            bounds = write_int8_copy(self._keys[lo:hi], self._codes[lo:hi], self._code_scale[lo:hi])
            self._scan_bounds = (max(self._scan_bounds[0], bounds[0]), max(self._scan_bounds[1], bounds[1]))
        norms = self._norms[lo:hi]
        nonzero = norms[norms > 0].to(torch.float64)
        if nonzero.numel():
            slack = float((1.0 / nonzero - 1.0).abs().max())
            self._norm_slack = max(self._norm_slack, slack * (1 + 2.0 ** -40))
        first = int(ids[0])
        if self._identity and not (first == lo and bool((ids == torch.arange(lo, hi, device=ids.device)).all())):
            self._identity = False
        if self._ascending:
            previous = int(self._ids[lo - 1]) if lo else -1
            self._ascending = first > previous and (hi - lo == 1 or bool((ids[1:] > ids[:-1]).all()))
        self._next_id = max(self._next_id, int(ids.max()) + 1)
        self._n = hi
        self._invalidate()

    def _norm_module(self):
        """``_cpu_tree`` when it computes this index's norms (a CPU index, the module built), else None."""
        if self._device.type != "cpu":
            return None
        return load_native("cpu", "tree")[0]

    @writer
    def remove(self, ids) -> int:
        """Remove keys by id; returns how many were removed.

        Parameters
        ----------
        ids : (n,) int or int
            Distinct ids held by the index (``ValueError`` names the first ones that are not).

        The rows stay as tombstones that searches skip until they are a fifth of the storage (then
        compacted in place, order kept), an ``add`` needs their room, or :meth:`compact`.
        """
        ids = self._check_ids(ids, "ids")
        if ids.numel() == 0:
            return 0
        rows = self._rows_of(ids)
        if bool((rows < 0).any()):
            raise ValueError(f"ids must be held by the index; not found: {ids[rows < 0][:5].tolist()}")
        self._alive[rows] = False
        self._dead += rows.numel()
        self._invalidate()
        if self._dead >= COMPACT_SHARE * self._n:
            self._compact()
        return int(rows.numel())

    @writer
    def reserve(self, count: int) -> None:
        """Make room for ``count`` more keys: when the storage lacks it, one allocation of exactly the rows
        needed (removed keys' rows count as room), where a bulk add would double the storage on the way
        (old and new tables held together) and end with up to twice the rows.  Adds beyond double it."""
        count = check_int(count, "count", minimum=0)
        if count:
            self._reserve(count, exact=True)

    @property
    def capacity(self) -> int:
        """Rows the storage holds before it grows (removed keys not compacted away included)."""
        return self._keys.shape[0]

    @writer
    def compact(self) -> None:
        """Drop the removed keys' rows now (in place, order kept); searches and ids are unchanged."""
        self._compact()

    def _compact(self) -> None:
        if not self._dead:
            return
        n = self._n
        live = self._alive[:n].nonzero()[:, 0]
        m = live.numel()
        first = int((~self._alive[:n]).nonzero()[0, 0])  # rows before the first tombstone stay put
        tables = [t for t in self._tables() if t is not None and t is not self._alive]
        step = max(1, _ROW_BUDGET // self._dim)
        # Destination row j <= source row live[j], so moving blocks in increasing order never
        # overwrites a row still to be read.
        for lo in range(first, m, step):
            src = live[lo : lo + step]
            for table in tables:
                table[lo : lo + src.numel()] = table[src]
        self._alive[:n] = True
        self._n, self._dead = m, 0
        ids = self._ids[:m]
        self._identity = bool((ids == torch.arange(m, device=ids.device)).all()) if m else True
        self._invalidate()

    # ---- search -------------------------------------------------------------
    def search(self, queries, k: int, *, ranges=None, backend: str = "auto") -> TopKResult:
        """The ``k`` keys most similar to each query by cosine.

        Parameters
        ----------
        queries : (Q, D) float tensor or array
            Finite; on the index's device; normalised internally (a zero query scores 0 everywhere).
        k : int >= 1
            Results per query; positions beyond the keys in range hold -1 / -inf.
        ranges : (Q, 2) int, optional
            Query q only considers keys whose id lies in ``[ranges[q, 0], ranges[q, 1])`` (faiss's
            ``IDSelectorRange``), ``0 <= start <= end``; needs ids ascending in insertion order (as
            the default ids are).
        backend : {"auto", "torch", "cpp", "triton"}

        Returns
        -------
        TopKResult with ``ids (Q, k)`` int64 (the keys' ids) and ``scores (Q, k)`` float32, best first,
        ties toward the earlier-added key: ``cosine_topk(queries, self.keys, k)`` with positions
        mapped to ids.  Inputs are never modified.
        """
        fast = INDEX_TOPK.run_fast(backend, self, queries, k, ranges)
        if fast is not None:
            return fast
        queries = prepare_queries(queries, self._dim, self._device, against="the index's keys")
        k = check_int(k, "k", minimum=1)
        num_q = queries.shape[0]
        if num_q * k > MAX_RESULTS:
            raise ValueError(f"k must keep Q x k <= {MAX_RESULTS} results, got k={k} for Q={num_q}")
        if ranges is not None:
            ranges = as_tensor(ranges, "ranges")
            check_dtype(ranges, "ranges", INT_INPUTS)
            if ranges.dim() != 2 or ranges.shape != (num_q, 2):
                raise ValueError(f"ranges must have shape (Q, 2)=({num_q}, 2), got {tuple(ranges.shape)}")
            ranges = ranges.to(device=self._device, dtype=torch.int64)
            if num_q and not bool(((ranges[:, 0] >= 0) & (ranges[:, 0] <= ranges[:, 1])).all()):
                raise ValueError(_RANGES_INSIDE)
        name = INDEX_TOPK.select(backend, self._device, inputs={"queries": queries}, k=k, num_keys=max(self._n, 1))
        if name != "cpp":
            check_finite(queries, "queries")
        if name == "triton" and self._dead:
            self.compact()  # the Triton kernel scans every row it is given
        if name == "cpp" and not self._native_norms:
            self._renorm_native()
        self._lock.acquire_read()
        try:
            return self._search_locked(queries, k, ranges, name)
        finally:
            self._lock.release_read()

    def _search_locked(self, queries, k, ranges, name) -> TopKResult:
        num_q, n = queries.shape[0], self._n
        if n - self._dead == 0:
            return TopKResult(torch.full((num_q, k), -1, dtype=torch.int64, device=self._device),
                              torch.full((num_q, k), float("-inf"), dtype=torch.float32, device=self._device))
        if ranges is None:
            rows = torch.empty((num_q, 2), dtype=torch.int64, device=self._device)
            rows[:, 0], rows[:, 1] = 0, n
        else:
            if not self._ascending:
                raise ValueError("ranges select ids in [start, end), which needs the index's ids ascending in "
                                 "insertion order (as default ids are)")
            rows = torch.searchsorted(self._ids[:n], ranges.contiguous()).contiguous()
        alive = self._alive[:n] if self._dead else None
        scan, scan_scale = self._scan_copy(n)
        found, scores = call_op(torch.ops.streammem.index_topk, INDEX_TOPK.impls, name, queries, self._keys[:n],
                                self._norms[:n], self._scale[:n], alive, rows, k, scan, scan_scale,
                                *self._scan_bounds, self._norm_slack)
        return TopKResult(self._labels(found), scores)

    def _scan_copy(self, n: int) -> tuple:
        """(copy, its row scales) of the first n rows: the float16 copy and None, the int8 codes and their
        scales, or (None, None)."""
        if self._half is not None:
            return self._half[:n], None
        if self._codes is not None:
            return self._codes[:n], self._code_scale[:n]
        return None, None

    def _labels(self, rows: torch.Tensor) -> torch.Tensor:
        if self._identity:
            return rows
        return torch.where(rows >= 0, self._ids[rows.clamp_min(0)], rows)

    @writer
    def _renorm_native(self) -> None:
        """Recompute every norm with the C++ scan's dot products (rows added while the module was hidden)."""
        module = self._norm_module()
        if module is not None:
            if self._n:
                module.row_norms(view(self._keys[: self._n]), view(self._norms[: self._n]))
            self._native_norms = True
            self._invalidate()

    def reconstruct(self, ids) -> torch.Tensor:
        """(n, D) float32 stored unit rows of the keys ``ids`` (held ids; faiss's ``reconstruct_batch``)."""
        ids = as_tensor(ids, "ids")
        check_dtype(ids, "ids", INT_INPUTS)
        shape = tuple(ids.shape)
        ids = ids.reshape(-1).to(device=self._device, dtype=torch.int64)
        self._lock.acquire_read()
        try:
            rows = self._rows_of(ids)
            if bool((rows < 0).any()):
                raise ValueError(f"ids must be held by the index; not found: {ids[rows < 0][:5].tolist()}")
            return self._keys[rows].reshape(*shape, self._dim)
        finally:
            self._lock.release_read()

    # ---- persistence ----------------------------------------------------------
    def state_dict(self) -> dict:
        """The index as plain data: ``dim``, ``keys`` (len, D) float32 unit rows and ``ids`` (len,) int64 in
        insertion order (CPU copies), ``next_id``; the derived tables are rebuilt by :meth:`from_state_dict`."""
        self._lock.acquire_read()
        try:
            return {"dim": self._dim, "keys": self._live(self._keys).cpu().clone(),
                    "ids": self._live(self._ids).cpu().clone(), "next_id": self._next_id}
        finally:
            self._lock.release_read()

    def save(self, path) -> None:
        """Write :meth:`state_dict` to ``path`` in the shared checkpoint format (kind ``"CosineIndex"``,
        atomically)."""
        checkpoint.save(path, CHECKPOINT_KIND, self.state_dict(), version=STATE_VERSION)

    @classmethod
    def load(cls, path, *, device="cpu", half_scan: bool = False, int8_scan: bool = False) -> "CosineIndex":
        """Read an index written by :meth:`save`; searches return exactly what they returned before.

        Every way the file can be wrong (missing, truncated, damaged, another kind; keys that are not
        finite unit rows, ids that are negative, repeated or not below ``next_id``) raises one
        ``ValueError`` naming the path and what is wrong.
        """
        state, _ = checkpoint.load(path, CHECKPOINT_KIND, versions=(STATE_VERSION,))
        return cls.from_state_dict(state, device=device, half_scan=half_scan, int8_scan=int8_scan, path=path)

    @classmethod
    def from_state_dict(cls, state: dict, *, device="cpu", half_scan: bool = False, int8_scan: bool = False,
                        path="state") -> "CosineIndex":
        """An index holding ``state`` (:meth:`state_dict`'s form), its unit rows stored as they are (no
        second normalisation, so searches answer as the index that wrote it did).  ``ValueError`` naming
        ``path`` and the field for anything malformed, as :meth:`load`."""
        if not isinstance(state, dict):
            raise ValueError(f"{path}: a CosineIndex state must be a dict, got {type(state).__name__}")
        reader = checkpoint.StateReader(path, CHECKPOINT_KIND, state)
        dim = reader.int("dim", low=1, high=MAX_DIM)
        keys = reader.tensor("keys", dtype=torch.float32, shape=(None, dim), finite=True)
        n = keys.shape[0]
        if n > MAX_NODES or n * dim > MAX_TABLE:
            raise reader.error("keys", f"holds {n} rows of dim {dim}: more than the bounds ({MAX_NODES} keys, "
                                       f"{MAX_TABLE} floats)")
        ids = reader.tensor("ids", dtype=torch.int64, shape=(n,), low=0)
        if torch.unique(ids).numel() != n:
            raise reader.error("ids", "must be distinct")
        next_id = reader.int("next_id", low=int(ids.max()) + 1 if n else 0)
        norms = torch.linalg.vector_norm(keys.contiguous(), dim=1)
        if not bool(((norms == 0) | ((norms - 1).abs() <= UNIT_TOLERANCE)).all()):
            raise reader.error("keys", "must be unit rows (or zero rows)")
        index = cls(dim, device=device, half_scan=half_scan, int8_scan=int8_scan, capacity=max(n, 1))
        if n:  # the stored bits as they are: no second normalisation
            index._keys[:n] = keys.to(index._device)
            index._derive(0, n, index._norm_module())
            index._commit(0, n, ids.to(index._device))
        index._next_id = next_id
        return index

    def __getstate__(self) -> dict:
        """Copy/pickle support: everything but the lock and the native views."""
        self._lock.acquire_read()
        try:
            state = self.__dict__.copy()
        finally:
            self._lock.release_read()
        del state["_lock"]
        state["_views"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        state = {"_codes": None, "_code_scale": None, "_int8_scan": False, **state}  # pickled before int8_scan
        self.__dict__.update(state)
        self._lock = SharedLock()


# --------------------------------------------------------------------------
# Custom op (works under torch.compile)
# --------------------------------------------------------------------------
@torch.library.custom_op("streammem::index_topk", mutates_args=())
def index_topk_op(queries: torch.Tensor, keys: torch.Tensor, norms: torch.Tensor, scale: torch.Tensor,
                  alive: torch.Tensor | None, ranges: torch.Tensor, k: int, scan: torch.Tensor | None,
                  scan_scale: torch.Tensor | None, scan_norm: float, scan_err: float, norm_slack: float,
                  backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Core top-k of a CosineIndex's stored rows: float32 queries (Q, D) of any norm, the prepared keys
    (N, D) with their norms and scales (N,), alive (N,) bool or None, row ranges (Q, 2) int64, the
    optional scan copy (float16 (N, D), or int8 (N, D) with its row scales scan_scale (N,)) and its
    bounds.  Returns (rows, scores) (Q, k)."""
    return tuple(INDEX_TOPK.impls[backend](queries, keys, norms, scale, alive, ranges, k, scan, scan_scale, scan_norm,
                                           scan_err, norm_slack))


@index_topk_op.register_fake
def _(queries, keys, norms, scale, alive, ranges, k, scan, scan_scale, scan_norm, scan_err, norm_slack, backend):
    q = queries.shape[0]
    return queries.new_empty((q, k), dtype=torch.int64), queries.new_empty((q, k), dtype=torch.float32)


# --------------------------------------------------------------------------
# Backends: torch (the reference), C++ (csrc/cpu/tree/index.cpp) and its latency path, Triton
# --------------------------------------------------------------------------
def _index_topk_torch(queries, keys, norms, scale, alive, ranges, k, scan, scan_scale, scan_norm, scan_err,
                      norm_slack):
    return index_topk_reference(queries, keys, k, ranges, alive)


def _index_topk_cpp(queries, keys, norms, scale, alive, ranges, k, scan, scan_scale, scan_norm, scan_err,
                    norm_slack):
    mod = INDEX_TOPK.cpp_module("cpp")
    num_q = queries.shape[0]
    if cosine_topk_uses_blas(num_q, keys.shape[0], ranges):
        return _index_topk_blas(mod, queries, keys, norms, alive, ranges, k)
    ids = torch.empty((num_q, k), dtype=torch.int64)
    scores = torch.empty((num_q, k), dtype=torch.float32)
    status = mod.index_topk(view(queries), view(keys), view(norms), None if alive is None else view(alive),
                            view(ranges), view(ids), view(scores), None if scan is None else view(scan),
                            None if scan_scale is None else view(scan_scale), scan_norm, scan_err, norm_slack)
    _INDEX_CHECKS.raise_for(status)
    return ids, scores


def _index_topk_blas(mod, queries, keys, norms, alive, ranges, k):
    """cosine_topk's BLAS path on prepared keys: blocked torch.mm score blocks filtered by a C++ running
    top-k (index_merge) that scores every admitted key exactly as the one-pass scan does."""
    num_q, num_k = queries.shape[0], keys.shape[0]
    unit = torch.empty_like(queries)
    _QUERY_CHECKS.raise_for(mod.unit_rows(view(queries), view(unit)))
    ids = torch.full((num_q, k), -1, dtype=torch.int64)
    scores = torch.full((num_q, k), float("-inf"), dtype=torch.float32)
    unit_v, ranges_v, ids_v, scores_v = view(unit), view(ranges), view(ids), view(scores)
    block = min(num_k, max(256, _BLAS_BLOCK_BUDGET // num_q))
    buf = torch.empty((num_q, block), dtype=torch.float32)
    for lo in range(0, num_k, block):
        hi = min(num_k, lo + block)
        dots = torch.mm(unit, keys[lo:hi].T, out=buf) if hi - lo == block else torch.mm(unit, keys[lo:hi].T)
        mod.index_merge(view(dots), view(norms[lo:hi]), unit_v, view(keys[lo:hi]), lo, ranges_v,
                        None if alive is None else view(alive[lo:hi]), ids_v, scores_v)
    return ids, scores


def _index_topk_fast(mod, index, queries, k, ranges):
    """search of plain float32 CPU queries, an int k, and no ranges and Q < 8 or plain int64 (Q, 2) CPU ranges
    that hold and that the C++ backend scans in one pass (a VideoAgent round), on a CPU index whose norms are
    the scan's: one call of the one-pass scan, which checks the queries.  Else the general path says why."""
    if not (type(queries) is _TENSOR and type(k) is int and queries.dtype is _F32
            and queries.is_cpu and not queries.requires_grad and queries.layout is _STRIDED
            and queries.is_contiguous() and type(index) is CosineIndex):
        return None
    shape = queries.shape
    if not (len(shape) == 2 and shape[0] >= 1 and shape[1] == index._dim
            and 1 <= k <= _FAST_MAX_K and index._device.type == "cpu" and index._native_norms):
        return None
    bounds = None if ranges is None else held_ranges(ranges, shape[0], k)
    if shape[0] >= BLAS_MIN_QUERIES if ranges is None else bounds is None:  # Q >= 8 unranged: the BLAS path
        return None
    lock = index._lock
    lock.acquire_read()
    try:
        views = index._views
        if views is None:
            views = index._fast_views()
        if views is False:
            return None
        keys, norms, alive, scan, scan_scale, scan_norm, scan_err, slack, labels = views
        rows_in = None
        if bounds is not None:  # the general path's searchsorted of the ids (over ids 0..n-1, a clip to n)
            bounds = np.minimum(bounds, index._n) if labels is None else np.searchsorted(labels, bounds)
            if not index._ascending or (shape[0] >= BLAS_MIN_QUERIES
                                        and cosine_topk_uses_blas(shape[0], index._n, bounds)):
                return None
            rows_in = bounds.__dlpack__()
        rows, scores = _np_empty((shape[0], k), _NP_I64), _np_empty((shape[0], k), _NP_F32)
        status = mod.index_topk(view(queries), keys, norms, alive, rows_in, rows.__dlpack__(), scores.__dlpack__(),
                                scan, scan_scale, scan_norm, scan_err, slack)
        if status:
            _INDEX_CHECKS.raise_for(status)
        if labels is not None:
            rows = np.where(rows >= 0, labels[rows], rows)
        return _new_tuple(TopKResult, (_from_numpy(rows), _from_numpy(scores)))
    finally:
        lock.release_read()


def _fast_views(index) -> tuple | bool:
    """The latency path's capsules of the stored prefixes (made once per write); False for an empty index."""
    n = index._n
    if n - index._dead == 0:
        index._views = False
        return False
    scan, scan_scale = index._scan_copy(n)
    labels = None if index._identity else index._ids[:n].numpy()
    views = (view(index._keys[:n]), view(index._norms[:n]), view(index._alive[:n]) if index._dead else None,
             None if scan is None else view(scan), None if scan_scale is None else view(scan_scale),
             *index._scan_bounds, index._norm_slack, labels)
    index._views = views
    return views


CosineIndex._fast_views = _fast_views


def _index_topk_triton(queries, keys, norms, scale, alive, ranges, k, scan, scan_scale, scan_norm, scan_err,
                       norm_slack):
    from ._triton import cosine_topk_triton

    if alive is not None:  # search() compacts first; a direct call with tombstones scans the live rows
        live = alive.nonzero()[:, 0]
        starts = torch.searchsorted(live, ranges.contiguous())
        rows, scores = cosine_topk_triton(unit_rows(queries), keys[live].contiguous(), k, starts.contiguous(),
                                          scale=scale[live].contiguous())
        return torch.where(rows >= 0, live[rows.clamp_min(0)], rows), scores
    return cosine_topk_triton(unit_rows(queries), keys, k, ranges, scale=scale)


def _index_topk_triton_reasons(device, k: int = 1, num_keys: int = 1, **_) -> list[str]:
    reasons = []
    if min(k, num_keys) > TRITON_TOPK_MAX_K:
        reasons.append(f"the Triton top-k keeps at most k={TRITON_TOPK_MAX_K} results per query, got k={k}")
    if num_keys > TRITON_TOPK_MAX_KEYS:
        reasons.append(f"the Triton top-k indexes at most {TRITON_TOPK_MAX_KEYS} keys, got N={num_keys}")
    return reasons


# Scores against the reference's (unit queries dotted with the stored unit rows, in float32): the C++
# and Triton backends also divide by the rows' norms (within a few ulps of 1), as cosine_topk does;
# ids must match exactly.
TOLERANCES = {"torch": {dtype: (0.0, 0.0) for dtype in FLOAT_INPUTS}, "cpp": SCORE_TOLERANCES,
              "triton": SCORE_TOLERANCES}

INDEX_TOPK = Op(
    "index_topk",
    {"torch": _index_topk_torch, "cpp": _index_topk_cpp, "triton": _index_topk_triton},
    extra_reasons={"triton": _index_topk_triton_reasons},
    tolerances=TOLERANCES,
    native="tree",
    fast=_index_topk_fast,
)
