"""Triton backend of batched k-means: a device-resident Lloyd loop, five launches per iteration.

Contract: ``reference.lloyd_loop`` (the same iterations in torch), within the declared tolerance (float32
centre sums in a fixed order, bit-reproducible run to run).  Nothing here reads a tensor value on the host,
so a call never synchronises the CUDA stream and can be captured in a CUDA graph; converged problems skip
their work but every launch up to ``iters`` still happens.  ``docs/ops/kmeans.md`` describes the kernels.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

# The hot kernels must stay within 128 registers and not spill on sm_80/sm_90
# (tests/gpu_readiness/test_triton_compile.py).  No kernel promises bit-identical decisions:
# the centre sums are float32 here, float64 in the reference.
# "spills": bytes (stored + loaded) that Triton 3.6 (the GPU image's compiler) spills on sm_80/sm_90
# where Triton 3.9 spills none; allowed until a GPU run measures their cost (bench/gpu.sh).
KERNEL_CONTRACTS = {
    "_assign_kernel": {"hot": True, "exact": False, "spills": {"3.6": 8}},
    "_centre_sums_kernel": {"hot": True, "exact": False},
    "_update_kernel": {"hot": False, "exact": False},
    "_own_distance_kernel": {"hot": False, "exact": False},
    "_finish_kernel": {"hot": False, "exact": False, "spills": {"3.6": 52}},
}

# Assignment tile: BLOCK_N points x BLOCK_K centres.  The feature tile depends on
# whether the rows are 16-byte aligned (D and the row stride multiples of 16,
# which Triton specialises on): aligned rows load 4 floats per instruction and
# a 64-wide tile stays within ~96 registers on sm_80/sm_90, while unaligned
# rows load element by element and only a 16-wide tile stays under 128 (a
# 32-wide one spills on sm_80).  Two pipeline stages: three cost 30 more
# registers on unaligned rows for a loop whose float32 FMA dot already hides
# the load latency.  Wider tiles also mean fewer Kahan steps (4 adds per 64 FMAs).
ASSIGN_BLOCK_N = 32
ASSIGN_BLOCK_K = 16
ASSIGN_BLOCK_D_ALIGNED = 64
ASSIGN_BLOCK_D_UNALIGNED = 16
ASSIGN_WARPS = 4
ASSIGN_STAGES = 2
# Centre sums: BLOCK_K centres x BLOCK_D features per program, BLOCK_N points per step.
SUMS_BLOCK_N = 32
SUMS_BLOCK_K = 16
SUMS_BLOCK_D = 32
# Update, distances and re-seeding: memory-bound row sweeps.
ROWS_BLOCK_K = 16
ROWS_BLOCK_N = 32
ROWS_BLOCK_D = 32


@triton.jit(do_not_specialize=["N", "K"])
def _assign_kernel(x_ptr, c_ptr, csq_ptr, len_ptr, active_ptr, labels_ptr, N, D, K, stride_xn,
                   COSINE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    pid_n = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    n_valid = tl.load(len_ptr + b)
    row0 = pid_n * BLOCK_N
    # A converged problem, or a tile past the problem's length, does nothing (labels past the
    # length stay -1 from the allocation).
    if (tl.load(active_ptr + b) != 0) & (row0 < n_valid):
        rows = row0 + tl.arange(0, BLOCK_N)
        row_ok = rows < n_valid
        x_rows = x_ptr + b * N * stride_xn + rows.to(tl.int64)[:, None] * stride_xn
        best = tl.full((BLOCK_N,), float("inf"), tl.float64)
        best_idx = tl.zeros((BLOCK_N,), tl.int64)
        for k0 in range(0, K, BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K)
            col_ok = cols < K
            c_rows = c_ptr + (b * K + cols.to(tl.int64))[:, None] * D
            dots = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
            comp = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)  # Kahan: the low-order part `dots` lost
            for d0 in range(0, D, BLOCK_D):
                feats = d0 + tl.arange(0, BLOCK_D)
                f_ok = feats < D
                xt = tl.load(x_rows + feats[None, :], mask=row_ok[:, None] & f_ok[None, :], other=0.0)
                ct = tl.load(c_rows + feats[None, :], mask=col_ok[:, None] & f_ok[None, :], other=0.0)
                part = tl.dot(xt, tl.trans(ct), input_precision="ieee") - comp
                total = dots + part
                comp = (total - dots) - part
                dots = total
            dot64 = dots.to(tl.float64) - comp.to(tl.float64)
            if COSINE:
                score = -dot64
            else:
                csq = tl.load(csq_ptr + b * K + cols, mask=col_ok, other=0.0)
                score = csq[None, :] - 2.0 * dot64
            score = tl.where(col_ok[None, :], score, float("inf"))
            # Ties go to the lowest centre index: within the tile by the documented tie rule of the
            # reduction, across tiles because a later tile must be strictly better.
            tile_best, tile_arg = tl.min(score, axis=1, return_indices=True, return_indices_tie_break_left=True)
            better = tile_best < best
            best_idx = tl.where(better, k0 + tile_arg.to(tl.int64), best_idx)
            best = tl.where(better, tile_best, best)
        tl.store(labels_ptr + b * N + rows, tl.where(row_ok, best_idx, -1), mask=rows < N)


@triton.jit(do_not_specialize=["N", "K"])
def _centre_sums_kernel(x_ptr, w_ptr, labels_ptr, len_ptr, active_ptr, sums_ptr, mass_ptr, N, D, K,
                        stride_xn, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    pid_k = tl.program_id(0)
    pid_d = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    if tl.load(active_ptr + b) != 0:
        n_valid = tl.load(len_ptr + b)
        cols = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
        feats = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
        f_ok = feats < D
        acc = tl.zeros((BLOCK_K, BLOCK_D), tl.float32)
        mass = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)  # reduced over the points once, after the loop
        for n0 in range(0, n_valid, BLOCK_N):
            rows = n0 + tl.arange(0, BLOCK_N)
            row_ok = rows < n_valid
            lab = tl.load(labels_ptr + b * N + rows, mask=row_ok, other=-1)
            w = tl.load(w_ptr + b * N + rows, mask=row_ok, other=0.0)
            onehot = tl.where(lab[:, None] == cols[None, :], w[:, None], 0.0)  # (BLOCK_N, BLOCK_K)
            xt = tl.load(x_ptr + b * N * stride_xn + rows.to(tl.int64)[:, None] * stride_xn + feats[None, :],
                         mask=row_ok[:, None] & f_ok[None, :], other=0.0)
            acc = tl.dot(tl.trans(onehot), xt, acc, input_precision="ieee")
            mass += onehot
        col_ok = cols < K
        rows_k = b * K + cols.to(tl.int64)
        tl.store(sums_ptr + rows_k[:, None] * D + feats[None, :], acc, mask=col_ok[:, None] & f_ok[None, :])
        if pid_d == 0:
            tl.store(mass_ptr + rows_k, tl.sum(mass, axis=0), mask=col_ok)


@triton.jit(do_not_specialize=["K", "cosine"])
def _update_kernel(sums_ptr, mass_ptr, old_ptr, new_ptr, new_csq_ptr, empty_ptr, n_empty_ptr, row_shift_ptr,
                   active_ptr, D, K, cosine, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    pid_k = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    if tl.load(active_ptr + b) != 0:
        cols = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
        col_ok = cols < K
        rows_k = b * K + cols.to(tl.int64)
        row_base = rows_k[:, None] * D
        mass = tl.load(mass_ptr + rows_k, mask=col_ok, other=0.0)
        # The arithmetic of kmeans.finish_update: the float64 quotient of the sums by the mass (cosine:
        # by their float64 norm), rounded to float32.
        if cosine != 0:
            norm_sq = tl.zeros((BLOCK_K, BLOCK_D), tl.float64)
            for d0 in range(0, D, BLOCK_D):
                feats = d0 + tl.arange(0, BLOCK_D)
                s = tl.load(sums_ptr + row_base + feats[None, :], mask=col_ok[:, None] & (feats < D)[None, :],
                            other=0.0).to(tl.float64)
                norm_sq += s * s
            norm = tl.sqrt(tl.sum(norm_sq, axis=1))
            empty = (mass <= 0) | (norm <= 0)
            norm = tl.where(empty, 1.0, norm)
        else:
            empty = mass <= 0
            norm = tl.full((BLOCK_K,), 1.0, tl.float64)
        mass = tl.where(empty, 1.0, mass)
        empty = empty & col_ok
        shift = tl.zeros((BLOCK_K, BLOCK_D), tl.float64)
        norm_new = tl.zeros((BLOCK_K, BLOCK_D), tl.float64)
        for d0 in range(0, D, BLOCK_D):
            feats = d0 + tl.arange(0, BLOCK_D)
            ok = col_ok[:, None] & (feats < D)[None, :]
            old = tl.load(old_ptr + row_base + feats[None, :], mask=ok, other=0.0).to(tl.float64)
            s = tl.load(sums_ptr + row_base + feats[None, :], mask=ok, other=0.0)
            if cosine != 0:
                new = (s.to(tl.float64) / norm[:, None]).to(tl.float32)
            else:
                # The correctly rounded float32 quotient of two float32 numbers equals their float64
                # quotient rounded to float32 (double rounding is innocuous: 53 >= 2 * 24 + 2), and
                # costs no float64 division (1/64 of the float32 rate on consumer GPUs).
                new = tl.div_rn(s, mass[:, None])
            tl.store(new_ptr + row_base + feats[None, :], new, mask=ok)
            new = new.to(tl.float64)
            shift += (new - old) * (new - old)
            norm_new += new * new
        tl.store(new_csq_ptr + rows_k, tl.sum(norm_new, axis=1), mask=col_ok)
        tl.store(empty_ptr + rows_k, empty.to(tl.int32), mask=col_ok)
        # Empty rows move to the point _finish_kernel picks: their shift is added there.
        tl.store(row_shift_ptr + rows_k, tl.where(empty, 0.0, tl.sum(shift, axis=1)), mask=col_ok)
        # Empty clusters per problem: an integer sum, exact whatever the order of the atomics.
        tl.atomic_add(n_empty_ptr + b + tl.zeros((BLOCK_K,), tl.int64), empty.to(tl.int32), mask=empty)


@triton.jit(do_not_specialize=["N", "K", "cosine"])
def _own_distance_kernel(x_ptr, c_ptr, labels_ptr, len_ptr, active_ptr, n_empty_ptr, dist_ptr, N, D, K,
                         stride_xn, cosine, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    pid_n = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    n_valid = tl.load(len_ptr + b)
    row0 = pid_n * BLOCK_N
    # Only an active problem with an empty cluster needs the distances (points past the length
    # stay at -1 from the allocation, so they are never chosen).
    if (tl.load(active_ptr + b) != 0) & (tl.load(n_empty_ptr + b) > 0) & (row0 < n_valid):
        rows = row0 + tl.arange(0, BLOCK_N)
        row_ok = rows < n_valid
        lab = tl.load(labels_ptr + b * N + rows, mask=row_ok, other=0)
        x_rows = x_ptr + b * N * stride_xn + rows.to(tl.int64)[:, None] * stride_xn
        c_rows = c_ptr + (b * K + lab)[:, None] * D
        acc = tl.zeros((BLOCK_N, BLOCK_D), tl.float64)
        for d0 in range(0, D, BLOCK_D):
            feats = d0 + tl.arange(0, BLOCK_D)
            ok = row_ok[:, None] & (feats < D)[None, :]
            xt = tl.load(x_rows + feats[None, :], mask=ok, other=0.0).to(tl.float64)
            ct = tl.load(c_rows + feats[None, :], mask=ok, other=0.0).to(tl.float64)
            if cosine != 0:
                acc += xt * ct
            else:
                acc += (xt - ct) * (xt - ct)
        dist = tl.sum(acc, axis=1)
        if cosine != 0:
            dist = 1.0 - dist
        tl.store(dist_ptr + b * N + rows, tl.where(row_ok, dist, -1.0), mask=rows < N)


@triton.jit(do_not_specialize=["N", "K"])
def _finish_kernel(x_ptr, old_ptr, new_ptr, new_csq_ptr, empty_ptr, n_empty_ptr, row_shift_ptr, dist_ptr, tol_ptr,
                   active_ptr, n_iter_ptr, N, D, K, stride_xn,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    if tl.load(active_ptr + b) != 0:
        shift = tl.zeros((BLOCK_K,), tl.float64)
        for k0 in range(0, K, BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K)
            shift += tl.load(row_shift_ptr + b * K + cols, mask=cols < K, other=0.0)
        shift = tl.sum(shift, axis=0)
        if tl.load(n_empty_ptr + b) > 0:
            # The last point taken, in the order (distance descending, index ascending): the next
            # empty cluster takes the farthest point after it, so each point is taken at most once.
            last_dist = tl.full((), float("inf"), tl.float64)
            last_idx = tl.full((), -1, tl.int64)
            moved = tl.zeros((BLOCK_D,), tl.float64)  # squared shift of the re-seeded centres
            for k0 in range(0, K, BLOCK_K):
                cols = k0 + tl.arange(0, BLOCK_K)
                if tl.sum(tl.load(empty_ptr + b * K + cols, mask=cols < K, other=0), axis=0) > 0:
                    for cluster in range(k0, tl.minimum(k0 + BLOCK_K, K)):  # empty ones in increasing order
                        if tl.load(empty_ptr + b * K + cluster) != 0:
                            # Per lane, the farthest eligible point among the rows it saw (an earlier tile keeps
                            # ties: lower index); then the farthest over the lanes, ties to the lowest index.
                            lane_dist = tl.full((BLOCK_N,), float("-inf"), tl.float64)
                            lane_idx = tl.zeros((BLOCK_N,), tl.int64)
                            for n0 in range(0, N, BLOCK_N):
                                rows = n0 + tl.arange(0, BLOCK_N)
                                d = tl.load(dist_ptr + b * N + rows, mask=rows < N, other=float("-inf"))
                                after = (d < last_dist) | ((d == last_dist) & (rows > last_idx))
                                better = after & (rows < N) & (d > lane_dist)
                                lane_idx = tl.where(better, rows.to(tl.int64), lane_idx)
                                lane_dist = tl.where(better, d, lane_dist)
                            last_dist = tl.max(lane_dist, axis=0)
                            last_idx = tl.min(tl.where(lane_dist == last_dist, lane_idx, N), axis=0)
                            # The chosen point becomes the centre; its shift and squared norm follow.
                            point = x_ptr + b * N * stride_xn + last_idx * stride_xn
                            row = (b * K + cluster) * D
                            norm_sq = tl.zeros((BLOCK_D,), tl.float64)
                            for d0 in range(0, D, BLOCK_D):
                                feats = d0 + tl.arange(0, BLOCK_D)
                                f_ok = feats < D
                                xv = tl.load(point + feats, mask=f_ok, other=0.0)
                                ov = tl.load(old_ptr + row + feats, mask=f_ok, other=0.0).to(tl.float64)
                                tl.store(new_ptr + row + feats, xv, mask=f_ok)
                                xv = xv.to(tl.float64)
                                moved += (xv - ov) * (xv - ov)
                                norm_sq += xv * xv
                            tl.store(new_csq_ptr + b * K + cluster, tl.sum(norm_sq, axis=0))
            shift += tl.sum(moved, axis=0)
            tl.store(n_empty_ptr + b, 0)
        tl.store(n_iter_ptr + b, tl.load(n_iter_ptr + b) + 1)
        tl.store(active_ptr + b, (shift > tl.load(tol_ptr + b)).to(tl.int32))


def lloyd_triton(points: torch.Tensor, weights: torch.Tensor, lengths: torch.Tensor, centres: torch.Tensor,
                 tol: torch.Tensor, iters: int, cosine: bool):
    """Lloyd iterations of B problems on the device, without host synchronisation.

    points (B, N, D) float32 with unit feature stride and any row stride s
    (batch stride N * s), weights (B, N) float32, lengths (B,) int64,
    centres (B, k, D) float32 initial centres (not modified), tol (B,) float64 absolute
    thresholds on the total squared centre shift, ``iters`` the iteration cap.
    Returns (centroids (B, k, D) float32, labels (B, N) int64, inertia (B,)
    float32, n_iter (B,) int64) with the semantics of kmeans.lloyd_loop.
    """
    B, N, D = points.shape
    K = centres.shape[1]
    if points.stride(2) != 1 or (B > 1 and points.stride(0) != N * points.stride(1)):
        raise ValueError(f"points must be rows of unit feature stride, evenly spaced across problems, got "
                         f"strides {tuple(points.stride())} for shape {tuple(points.shape)}")
    device = points.device
    weights = weights.to(torch.float32).contiguous()
    lengths = lengths.to(torch.int64).contiguous()
    tol = tol.to(torch.float64).contiguous()
    # Centres after an even / odd number of updates.  Iteration i reads buffer i % 2 and writes
    # the other; a problem that has stopped is no longer written, so its final centres are in
    # buffer n_iter[b] % 2 and nothing is copied for it.
    buffers = [centres.to(torch.float32).contiguous().clone(), torch.empty((B, K, D), dtype=torch.float32,
                                                                           device=device)]
    norms = [(buffers[0].double() ** 2).sum(-1), torch.empty((B, K), dtype=torch.float64, device=device)]
    labels = torch.full((B, N), -1, dtype=torch.int64, device=device)
    dist = torch.full((B, N), -1.0, dtype=torch.float64, device=device)
    sums = torch.empty((B, K, D), dtype=torch.float32, device=device)
    mass = torch.empty((B, K), dtype=torch.float32, device=device)
    empty = torch.empty((B, K), dtype=torch.int32, device=device)
    row_shift = torch.empty((B, K), dtype=torch.float64, device=device)
    n_empty = torch.zeros((B,), dtype=torch.int32, device=device)
    active = torch.ones((B,), dtype=torch.int32, device=device)
    n_iter = torch.zeros((B,), dtype=torch.int64, device=device)
    # The assignment and sums are the arithmetic-heavy kernels (FMA allowed); the row sweeps that
    # mirror finish_update are launched without fusion, so their float64 products and sums round as
    # the reference's separate multiplies and adds do.
    for i in range(iters):
        current, following = buffers[i % 2], buffers[1 - i % 2]
        _assign(points, current, norms[i % 2], lengths, active, labels, cosine)
        _centre_sums_kernel[(triton.cdiv(K, SUMS_BLOCK_K), triton.cdiv(D, SUMS_BLOCK_D), B)](
            points, weights, labels, lengths, active, sums, mass, N, D, K, points.stride(1),
            BLOCK_N=SUMS_BLOCK_N, BLOCK_K=SUMS_BLOCK_K, BLOCK_D=SUMS_BLOCK_D, enable_fp_fusion=True)
        _update_kernel[(triton.cdiv(K, ROWS_BLOCK_K), B)](
            sums, mass, current, following, norms[1 - i % 2], empty, n_empty, row_shift, active, D, K, int(cosine),
            BLOCK_K=ROWS_BLOCK_K, BLOCK_D=ROWS_BLOCK_D, enable_fp_fusion=False)
        _own_distance(points, current, labels, lengths, active, n_empty, dist, cosine)
        _finish_kernel[(B,)](
            points, current, following, norms[1 - i % 2], empty, n_empty, row_shift, dist, tol, active, n_iter,
            N, D, K, points.stride(1), BLOCK_N=ROWS_BLOCK_N, BLOCK_K=ROWS_BLOCK_K,
            BLOCK_D=ROWS_BLOCK_D, enable_fp_fusion=False)
    odd = (n_iter % 2 == 1)
    centroids = torch.where(odd[:, None, None], buffers[1], buffers[0])
    centre_norms = torch.where(odd[:, None], norms[1], norms[0])
    # Final assignment (labels consistent with the returned centres) and inertia, for every problem.
    every = torch.ones((B,), dtype=torch.int32, device=device)
    _assign(points, centroids, centre_norms, lengths, every, labels, cosine)
    _own_distance(points, centroids, labels, lengths, every, every, dist, cosine)
    valid = torch.arange(N, device=device)[None, :] < lengths[:, None]
    inertia = (dist * weights.double() * valid).sum(dim=1).to(torch.float32)
    return centroids, labels, inertia, n_iter


def _assign(points, centres, centre_norms, lengths, active, labels, cosine):
    B, N, D = points.shape
    K = centres.shape[1]
    aligned = D % 16 == 0 and points.stride(1) % 16 == 0
    _assign_kernel[(triton.cdiv(N, ASSIGN_BLOCK_N), B)](
        points, centres, centre_norms, lengths, active, labels, N, D, K, points.stride(1),
        COSINE=bool(cosine), BLOCK_N=ASSIGN_BLOCK_N, BLOCK_K=ASSIGN_BLOCK_K,
        BLOCK_D=ASSIGN_BLOCK_D_ALIGNED if aligned else ASSIGN_BLOCK_D_UNALIGNED,
        num_warps=ASSIGN_WARPS, num_stages=ASSIGN_STAGES, enable_fp_fusion=True)


def _own_distance(points, centres, labels, lengths, active, n_empty, dist, cosine):
    B, N, D = points.shape
    K = centres.shape[1]
    _own_distance_kernel[(triton.cdiv(N, ROWS_BLOCK_N), B)](
        points, centres, labels, lengths, active, n_empty, dist, N, D, K, points.stride(1), int(cosine),
        BLOCK_N=ROWS_BLOCK_N, BLOCK_D=ROWS_BLOCK_D, enable_fp_fusion=False)
