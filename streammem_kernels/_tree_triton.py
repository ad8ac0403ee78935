"""Triton kernels of the cosine memory tree (contract in tree.py).

* ``gather_dot_triton``: one program per (query block, candidate block); it
  gathers the candidate rows of each query (one level of a tree descent) and
  does the dot products.  The level loop and the top-b selection stay in
  tree.py, shared with the torch reference.
* ``cosine_topk_triton``: one program per query block; a blocked GEMM over
  the keys in the block's range union, key norms from the same tiles, and a
  running top-k held in registers, merged after each key tile by k rounds of
  "take the larger head" (the running list holds only lower indices, so it
  wins ties).

Written for the interpreter as well as GPUs: pointer arithmetic (no block
pointers), every load masked, one launch configuration.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

_BLOCK_Q = 16
_BLOCK_C = 16
_BLOCK_N = 64
# The interpreter pays per operation, not per element: wider D tiles there.
_BLOCK_D = 128 if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") else 32


@triton.jit
def _gather_dot_kernel(q_ptr, emb_ptr, cand_ptr, out_ptr, num_rows, num_cand, dim,
                       BLOCK_Q: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr):
    pid_q = tl.program_id(0)
    pid_c = tl.program_id(1)
    rows = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    row_ok = rows < num_rows
    tile_ok = row_ok[:, None] & (cols[None, :] < num_cand)
    cand = tl.load(cand_ptr + rows[:, None].to(tl.int64) * num_cand + cols[None, :], mask=tile_ok, other=-1)
    valid = cand >= 0
    safe = tl.where(valid, cand, 0).to(tl.int64)
    acc = tl.zeros((BLOCK_Q, BLOCK_C), dtype=tl.float32)
    for d0 in range(0, dim, BLOCK_D):
        dims = d0 + tl.arange(0, BLOCK_D)
        d_ok = dims < dim
        qv = tl.load(q_ptr + rows[:, None].to(tl.int64) * dim + dims[None, :], mask=row_ok[:, None] & d_ok[None, :],
                     other=0.0)
        ev = tl.load(emb_ptr + safe[:, :, None] * dim + dims[None, None, :],
                     mask=valid[:, :, None] & d_ok[None, None, :], other=0.0)
        acc += tl.sum(ev * qv[:, None, :], axis=2)
    out = tl.where(valid, acc, float("-inf"))
    tl.store(out_ptr + rows[:, None].to(tl.int64) * num_cand + cols[None, :], out, mask=tile_ok)


def gather_dot_triton(queries: torch.Tensor, embeddings: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
    """scores[s, c] = queries[s] . embeddings[cand[s, c]] (-inf where cand < 0)."""
    rows, num_cand = cand.shape
    out = torch.empty((rows, num_cand), dtype=torch.float32, device=queries.device)
    if rows == 0 or num_cand == 0:
        return out
    queries = queries.contiguous()
    cand = cand.contiguous()
    grid = (triton.cdiv(rows, _BLOCK_Q), triton.cdiv(num_cand, _BLOCK_C))
    _gather_dot_kernel[grid](queries, embeddings.contiguous(), cand, out, rows, num_cand, queries.shape[1],
                             BLOCK_Q=_BLOCK_Q, BLOCK_C=_BLOCK_C, BLOCK_D=_BLOCK_D)
    return out


@triton.jit
def _cosine_topk_kernel(q_ptr, key_ptr, range_ptr, ids_ptr, scores_ptr, num_q, dim, k,
                        BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, K_PAD: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_Q + tl.arange(0, BLOCK_Q)
    row_ok = rows < num_q
    start = tl.load(range_ptr + rows * 2, mask=row_ok, other=0)
    end = tl.load(range_ptr + rows * 2 + 1, mask=row_ok, other=0)
    lo = tl.min(tl.where(row_ok & (end > start), start, 2147483647))
    hi = tl.max(tl.where(row_ok, end, 0))
    slot = tl.arange(0, K_PAD)
    best_s = tl.full((BLOCK_Q, K_PAD), float("-inf"), tl.float32)
    best_i = tl.full((BLOCK_Q, K_PAD), -1, tl.int64)
    local = tl.arange(0, BLOCK_N)
    for n0 in range(lo, hi, BLOCK_N):
        keys = n0 + local
        key_ok = keys < hi
        acc = tl.zeros((BLOCK_Q, BLOCK_N), dtype=tl.float32)
        nsq = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for d0 in range(0, dim, BLOCK_D):
            dims = d0 + tl.arange(0, BLOCK_D)
            d_ok = dims < dim
            qv = tl.load(q_ptr + rows[:, None].to(tl.int64) * dim + dims[None, :],
                         mask=row_ok[:, None] & d_ok[None, :], other=0.0)
            kv = tl.load(key_ptr + keys[:, None].to(tl.int64) * dim + dims[None, :],
                         mask=key_ok[:, None] & d_ok[None, :], other=0.0)
            acc += tl.dot(qv, tl.trans(kv), input_precision="ieee")
            nsq += tl.sum(kv * kv, axis=1)
        # Correctly rounded sqrt and division, as in the reference normalisation.
        norm = tl.sqrt_rn(tl.where(nsq > 0, nsq, 1.0))
        cos = tl.where(nsq[None, :] > 0, tl.div_rn(acc, norm[None, :]), 0.0)
        inside = (keys[None, :] >= start[:, None]) & (keys[None, :] < end[:, None]) & row_ok[:, None]
        tile = tl.where(inside, cos, float("-inf"))
        # The k-th best so far (slot k-1; -inf while fewer than k are held).
        kth = tl.sum(tl.where(slot[None, :] == k - 1, best_s, 0.0), axis=1)
        kth = tl.where(tl.max(tl.where(slot[None, :] == k - 1, best_i, -1), axis=1) >= 0, kth, float("-inf"))
        tile_best = tl.max(tile, axis=1)
        if tl.sum((tile_best > kth).to(tl.int32)) > 0:
            new_s = tl.full((BLOCK_Q, K_PAD), float("-inf"), tl.float32)
            new_i = tl.full((BLOCK_Q, K_PAD), -1, tl.int64)
            for r in range(0, k):
                head_best = tl.max(best_s, axis=1)
                head_tile = tl.max(tile, axis=1)
                take_best = head_best >= head_tile
                pos_best = tl.min(tl.where(best_s == head_best[:, None], slot[None, :], K_PAD), axis=1)
                pos_tile = tl.min(tl.where(tile == head_tile[:, None], local[None, :], BLOCK_N), axis=1)
                id_best = tl.max(tl.where(slot[None, :] == pos_best[:, None], best_i, -1), axis=1)
                id_tile = (n0 + pos_tile).to(tl.int64)
                id_tile = tl.where(head_tile > float("-inf"), id_tile, -1)
                val = tl.where(take_best, head_best, head_tile)
                idx = tl.where(val > float("-inf"), tl.where(take_best, id_best, id_tile), -1)
                new_s = tl.where(slot[None, :] == r, val[:, None], new_s)
                new_i = tl.where(slot[None, :] == r, idx[:, None], new_i)
                best_s = tl.where(take_best[:, None] & (slot[None, :] == pos_best[:, None]), float("-inf"), best_s)
                tile = tl.where((~take_best)[:, None] & (local[None, :] == pos_tile[:, None]), float("-inf"), tile)
            best_s = new_s
            best_i = new_i
    out_mask = row_ok[:, None] & (slot[None, :] < k)
    offs = rows[:, None].to(tl.int64) * k + slot[None, :]
    tl.store(scores_ptr + offs, best_s, mask=out_mask)
    tl.store(ids_ptr + offs, best_i, mask=out_mask)


def cosine_topk_triton(queries: torch.Tensor, keys: torch.Tensor, k: int, ranges: torch.Tensor):
    """Exact top-k (ids, scores) of unit queries against raw keys within ranges."""
    num_q, dim = queries.shape
    ids = torch.empty((num_q, k), dtype=torch.int64, device=queries.device)
    scores = torch.empty((num_q, k), dtype=torch.float32, device=queries.device)
    k_pad = triton.next_power_of_2(k)
    grid = (triton.cdiv(num_q, _BLOCK_Q),)
    _cosine_topk_kernel[grid](queries.contiguous(), keys.contiguous(), ranges.contiguous(), ids, scores, num_q, dim,
                              k, BLOCK_Q=_BLOCK_Q, BLOCK_N=_BLOCK_N, BLOCK_D=_BLOCK_D, K_PAD=k_pad)
    return ids, scores
