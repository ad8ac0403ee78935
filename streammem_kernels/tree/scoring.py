"""The scoring and ranking rules every cosine search of the package shares.

* A score is ``dot(q / |q|, v / |v|)`` in float32; the norm is computed after
  scaling the row by the power of two that brings its largest |component| into
  [0.5, 1) (:func:`pow2_row_scale`), so rows of any finite magnitude -- a norm
  above 1.8e19, whose square overflows float32, or below 1e-19, whose square
  underflows -- get their true direction; the scaling is exact, so it changes
  nothing for rows of ordinary magnitude.  An all-zero row is the zero vector and
  scores 0 against everything (:func:`unit_rows`).
* A dot product is a product summed along D (:func:`dot_rows`), never a GEMM:
  a GEMM's summation order depends on where a row falls in its tiles, so two
  identical rows could score an ulp apart and the tie rule would not hold.
* A ranking orders by (score desc, id asc); ``-inf`` marks an absent entry
  (:func:`topk_low_id`).

The torch references of :mod:`~streammem_kernels.topk` (exact top-k),
:mod:`~streammem_kernels.traversal` (tree search) and the store
(:mod:`~streammem_kernels.cosine_tree`, which normalises on insertion) are
written with these; the native kernels implement the same rules.
"""
from __future__ import annotations

import torch

from ..runtime.validate import check_int

# Size bounds checked before anything is allocated (a ValueError naming the argument instead of
# a MemoryError, a pybind type error for ints >= 2^63 or an int32 overflow in a kernel).
MAX_DIM = 1 << 20  # embedding dimension
MAX_NODES = 1 << 40  # tree nodes / keys
MAX_TABLE = 1 << 36  # capacity x dim floats of a CosineTree's embedding table (256 GiB)
MAX_RESULTS = 1 << 28  # entries of one result tensor (Q x k, Q x R x (H + 1))
MAX_WIDTH = 2**31 - 1  # a beam width


def check_size(value, name: str, *, minimum: int = 1, maximum: int) -> int:
    """``value`` as an int in [minimum, maximum] (ValueError naming ``name`` otherwise)."""
    value = check_int(value, name, minimum=minimum)
    if value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


FLOAT_INPUTS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
INT_INPUTS = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


# Exponent range of the row scale: 2^-e for e in [-126, 126] is a normal float32, so the scale
# itself is exact; a row whose largest |component| is >= 2^127 ends in [2, 4), a subnormal one
# at >= 2^-23 -- either way its squares neither overflow nor underflow.
POW2_SCALE_EXPONENT = 126


def pow2_row_scale(x: torch.Tensor) -> torch.Tensor:
    """(..., 1) float32 power of two that brings each row's largest |component| into [0.5, 1)
    (1 for an all-zero row; the exponent clamped to +-126).  Multiplying by it is exact."""
    amax = x.abs().amax(-1, keepdim=True)
    _, exponent = torch.frexp(amax)
    return torch.ldexp(torch.ones_like(amax), (-exponent).clamp(-POW2_SCALE_EXPONENT, POW2_SCALE_EXPONENT))


def unit_rows(x: torch.Tensor) -> torch.Tensor:
    """Rows scaled to unit L2 norm in float32; all-zero rows stay zero (never NaN).

    The row is first scaled by :func:`pow2_row_scale` (exact), so that its squared
    norm neither overflows nor underflows; dividing by the norm clamped to the
    smallest normal float then gives 0 / tiny = 0 for a zero row and changes
    nothing for any other (its scaled norm is at least 0.5).
    """
    x = x.to(torch.float32)
    x = x * pow2_row_scale(x)
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    return x / norm.clamp_min(torch.finfo(torch.float32).tiny)


def dot_rows(queries: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """dots[s, c] = queries[s] . rows[s, c] for queries (S, D) and rows (S, C, D), summed along D."""
    return (rows * queries[:, None, :]).sum(-1)


def topk_low_id(ids: torch.Tensor, scores: torch.Tensor, k: int):
    """Top-k of each row by (score desc, id asc); -inf scores count as absent (id -1).

    Returns ``(ids, scores)`` of shape (S, k), padded with -1 / -inf when a row has
    fewer than k columns.
    """
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
