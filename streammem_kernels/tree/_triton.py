"""Triton kernels of the cosine memory tree (contract: search.py, topk.py).

* ``greedy_triton``: the whole greedy descent (Algorithm 1) in one launch, one
  program per block of search rows: the argmax over the roots, then over the
  children of each row's chosen node, ``height`` levels down.  The loops run
  to bounds read from the CSR arrays on the device: no level needs the host.
* ``gather_dot_triton``: one program per (row, block of candidates) gathers
  the candidate rows and dots them with the row's query (the beam search's
  pool scoring; the level loop and the top-b selection are torch ops on
  fixed-width tensors in reference.py, shared with the torch backend).
* ``cosine_topk_triton``: one program per (block of queries, slice of the
  keys) keeps the exact top-k of its slice; the same kernel, launched once
  more, merges the slices of each query (skipped when one slice covers the
  keys, as happens for large batches).

Every score is a product accumulated along D element by element and summed
over D once, the same way for every (query, row) pair -- never ``tl.dot``,
whose interpreter fallback (numpy's BLAS) sums in an order that depends on
where a row sits in its tile: identical rows score identically, so ties go to
the lower id as the contract says, on a GPU and under the interpreter alike.
On a GPU one query (or row) per program gets a wide D tile, a block of 16 a
narrow one: a block of 16 queries reads each key tile once for all of them,
one query per program lets a few queries fill the GPU.

The top-k keeps each candidate as one int64: the float32 score's bits mapped
to an order-preserving signed int in the high half and ``2^31 - 1 - index``
in the low half, so that a larger int is a higher score, then a lower index --
the contract's order -- and a plain ``max`` picks the next result.  A running
top-k is a set of K_PAD such ints per query (empty slot ``j`` holds
``_EMPTY + j``, so entries are distinct); a tile enters it by "while a
query's best candidate beats its worst entry, swap them": three reductions per
tile once the set is good.

Written for the interpreter as well as GPUs: pointer arithmetic (no block
pointers), every load masked, the same block sizes on both.  Device helpers
are few because the interpreter re-patches the language on every call of a
``@triton.jit`` function (milliseconds each, reductions included).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .reference import pow2_row_scale
from ..runtime.launch import gpu_launch, multiprocessors

# "spills": bytes (stored + loaded) that Triton 3.6 (the GPU image's compiler) spills on sm_80 where
# Triton 3.9 spills none; allowed until a GPU run measures their cost (bench/gpu.sh).
KERNEL_CONTRACTS = {
    "_greedy_kernel": {"hot": True, "exact": False, "spills": {"3.6": 8}},
    "_gather_dot_kernel": {"hot": True, "exact": False},
    # Scores divide by the key norm with correctly rounded sqrt/division, as the reference normalises.
    "_cosine_topk_kernel": {"hot": True, "exact": True, "spills": {"3.6": 16}},
}

_NUM_WARPS = 8
# Rows per program of the greedy descent and the top-k: a block when there are many (and,
# for the top-k, k small enough for a block's running top-k to stay in registers).
_ROW_BLOCK = 16
_ROW_BLOCK_MAX_K_PAD = 64
# (candidates, D) tile shapes by rows per program.  On a GPU the (rows x candidates x D)
# product tiles hold 2048 to 4096 elements over 8 warps, 8 to 16 per thread: at most 110
# registers and no spills on sm_80/sm_90 (python -m streammem_kernels.runtime.aot check
# tests/gpu_readiness/triton_scenarios.py --only tree); gathered rows cost a 64-bit address per element,
# and the blocks of 16 rows with 4096 elements took 170 registers.  The interpreter pays
# per operation, not per element (a reduction costs milliseconds): there the tiles are 16
# to 32 times larger, so that the test suite can afford every case; the code and the
# results are the same, and tests/kernels/tree/test_tree.py also runs the GPU tiles through the
# interpreter on small inputs.
_GREEDY_TILE = {True: {1: (16, 256), _ROW_BLOCK: (16, 8)}, False: {1: (16, 1024), _ROW_BLOCK: (16, 256)}}
_TOPK_TILE = {True: {1: (16, 128), _ROW_BLOCK: (16, 8)}, False: {1: (128, 512), _ROW_BLOCK: (64, 128)}}
_GATHER_TILE = {True: {1: (64, 64), _ROW_BLOCK: (16, 16)}, False: {1: (256, 256), _ROW_BLOCK: (64, 64)}}
# Programs per multiprocessor the keys are split for (few queries, many keys), each
# slice at least 4 tiles and 4 x K_PAD keys: filling a running top-k costs K_PAD
# swaps, which a slice of a few tiles would barely amortise.
_PROGRAMS_PER_SM = 4
_MIN_TILES_PER_SPLIT = 4
# k <= tree.TRITON_TOPK_MAX_K (the running top-k is held in registers) and N < 2^31
# (key indices live in 31 bits of the packed (score, index) int): topk.py checks both.

_NONE = tl.constexpr(-(2**63))  # no candidate: below every entry of a running top-k
_EMPTY = tl.constexpr(-(2**63) + 1)  # empty slot j of a running top-k holds _EMPTY + j
_INDEX_MASK = tl.constexpr(2**31 - 1)
_INT32_MIN = tl.constexpr(-(2**31))

_SCAN_FINAL, _SCAN_PARTIAL, _MERGE = 0, 1, 2


def _rows_per_program(rows: int, device: torch.device, k_pad: int = 1) -> int:
    """1 or _ROW_BLOCK.  On a GPU one row per program lets few rows spread over the
    multiprocessors with wide D tiles; the interpreter always takes blocks (fewer operations)."""
    many = rows >= _ROW_BLOCK or not gpu_launch(device)
    return _ROW_BLOCK if many and k_pad <= _ROW_BLOCK_MAX_K_PAD else 1


# --------------------------------------------------------------------------
# Greedy descent
# --------------------------------------------------------------------------
@triton.jit
def _best_in_runs(ids_ptr, lo, hi, q_rows, row_ok, emb_ptr, dim, BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr):
    """Per row: (node, score) of the best of ``ids_ptr[lo:hi]`` (ascending ids), the first
    maximum -- the lowest id among equals; (-1, -inf) for an empty run."""
    best_node = tl.full(lo.shape, -1, tl.int64)
    best_score = tl.full(lo.shape, float("-inf"), tl.float32)
    longest = tl.max(tl.where(row_ok, hi - lo, 0), axis=0)
    offs = tl.arange(0, BLOCK_C)
    for c0 in range(0, longest, BLOCK_C):
        pos = lo[:, None] + c0 + offs[None, :]
        ok = pos < hi[:, None]
        nodes = tl.load(ids_ptr + pos, mask=ok, other=0)
        acc = tl.zeros((lo.shape[0], BLOCK_C, BLOCK_D), dtype=tl.float32)
        for d0 in range(0, dim, BLOCK_D):
            dims = d0 + tl.arange(0, BLOCK_D)
            d_ok = dims < dim
            rows = tl.load(emb_ptr + nodes[:, :, None] * dim + dims[None, None, :],
                           mask=ok[:, :, None] & d_ok[None, None, :], other=0.0)
            qv = tl.load(q_rows[:, None] + dims[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)
            acc += rows * qv[:, None, :]
        scores = tl.where(ok, tl.sum(acc, axis=2), float("-inf"))
        top, first = tl.max(scores, axis=1, return_indices=True, return_indices_tie_break_left=True)
        take = top > best_score  # strict: an earlier block keeps its tie
        node = tl.load(ids_ptr + lo + c0 + first, mask=take, other=-1)
        best_node = tl.where(take, node, best_node)
        best_score = tl.where(take, top, best_score)
    return best_node, best_score


@triton.jit
def _greedy_kernel(emb_ptr, child_ptr_ptr, child_idx_ptr, roots_ptr, q_ptr, path_ptr, path_score_ptr,
                   best_node_ptr, best_score_ptr, num_rows, num_roots, dim, height,
                   FROM_EVERY_ROOT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                   BLOCK_D: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < num_rows
    width = height + 1
    if FROM_EVERY_ROOT:  # row = query * num_roots + root
        first_root = rows % num_roots
        q_rows = q_ptr + (rows // num_roots) * dim
        cur, cur_score = _best_in_runs(roots_ptr, first_root, tl.where(row_ok, first_root + 1, first_root),
                                       q_rows, row_ok, emb_ptr, dim, BLOCK_C, BLOCK_D)
    else:
        q_rows = q_ptr + rows * dim
        cur, cur_score = _best_in_runs(roots_ptr, rows * 0, tl.where(row_ok, num_roots, 0), q_rows, row_ok,
                                       emb_ptr, dim, BLOCK_C, BLOCK_D)
    tl.store(path_ptr + rows * width, cur, mask=row_ok)
    tl.store(path_score_ptr + rows * width, cur_score, mask=row_ok)
    best_node = cur
    best_score = cur_score
    for step in range(1, width):
        safe = tl.maximum(cur, 0)
        live = row_ok & (cur >= 0)
        lo = tl.load(child_ptr_ptr + safe, mask=live, other=0)
        hi = tl.load(child_ptr_ptr + safe + 1, mask=live, other=0)
        cur, cur_score = _best_in_runs(child_idx_ptr, lo, hi, q_rows, live, emb_ptr, dim, BLOCK_C, BLOCK_D)
        tl.store(path_ptr + rows * width + step, cur, mask=row_ok)  # -1 / -inf below a leaf
        tl.store(path_score_ptr + rows * width + step, cur_score, mask=row_ok)
        take = cur_score > best_score  # running best from -inf, strict: the first maximum on the path
        best_node = tl.where(take, cur, best_node)
        best_score = tl.where(take, cur_score, best_score)
    tl.store(best_node_ptr + rows, best_node, mask=row_ok)
    tl.store(best_score_ptr + rows, best_score, mask=row_ok)


def greedy_triton(embeddings, child_ptr, child_idx, roots, queries, height: int, from_every_root: bool):
    """Greedy descent of prepared input (see ``tree_greedy``): path, path_scores, best_node,
    best_score with one row per query (per (query, root) with ``from_every_root``)."""
    num_q, dim = queries.shape
    num_roots = roots.shape[0]
    rows = num_q * num_roots if from_every_root else num_q
    dev = queries.device
    path = torch.empty((rows, height + 1), dtype=torch.int64, device=dev)
    path_scores = torch.empty((rows, height + 1), dtype=torch.float32, device=dev)
    best_node = torch.empty(rows, dtype=torch.int64, device=dev)
    best_score = torch.empty(rows, dtype=torch.float32, device=dev)
    block_r = _rows_per_program(rows, dev)
    block_c, block_d = _GREEDY_TILE[gpu_launch(dev)][block_r]
    _greedy_kernel[(triton.cdiv(rows, block_r),)](
        embeddings, child_ptr, child_idx, roots, queries, path, path_scores, best_node, best_score, rows, num_roots,
        dim, height, FROM_EVERY_ROOT=bool(from_every_root), BLOCK_R=block_r, BLOCK_C=block_c, BLOCK_D=block_d,
        num_warps=_NUM_WARPS, enable_fp_fusion=True)
    return path, path_scores, best_node, best_score


# --------------------------------------------------------------------------
# Candidate scoring (beam search)
# --------------------------------------------------------------------------
@triton.jit
def _gather_dot_kernel(q_ptr, emb_ptr, cand_ptr, out_ptr, num_rows, num_cand, blocks_per_row, dim,
                       BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    rows = (pid // blocks_per_row) * BLOCK_R + tl.arange(0, BLOCK_R)
    pos = (pid % blocks_per_row) * BLOCK_C + tl.arange(0, BLOCK_C)
    in_tile = (rows < num_rows)[:, None] & (pos < num_cand)[None, :]
    offs = rows[:, None] * num_cand + pos[None, :]
    nodes = tl.load(cand_ptr + offs, mask=in_tile, other=-1)
    ok = nodes >= 0
    acc = tl.zeros((BLOCK_R, BLOCK_C, BLOCK_D), dtype=tl.float32)
    for d0 in range(0, dim, BLOCK_D):
        dims = d0 + tl.arange(0, BLOCK_D)
        d_ok = dims < dim
        emb = tl.load(emb_ptr + nodes[:, :, None] * dim + dims[None, None, :], mask=ok[:, :, None] & d_ok[None, None, :],
                      other=0.0)
        qv = tl.load(q_ptr + rows[:, None] * dim + dims[None, :], mask=(rows < num_rows)[:, None] & d_ok[None, :],
                     other=0.0)
        acc += emb * qv[:, None, :]
    tl.store(out_ptr + offs, tl.where(ok, tl.sum(acc, axis=2), float("-inf")), mask=in_tile)


def gather_dot_triton(queries: torch.Tensor, embeddings: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
    """scores[s, c] = queries[s] . embeddings[cand[s, c]] (-inf where cand < 0); contiguous inputs."""
    rows, num_cand = cand.shape
    out = torch.empty((rows, num_cand), dtype=torch.float32, device=queries.device)
    if rows == 0 or num_cand == 0:
        return out
    block_r = _rows_per_program(rows, queries.device)
    block_c, block_d = _GATHER_TILE[gpu_launch(queries.device)][block_r]
    blocks = triton.cdiv(num_cand, block_c)
    _gather_dot_kernel[(triton.cdiv(rows, block_r) * blocks,)](
        queries, embeddings, cand, out, rows, num_cand, blocks, queries.shape[1], BLOCK_R=block_r, BLOCK_C=block_c,
        BLOCK_D=block_d, num_warps=_NUM_WARPS, enable_fp_fusion=True)
    return out


# --------------------------------------------------------------------------
# Exact cosine top-k
# --------------------------------------------------------------------------
@triton.jit
def _cosine_topk_kernel(q_ptr, key_ptr, scale_ptr, range_ptr, part_ptr, ids_ptr, scores_ptr, num_q, num_keys, dim, k,
                        keys_per_split, num_cand, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_D: tl.constexpr, K_PAD: tl.constexpr, STAGE: tl.constexpr):
    """Running top-K_PAD of a block of queries (``program_id(0)``).

    STAGE 0 / 1 scan key slice ``program_id(1)`` within each query's range and
    write the k best (0: one slice covers the keys) or the packed set to
    ``part_ptr`` (1); STAGE 2 merges the ``num_cand`` packed entries of every
    slice of a query and writes the k best.
    """
    rows = tl.program_id(0).to(tl.int64) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    row_ok = rows < num_q
    slot = tl.arange(0, K_PAD)
    offs = tl.arange(0, BLOCK_N)
    best = tl.zeros((BLOCK_Q, K_PAD), dtype=tl.int64) + (slot.to(tl.int64) + _EMPTY)[None, :]
    if STAGE == 2:
        lo = tl.program_id(1).to(tl.int64) * 0
        hi = lo + num_cand
    else:
        split = tl.program_id(1).to(tl.int64)
        start = tl.load(range_ptr + 2 * rows, mask=row_ok, other=0)
        end = tl.load(range_ptr + 2 * rows + 1, mask=row_ok, other=0)
        has_keys = row_ok & (end > start)
        # Clamped to the keys: on CUDA, bad ranges raise a device-side assertion only after the launch.
        lo = tl.maximum(tl.min(tl.where(has_keys, start, num_keys), axis=0), split * keys_per_split)
        hi = tl.minimum(tl.max(tl.where(has_keys, end, 0), axis=0),
                        tl.minimum((split + 1) * keys_per_split, num_keys))
    for n0 in range(lo, hi, BLOCK_N):
        if STAGE == 2:
            pos = n0 + offs
            ok = row_ok[:, None] & (pos < hi)[None, :]
            cand = tl.load(part_ptr + rows[:, None] * num_cand + pos[None, :], mask=ok, other=_NONE)
        else:
            keys = n0 + offs
            key_ok = keys < hi
            # Power of two bringing each key's largest |component| into [0.5, 1) (exact): its
            # squared norm neither overflows nor underflows, as in the reference's unit_rows.
            kscale = tl.load(scale_ptr + keys, mask=key_ok, other=1.0)
            acc = tl.zeros((BLOCK_Q, BLOCK_N, BLOCK_D), dtype=tl.float32)
            squares = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
            for d0 in range(0, dim, BLOCK_D):
                dims = d0 + tl.arange(0, BLOCK_D)
                d_ok = dims < dim
                kv = tl.load(key_ptr + keys[:, None] * dim + dims[None, :], mask=key_ok[:, None] & d_ok[None, :],
                             other=0.0) * kscale[:, None]
                qv = tl.load(q_ptr + rows[:, None] * dim + dims[None, :], mask=row_ok[:, None] & d_ok[None, :],
                             other=0.0)
                acc += qv[:, None, :] * kv[None, :, :]
                squares += kv * kv
            nsq = tl.sum(squares, axis=1)
            # Correctly rounded sqrt and division: a key parallel to the query scores like its unit copy.
            norm = tl.sqrt_rn(tl.where(nsq > 0, nsq, 1.0))
            cos = tl.where(nsq[None, :] > 0, tl.div_rn(tl.sum(acc, axis=2), norm[None, :]), 0.0)
            cos = tl.where(cos == 0.0, 0.0, cos)  # -0.0 (a zero query) ranks as 0.0
            bits = cos.to(tl.int32, bitcast=True)
            ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # negative floats: flip the magnitude bits
            packed = (ordered.to(tl.int64) << 32) | (keys[None, :] ^ _INDEX_MASK)
            inside = (keys[None, :] >= start[:, None]) & (keys[None, :] < end[:, None]) & key_ok[None, :]
            cand = tl.where(inside & row_ok[:, None], packed, _NONE)
        # Enter the tile: each query swaps its worst entry for its best candidate while that is better.
        top = tl.max(cand, axis=1)
        worst = tl.min(best, axis=1)
        while tl.max((top > worst).to(tl.int32), axis=0) > 0:
            enter = top > worst
            best = tl.where(enter[:, None] & (best == worst[:, None]), top[:, None], best)
            cand = tl.where(enter[:, None] & (cand == top[:, None]), _NONE, cand)
            top = tl.max(cand, axis=1)
            worst = tl.min(best, axis=1)
    if STAGE == 1:
        real = (best >> 32).to(tl.int32) != _INT32_MIN  # empty slots leave as _NONE (never entered again)
        out = part_ptr + rows[:, None] * num_cand + tl.program_id(1) * K_PAD + slot[None, :]
        tl.store(out, tl.where(real, best, _NONE), mask=row_ok[:, None])
    else:
        for r in range(0, k):  # the k best, best first
            top = tl.max(best, axis=1)
            best = tl.where(best == top[:, None], _NONE, best)
            ordered = (top >> 32).to(tl.int32)
            real = ordered != _INT32_MIN
            score = (ordered ^ ((ordered >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)
            index = (top & _INDEX_MASK) ^ _INDEX_MASK
            tl.store(ids_ptr + rows * k + r, tl.where(real, index, -1), mask=row_ok)
            tl.store(scores_ptr + rows * k + r, tl.where(real, score, float("-inf")), mask=row_ok)


def topk_slice(num_query_blocks: int, num_keys: int, block_n: int, k_pad: int, device: torch.device) -> int:
    """Keys per slice (a multiple of ``block_n``): enough programs to fill the GPU when queries are few."""
    wanted = triton.cdiv(_PROGRAMS_PER_SM * multiprocessors(device), num_query_blocks)
    tiles = max(triton.cdiv(triton.cdiv(num_keys, block_n), wanted), _MIN_TILES_PER_SPLIT,
                triton.cdiv(4 * k_pad, block_n))
    return tiles * block_n


def cosine_topk_triton(queries: torch.Tensor, keys: torch.Tensor, k: int, ranges: torch.Tensor,
                       scale: torch.Tensor | None = None):
    """Exact top-k (ids, scores) of unit queries (Q, D) against raw keys (N, D) within ranges (Q, 2).

    ``scale``: the keys' :func:`~.reference.pow2_row_scale` (N,), when the caller keeps it (a
    ``CosineIndex`` computes it once per key); computed here otherwise."""
    num_q, dim = queries.shape
    num_keys = keys.shape[0]
    dev = queries.device
    ids = torch.empty((num_q, k), dtype=torch.int64, device=dev)
    scores = torch.empty((num_q, k), dtype=torch.float32, device=dev)
    k_pad = triton.next_power_of_2(min(k, num_keys))
    block_q = _rows_per_program(num_q, dev, k_pad)
    block_n, block_d = _TOPK_TILE[gpu_launch(dev)][block_q]
    q_blocks = triton.cdiv(num_q, block_q)
    keys_per_split = topk_slice(q_blocks, num_keys, block_n, k_pad, dev)
    splits = triton.cdiv(num_keys, keys_per_split)
    num_cand = splits * k_pad
    part = torch.empty((num_q, num_cand) if splits > 1 else (1,), dtype=torch.int64, device=dev)
    scale = pow2_row_scale(keys).reshape(-1) if scale is None else scale
    common = dict(BLOCK_Q=block_q, BLOCK_N=block_n, K_PAD=k_pad, num_warps=_NUM_WARPS, enable_fp_fusion=False)
    _cosine_topk_kernel[(q_blocks, splits)](queries, keys, scale, ranges, part, ids, scores, num_q, num_keys, dim, k,
                                            keys_per_split, num_cand, BLOCK_D=block_d,
                                            STAGE=_SCAN_FINAL if splits == 1 else _SCAN_PARTIAL, **common)
    if splits > 1:
        _cosine_topk_kernel[(q_blocks, 1)](queries, keys, scale, ranges, part, ids, scores, num_q, num_keys, dim, k,
                                           keys_per_split, num_cand, BLOCK_D=block_d, STAGE=_MERGE, **common)
    return ids, scores
