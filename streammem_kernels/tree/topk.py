"""Exact (optionally segmented) cosine top-k: :func:`cosine_topk`.

Every key in a query's range is scored ``dot(q / |q|, v / |v|)`` in float32 by the rules of
:mod:`.reference` (a zero vector scores 0; rows of any finite magnitude get their true cosine) and
the ``k`` best come back, ties toward the lower key index.  Backends: ``torch``
(:func:`~.reference.cosine_topk_reference`), ``cpp`` (a fused one-pass scan, or CPU BLAS GEMMs
filtering for a running top-k on large batches, by the fixed rule :func:`cosine_topk_uses_blas`)
and ``triton``; every backend returns the same ids, and scores within ``TOLERANCES``.
``docs/ops/tree.md`` describes the kernels and the latency path.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from .reference import (FLOAT_INPUTS, INT_INPUTS, MAX_RESULTS, cosine_scores, score_candidates, topk_low_id,
                        unit_rows)
from ..runtime.dispatch import Op, call_op
from ..runtime.launch import block_elements
from ..runtime.native import NativeChecks, view
from ..runtime.validate import (as_tensor, check_dtype, check_finite, check_int, check_rank, check_values,
                                sized_message)

__all__ = ["TopKResult", "cosine_topk", "cosine_topk_uses_blas"]

BLAS_MIN_QUERIES = 8
# BLAS path: score block of at most 256K floats (1 MiB) per GEMM, so the block stays in L2
# between the GEMM writing it and the top-k merge reading it: at N = 10^5, Q = 1024, D = 384
# this took the call from 0.73 s to 0.60 s on 2 cores (16M-float blocks ran the GEMM itself
# 1.5x slower than 1K-key blocks).
_BLAS_BLOCK_BUDGET = 1 << 18
# Limits of the Triton top-k: its running top-k (min(k, N) rounded up to a power of two)
# lives in registers, and a key index in 31 bits of the packed (score, index) int.
TRITON_TOPK_MAX_K = 1024
TRITON_TOPK_MAX_KEYS = 2**31 - 1


# The latency path's k; with Q < BLAS_MIN_QUERIES, Q x k stays within MAX_RESULTS (larger ranged Q are checked).
_FAST_MAX_K = MAX_RESULTS // BLAS_MIN_QUERIES
# Builds a NamedTuple without its Python-level __new__ (0.3 us of a 5 us call).
_new_tuple = tuple.__new__


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


# --------------------------------------------------------------------------
# Public function: contract, validation, preparation
# --------------------------------------------------------------------------
def cosine_topk(queries, keys, k: int, *, ranges=None, backend: str = "auto") -> TopKResult:
    """Exact top-k keys by cosine similarity for every query.

    Parameters
    ----------
    queries : (Q, D) float tensor or array
        Finite; normalised internally (a zero query scores 0 everywhere).
    keys : (N, D) float tensor or array, N >= 1
        Finite; not normalised beforehand (the kernels divide by the norms);
        zero keys score 0.
    k : int >= 1
        Results per query; positions beyond the keys in range hold -1 / -inf.
    ranges : (Q, 2) int, optional
        Query q only considers ``keys[ranges[q, 0]:ranges[q, 1]]`` (indices
        stay global); ``0 <= start <= end <= N``.
    backend : {"auto", "torch", "cpp", "triton"}

    Returns
    -------
    TopKResult with ``ids (Q, k)`` int64 and ``scores (Q, k)`` float32, best
    first, ties toward the lower index.  Inputs are never modified.
    """
    fast = COSINE_TOPK.run_fast(backend, queries, keys, k, ranges)
    if fast is not None:
        return fast
    return _cosine_topk_general(queries, keys, k, ranges, backend)


def _cosine_topk_general(queries, keys, k, ranges, backend) -> TopKResult:
    keys = as_tensor(keys, "keys")
    check_rank(keys, "keys", (2,), "(N, D)")
    check_dtype(keys, "keys", FLOAT_INPUTS)
    if keys.shape[0] < 1 or keys.shape[1] < 1:
        raise ValueError(f"keys must hold at least one key of dimension >= 1, got shape {tuple(keys.shape)}")
    queries = prepare_queries(queries, keys.shape[1], keys.device)
    k = check_int(k, "k", minimum=1)
    if queries.shape[0] * k > MAX_RESULTS:
        raise ValueError(f"k must keep Q x k <= {MAX_RESULTS} results, got k={k} for Q={queries.shape[0]}")
    keys = keys.to(torch.float32).contiguous()
    r = _prepare_ranges(ranges, queries.shape[0], keys.shape[0], keys.device)
    name = COSINE_TOPK.select(backend, keys.device, inputs={"queries": queries, "keys": keys, "ranges": r},
                              k=k, num_keys=keys.shape[0])
    if name != "cpp":  # the C++ kernels check the values themselves, in the pass they make anyway
        check_finite(queries, "queries")
        check_finite(keys, "keys")
        check_values(((r[:, 0] >= 0) & (r[:, 1] <= keys.shape[0]) & (r[:, 0] <= r[:, 1])).all(),
                     sized_message(_RANGES_INSIDE, N=keys.shape[0]))
    ids, scores = call_op(torch.ops.streammem.cosine_topk, COSINE_TOPK.impls, name, queries, keys, k, r)
    return TopKResult(ids, scores)


def prepare_queries(queries, dim: int, device: torch.device, name: str = "queries",
                    against: str = "keys") -> torch.Tensor:
    """(Q, D) float32 contiguous queries on ``device`` (metadata checked here, values by the backends);
    ``against`` names what holds the D columns they must match (in the error, which may be either's)."""
    queries = as_tensor(queries, name)
    check_rank(queries, name, (2,), "(Q, D)")
    check_dtype(queries, name, FLOAT_INPUTS)
    if queries.shape[0] < 1:
        raise ValueError(f"{name} must hold at least one query, got shape {tuple(queries.shape)}")
    if queries.shape[1] != dim:
        raise ValueError(f"{name} and {against} must have the same number of columns D: {name} has shape "
                         f"{tuple(queries.shape)}, {against} D={dim}")
    if queries.device != device:
        raise ValueError(f"{name} must be on {device}, got {queries.device}")
    return queries.detach().to(torch.float32).contiguous()


def _prepare_ranges(ranges, num_queries: int, num_keys: int, device) -> torch.Tensor:
    if ranges is None:
        out = torch.empty((num_queries, 2), dtype=torch.int64, device=device)
        out[:, 0], out[:, 1] = 0, num_keys
        return out
    ranges = as_tensor(ranges, "ranges")
    check_dtype(ranges, "ranges", INT_INPUTS)
    if ranges.dim() != 2 or ranges.shape != (num_queries, 2):
        raise ValueError(f"ranges must have shape (Q, 2)=({num_queries}, 2), got {tuple(ranges.shape)}")
    return ranges.to(device=device, dtype=torch.int64).contiguous()


def cosine_topk_uses_blas(num_queries: int, num_keys: int, ranges=None) -> bool:
    """The rule by which the C++ backend of :func:`cosine_topk` uses the CPU BLAS.

    Blocked ``torch.mm`` + C++ running top-k when ``Q >= 8`` and the ranges
    ((Q, 2) int64, a tensor or a numpy array) cover at least half of the
    Q x N (query, key) pairs; otherwise the fused one-pass C++ scan, whose
    cost is proportional to the pairs in range.
    """
    if num_queries < BLAS_MIN_QUERIES:
        return False
    if ranges is None:
        return True
    covered = int((ranges[:, 1] - ranges[:, 0]).sum())
    return 2 * covered >= num_queries * num_keys


# --------------------------------------------------------------------------
# Custom op (works under torch.compile; opcheck-tested)
# --------------------------------------------------------------------------
@torch.library.custom_op("streammem::cosine_topk", mutates_args=())
def cosine_topk_op(queries: torch.Tensor, keys: torch.Tensor, k: int, ranges: torch.Tensor,
                   backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.ops.streammem.cosine_topk`` (its schema: docs/compile.md).

    Core exact top-k: float32 queries (Q, D) (any norm; each backend normalises them), raw float32
    keys (N, D), ranges (Q, 2) int64, all contiguous."""
    return tuple(COSINE_TOPK.impls[backend](queries, keys, k, ranges))


@cosine_topk_op.register_fake
def _(queries, keys, k, ranges, backend):
    q = queries.shape[0]
    return queries.new_empty((q, k), dtype=torch.int64), queries.new_empty((q, k), dtype=torch.float32)


# --------------------------------------------------------------------------
# Backend: torch (the reference, narrowed to the ranges)
# --------------------------------------------------------------------------
def _cosine_topk_torch(queries, keys, k, ranges):
    """The reference's scores, ranked by one ``torch.topk`` per query instead of two full sorts.

    The reference scores all Q x N pairs and sorts each query's N scores twice (by id, then stably by
    score); here the scores are the same tensors (:func:`~.reference.cosine_scores`), and
    :func:`_top_by_packed_key` picks the same ``k`` in the same order.  With ranges (a VideoAgent
    round: one query per segment) almost all pairs lie outside, so each query gathers the keys of its
    own range (``window``, the widest range, columns; -1 past its end) and scores them by the
    reference's rules (``score_candidates``: the same products summed along D).  Either way ids and
    scores are the reference's bit for bit.  The window is a tensor value: on a GPU reading it would
    synchronise, so there (and whenever the window covers more than half the keys) every key is scored.
    """
    num_k = keys.shape[0]
    if ranges.device.type != "cpu" or queries.shape[0] == 0:
        return _top_by_packed_key(torch.arange(num_k, device=keys.device), cosine_scores(queries, keys, ranges), k,
                                  num_k)
    start, end = ranges[:, 0], ranges[:, 1]
    window = int((end - start).max())
    if 2 * window > num_k:
        return _top_by_packed_key(torch.arange(num_k), cosine_scores(queries, keys, ranges), k, num_k)
    offsets = torch.arange(window, dtype=torch.int64)
    ids = start[:, None] + offsets[None, :]
    ids = torch.where(ids < end[:, None], ids, torch.full_like(ids, -1))
    return _top_by_packed_key(ids, score_candidates(unit_rows(queries), unit_rows(keys), ids), k, num_k)


# The largest id that fits the low 32 bits of a packed ranking key (more keys: the reference's sorts).
_PACKED_MAX_ID = 2**32 - 1
# Scores ranked at once on a CPU (int64 keys of 1 MB; large on a GPU, block_elements): fresh temporaries of many MB
# cost a page fault per 4 KB.
_RANK_BLOCK = 1 << 17


def _top_by_packed_key(ids: torch.Tensor, scores: torch.Tensor, k: int, num_keys: int):
    """``topk_low_id(ids, scores, k)`` by one ``torch.topk`` on an int64 key per entry.

    The key is the score's float32 bits made monotone (high 32 bits) over ``2**32 - 1 - id`` (low 32
    bits): distinct entries have distinct keys, and a larger key is exactly a higher score, then a lower
    id, the reference's order; so ``torch.topk``, whatever order it gives equal values, has none to
    give.  ``-0.0`` counts as ``+0.0`` (the reference's sort compares them equal); -inf entries and
    padding come out as the reference's (-1, -inf).  ``ids`` (N,) shared by every row, or (Q, C), in
    ``[0, num_keys)`` where the score is finite.
    """
    num_q, num_c = scores.shape
    if num_keys - 1 > _PACKED_MAX_ID:
        return topk_low_id(ids.expand_as(scores), scores, k)
    ids = ids.expand_as(scores)
    low = _PACKED_MAX_ID - ids.clamp_min(0)
    rows = max(1, block_elements(scores.device, _RANK_BLOCK) // max(1, num_c))
    pos = torch.empty((num_q, min(k, num_c)), dtype=torch.int64, device=scores.device)
    for lo in range(0, num_q, rows):
        key = (scores[lo : lo + rows] + 0.0).view(torch.int32).to(torch.int64)  # + 0.0: -0.0 becomes +0.0
        key ^= (key >> 31) & 0x7FFFFFFF  # negative floats: a larger magnitude, a smaller key
        key *= 2**32
        key += low[lo : lo + rows]
        pos[lo : lo + rows] = torch.topk(key, pos.shape[1], dim=1).indices
    top_scores = scores.gather(1, pos)
    top_ids = torch.where(torch.isfinite(top_scores), ids.gather(1, pos), -1)
    if top_ids.shape[1] < k:
        pad = k - top_ids.shape[1]
        top_ids = torch.cat([top_ids, top_ids.new_full((num_q, pad), -1)], 1)
        top_scores = torch.cat([top_scores, top_scores.new_full((num_q, pad), float("-inf"))], 1)
    return top_ids, top_scores


# --------------------------------------------------------------------------
# Backend: C++ (csrc/cpu/tree/topk.cpp), and the latency path COSINE_TOPK declares
# --------------------------------------------------------------------------
# The value checks the C++ entries make in their own pass, in the order of their statuses (each
# message is the general path's).
_QUERIES_FINITE = "queries must be finite, found NaN or Inf"
_KEYS_FINITE = "keys must be finite, found NaN or Inf"
_RANGES_INSIDE = "ranges must satisfy 0 <= start <= end <= N={N} for every query"
_TOPK_CHECKS = NativeChecks(_QUERIES_FINITE, _KEYS_FINITE, _RANGES_INSIDE)
_QUERY_CHECKS = NativeChecks(_QUERIES_FINITE)
_KEY_CHECKS = NativeChecks(_KEYS_FINITE)

_TENSOR, _F32, _I64, _STRIDED = torch.Tensor, torch.float32, torch.int64, torch.strided
# Results allocated through numpy (about 0.7 us against 1.4 for torch.empty with a shape and a dtype),
# handed to the kernel by the array's own DLPack capsule (0.08 us against 0.22 for a tensor's).
_from_numpy, _np_empty, _NP_F32, _NP_I64 = torch.from_numpy, np.empty, np.float32, np.int64


def _cosine_topk_fast(mod, queries, keys, k, ranges):
    """cosine_topk of plain float32 CPU tensors, an int k, and either no ranges and ``Q < BLAS_MIN_QUERIES``
    or plain int64 (Q, 2) CPU ranges that the C++ backend scans in one pass (any Q below the BLAS rule's
    coverage: a VideoAgent round): one call of the fused scan, which also checks the values, ranges
    included."""
    if not ((ranges is None or is_plain_ranges(ranges)) and type(queries) is _TENSOR and type(keys) is _TENSOR
            and type(k) is int
            and queries.dtype is _F32 and keys.dtype is _F32 and queries.is_cpu and keys.is_cpu
            and not (queries.requires_grad or keys.requires_grad) and queries.layout is _STRIDED
            and keys.layout is _STRIDED and queries.is_contiguous() and keys.is_contiguous()):
        return None
    q_shape, k_shape = queries.shape, keys.shape
    if not (len(q_shape) == 2 and len(k_shape) == 2 and q_shape[0] >= 1 and k_shape[0] >= 1
            and k_shape[1] >= 1 and q_shape[1] == k_shape[1] and 1 <= k <= _FAST_MAX_K):
        return None
    if ranges is None:
        if q_shape[0] >= BLAS_MIN_QUERIES:
            return None
    elif ranges.shape != (q_shape[0], 2) or (
            q_shape[0] >= BLAS_MIN_QUERIES and (q_shape[0] * k > MAX_RESULTS
                                                or cosine_topk_uses_blas(q_shape[0], k_shape[0], ranges.numpy()))):
        return None
    ids, scores = _np_empty((q_shape[0], k), _NP_I64), _np_empty((q_shape[0], k), _NP_F32)
    status = mod.cosine_topk(view(queries), view(keys), None if ranges is None else view(ranges), ids.__dlpack__(),
                             scores.__dlpack__())
    if status:
        _TOPK_CHECKS.raise_for(status, N=k_shape[0])
    return _new_tuple(TopKResult, (_from_numpy(ids), _from_numpy(scores)))


def is_plain_ranges(ranges) -> bool:
    """Whether the latency paths take ``ranges`` as they are: a plain int64 contiguous CPU tensor."""
    return (type(ranges) is _TENSOR and ranges.dtype is _I64 and ranges.is_cpu and ranges.layout is _STRIDED
            and ranges.is_contiguous())


def held_ranges(ranges, num_queries: int, k: int):
    """A numpy view of ``ranges`` when a latency path that does not check them itself can take them: plain
    (``is_plain_ranges``), (Q, 2), Q x k results within MAX_RESULTS and 0 <= start <= end for every query;
    else None (the general path then says what is wrong)."""
    if not (is_plain_ranges(ranges) and ranges.shape == (num_queries, 2) and num_queries * k <= MAX_RESULTS):
        return None
    bounds = ranges.numpy()
    return bounds if bool((bounds[:, 0] >= 0).all() and (bounds[:, 0] <= bounds[:, 1]).all()) else None


def _cosine_topk_cpp_fused(queries, keys, k, ranges):
    mod = COSINE_TOPK.cpp_module("cpp")
    ids = torch.empty((queries.shape[0], k), dtype=torch.int64)
    scores = torch.empty((queries.shape[0], k), dtype=torch.float32)
    _TOPK_CHECKS.raise_for(mod.cosine_topk(view(queries), view(keys), view(ranges), view(ids), view(scores)),
                           N=keys.shape[0])
    return ids, scores


def _cosine_topk_cpp_blas(queries, keys, k, ranges):
    """Blocked torch.mm (CPU BLAS) score blocks filtered by a C++ running top-k, which scores
    the keys it admits exactly as the fused scan does (the same ranking, ties included)."""
    mod = COSINE_TOPK.cpp_module("cpp")
    num_q, num_k = queries.shape[0], keys.shape[0]
    unit = torch.empty_like(queries)
    _QUERY_CHECKS.raise_for(mod.unit_rows(view(queries), view(unit)))
    norms = torch.empty(num_k, dtype=torch.float32)
    _KEY_CHECKS.raise_for(mod.row_norms(view(keys), view(norms)))
    if num_q and bool(((ranges[:, 0] < 0) | (ranges[:, 1] > num_k) | (ranges[:, 0] > ranges[:, 1])).any()):
        raise ValueError(_RANGES_INSIDE.format(N=num_k))
    ids = torch.full((num_q, k), -1, dtype=torch.int64)
    scores = torch.full((num_q, k), float("-inf"), dtype=torch.float32)
    unit_v, ranges_v, ids_v, scores_v = view(unit), view(ranges), view(ids), view(scores)
    block = min(num_k, max(256, _BLAS_BLOCK_BUDGET // num_q))
    buf = torch.empty((num_q, block), dtype=torch.float32)  # one score block, reused (cache-resident output)
    for lo in range(0, num_k, block):
        hi = min(num_k, lo + block)
        dots = torch.mm(unit, keys[lo:hi].T, out=buf) if hi - lo == block else torch.mm(unit, keys[lo:hi].T)
        mod.topk_merge(view(dots), view(norms[lo:hi]), unit_v, view(keys[lo:hi]), lo, ranges_v, ids_v, scores_v)
    return ids, scores


def _cosine_topk_cpp(queries, keys, k, ranges):
    if cosine_topk_uses_blas(queries.shape[0], keys.shape[0], ranges):
        return _cosine_topk_cpp_blas(queries, keys, k, ranges)
    return _cosine_topk_cpp_fused(queries, keys, k, ranges)


# --------------------------------------------------------------------------
# Backend: Triton (_triton.py)
# --------------------------------------------------------------------------
def _cosine_topk_triton(queries, keys, k, ranges):
    from ._triton import cosine_topk_triton

    return cosine_topk_triton(unit_rows(queries), keys, k, ranges)


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
SCORE_TOLERANCES = {dtype: (2e-5, 0.0) for dtype in FLOAT_INPUTS}
TOLERANCES = {"torch": {dtype: (0.0, 0.0) for dtype in FLOAT_INPUTS}, "cpp": SCORE_TOLERANCES,
              "triton": SCORE_TOLERANCES, "cuda": SCORE_TOLERANCES}

COSINE_TOPK = Op(
    "cosine_topk",
    {"torch": _cosine_topk_torch, "cpp": _cosine_topk_cpp, "triton": _cosine_topk_triton},
    extra_reasons={"triton": _cosine_topk_triton_reasons},
    tolerances=TOLERANCES,
    native="tree",
    fast=_cosine_topk_fast,
)
