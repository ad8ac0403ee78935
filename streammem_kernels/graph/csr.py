"""The storage of the graph op: :class:`CSRGraph`, compressed sparse rows validated once, at construction.

Row ``u``'s entries are ``col_idx[row_ptr[u]:row_ptr[u+1]]``, targets in ``[0, num_cols)``;
self-loops and repeated entries are allowed.  **Row order is priority**: an expansion capped by
``max_fanout=f`` follows the first ``f`` entries of each row, so :meth:`CSRGraph.from_edges` writes
every row by edge weight descending, then target id ascending (then input order), and a caller
building CSR by hand decides the priority by the order it writes.  ``edge_ids`` maps each entry of a
graph built from an edge list back to its input edge.
"""
from __future__ import annotations

import torch

from ..runtime.dispatch import TraceHandles
from ..runtime.validate import as_tensor, check_dtype, check_finite, check_int, check_rank, check_values
from .reference import FLOAT_INPUTS as _FLOAT_INPUTS
from .reference import INT_INPUTS as _INT_INPUTS
from .reference import NO_CAP

__all__ = ["CSRGraph", "MAX_BUILT_ROWS"]

# The most rows from_edges builds (4 GiB of row offsets and degree counts): a larger num_rows is a
# mistake (num_rows=1e9 for a graph of a few nodes), stopped before any allocation.
MAX_BUILT_ROWS = 1 << 28
# Every graph's handle: torch.compile's trace reads a CUDA graph's max degree through it (graph/__init__.py).
GRAPH_HANDLES = TraceHandles()


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

    The graph owns its arrays: ``row_ptr`` and ``col_idx`` are copied (as
    contiguous int64), so the caller may change or free its tensors afterwards,
    and the ``row_ptr`` / ``col_idx`` properties return copies.  On CUDA tensors the
    value checks are device-side assertions (no synchronisation).  A graph is
    immutable after construction, so any number of threads may query it at
    once.
    """

    _native = None  # graphs unpickled from before the attribute existed

    def __init__(self, row_ptr, col_idx, *, num_cols: int | None = None):
        row_ptr = as_tensor(row_ptr, "row_ptr")
        check_rank(row_ptr, "row_ptr", (1,), "(R+1,)")
        check_dtype(row_ptr, "row_ptr", _INT_INPUTS)
        if row_ptr.numel() < 1:
            raise ValueError("row_ptr must have shape (R+1,) with R >= 0, got an empty tensor")
        # Copies, never the caller's storage: a caller writing to its tensors later would otherwise
        # change a validated graph under the C++ backend (an out-of-range id read out of bounds).
        col_idx = _index_vector(col_idx, "col_idx", row_ptr.device).clone()
        row_ptr = row_ptr.to(torch.int64).contiguous().clone()
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
        self._handle = GRAPH_HANDLES.register(self)  # for torch.compile's trace (graph/__init__.py)
        # The C++ backend's views of row_ptr and col_idx (a CPU graph is immutable: made once, by the
        # first call that needs them); never copied or pickled.
        self._native = None

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
        if num_rows > MAX_BUILT_ROWS:
            raise ValueError(f"num_rows must be <= {MAX_BUILT_ROWS} (2**28) to build from an edge list (its row_ptr "
                             f"and degree counts take 16 bytes a row), got {num_rows}")
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
        """(R+1,) int64 row offsets into ``col_idx`` (a copy: the graph's own array never changes)."""
        return self._row_ptr.clone()

    @property
    def col_idx(self) -> torch.Tensor:
        """(E,) int64 targets, each row in priority order (a copy: the graph's own array never changes)."""
        return self._col_idx.clone()

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

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_native": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._handle = GRAPH_HANDLES.register(self)  # a copy is another object: its own handle

    def __repr__(self) -> str:
        return (f"CSRGraph(num_rows={self.num_rows}, num_cols={self.num_cols}, num_edges={self.num_edges}, "
                f"device={self.device})")
