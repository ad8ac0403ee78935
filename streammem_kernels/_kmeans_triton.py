"""Triton kernels of batched k-means (imported lazily by kmeans.py).

* ``_assign_kernel``: one program per (problem, tile of BLOCK_N points).  It
  walks the centres in tiles of BLOCK_K and the features in tiles of BLOCK_D,
  forms ``x.c`` with ``tl.dot`` (``input_precision="ieee"``: true float32, no
  TF32) per feature tile, adds the tiles' partial dots in float64 (so long
  rows, D = 65,536, do not drift as one long float32 sum would), turns it into the score ``||c||^2 - 2 x.c`` (cosine: ``-x.c``) and
  keeps a running (min, argmin) per point, as flash-kmeans does: the N x k
  distance matrix is never written, only the labels.
* ``_centre_sums_kernel``: one program per (problem, tile of BLOCK_K centres,
  tile of BLOCK_D features).  It walks the points in tiles and accumulates
  ``onehot(labels)^T @ (w x)`` in float32 with ``tl.dot``: a segmented
  reduction without atomics, in a fixed order, so the sums are bit-identical
  from run to run (deterministic; float32, not the float64 of the C++ kernel).

The convergence test, empty-cluster re-seeding and inertia are the shared
torch code of kmeans.py (they touch O(k D) or O(N D) data once per iteration).
Under ``TRITON_INTERPRET=1`` the kernels run on CPU tensors (tests).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_N = 32
BLOCK_K = 16
BLOCK_D = 32


@triton.jit
def _assign_kernel(x_ptr, c_ptr, csq_ptr, len_ptr, labels_ptr, N, D, K,
                   COSINE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    pid_n = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    n_valid = tl.load(len_ptr + b)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < n_valid
    x_base = x_ptr + b * N * D
    c_base = c_ptr + b * K * D
    best = tl.full((BLOCK_N,), float("inf"), tl.float64)
    best_idx = tl.zeros((BLOCK_N,), tl.int64)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        col_ok = cols < K
        dots = tl.zeros((BLOCK_N, BLOCK_K), tl.float64)
        for d0 in range(0, D, BLOCK_D):
            feats = d0 + tl.arange(0, BLOCK_D)
            f_ok = feats < D
            xt = tl.load(x_base + rows[:, None] * D + feats[None, :], mask=row_ok[:, None] & f_ok[None, :], other=0.0)
            ct = tl.load(c_base + cols[:, None] * D + feats[None, :], mask=col_ok[:, None] & f_ok[None, :], other=0.0)
            dots += tl.dot(xt, tl.trans(ct), input_precision="ieee").to(tl.float64)
        if COSINE:
            score = -dots
        else:
            csq = tl.load(csq_ptr + b * K + cols, mask=col_ok, other=0.0)
            score = csq[None, :] - 2.0 * dots
        score = tl.where(col_ok[None, :], score, float("inf"))
        tile_best = tl.min(score, axis=1)
        # Lowest index among the tile's minima (explicit, not relying on argmin's tie rule).
        tile_idx = tl.min(tl.where(score == tile_best[:, None], cols[None, :], K), axis=1).to(tl.int64)
        better = tile_best < best  # strict: an earlier tile keeps ties
        best_idx = tl.where(better, tile_idx, best_idx)
        best = tl.where(better, tile_best, best)
    labels = tl.where(row_ok, best_idx, -1)
    tl.store(labels_ptr + b * N + rows, labels, mask=rows < N)


@triton.jit
def _centre_sums_kernel(x_ptr, w_ptr, labels_ptr, sums_ptr, mass_ptr, N, D, K,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    pid_k = tl.program_id(0)
    pid_d = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    cols = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    feats = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    f_ok = feats < D
    acc = tl.zeros((BLOCK_K, BLOCK_D), tl.float32)
    mass = tl.zeros((BLOCK_K,), tl.float32)
    for n0 in range(0, N, BLOCK_N):
        rows = n0 + tl.arange(0, BLOCK_N)
        row_ok = rows < N
        lab = tl.load(labels_ptr + b * N + rows, mask=row_ok, other=-1)
        w = tl.load(w_ptr + b * N + rows, mask=row_ok, other=0.0)
        onehot = tl.where(lab[:, None] == cols[None, :], w[:, None], 0.0)  # (BLOCK_N, BLOCK_K); label -1 matches nothing
        xt = tl.load(x_ptr + b * N * D + rows[:, None] * D + feats[None, :], mask=row_ok[:, None] & f_ok[None, :],
                     other=0.0)
        acc += tl.dot(tl.trans(onehot), xt, input_precision="ieee")
        mass += tl.sum(onehot, axis=0)
    col_ok = cols < K
    tl.store(sums_ptr + b * K * D + cols[:, None] * D + feats[None, :], acc, mask=col_ok[:, None] & f_ok[None, :])
    if pid_d == 0:
        tl.store(mass_ptr + b * K + cols, mass, mask=col_ok)


def assign_triton(points: torch.Tensor, centres: torch.Tensor, lengths: torch.Tensor, cosine: bool) -> torch.Tensor:
    """(B, N) int64 labels, -1 past lengths[b]."""
    B, N, D = points.shape
    K = centres.shape[1]
    centres = centres.contiguous()
    csq = (centres.double() ** 2).sum(-1).contiguous()
    labels = torch.empty((B, N), dtype=torch.int64, device=points.device)
    grid = (triton.cdiv(N, BLOCK_N), B)
    _assign_kernel[grid](points, centres, csq, lengths, labels, N, D, K, COSINE=bool(cosine),
                         BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, BLOCK_D=BLOCK_D)
    return labels


def centre_sums_triton(points: torch.Tensor, weights: torch.Tensor, labels: torch.Tensor, k: int):
    """(B, k, D) float32 weighted sums and (B, k) float32 weights per cluster."""
    B, N, D = points.shape
    sums = torch.empty((B, k, D), dtype=torch.float32, device=points.device)
    mass = torch.empty((B, k), dtype=torch.float32, device=points.device)
    grid = (triton.cdiv(k, BLOCK_K), triton.cdiv(D, BLOCK_D), B)
    _centre_sums_kernel[grid](points, weights.contiguous(), labels, sums, mass, N, D, k,
                              BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, BLOCK_D=BLOCK_D)
    return sums, mass
