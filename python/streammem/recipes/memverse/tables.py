"""The long-term graph's tables: append-only columns, stable handles of renumbered ids, CSR extension and
compaction without a sort, and the eviction's order (what :class:`~.graph.LongTermGraph` keeps in step)."""
from __future__ import annotations

import operator
from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["Column", "HandleList", "Handles", "compact_csr", "extend_csr", "least_useful", "row_counts"]


def extend_csr(row_ptr: torch.Tensor, col_idx: torch.Tensor, num_rows: int, src: torch.Tensor,
               dst: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Add entries ``src[i] -> dst[i]`` to a CSR, in front of each row's old entries, newest first.

    Parameters
    ----------
    row_ptr : (R+1,) int64
    col_idx : (E,) int64
    num_rows : int >= R
        Rows of the result (rows ``R..num_rows-1`` are new).
    src, dst : (b,) int64
        New entries; a later entry counts as newer.

    Returns
    -------
    (row_ptr (num_rows+1,), col_idx (E+b,)): row ``u`` lists its new entries by
    descending position in ``src``, then its old entries in their old order.
    Equal to ``CSRGraph.from_edges`` over all entries with weight = insertion
    order (tested), in O(E + b log b) instead of a sort of E + b entries.
    """
    old_rows = row_ptr.numel() - 1
    if num_rows < old_rows:
        raise ValueError(f"num_rows must be >= the CSR's {old_rows} rows, got {num_rows}")
    device = row_ptr.device
    degree_old = torch.zeros(num_rows, dtype=torch.int64, device=device)
    degree_old[:old_rows] = row_ptr[1:] - row_ptr[:-1]
    added = torch.bincount(src, minlength=num_rows)
    new_ptr = torch.zeros(num_rows + 1, dtype=torch.int64, device=device)
    torch.cumsum(degree_old + added, 0, out=new_ptr[1:])
    out = torch.empty(col_idx.numel() + src.numel(), dtype=torch.int64, device=device)
    # Old entry i of row r lands at new_ptr[r] + added[r] + (i - row_ptr[r]) = i + (added up to and including r).
    added_through = torch.cumsum(added, 0)
    if col_idx.numel():
        row_of = torch.repeat_interleave(torch.arange(old_rows, device=device), degree_old[:old_rows])
        out[torch.arange(col_idx.numel(), device=device) + added_through[row_of]] = col_idx
    if src.numel():
        newest_first = torch.arange(src.numel() - 1, -1, -1, device=device)
        order = newest_first[torch.argsort(src[newest_first], stable=True)]
        rows = src[order]
        rank = torch.arange(src.numel(), device=device) - (added_through - added)[rows]
        out[new_ptr[rows] + rank] = dst[order]
    return new_ptr, out


def compact_csr(row_ptr: torch.Tensor, col_idx: torch.Tensor, row_map: torch.Tensor,
                col_map: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop removed rows and entries, renumber the rest, keep every row's order.

    ``row_map (R,)`` / ``col_map (num_cols,)`` give each row's / target's new id,
    or -1 when removed; new row ids must be increasing.  Returns the new
    ``(row_ptr, col_idx)``.  Five passes over the entries (a gather, the row
    mask, a cumulative count, a compaction): an eviction's CSR cost.
    """
    kept_rows = row_map >= 0
    degree = row_ptr[1:] - row_ptr[:-1]
    new_col = col_map[col_idx]
    keep = (new_col >= 0) & torch.repeat_interleave(kept_rows, degree, output_size=col_idx.numel())
    before = torch.zeros(col_idx.numel() + 1, dtype=torch.int64, device=row_ptr.device)
    torch.cumsum(keep, 0, out=before[1:])
    kept = before[row_ptr[1:]] - before[row_ptr[:-1]]  # entries kept per old row
    new_ptr = torch.zeros(int(kept_rows.sum()) + 1, dtype=torch.int64, device=row_ptr.device)
    torch.cumsum(kept[kept_rows], 0, out=new_ptr[1:])
    return new_ptr, new_col[keep]


class Handles:
    """Stable handles of dense ids: what the name maps and the embedding indexes hold, so that an eviction,
    which renumbers the dense ids, rewrites two int arrays instead of every map entry and index row.

    ``handle[d]``: dense id -> handle; ``dense[h]``: handle -> dense id, -1 once removed.  Handles are
    issued in dense order and never reused (8 bytes per handle ever issued).
    """

    def __init__(self):
        self._handle = np.empty(16, np.int64)
        self._dense = np.empty(16, np.int64)
        self.count = 0  # dense ids
        self.issued = 0  # handles

    @property
    def handle(self) -> np.ndarray:
        return self._handle[: self.count]

    @property
    def dense(self) -> np.ndarray:
        return self._dense[: self.issued]

    @staticmethod
    def _room(array: np.ndarray, used: int, need: int) -> np.ndarray:
        if need <= array.shape[0]:
            return array
        grown = np.empty(max(need, 2 * array.shape[0]), np.int64)
        grown[:used] = array[:used]
        return grown

    def issue(self, count: int) -> np.ndarray:
        """Handles of ``count`` new dense ids appended after the current ones."""
        self._dense = self._room(self._dense, self.issued, self.issued + count)
        self._handle = self._room(self._handle, self.count, self.count + count)
        new = np.arange(self.issued, self.issued + count, dtype=np.int64)
        self._dense[self.issued : self.issued + count] = np.arange(self.count, self.count + count)
        self._handle[self.count : self.count + count] = new
        self.issued += count
        self.count += count
        return new

    def keep(self, mask: np.ndarray) -> None:
        """Remove the dense ids where ``mask`` is False and renumber the rest in order."""
        handle = self.handle
        self._dense[handle[~mask]] = -1
        kept = handle[mask]
        self._handle[: kept.shape[0]] = kept
        self.count = kept.shape[0]
        self._dense[kept] = np.arange(self.count)

    def reset(self, count: int) -> None:
        """``count`` dense ids, handle = dense id (a loaded graph)."""
        self._handle = np.arange(max(count, 16), dtype=np.int64)
        self._dense = np.arange(max(count, 16), dtype=np.int64)
        self.count = self.issued = count

    def dense_of(self, handles: torch.Tensor) -> torch.Tensor:
        """Dense ids of ``handles`` (a tensor; -1 entries stay -1)."""
        table = torch.from_numpy(self._dense[: max(self.issued, 1)])
        return torch.where(handles >= 0, table[handles.clamp_min(0)], handles)

    def handles_of(self, ids: torch.Tensor) -> torch.Tensor:
        """Handles of dense ``ids`` (a tensor of ids >= 0)."""
        return torch.from_numpy(self.handle)[ids]


class HandleList(Sequence):
    """Python objects by dense id (a read-only sequence: ``texts[node]``, ``len``, iteration, ``==`` with a
    list), stored by handle (``Handles``), so that an eviction drops the removed ones (:meth:`drop`, work
    per removed item) instead of rebuilding a list of every kept one: the rebuild's reference counting
    touches each kept object, ~0.1 us a cache miss each, 0.2 s per list at 2 x 10^6 nodes.  Like the
    handles, the storage keeps a slot (8 bytes) per handle ever issued.
    """

    __hash__ = None

    def __init__(self, handles: Handles, items=()):
        self._handles = handles
        self._items = list(items)  # by handle; None once dropped

    def __len__(self) -> int:
        return self._handles.count

    def __getitem__(self, at):
        handle = self._handles.handle
        if isinstance(at, slice):
            return [self._items[h] for h in handle[at].tolist()]
        return self._items[handle[operator.index(at)]]

    def __iter__(self):
        items = self._items
        return (items[h] for h in self._handles.handle.tolist())

    def __eq__(self, other) -> bool:
        if not isinstance(other, (list, tuple, HandleList)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    def __repr__(self) -> str:
        return f"HandleList({list(self)!r:.200})"

    def extend(self, values) -> None:
        """Append the objects of the handles issued last (``Handles.issue``), in their order."""
        values = list(values)
        # Handles issued without objects (a write that failed after issuing them) hold None.
        self._items.extend([None] * (self._handles.issued - len(self._items) - len(values)))
        self._items.extend(values)

    def of_handles(self, handles: np.ndarray) -> list:
        return [self._items[h] for h in handles.tolist()]

    def drop(self, handles: np.ndarray) -> None:
        """Release the objects of removed ``handles`` (before or after ``Handles.keep`` removes them)."""
        items = self._items
        for h in handles.tolist():
            items[h] = None


def least_useful(ratio: torch.Tensor, created: torch.Tensor, cost: torch.Tensor, need: float) -> torch.Tensor:
    """The entries an eviction removes, in its order (least utility per word first, older first among equals,
    then lower position): the shortest prefix of that order whose cost reaches ``need`` (all of it if none).

    Equal to sorting all entries by those keys (two stable sorts) and cutting, without sorting all of
    them: only the entries whose ratio is at most the m-th smallest are sorted, m grown until their
    cost reaches ``need``.
    """
    total = ratio.numel()
    mean_cost = float(cost.sum()) / max(1, total)
    wanted = max(64, int(4 * need / max(mean_cost, 1e-9)))
    while True:
        if wanted >= total:
            candidates = torch.arange(total)
        else:
            threshold = torch.kthvalue(ratio, wanted).values
            candidates = (ratio <= threshold).nonzero()[:, 0]
        order = candidates[torch.argsort(created[candidates], stable=True)]
        order = order[torch.argsort(ratio[order], stable=True)]
        freed = torch.cumsum(cost[order], 0)
        if candidates.numel() == total or (freed.numel() and float(freed[-1]) >= need):
            break
        wanted *= 4
    count = int(torch.searchsorted(freed.to(torch.float64), need))
    return order[: count + 1]


# Rows from which a Column grows by an eighth instead of doubling.
GROW_LARGE = 1 << 16


class Column:
    """Append-only tensor rows with amortised geometric growth (and compaction by a mask or row numbers)."""

    def __init__(self, dtype: torch.dtype, width: int | None = None):
        self._data = torch.zeros((16,) if width is None else (16, width), dtype=dtype)
        self.n = 0

    def extend(self, values: torch.Tensor) -> None:
        need = self.n + values.shape[0]
        if need > self._data.shape[0]:
            # Doubling while small; by an eighth once large (a column of 10^6 rows regrows after every
            # eviction, which keeps exactly the kept rows): still amortised O(1) per row.
            size = self._data.shape[0]
            grown = torch.zeros((max(need, 2 * size if size < GROW_LARGE else size + size // 8),)
                                + tuple(self._data.shape[1:]), dtype=self._data.dtype)
            grown[: self.n] = self._data[: self.n]
            self._data = grown
        self._data[self.n:need] = values
        self.n = need

    @property
    def values(self) -> torch.Tensor:
        return self._data[: self.n]

    def keep(self, rows: torch.Tensor) -> None:
        """Keep the rows ``rows`` (a bool mask, or ascending int64 row numbers: one ``nonzero`` for every
        column of a table instead of one per column), in order: a new tensor of exactly the kept rows (views
        of the old values stay as they were); the next extend regrows it."""
        if rows.dtype == torch.bool:
            rows = rows.nonzero()[:, 0]
        self._data = self.values.index_select(0, rows)
        self.n = self._data.shape[0]

    def load(self, values: torch.Tensor) -> None:
        self.n = 0
        self.extend(values)


def row_counts(row_ptr: torch.Tensor, flags: torch.Tensor) -> torch.Tensor:
    """(R,) number of True ``flags`` (one per CSR entry) in each row."""
    before = torch.zeros(flags.numel() + 1, dtype=torch.int64)
    torch.cumsum(flags, 0, out=before[1:])
    return before[row_ptr[1:]] - before[row_ptr[:-1]]
