"""Triton kernel of the batched k-hop expansion (the spec: reference.py, expand_reference).

``_expand_kernel``: one program per query runs the whole expansion (every hop)
in one launch, so a batch costs one launch whatever ``hops`` is and nothing in
it waits for the host:

* the frontier of hop h is the slice of the query's output list written at
  hop h-1 (``nodes[b, fs:fe]``), read back after a CTA barrier; in chunk mode
  (``KEEP_SOURCES=False``) the one frontier is the ``sources`` row itself;
* the frontier is processed ``BLOCK_F`` nodes at a time: their CSR rows
  (capped at ``max_fanout`` entries) are laid end to end -- a prefix sum of the
  row lengths -- and walked ``BLOCK_E`` edges at a time, each lane finding its
  frontier node by a one-hot comparison with the prefix sum, so the candidates
  come out exactly in the reference's order (frontier order, then row order)
  whatever the degrees;
* each block of candidates is deduplicated inside the block (lane i is dropped
  when an earlier lane holds the same id: a BLOCK_E x BLOCK_E comparison) and
  against everything admitted before by a visited bitmap of one bit per node
  and query (``marks``, int32 words), tested and set in one ``atomic_or`` whose
  old value says whether the node was new; the new nodes get their output
  positions from a prefix sum, the first ``room`` are admitted, and the marks
  of the new nodes a cap turned away are cleared again (``atomic_and``): a
  node the frontier cap drops at hop h may still be reached at hop h+1;
* the marks are only ever touched by atomics (never a plain load that an L1
  line could serve stale), and each hop ends with a CTA barrier
  (``tl.debug_barrier``: ``bar.sync`` orders the CTA's global writes) before
  the next hop reads the output list back.  A BLOCK_E-lane vector is held
  by several warps (replicated); Triton performs the atomic once per element
  and hands its old value to every copy through shared memory (seen in the
  PTX of Triton 3.6 and 3.9), so all warps agree on which candidates are new.

Written for the interpreter as well as GPUs: pointer arithmetic, every load
masked, one launch configuration (the interpreter runs the GPU block sizes).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

# Frontier nodes whose rows are laid end to end per step, and candidate edges per block.  The
# in-block deduplication is a BLOCK_E x BLOCK_E comparison: 32 lanes on 4 warps compile to 72 / 80
# registers (sm_80 / sm_90) with no spills, where 64 lanes took 168-232 registers and spilled on
# 4 warps, and 128 / 158 registers with spills on sm_90 on 8 warps (`_aot check --only graph`).
_BLOCK_F = 16
_BLOCK_E = 32
# A small CTA: the per-query work is a dependent chain of short blocks, not a wide tile.
_NUM_WARPS = 4

# hot: the expansion is the op's whole GPU path.  exact: integer work only (no floating point at all).
# "spills": bytes (stored + loaded) that Triton 3.6 (the GPU image's compiler) spills on sm_90 where
# Triton 3.9 spills none; allowed until a GPU run measures their cost (bench/gpu.sh).
KERNEL_CONTRACTS = {"_expand_kernel": {"hot": True, "exact": True, "spills": {"3.6": 40}}}


@triton.jit
def _admit(v, seed, parent, edge, hop, count, in_hop, truncated, frontier_cap, capacity, lane,
           marks_row, out_row, nodes_ptr, hop_ptr, seed_ptr, parent_ptr, edge_ptr, BLOCK_E: tl.constexpr):
    """Append the new distinct candidates of one block (in lane order) to the query's list.

    Returns the updated (count, in_hop, truncated)."""
    valid = v >= 0
    # First occurrence inside the block: no earlier valid lane holds the same id (ids < 2**31 - 1,
    # so int32 compares: half the registers of the int64 tile).
    v32 = v.to(tl.int32)
    earlier = (v32[:, None] == v32[None, :]) & (lane[None, :] < lane[:, None]) & valid[None, :]
    repeated = tl.max(earlier.to(tl.int32), axis=1) > 0
    candidate = valid & (~repeated)
    safe = tl.where(candidate, v, 0)
    word = marks_row + (safe >> 5)
    bit = tl.full([BLOCK_E], 1, tl.int32) << (safe & 31).to(tl.int32)
    old = tl.atomic_or(word, bit, mask=candidate)
    new = candidate & ((old & bit) == 0)
    rank = tl.cumsum(new.to(tl.int32), axis=0) - 1
    n_new = tl.sum(new.to(tl.int32), axis=0)
    room_capacity = capacity - count
    room_frontier = frontier_cap - in_hop
    room = tl.minimum(room_capacity, room_frontier)
    admit = new & (rank < room)
    # A node a cap turned away is not visited: clear its mark (it may be reached at a later hop).
    tl.atomic_and(word, ~bit, mask=new & (~admit))
    pos = out_row + (count + rank).to(tl.int64)
    tl.store(nodes_ptr + pos, v, mask=admit)
    tl.store(hop_ptr + pos, tl.zeros([BLOCK_E], tl.int64) + hop, mask=admit)
    tl.store(seed_ptr + pos, seed, mask=admit)
    tl.store(parent_ptr + pos, parent, mask=admit)
    tl.store(edge_ptr + pos, edge, mask=admit)
    # Truncated: the capacity, not the frontier cap, turned a new node away.
    cut = (n_new > room) & (room_capacity < room_frontier)
    taken = tl.minimum(n_new, room)
    return count + taken, in_hop + taken, truncated | cut.to(tl.int32)


# The integer arguments are not specialised (== 1, multiple of 16): nothing in the kernel gains
# from it, and a recipe varying its capacity or caps would otherwise compile one binary per class.
@triton.jit(do_not_specialize=["num_src", "hops", "capacity", "max_fanout", "max_frontier", "words"])
def _expand_kernel(row_ptr, col_idx, src_ptr, num_src, hops, capacity, max_fanout, max_frontier, marks_ptr, words,
                   nodes_ptr, hop_ptr, seed_ptr, parent_ptr, edge_ptr, count_ptr, truncated_ptr,
                   KEEP_SOURCES: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_E: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    out_row = b * capacity
    marks_row = marks_ptr + b * words
    src_row = src_ptr + b * num_src
    lane = tl.arange(0, BLOCK_E)
    slot = tl.arange(0, BLOCK_F)
    count = tl.zeros([], tl.int32)
    truncated = tl.zeros([], tl.int32)
    fs = tl.zeros([], tl.int32)
    fe = tl.zeros([], tl.int32) + num_src
    if KEEP_SOURCES:
        # Hop 0: the distinct sources, in order (no frontier cap on the seeds).
        s0 = tl.zeros([], tl.int32)
        seeds_in = tl.zeros([], tl.int32)
        none = tl.full([BLOCK_E], -1, tl.int64)
        while (s0 < num_src) & (truncated == 0):
            ids = s0 + lane
            v = tl.load(src_row + ids, mask=ids < num_src, other=-1)
            count, seeds_in, truncated = _admit(v, v, none, none, 0, count, seeds_in, truncated, 2147483647,
                                                capacity, lane, marks_row, out_row, nodes_ptr, hop_ptr, seed_ptr,
                                                parent_ptr, edge_ptr, BLOCK_E)
            s0 += BLOCK_E
        fe = count
        tl.debug_barrier()
    h = tl.zeros([], tl.int32) + 1
    while (h <= hops) & (fs < fe) & (truncated == 0):
        in_hop = tl.zeros([], tl.int32)
        f0 = fs
        while (f0 < fe) & (in_hop < max_frontier) & (truncated == 0):
            fr = f0 + slot
            f_ok = fr < fe
            if KEEP_SOURCES:
                u = tl.load(nodes_ptr + out_row + fr, mask=f_ok, other=-1)
            else:
                u = tl.load(src_row + fr, mask=f_ok, other=-1)
            u_ok = u >= 0
            start = tl.load(row_ptr + u, mask=u_ok, other=0)
            stop = tl.load(row_ptr + u + 1, mask=u_ok, other=0)
            degree = tl.minimum(stop - start, max_fanout)
            last = tl.cumsum(degree, axis=0)  # end of each row in the laid-out edge sequence
            total = tl.sum(degree, axis=0)
            t0 = tl.zeros([], tl.int64)
            while (t0 < total) & (in_hop < max_frontier) & (truncated == 0):
                e = t0 + lane
                e_ok = e < total
                # Lane -> frontier slot: the rows ending at or before e precede its row, and the
                # last of those ends where its row starts.
                before = last[None, :] <= e[:, None]
                owner = tl.sum(before.to(tl.int32), axis=1)
                row_start = tl.max(tl.where(before, last[None, :], 0), axis=1)
                # Reload the owner's entries (cached) rather than select them from the block's tiles.
                if KEEP_SOURCES:
                    parent = tl.load(nodes_ptr + out_row + f0 + owner, mask=e_ok, other=-1)
                    seed = tl.load(seed_ptr + out_row + f0 + owner, mask=e_ok, other=-1)
                else:
                    parent = tl.load(src_row + f0 + owner, mask=e_ok, other=-1)
                    seed = parent
                edge = tl.load(row_ptr + parent, mask=e_ok, other=0) + (e - row_start)
                v = tl.load(col_idx + edge, mask=e_ok, other=-1)
                count, in_hop, truncated = _admit(v, seed, parent, edge, h, count, in_hop, truncated, max_frontier,
                                                  capacity, lane, marks_row, out_row, nodes_ptr, hop_ptr, seed_ptr,
                                                  parent_ptr, edge_ptr, BLOCK_E)
                t0 += BLOCK_E
            f0 += BLOCK_F
        # The next hop reads back the list written in this one (and the marks cleared in it).
        tl.debug_barrier()
        fs = fe
        fe = count
        h += 1
    tl.store(count_ptr + b, count.to(tl.int64))
    tl.store(truncated_ptr + b, (truncated != 0).to(tl.int8))


def expand_triton(row_ptr: torch.Tensor, col_idx: torch.Tensor, sources: torch.Tensor, num_cols: int, hops: int,
                  capacity: int, max_fanout: int, max_frontier: int, keep_sources: bool):
    """Run the expansion; arguments prepared by graph.py (int64, contiguous, caps as ints)."""
    num_q, num_src = sources.shape
    device = sources.device
    lists = torch.full((5, num_q, capacity), -1, dtype=torch.int64, device=device)
    count = torch.empty(num_q, dtype=torch.int64, device=device)
    truncated = torch.empty(num_q, dtype=torch.int8, device=device)
    words = max(1, triton.cdiv(num_cols, 32))
    marks = torch.zeros((num_q, words), dtype=torch.int32, device=device)
    nodes, hop, seed, parent, edge = lists.unbind(0)
    _expand_kernel[(num_q,)](row_ptr, col_idx, sources, num_src, hops, capacity, max_fanout, max_frontier, marks,
                             words, nodes, hop, seed, parent, edge, count, truncated,
                             KEEP_SOURCES=keep_sources, BLOCK_F=_BLOCK_F, BLOCK_E=_BLOCK_E, num_warps=_NUM_WARPS,
                             enable_fp_fusion=False)
    return nodes, hop, seed, parent, edge, count, truncated.view(torch.bool)
