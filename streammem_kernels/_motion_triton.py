"""Triton kernels for Lucas-Kanade motion magnitude (see motion.py for the contract).

Two stages, one program per (pair, row tile):

1. ``_lk_products_kernel`` writes the five structure products of the valid
   gradient region, (P, 5, H-2, W-2) float32;
2. ``_lk_window_kernel`` sums them over each w x w window (a static w^2 loop of
   shifted loads, which the GPU serves from L1/L2), solves the 2x2 system per
   pixel and reduces to per-tile partials (sum |flow|, count, sum u, sum v);
   ``_lk_global_kernel`` instead reduces the products themselves (window=None).

Partials are summed on the host side in float64 in a fixed order, so results are
deterministic (no atomics).  Everything is computed in float32; uint8 frames are
scaled by 1/255 on load.  Every load and store is masked (the interpreter does
not check bounds).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .motion import solve_lk

BLOCK_ROWS = 8
BLOCK_COLS = 64


@triton.jit
def _lk_products_kernel(frames_ptr, prod_ptr, H, W, scale, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    pair = tl.program_id(0)
    tile = tl.program_id(1)
    Hg = H - 2
    Wg = W - 2
    rows = tile * BLOCK_R + tl.arange(0, BLOCK_R)
    prev_base = frames_ptr + pair.to(tl.int64) * H * W
    cur_base = prev_base + H * W
    out_base = prod_ptr + pair.to(tl.int64) * 5 * Hg * Wg
    for c0 in range(0, Wg, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        mask = (rows[:, None] < Hg) & (cols[None, :] < Wg)
        ix = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
        iy = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
        # Sobel / 8 on the mean of the two frames; (dy, dx) index the 3x3 stencil.
        for dy in tl.static_range(3):
            for dx in tl.static_range(3):
                wx = (dx - 1) * (2 - (dy - 1) * (dy - 1))
                wy = (dy - 1) * (2 - (dx - 1) * (dx - 1))
                if wx != 0 or wy != 0:
                    offs = (rows[:, None] + dy) * W + (cols[None, :] + dx)
                    p = tl.load(prev_base + offs, mask=mask, other=0).to(tl.float32)
                    c = tl.load(cur_base + offs, mask=mask, other=0).to(tl.float32)
                    m = (p + c) * (0.5 * scale)
                    ix += m * (wx * 0.125)
                    iy += m * (wy * 0.125)
        centre = (rows[:, None] + 1) * W + (cols[None, :] + 1)
        it = (tl.load(cur_base + centre, mask=mask, other=0).to(tl.float32)
              - tl.load(prev_base + centre, mask=mask, other=0).to(tl.float32)) * scale
        out = rows[:, None] * Wg + cols[None, :]
        plane = Hg * Wg
        tl.store(out_base + out, ix * ix, mask=mask)
        tl.store(out_base + plane + out, ix * iy, mask=mask)
        tl.store(out_base + 2 * plane + out, iy * iy, mask=mask)
        tl.store(out_base + 3 * plane + out, ix * it, mask=mask)
        tl.store(out_base + 4 * plane + out, iy * it, mask=mask)


@triton.jit
def _lk_window_kernel(prod_ptr, partial_ptr, Hg, Wg, n_tiles, min_eig, WIN: tl.constexpr,
                      BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    pair = tl.program_id(0)
    tile = tl.program_id(1)
    Ho = Hg - WIN + 1
    Wo = Wg - WIN + 1
    plane = Hg * Wg
    base = prod_ptr + pair.to(tl.int64) * 5 * plane
    rows = tile * BLOCK_R + tl.arange(0, BLOCK_R)
    inv_area = 1.0 / (WIN * WIN)
    sum_mag = 0.0
    sum_u = 0.0
    sum_v = 0.0
    count = 0.0
    for c0 in range(0, Wo, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        mask = (rows[:, None] < Ho) & (cols[None, :] < Wo)
        a = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
        b = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
        c = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
        sx = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
        sy = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
        for dy in tl.static_range(WIN):
            for dx in tl.static_range(WIN):
                offs = (rows[:, None] + dy) * Wg + (cols[None, :] + dx)
                a += tl.load(base + offs, mask=mask, other=0.0)
                b += tl.load(base + plane + offs, mask=mask, other=0.0)
                c += tl.load(base + 2 * plane + offs, mask=mask, other=0.0)
                sx += tl.load(base + 3 * plane + offs, mask=mask, other=0.0)
                sy += tl.load(base + 4 * plane + offs, mask=mask, other=0.0)
        a = a * inv_area
        b = b * inv_area
        c = c * inv_area
        bx = -sx * inv_area
        by = -sy * inv_area
        det = a * c - b * b
        lmax = 0.5 * ((a + c) + tl.sqrt((a - c) * (a - c) + 4.0 * b * b))
        lmin = det / tl.where(lmax > 0, lmax, 1.0)
        valid = (lmax > 0) & (lmin > min_eig) & mask
        safe_det = tl.where(valid, det, 1.0)
        u = tl.where(valid, (c * bx - b * by) / safe_det, 0.0)
        v = tl.where(valid, (a * by - b * bx) / safe_det, 0.0)
        sum_mag += tl.sum(tl.sum(tl.sqrt(u * u + v * v), axis=1), axis=0)
        sum_u += tl.sum(tl.sum(u, axis=1), axis=0)
        sum_v += tl.sum(tl.sum(v, axis=1), axis=0)
        count += tl.sum(tl.sum(valid.to(tl.float32), axis=1), axis=0)
    out = partial_ptr + (pair * n_tiles + tile) * 4
    tl.store(out, sum_mag)
    tl.store(out + 1, count)
    tl.store(out + 2, sum_u)
    tl.store(out + 3, sum_v)


@triton.jit
def _lk_global_kernel(prod_ptr, partial_ptr, Hg, Wg, n_tiles, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    pair = tl.program_id(0)
    tile = tl.program_id(1)
    plane = Hg * Wg
    base = prod_ptr + pair.to(tl.int64) * 5 * plane
    rows = tile * BLOCK_R + tl.arange(0, BLOCK_R)
    out = partial_ptr + (pair * n_tiles + tile) * 5
    for k in tl.static_range(5):
        total = 0.0
        for c0 in range(0, Wg, BLOCK_C):
            cols = c0 + tl.arange(0, BLOCK_C)
            mask = (rows[:, None] < Hg) & (cols[None, :] < Wg)
            vals = tl.load(base + k * plane + rows[:, None] * Wg + cols[None, :], mask=mask, other=0.0)
            total += tl.sum(tl.sum(vals, axis=1), axis=0)
        tl.store(out + k, total)


def lk_flow_triton(gray: torch.Tensor, window: int, min_eig: float):
    pairs, H, W = gray.shape[0] - 1, gray.shape[1], gray.shape[2]
    Hg, Wg = H - 2, W - 2
    scale = 1.0 / 255.0 if gray.dtype == torch.uint8 else 1.0
    prods = torch.empty((pairs, 5, Hg, Wg), dtype=torch.float32, device=gray.device)
    grid = (pairs, triton.cdiv(Hg, BLOCK_ROWS))
    _lk_products_kernel[grid](gray, prods, H, W, scale, BLOCK_R=BLOCK_ROWS, BLOCK_C=BLOCK_COLS)
    if window == 0:
        n_tiles = triton.cdiv(Hg, BLOCK_ROWS)
        partial = torch.empty((pairs, n_tiles, 5), dtype=torch.float32, device=gray.device)
        _lk_global_kernel[(pairs, n_tiles)](prods, partial, Hg, Wg, n_tiles, BLOCK_R=BLOCK_ROWS, BLOCK_C=BLOCK_COLS)
        sums = (partial.double().sum(dim=1) / (Hg * Wg)).float()
        u, v, _ = solve_lk(sums, min_eig)
        return torch.sqrt(u * u + v * v), torch.stack((u, v), dim=1)
    Ho = Hg - window + 1
    n_tiles = triton.cdiv(Ho, BLOCK_ROWS)
    partial = torch.empty((pairs, n_tiles, 4), dtype=torch.float32, device=gray.device)
    _lk_window_kernel[(pairs, n_tiles)](prods, partial, Hg, Wg, n_tiles, float(min_eig), WIN=window,
                                        BLOCK_R=BLOCK_ROWS, BLOCK_C=BLOCK_COLS)
    totals = partial.double().sum(dim=1)
    count = totals[:, 1].clamp_min(1.0)
    flow_px = (totals[:, 0] / count).float()
    mean_uv = (totals[:, 2:4] / count[:, None]).float()
    return flow_px, mean_uv
