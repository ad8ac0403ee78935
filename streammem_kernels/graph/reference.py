"""The torch reference of the graph op: the k-hop expansion (:func:`expand_reference`), the spec every
backend reproduces integer for integer, and the torch backend itself.

Per query ``b`` the expansion appends to one list in a fixed order, a level-synchronous
breadth-first search:

* hop 0: the distinct seeds ``seeds[b]`` in column order (``-1`` entries are skipped), each its
  own seed;
* hop ``h = 1..hops``: for each node ``u`` of hop ``h-1`` in list order, the first ``max_fanout``
  entries of ``u``'s row in row order; an entry whose target ``v`` is not listed yet appends ``v``
  with hop ``h``, ``seed`` = the seed ``u`` came from, ``parent = u`` and ``edge`` = the entry's
  position in ``col_idx``;
* ``max_frontier`` caps the nodes a hop ``h >= 1`` appends: once the hop holds that many, its other
  candidates are dropped (and may still be reached at the next hop); the seeds are not capped by it;
* ``capacity`` caps the whole list: the query stops when it is full; ``truncated[b]`` is true when
  a larger capacity would have listed more nodes (a node the other caps admit was turned away).

So a node is listed once, at its breadth-first distance from the seeds over the edges the caps
follow, credited to the first seed (in seed order) that reaches it at that distance, and ``hop`` is
non-decreasing along a list.  In chunk mode (``keep_sources=False``, :func:`neighbourhood_chunks`)
the sources row is the one frontier of a single hop and is not listed itself.

Every shape comes from host metadata (B, S, capacity, the caps, ``width``), never from tensor
values, so the reference runs on a GPU without synchronising.  ``docs/ops/graph.md`` explains the
op.  Imports nothing of the op but the shared runtime.
"""
from __future__ import annotations

import torch

INT_INPUTS = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
FLOAT_INPUTS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
# "No cap" for max_fanout / max_frontier; capacities must stay below it (the kernels count in int32).
NO_CAP = 2**31 - 1
# Sorts after every id (the padding key of the deduplication).
ABSENT = torch.iinfo(torch.int64).max


def first_occurrences(key: torch.Tensor) -> torch.Tensor:
    """(B, W) bool: True where ``key[b, j]`` does not appear in ``key[b, :j]``."""
    order = torch.argsort(key, dim=1, stable=True)
    in_order = key.gather(1, order)
    first_in_order = torch.ones_like(in_order, dtype=torch.bool)
    first_in_order[:, 1:] = in_order[:, 1:] != in_order[:, :-1]
    return torch.empty_like(first_in_order).scatter_(1, order, first_in_order)


def row_entries(row_ptr, col_idx, frontier, width):
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


def expand_reference(row_ptr, col_idx, sources, num_cols, hops, capacity, max_fanout, max_frontier, keep_sources,
                     width):
    """The expansion of the sources (B, S) (``keep_sources``: listed first, as hop 0; otherwise the
    one frontier of a single hop, the chunk mode of ``neighbourhood_chunks``) over the CSR graph:
    ``(nodes, hop, seed, parent, edge)`` (B, capacity) int64 padded with -1, ``count`` (B,) int64 and
    ``truncated`` (B,) bool.  ``width`` is the candidates per frontier node of the padded candidate
    matrix: at least the longest row the expansion follows, ``min(max_fanout, max degree)``."""
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
        key = torch.where(target >= 0, target, ABSENT)
        listed = torch.sort(torch.where(lists[0, :, :capacity] >= 0, lists[0, :, :capacity], ABSENT), 1).values
        at = torch.searchsorted(listed, key).clamp_max(capacity - 1)
        new = (target >= 0) & (listed.gather(1, at) != key) & first_occurrences(key)
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
        target, edge = row_entries(row_ptr, col_idx, frontier, width)
        parent = torch.where(target >= 0, frontier.repeat_interleave(width, 1), -1)
        seed = torch.where(target >= 0, frontier_seed.repeat_interleave(width, 1), -1)
        before = count
        admit(target, seed, parent, edge, hop, max_frontier)
        # A hop appends at most max_frontier nodes, capacity in all, and one per candidate.
        frontier, frontier_seed = listed_between(before, count, min(max_frontier, capacity, target.shape[1]))
    nodes, hop, seed, parent, edge = lists[:, :, :capacity]
    return nodes, hop, seed, parent, edge, count, truncated
