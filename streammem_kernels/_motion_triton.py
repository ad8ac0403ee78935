"""Triton kernels for Lucas-Kanade motion magnitude (see motion.py for the contract).

Two stages, each a grid of (pair, row tile, column tile) programs:

1. ``_lk_products_kernel`` writes the five structure products of the valid
   gradient region, (P, 5, H-2, W-2) float32 (the reference's
   ``structure_products``);
2. ``_lk_window_kernel`` averages them over each w x w window, solves the 2x2
   system per pixel and writes the per-pixel fields |flow|, u, v, valid,
   (P, 4, Ho, Wo) float32 (the reference's ``flow_fields``).

The per-frame summary (float64 sums over each frame) and the global mode
(window=None: one system per pair from the mean products) are the reference's
own torch functions applied to these tensors.

**Bit for bit.**  Both kernels evaluate the reference's expressions in the
reference's order (the Sobel differences, the row-major window sum from 0 and
its division by w*w as ``avg_pool2d`` does, the closed-form solve), launched
with ``enable_fp_fusion=False`` (no contraction into FMAs) and with correctly
rounded ``sqrt_rn`` / ``div_rn``: the fields equal the reference's bit for bit,
and since the summary is the same torch code on equal tensors, so do flow_px,
mean_uv and every keep/drop decision made from them.

**Registers.**  The window is a runtime argument and both window loops are
runtime loops: one compiled kernel serves every window the public API accepts
(any odd w >= 3), and its registers do not grow with w (a static w*w unroll
hoisted all 5*w*w loads: 255 registers at w=5 and spills at w=7).  The loads
hit L1/L2: a program's tile plus halo of the five planes is at most a few KB
for w <= 7.

Every load and store is masked (the interpreter does not check bounds).
Offsets inside one frame are 32-bit (frames below 2**31 pixels), pair offsets
64-bit.  The kernels use the same block sizes under the interpreter as on a
GPU.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .motion import global_flow, summarise_fields

# One tile shape for both kernels and both targets: 512 pixels, 4 per thread
# at 4 warps; 64 float32 columns are two 128-byte lines per row.
BLOCK_ROWS = 8
BLOCK_COLS = 64
NUM_WARPS = 4

KERNEL_CONTRACTS = {
    "_lk_products_kernel": {"hot": True, "exact": True},
    "_lk_window_kernel": {"hot": True, "exact": True},
}


@triton.jit
def _mean_at(prev_base, cur_base, offs, mask, scale):
    p = tl.load(prev_base + offs, mask=mask, other=0).to(tl.float32) * scale
    c = tl.load(cur_base + offs, mask=mask, other=0).to(tl.float32) * scale
    return 0.5 * (p + c)


@triton.jit
def _lk_products_kernel(frames_ptr, prod_ptr, H, W, scale, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    pair = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    Hg = H - 2
    Wg = W - 2
    inside = (rows[:, None] < Hg) & (cols[None, :] < Wg)
    prev_base = frames_ptr + pair.to(tl.int64) * H * W
    cur_base = prev_base + H * W
    corner = rows[:, None] * W + cols[None, :]  # top-left of each pixel's 3x3 stencil

    # Intensities in [0, 1] and the mean frame, rounded as the reference rounds them.
    m00 = _mean_at(prev_base, cur_base, corner, inside, scale)
    m01 = _mean_at(prev_base, cur_base, corner + 1, inside, scale)
    m02 = _mean_at(prev_base, cur_base, corner + 2, inside, scale)
    m10 = _mean_at(prev_base, cur_base, corner + W, inside, scale)
    m12 = _mean_at(prev_base, cur_base, corner + W + 2, inside, scale)
    m20 = _mean_at(prev_base, cur_base, corner + 2 * W, inside, scale)
    m21 = _mean_at(prev_base, cur_base, corner + 2 * W + 1, inside, scale)
    m22 = _mean_at(prev_base, cur_base, corner + 2 * W + 2, inside, scale)
    # Sobel / 8, the reference's order: ((d0 + 2 d1) + d2) * 0.125.
    ix = (((m02 - m00) + 2.0 * (m12 - m10)) + (m22 - m20)) * 0.125
    iy = (((m20 - m00) + 2.0 * (m21 - m01)) + (m22 - m02)) * 0.125
    centre = corner + W + 1
    it = (tl.load(cur_base + centre, mask=inside, other=0).to(tl.float32) * scale
          - tl.load(prev_base + centre, mask=inside, other=0).to(tl.float32) * scale)

    plane = Hg * Wg
    out = prod_ptr + pair.to(tl.int64) * 5 * Hg * Wg + (rows[:, None] * Wg + cols[None, :])
    tl.store(out, ix * ix, mask=inside)
    out += plane
    tl.store(out, ix * iy, mask=inside)
    out += plane
    tl.store(out, iy * iy, mask=inside)
    out += plane
    tl.store(out, ix * it, mask=inside)
    out += plane
    tl.store(out, iy * it, mask=inside)


@triton.jit
def _lk_window_kernel(prod_ptr, fields_ptr, Hg, Wg, Ho, Wo, window, min_eig, BLOCK_R: tl.constexpr,
                      BLOCK_C: tl.constexpr):
    pair = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    inside = (rows[:, None] < Ho) & (cols[None, :] < Wo)
    plane = Hg * Wg
    a_ptr = prod_ptr + pair.to(tl.int64) * 5 * Hg * Wg + (rows[:, None] * Wg + cols[None, :])
    a = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    b = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    c = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    sx = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    sy = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    # Row-major window sum from 0 (avg_pool2d's order); runtime loops keep the
    # registers independent of the window.
    for dy in range(window):
        for dx in range(window):
            p = a_ptr + (dy * Wg + dx)
            a += tl.load(p, mask=inside, other=0.0)
            p += plane
            b += tl.load(p, mask=inside, other=0.0)
            p += plane
            c += tl.load(p, mask=inside, other=0.0)
            p += plane
            sx += tl.load(p, mask=inside, other=0.0)
            p += plane
            sy += tl.load(p, mask=inside, other=0.0)
    area = (window * window).to(tl.float32)
    a = tl.div_rn(a, area)
    b = tl.div_rn(b, area)
    c = tl.div_rn(c, area)
    bx = -tl.div_rn(sx, area)
    by = -tl.div_rn(sy, area)
    # The reference's solve_lk, operation for operation.
    det = a * c - b * b
    lmax = 0.5 * ((a + c) + tl.sqrt_rn((a - c) * (a - c) + 4.0 * b * b))
    lmin = tl.div_rn(det, tl.where(lmax > 0, lmax, 1.0))
    valid = (lmax > 0) & (lmin > min_eig)
    safe_det = tl.where(valid, det, 1.0)
    u = tl.where(valid, tl.div_rn(c * bx - b * by, safe_det), 0.0)
    v = tl.where(valid, tl.div_rn(a * by - b * bx, safe_det), 0.0)

    out_plane = Ho * Wo
    out = fields_ptr + pair.to(tl.int64) * 4 * Ho * Wo + (rows[:, None] * Wo + cols[None, :])
    tl.store(out, tl.sqrt_rn(u * u + v * v), mask=inside)
    out += out_plane
    tl.store(out, u, mask=inside)
    out += out_plane
    tl.store(out, v, mask=inside)
    out += out_plane
    tl.store(out, valid.to(tl.float32), mask=inside)


def structure_products_triton(gray: torch.Tensor) -> torch.Tensor:
    """(P, 5, H-2, W-2) float32 products of contiguous (T, H, W) uint8/float32 frames; equals
    ``motion.structure_products`` bit for bit."""
    pairs, H, W = gray.shape[0] - 1, gray.shape[1], gray.shape[2]
    prods = torch.empty((pairs, 5, H - 2, W - 2), dtype=torch.float32, device=gray.device)
    scale = 1.0 / 255.0 if gray.dtype == torch.uint8 else 1.0
    grid = (pairs, triton.cdiv(H - 2, BLOCK_ROWS), triton.cdiv(W - 2, BLOCK_COLS))
    _lk_products_kernel[grid](gray, prods, H, W, scale, BLOCK_R=BLOCK_ROWS, BLOCK_C=BLOCK_COLS,
                              num_warps=NUM_WARPS, enable_fp_fusion=False)
    return prods


def flow_fields_triton(prods: torch.Tensor, window: int, min_eig: float) -> torch.Tensor:
    """(P, 4, Ho, Wo) float32 fields of (P, 5, Hg, Wg) products; equals
    ``motion.flow_fields(motion.window_average(prods, window), min_eig)`` bit for bit."""
    pairs, _, Hg, Wg = prods.shape
    Ho, Wo = Hg - window + 1, Wg - window + 1
    fields = torch.empty((pairs, 4, Ho, Wo), dtype=torch.float32, device=prods.device)
    grid = (pairs, triton.cdiv(Ho, BLOCK_ROWS), triton.cdiv(Wo, BLOCK_COLS))
    _lk_window_kernel[grid](prods, fields, Hg, Wg, Ho, Wo, window, float(min_eig), BLOCK_R=BLOCK_ROWS,
                            BLOCK_C=BLOCK_COLS, num_warps=NUM_WARPS, enable_fp_fusion=False)
    return fields


def lk_flow_triton(gray: torch.Tensor, window: int, min_eig: float):
    prods = structure_products_triton(gray)
    if window == 0:
        return global_flow(prods, min_eig)
    return summarise_fields(flow_fields_triton(prods, window, min_eig))
