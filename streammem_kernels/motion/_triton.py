"""Triton backend of the motion op: the per-level stages of ``reference.pyramid_flow`` (``TRITON_STAGES``).

Each kernel is the reference function of the same name evaluated operation for operation, bit for
bit (``docs/ops/motion.md``, "Backends and tolerances"), on a grid of (pair or frame, row tile,
column tile) programs:

* ``_lk_reduce_kernel``   -- ``reduce_level``: the next pyramid level;
* ``_lk_guess_kernel``    -- ``guess_field``: a level's flow smoothed into the next level's guess;
* ``_lk_warp_kernel``     -- ``warp_frames``: the current frames moved by the guess's whole-pixel offsets;
* ``_lk_products_kernel`` -- ``pair_products``: (P, 5, H-2, W-2) float32 structure products;
* ``_lk_window_kernel``   -- ``flow_fields(window_average(...))``: (P, 4, Ho, Wo) float32 fields
  |flow|, u, v, valid;
* ``_lk_search_kernel``   -- ``search_sads``: (P, K) int64 sums of quantised absolute differences;
* ``_streamchat_products_kernel`` -- ``streamchat_products``: (P, 5, H, W) float32 products of the
  "streamchat" statistic (unscaled zero-padded Sobel of the previous frame);
* ``_streamchat_window_kernel``   -- ``streamchat_fields(window_average(...) * window**2)``: (P, 3, Ho, Wo)
  float32 fields reading, u, v (the per-pair means are the reference's ``summarise_streamchat``).

Launched with ``enable_fp_fusion=False`` (no FMA contraction) and correctly rounded ``sqrt_rn`` /
``div_rn``; the window is a runtime argument (one compiled kernel for every odd window); every load
and store is masked; offsets inside a frame are 32-bit (frames below 2**31 pixels), pair offsets
64-bit.  Nothing here reads a value on the host.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch
import triton
import triton.language as tl

from .reference import GUESS_BOX, SEARCH_QUANT, shift_of_sads, summarise_streamchat, to_unit_float

# One tile shape for every kernel and both targets: 512 pixels, 4 per thread
# at 4 warps; 64 float32 columns are two 128-byte lines per row.
BLOCK_ROWS = 8
BLOCK_COLS = 64
NUM_WARPS = 4

KERNEL_CONTRACTS = {
    "_lk_products_kernel": {"hot": True, "exact": True},
    "_lk_window_kernel": {"hot": True, "exact": True},
    "_lk_reduce_kernel": {"hot": True, "exact": True},
    "_lk_guess_kernel": {"hot": True, "exact": True},
    "_lk_warp_kernel": {"hot": True, "exact": True},
    "_lk_search_kernel": {"hot": True, "exact": True},
    "_streamchat_products_kernel": {"hot": True, "exact": True},
    "_streamchat_window_kernel": {"hot": True, "exact": True},
}


@triton.jit
def _unit_at(base, offs, mask, scale):
    return tl.load(base + offs, mask=mask, other=0).to(tl.float32) * scale


@triton.jit
def _lk_products_kernel(prev_ptr, cur_ptr, prod_ptr, H, W, scale, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    pair = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    Hg = H - 2
    Wg = W - 2
    inside = (rows[:, None] < Hg) & (cols[None, :] < Wg)
    prev_base = prev_ptr + pair.to(tl.int64) * H * W
    cur_base = cur_ptr + pair.to(tl.int64) * H * W
    corner = rows[:, None] * W + cols[None, :]  # top-left of each pixel's 3x3 stencil

    # Intensities in [0, 1], then per stencil row: the mean frame's values at the three columns,
    # and the row's [1 2 1] sum of It = cur - prev; all rounded as the reference rounds them.
    p0 = _unit_at(prev_base, corner, inside, scale)
    p1 = _unit_at(prev_base, corner + 1, inside, scale)
    p2 = _unit_at(prev_base, corner + 2, inside, scale)
    c0 = _unit_at(cur_base, corner, inside, scale)
    c1 = _unit_at(cur_base, corner + 1, inside, scale)
    c2 = _unit_at(cur_base, corner + 2, inside, scale)
    m00 = 0.5 * (p0 + c0)
    m01 = 0.5 * (p1 + c1)
    m02 = 0.5 * (p2 + c2)
    t0 = ((c0 - p0) + 2.0 * (c1 - p1)) + (c2 - p2)
    p0 = _unit_at(prev_base, corner + W, inside, scale)
    p1 = _unit_at(prev_base, corner + W + 1, inside, scale)
    p2 = _unit_at(prev_base, corner + W + 2, inside, scale)
    c0 = _unit_at(cur_base, corner + W, inside, scale)
    c1 = _unit_at(cur_base, corner + W + 1, inside, scale)
    c2 = _unit_at(cur_base, corner + W + 2, inside, scale)
    m10 = 0.5 * (p0 + c0)
    m12 = 0.5 * (p2 + c2)
    t1 = ((c0 - p0) + 2.0 * (c1 - p1)) + (c2 - p2)
    p0 = _unit_at(prev_base, corner + 2 * W, inside, scale)
    p1 = _unit_at(prev_base, corner + 2 * W + 1, inside, scale)
    p2 = _unit_at(prev_base, corner + 2 * W + 2, inside, scale)
    c0 = _unit_at(cur_base, corner + 2 * W, inside, scale)
    c1 = _unit_at(cur_base, corner + 2 * W + 1, inside, scale)
    c2 = _unit_at(cur_base, corner + 2 * W + 2, inside, scale)
    m20 = 0.5 * (p0 + c0)
    m21 = 0.5 * (p1 + c1)
    m22 = 0.5 * (p2 + c2)
    t2 = ((c0 - p0) + 2.0 * (c1 - p1)) + (c2 - p2)
    # Sobel / 8, the reference's order: ((d0 + 2 d1) + d2) * 0.125; It: ((t0 + 2 t1) + t2) / 16.
    ix = (((m02 - m00) + 2.0 * (m12 - m10)) + (m22 - m20)) * 0.125
    iy = (((m20 - m00) + 2.0 * (m21 - m01)) + (m22 - m02)) * 0.125
    it = ((t0 + 2.0 * t1) + t2) * 0.0625

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
def _guess_offsets(guess_base, y, x, H, W, Hc, Wc, border, factor):
    """Whole-pixel offsets (gx, gy) at level pixels (y, x): the reference's guess_offsets."""
    ci = tl.minimum(tl.maximum(y // factor - border, 0), Hc - 1)
    cj = tl.minimum(tl.maximum(x // factor - border, 0), Wc - 1)
    at = ci * Wc + cj
    f = factor.to(tl.float32)
    gx = tl.floor(f * tl.load(guess_base + at) + 0.5)
    gy = tl.floor(f * tl.load(guess_base + Hc * Wc + at) + 0.5)
    wf = W.to(tl.float32)
    hf = H.to(tl.float32)
    gx = tl.where(gx >= -wf, tl.where(gx <= wf, gx, wf), -wf)  # NaN-safe clamp (NaN -> low)
    gy = tl.where(gy >= -hf, tl.where(gy <= hf, gy, hf), -hf)
    return gx, gy


@triton.jit
def _window_sums(a_ptr, plane, row_stride, window, inside, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Window sums of the five product planes (Ix Ix, Ix Iy, Iy Iy, Ix It, Iy It; ``plane`` apart) at the
    (BLOCK_R, BLOCK_C) outputs whose window's top-left product is ``a_ptr``: row-major from 0 (avg_pool2d's
    order); runtime loops keep the registers independent of the window."""
    a = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    b = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    c = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    sx = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    sy = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    for dy in range(window):
        for dx in range(window):
            p = a_ptr + (dy * row_stride + dx)
            a += tl.load(p, mask=inside, other=0.0)
            p += plane
            b += tl.load(p, mask=inside, other=0.0)
            p += plane
            c += tl.load(p, mask=inside, other=0.0)
            p += plane
            sx += tl.load(p, mask=inside, other=0.0)
            p += plane
            sy += tl.load(p, mask=inside, other=0.0)
    return a, b, c, sx, sy


@triton.jit(do_not_specialize=["factor"])  # factor 1 (coarsest-level steps) stays a runtime int
def _lk_window_kernel(prod_ptr, fields_ptr, guess_ptr, Hg, Wg, Ho, Wo, window, min_eig, Hc, Wc, factor,
                      HAS_GUESS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    pair = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    inside = (rows[:, None] < Ho) & (cols[None, :] < Wo)
    plane = Hg * Wg
    a_ptr = prod_ptr + pair.to(tl.int64) * 5 * Hg * Wg + (rows[:, None] * Wg + cols[None, :])
    a, b, c, sx, sy = _window_sums(a_ptr, plane, Wg, window, inside, BLOCK_R, BLOCK_C)
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
    if HAS_GUESS:
        # The products came from the pair warped by the guess's offsets: compose (flow_fields).
        H = Hg + 2
        W = Wg + 2
        border = (window - 1) // 2 + 1
        y = rows[:, None] + border
        x = cols[None, :] + border
        guess_base = guess_ptr + pair.to(tl.int64) * 2 * Hc * Wc
        gx, gy = _guess_offsets(guess_base, y, x, H, W, Hc, Wc, border, factor)
        xs = x.to(tl.float32) + gx
        ys = y.to(tl.float32) + gy
        lo = border.to(tl.float32)
        in_frame = (xs >= lo) & (xs <= (W - 1 - border).to(tl.float32)) & (ys >= lo) & \
                   (ys <= (H - 1 - border).to(tl.float32))
        valid = valid & in_frame
        u = tl.where(valid, gx + u, gx)
        v = tl.where(valid, gy + v, gy)

    out_plane = Ho * Wo
    out = fields_ptr + pair.to(tl.int64) * 4 * Ho * Wo + (rows[:, None] * Wo + cols[None, :])
    tl.store(out, tl.sqrt_rn(u * u + v * v), mask=inside)
    out += out_plane
    tl.store(out, u, mask=inside)
    out += out_plane
    tl.store(out, v, mask=inside)
    out += out_plane
    tl.store(out, valid.to(tl.float32), mask=inside)


@triton.jit
def _lk_guess_kernel(fields_ptr, guess_ptr, Ho, Wo, box, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    pair = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    inside = (rows[:, None] < Ho) & (cols[None, :] < Wo)
    plane = Ho * Wo
    base = fields_ptr + pair.to(tl.int64) * 4 * Ho * Wo
    su = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    sv = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    sw = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    # avg_pool2d with zero padding: the in-frame part of each box, row-major from 0 (a masked
    # neighbour adds +0.0, which changes no sum that starts from +0.0).  Runtime loops: a static
    # unroll hoisted all 75 loads (255 registers).
    half = box // 2
    for dy in range(box):
        for dx in range(box):
            r = rows[:, None] + (dy - half)
            q = cols[None, :] + (dx - half)
            ok = inside & (r >= 0) & (r < Ho) & (q >= 0) & (q < Wo)
            at = r * Wo + q
            w = tl.load(base + 3 * plane + at, mask=ok, other=0.0)
            su += tl.load(base + plane + at, mask=ok, other=0.0) * w
            sv += tl.load(base + 2 * plane + at, mask=ok, other=0.0) * w
            sw += w
    area = (box * box).to(tl.float32)
    su = tl.div_rn(su, area)
    sv = tl.div_rn(sv, area)
    sw = tl.div_rn(sw, area)
    has = sw > 0
    at = rows[:, None] * Wo + cols[None, :]
    own_u = tl.load(base + plane + at, mask=inside, other=0.0)
    own_v = tl.load(base + 2 * plane + at, mask=inside, other=0.0)
    safe = tl.where(has, sw, 1.0)
    out = guess_ptr + pair.to(tl.int64) * 2 * Ho * Wo + at
    tl.store(out, tl.where(has, tl.div_rn(su, safe), own_u), mask=inside)
    tl.store(out + plane, tl.where(has, tl.div_rn(sv, safe), own_v), mask=inside)


@triton.jit(do_not_specialize=["factor"])  # factor 1 (coarsest-level steps) stays a runtime int
def _lk_warp_kernel(src_ptr, guess_ptr, out_ptr, H, W, Hc, Wc, border, factor, BLOCK_R: tl.constexpr,
                    BLOCK_C: tl.constexpr):
    pair = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    inside = (rows[:, None] < H) & (cols[None, :] < W)
    y = rows[:, None]
    x = cols[None, :]
    guess_base = guess_ptr + pair.to(tl.int64) * 2 * Hc * Wc
    # The guess is read at clamped indices, so the loads are in bounds without a mask.
    gx, gy = _guess_offsets(guess_base, y, x, H, W, Hc, Wc, border, factor)
    sy = tl.minimum(tl.maximum(y + gy.to(tl.int32), 0), H - 1)
    sx = tl.minimum(tl.maximum(x + gx.to(tl.int32), 0), W - 1)
    frame = pair.to(tl.int64) * H * W
    value = tl.load(src_ptr + frame + (sy * W + sx), mask=inside)
    tl.store(out_ptr + frame + (y * W + x), value, mask=inside)


@triton.jit
def _lk_reduce_kernel(src_ptr, dst_ptr, H, W, Hn, Wn, scale, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    frame = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    inside = (rows[:, None] < Hn) & (cols[None, :] < Wn)
    src = src_ptr + frame.to(tl.int64) * H * W
    left = tl.maximum(2 * cols - 1, 0)[None, :]
    centre = tl.minimum(2 * cols, W - 1)[None, :]
    right = tl.minimum(2 * cols + 1, W - 1)[None, :]
    # The reference's [1 2 1] / 4 along rows at the three source rows, then along the column.
    r = tl.maximum(2 * rows - 1, 0)[:, None] * W
    h0 = ((_unit_at(src, r + left, inside, scale) + 2.0 * _unit_at(src, r + centre, inside, scale))
          + _unit_at(src, r + right, inside, scale)) * 0.25
    r = tl.minimum(2 * rows, H - 1)[:, None] * W
    h1 = ((_unit_at(src, r + left, inside, scale) + 2.0 * _unit_at(src, r + centre, inside, scale))
          + _unit_at(src, r + right, inside, scale)) * 0.25
    r = tl.minimum(2 * rows + 1, H - 1)[:, None] * W
    h2 = ((_unit_at(src, r + left, inside, scale) + 2.0 * _unit_at(src, r + centre, inside, scale))
          + _unit_at(src, r + right, inside, scale)) * 0.25
    out = dst_ptr + frame.to(tl.int64) * Hn * Wn + (rows[:, None] * Wn + cols[None, :])
    tl.store(out, ((h0 + 2.0 * h1) + h2) * 0.25, mask=inside)


@triton.jit
def _lk_search_kernel(prev_ptr, cur_ptr, sad_ptr, H, W, ry, rx, quant, BLOCK_R: tl.constexpr,
                      BLOCK_C: tl.constexpr):
    """One program per pair: for each shift k (row-major over dy, dx), the sum over prev's central
    region of |floor(quant * (cur[y + dy, x + dx] - prev[y, x]) + 0.5)| in int64."""
    pair = tl.program_id(0)
    base = pair.to(tl.int64) * H * W
    nr = H - 2 * ry
    nc = W - 2 * rx
    side = 2 * rx + 1
    shifts = (2 * ry + 1) * side
    for k in range(shifts):
        dy = k // side - ry
        dx = k % side - rx
        acc = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.int64)
        for r0 in range(0, nr, BLOCK_R):
            for c0 in range(0, nc, BLOCK_C):
                rows = r0 + tl.arange(0, BLOCK_R)
                cols = c0 + tl.arange(0, BLOCK_C)
                ok = (rows[:, None] < nr) & (cols[None, :] < nc)
                at = (rows[:, None] + ry) * W + (cols[None, :] + rx)
                a = tl.load(prev_ptr + base + at, mask=ok, other=0.0)
                b = tl.load(cur_ptr + base + at + (dy * W + dx), mask=ok, other=0.0)
                q = tl.abs(tl.floor((b - a) * quant + 0.5))
                acc += tl.where(ok, q, 0.0).to(tl.int64)
        tl.store(sad_ptr + pair.to(tl.int64) * shifts + k, tl.sum(tl.sum(acc, axis=1), axis=0))


@triton.jit
def _streamchat_products_kernel(prev_ptr, cur_ptr, prod_ptr, H, W, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    pair = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    y = rows[:, None]
    x = cols[None, :]
    inside = (y < H) & (x < W)
    prev_base = prev_ptr + pair.to(tl.int64) * H * W
    at = y * W + x
    # The previous frame zero padded: a neighbour outside the frame loads 0.0, the reference's F.pad.
    up = inside & (y >= 1)
    below = inside & (y + 1 < H)
    left = x >= 1
    right = x + 1 < W
    p00 = tl.load(prev_base + at - W - 1, mask=up & left, other=0.0)
    p01 = tl.load(prev_base + at - W, mask=up, other=0.0)
    p02 = tl.load(prev_base + at - W + 1, mask=up & right, other=0.0)
    p10 = tl.load(prev_base + at - 1, mask=inside & left, other=0.0)
    p11 = tl.load(prev_base + at, mask=inside, other=0.0)
    p12 = tl.load(prev_base + at + 1, mask=inside & right, other=0.0)
    p20 = tl.load(prev_base + at + W - 1, mask=below & left, other=0.0)
    p21 = tl.load(prev_base + at + W, mask=below, other=0.0)
    p22 = tl.load(prev_base + at + W + 1, mask=below & right, other=0.0)
    # The reference's order: (d0 + 2 d1) + d2 of right-minus-left rows (Ix), bottom-minus-top columns (Iy).
    ix = ((p02 - p00) + 2.0 * (p12 - p10)) + (p22 - p20)
    iy = ((p20 - p00) + 2.0 * (p21 - p01)) + (p22 - p02)
    it = tl.load(cur_ptr + pair.to(tl.int64) * H * W + at, mask=inside, other=0.0) - p11

    plane = H * W
    out = prod_ptr + pair.to(tl.int64) * 5 * H * W + at
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
def _streamchat_window_kernel(prod_ptr, fields_ptr, H, W, Ho, Wo, window, eps, BLOCK_R: tl.constexpr,
                              BLOCK_C: tl.constexpr):
    pair = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    inside = (rows[:, None] < Ho) & (cols[None, :] < Wo)
    plane = H * W
    a_ptr = prod_ptr + pair.to(tl.int64) * 5 * H * W + (rows[:, None] * W + cols[None, :])
    a, b, c, sx, sy = _window_sums(a_ptr, plane, W, window, inside, BLOCK_R, BLOCK_C)
    # StreamChat's avg_pool2d(...) * window**2: divided, then multiplied, each rounded.
    area = (window * window).to(tl.float32)
    a = tl.div_rn(a, area) * area + eps
    b = tl.div_rn(b, area) * area
    c = tl.div_rn(c, area) * area + eps
    rx = -(tl.div_rn(sx, area) * area)
    ry = -(tl.div_rn(sy, area) * area)
    det = a * c - b * b
    u = tl.div_rn(c * rx - b * ry, det)
    v = tl.div_rn(a * ry - b * rx, det)
    out_plane = Ho * Wo
    out = fields_ptr + pair.to(tl.int64) * 3 * Ho * Wo + (rows[:, None] * Wo + cols[None, :])
    tl.store(out, tl.sqrt_rn(u * u + u * u), mask=inside)
    out += out_plane
    tl.store(out, u, mask=inside)
    out += out_plane
    tl.store(out, v, mask=inside)


def _scale(frames: torch.Tensor) -> float:
    return 1.0 / 255.0 if frames.dtype == torch.uint8 else 1.0


def _grid(first: int, rows: int, cols: int):
    return (first, triton.cdiv(rows, BLOCK_ROWS), triton.cdiv(cols, BLOCK_COLS))


def products_triton(prev: torch.Tensor, cur: torch.Tensor) -> torch.Tensor:
    """(P, 5, H-2, W-2) float32 products of contiguous (P, H, W) uint8/float32 frame pairs; equals
    ``reference.pair_products`` bit for bit."""
    pairs, H, W = prev.shape
    prods = torch.empty((pairs, 5, H - 2, W - 2), dtype=torch.float32, device=prev.device)
    _lk_products_kernel[_grid(pairs, H - 2, W - 2)](prev, cur, prods, H, W, _scale(prev), BLOCK_R=BLOCK_ROWS,
                                                    BLOCK_C=BLOCK_COLS, num_warps=NUM_WARPS,
                                                    enable_fp_fusion=False)
    return prods


def structure_products_triton(gray: torch.Tensor) -> torch.Tensor:
    """(T-1, 5, H-2, W-2) products of every consecutive pair; equals ``reference.structure_products``."""
    return products_triton(gray[:-1], gray[1:])


def flow_fields_triton(prods: torch.Tensor, window: int, min_eig: float, guess: torch.Tensor | None = None,
                       level_hw=None, factor: int = 2) -> torch.Tensor:
    """(P, 4, Ho, Wo) float32 fields of (P, 5, Hg, Wg) products; equals
    ``reference.flow_fields(reference.window_average(prods, window), min_eig, guess, level_hw, factor)`` bit for bit
    (``level_hw`` is (Hg + 2, Wg + 2))."""
    pairs, _, Hg, Wg = prods.shape
    Ho, Wo = Hg - window + 1, Wg - window + 1
    fields = torch.empty((pairs, 4, Ho, Wo), dtype=torch.float32, device=prods.device)
    Hc, Wc = (1, 1) if guess is None else guess.shape[2:]
    _lk_window_kernel[_grid(pairs, Ho, Wo)](prods, fields, prods if guess is None else guess, Hg, Wg, Ho, Wo,
                                            window, float(min_eig), Hc, Wc, factor if guess is not None else 2,
                                            HAS_GUESS=guess is not None,
                                            BLOCK_R=BLOCK_ROWS, BLOCK_C=BLOCK_COLS, num_warps=NUM_WARPS,
                                            enable_fp_fusion=False)
    return fields


def guess_field_triton(fields: torch.Tensor) -> torch.Tensor:
    """(P, 2, Ho, Wo) float32; equals ``reference.guess_field(fields)`` bit for bit."""
    pairs, _, Ho, Wo = fields.shape
    guess = torch.empty((pairs, 2, Ho, Wo), dtype=torch.float32, device=fields.device)
    _lk_guess_kernel[_grid(pairs, Ho, Wo)](fields, guess, Ho, Wo, GUESS_BOX, BLOCK_R=BLOCK_ROWS,
                                           BLOCK_C=BLOCK_COLS, num_warps=NUM_WARPS, enable_fp_fusion=False)
    return guess


def warp_frames_triton(cur: torch.Tensor, guess: torch.Tensor, border: int, factor: int) -> torch.Tensor:
    """(P, H, W) in ``cur``'s dtype; equals ``reference.warp_frames(cur, guess, border, factor)``."""
    pairs, H, W = cur.shape
    out = torch.empty_like(cur)
    _lk_warp_kernel[_grid(pairs, H, W)](cur, guess, out, H, W, guess.shape[2], guess.shape[3], border, factor,
                                        BLOCK_R=BLOCK_ROWS, BLOCK_C=BLOCK_COLS, num_warps=NUM_WARPS,
                                        enable_fp_fusion=False)
    return out


def reduce_level_triton(frames: torch.Tensor) -> torch.Tensor:
    """(T, (H+1)//2, (W+1)//2) float32; equals ``reference.reduce_level(frames)`` bit for bit."""
    T, H, W = frames.shape
    Hn, Wn = (H + 1) // 2, (W + 1) // 2
    out = torch.empty((T, Hn, Wn), dtype=torch.float32, device=frames.device)
    _lk_reduce_kernel[_grid(T, Hn, Wn)](frames, out, H, W, Hn, Wn, _scale(frames), BLOCK_R=BLOCK_ROWS,
                                        BLOCK_C=BLOCK_COLS, num_warps=NUM_WARPS, enable_fp_fusion=False)
    return out


def search_shift_triton(prev: torch.Tensor, cur: torch.Tensor, radius) -> torch.Tensor:
    """(P, 2, 1, 1) float32; equals ``reference.search_shift(prev, cur, radius)`` bit for bit."""
    prev, cur = to_unit_float(prev).contiguous(), to_unit_float(cur).contiguous()
    pairs, H, W = prev.shape
    ry, rx = radius
    sads = torch.empty((pairs, (2 * ry + 1) * (2 * rx + 1)), dtype=torch.int64, device=prev.device)
    _lk_search_kernel[(pairs,)](prev, cur, sads, H, W, ry, rx, SEARCH_QUANT, BLOCK_R=BLOCK_ROWS, BLOCK_C=BLOCK_COLS,
                                num_warps=NUM_WARPS, enable_fp_fusion=False)
    return shift_of_sads(sads, radius)


def streamchat_fields_triton(gray: torch.Tensor, window: int, eps: float) -> torch.Tensor:
    """(T-1, 3, Ho, Wo) float32 fields reading, u, v of contiguous (T, H, W) float32 gray; equals
    ``reference.streamchat_fields(window_average(streamchat_products(...), window) * window**2, eps)``
    bit for bit."""
    T, H, W = gray.shape
    pairs, Ho, Wo = T - 1, H - window + 1, W - window + 1
    prods = torch.empty((pairs, 5, H, W), dtype=torch.float32, device=gray.device)
    _streamchat_products_kernel[_grid(pairs, H, W)](gray[:-1], gray[1:], prods, H, W, BLOCK_R=BLOCK_ROWS,
                                                    BLOCK_C=BLOCK_COLS, num_warps=NUM_WARPS,
                                                    enable_fp_fusion=False)
    fields = torch.empty((pairs, 3, Ho, Wo), dtype=torch.float32, device=gray.device)
    _streamchat_window_kernel[_grid(pairs, Ho, Wo)](prods, fields, H, W, Ho, Wo, window, float(eps),
                                                    BLOCK_R=BLOCK_ROWS, BLOCK_C=BLOCK_COLS, num_warps=NUM_WARPS,
                                                    enable_fp_fusion=False)
    return fields


def streamchat_flow_triton(gray: torch.Tensor, window: int, eps: float):
    """(flow_px (T-1,), mean_uv (T-1, 2)): ``reference.streamchat_flow(gray, window, eps)`` bit for bit
    (the fields from the kernels, their means by the reference's float64 reduction)."""
    return summarise_streamchat(streamchat_fields_triton(gray, window, eps))


TRITON_STAGES = SimpleNamespace(
    products=products_triton,
    fields=flow_fields_triton,
    guess=guess_field_triton,
    warp=warp_frames_triton,
    reduce=reduce_level_triton,
    search=search_shift_triton,
)
