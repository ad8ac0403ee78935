"""The torch reference of the motion op (the spec every backend reproduces): gray conversion,
the Lucas-Kanade stages and the staged pyramid driver that every backend fills in.

Every rounding step is fixed here (the order of the Sobel and It differences, row-major window
sums from 0, correctly rounded square roots, float64 sums over each frame), so that the
``triton`` and ``cuda`` backends can reproduce it bit for bit; ``docs/ops/motion.md`` explains
the algorithm and its numerics.  Imports nothing of the op but the shared runtime.
"""
from __future__ import annotations

import functools
from types import SimpleNamespace

import torch
import torch.nn.functional as F


GRAY_WEIGHTS = (0.299, 0.587, 0.114)
FRAME_DTYPES = (torch.uint8, torch.float16, torch.bfloat16, torch.float32, torch.float64)

STATISTICS = ("moving", "textured", "streamchat")
# The "streamchat" statistic: StreamChat's own gate reading (streamchat_flow), with its gray weights
# (applied to the channels as normalised, not to [0, 1] intensities), its window and its regularisation.
STREAMCHAT_GRAY_WEIGHTS = (0.2989, 0.5870, 0.1140)
STREAMCHAT_WINDOW = 5
STREAMCHAT_EPS = 1e-6
# The "moving" statistic's soft noise floor (px at the working size): weight 0 below the
# first, 1 above the second, linear between.  And its minimum region, a fraction of the
# window outputs.  Chosen on synthetic static-camera clips (bench/calibrate_motion_gate.py).
MOVING_FLOOR_PX = (0.25, 0.5)
MOVING_MIN_AREA = 0.002
MAX_AUTO_LEVELS = 5
# The working size's upper bound (8K): a typo (size=100000) stops with a ValueError instead of
# allocating frames of that size.
MAX_SIZE = 8192
GUESS_BOX = 5  # side of the box that smooths a coarse level's flow into the next level's guess
SEARCH_RADIUS = 4  # largest whole-pixel shift per axis tried by the coarsest level's search
SEARCH_QUANT = 4096.0  # the search's differences are counted in 1/4096ths of the intensity range


def level_shapes(h: int, w: int, levels: int) -> list[tuple[int, int]]:
    """(H, W) of each pyramid level, finest first: level l+1 is ((H+1)//2, (W+1)//2) of level l."""
    shapes = [(h, w)]
    for _ in range(levels - 1):
        h, w = (h + 1) // 2, (w + 1) // 2
        shapes.append((h, w))
    return shapes


def gray_resize(frames: torch.Tensor, out_hw) -> torch.Tensor:
    """Reference preparation: gray (uint8 kept when no resize), area/bilinear resize."""
    if frames.dim() == 4:
        # Traced by torch.compile, the weights are a constant of the graph (Dynamo warns about a cache it
        # would trace through).
        weights = (torch.tensor(GRAY_WEIGHTS, dtype=torch.float32, device=frames.device)
                   if torch.compiler.is_compiling() else gray_weights(frames.device))
        gray = frames.to(torch.float32) @ weights
        if frames.dtype == torch.uint8:
            gray = gray * (1.0 / 255.0)
    elif frames.dtype == torch.uint8 and out_hw == tuple(frames.shape[1:]):
        return frames  # the kernels read uint8 directly and scale on load
    else:
        gray = frames.to(torch.float32)
        if frames.dtype == torch.uint8:
            gray = gray * (1.0 / 255.0)
    if out_hw != tuple(gray.shape[1:]):
        if out_hw[0] <= gray.shape[1] and out_hw[1] <= gray.shape[2]:
            gray = F.interpolate(gray[:, None], size=out_hw, mode="area")[:, 0]
        else:
            gray = F.interpolate(gray[:, None], size=out_hw, mode="bilinear", align_corners=False)[:, 0]
    return gray


@functools.cache
def gray_weights(device: torch.device) -> torch.Tensor:
    """The RGB weights on ``device``, made once per device: building them from Python numbers is a
    host-to-device copy, which a CUDA graph cannot capture."""
    return torch.tensor(GRAY_WEIGHTS, dtype=torch.float32, device=device)


# --------------------------------------------------------------------------
# Backend: torch reference (the spec)
# --------------------------------------------------------------------------
def to_unit_float(gray: torch.Tensor) -> torch.Tensor:
    if gray.dtype == torch.uint8:
        return gray.to(torch.float32) * (1.0 / 255.0)
    return gray.to(torch.float32)


def pair_products(prev: torch.Tensor, cur: torch.Tensor) -> torch.Tensor:
    """(P, 5, H-2, W-2) per-pixel products Ix^2, IxIy, Iy^2, IxIt, IyIt of frame pairs (P, H, W).

    The 3x3 Sobel / 8 is written out as differences of shifted slices so that
    its rounding is defined here, in this order (``((d0 + 2 d1) + d2) / 8`` over
    the three rows or columns), not by a convolution library.  It is the
    difference ``cur - prev`` smoothed by [1 2 1] along rows, then along
    columns, then divided by 16: the Sobel's cross smoothing, applied to both
    axes because It pairs with both gradients.
    """
    prev, cur = to_unit_float(prev), to_unit_float(cur)
    mean = 0.5 * (prev + cur)
    across = mean[:, :, 2:] - mean[:, :, :-2]  # (P, H, W-2): right minus left
    down = mean[:, 2:, :] - mean[:, :-2, :]  # (P, H-2, W): bottom minus top
    ix = ((across[:, :-2] + 2.0 * across[:, 1:-1]) + across[:, 2:]) * 0.125
    iy = ((down[:, :, :-2] + 2.0 * down[:, :, 1:-1]) + down[:, :, 2:]) * 0.125
    diff = cur - prev
    rows = (diff[:, :, :-2] + 2.0 * diff[:, :, 1:-1]) + diff[:, :, 2:]  # (P, H, W-2)
    it = ((rows[:, :-2] + 2.0 * rows[:, 1:-1]) + rows[:, 2:]) * 0.0625
    return torch.stack((ix * ix, ix * iy, iy * iy, ix * it, iy * it), dim=1)


def structure_products(gray: torch.Tensor) -> torch.Tensor:
    """(T-1, 5, H-2, W-2) products of every consecutive pair of (T, H, W) frames."""
    return pair_products(gray[:-1], gray[1:])


def window_average(prods: torch.Tensor, window: int) -> torch.Tensor:
    """(P, 5, Ho, Wo) mean of each product over every ``window`` x ``window`` window (valid region).

    ``avg_pool2d`` sums each window in row-major order, starting from 0, in
    float32, then divides by ``window**2`` (on CPU and CUDA alike; pinned by a
    test): the order a kernel reproducing the reference bit for bit follows.
    On CPU, for outputs of at least 64x64 pixels, that order is written out as
    ``window**2`` additions of shifted slices, the same bits 4x faster than
    ``avg_pool2d``'s scalar loop over each window (224x168 frames); smaller
    levels, and a GPU, where ``avg_pool2d`` is one pass, call it.
    """
    out_h, out_w = prods.shape[2] - window + 1, prods.shape[3] - window + 1
    if prods.device.type != "cpu" or out_h * out_w < 64 * 64:
        return F.avg_pool2d(prods, window, stride=1)
    total = prods[:, :, :out_h, :out_w] + 0.0  # 0 + the first term: -0.0 becomes +0.0, as in a sum from 0
    for dy in range(window):
        for dx in range(window):
            if dy or dx:
                total += prods[:, :, dy:dy + out_h, dx:dx + out_w]
    return total / (window * window)


def sqrt_rn(x: torch.Tensor) -> torch.Tensor:
    """Correctly rounded float32 square root (through float64; torch's float32 CPU ``sqrt`` is
    off by one ulp for some inputs, so it cannot define results a kernel reproduces)."""
    return torch.sqrt(x.double()).float()


def solve_lk(s: torch.Tensor, min_eig: float):
    """Closed-form 2x2 LK solve of averaged sums s[..., 5] -> (u, v, valid)."""
    a, b, c, bx, by = (s[..., i] for i in range(5))
    bx, by = -bx, -by
    det = a * c - b * b
    lmax = 0.5 * ((a + c) + sqrt_rn((a - c) * (a - c) + 4.0 * b * b))
    lmin = torch.where(lmax > 0, det / torch.where(lmax > 0, lmax, torch.ones_like(lmax)), torch.zeros_like(lmax))
    valid = lmin > min_eig
    safe_det = torch.where(valid, det, torch.ones_like(det))
    u = torch.where(valid, (c * bx - b * by) / safe_det, torch.zeros_like(det))
    v = torch.where(valid, (a * by - b * bx) / safe_det, torch.zeros_like(det))
    return u, v, valid


def clamp_nan_low(x: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """``x`` clamped to [low, high] with NaN sent to ``low`` (comparisons with NaN are false)."""
    return torch.where(x >= low, torch.where(x <= high, x, high), low)


def guess_offsets(guess: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, shape, border: int, factor: int):
    """Whole-pixel offsets (gx, gy) float32 at level pixels (rows[:, None], cols[None, :]).

    ``guess`` (P, 2, Hc, Wc) is a coarser level's smoothed flow on its window-output grid,
    whose (i, j) is the coarse pixel (i + border, j + border), ``factor`` (2 or 4) times
    coarser; a level pixel (y, x) reads its parent (y // factor, x // factor), clamped to the
    grid.  The offset is ``floor(factor * guess + 0.5)``, clamped to [-W, W] x [-H, H]
    (NaN-safe: a larger shift leaves the frame anyway).
    """
    H, W = shape
    Hc, Wc = guess.shape[2:]
    ci = torch.clamp(torch.div(rows, factor, rounding_mode="floor") - border, 0, Hc - 1)
    cj = torch.clamp(torch.div(cols, factor, rounding_mode="floor") - border, 0, Wc - 1)
    # Rounded and clamped on the coarse grid, then copied to the level pixels (factor^2 fewer operations).
    g = torch.floor(float(factor) * guess + 0.5)
    gx, gy = clamp_nan_low(g[:, 0], -float(W), float(W)), clamp_nan_low(g[:, 1], -float(H), float(H))
    return gx[:, ci][:, :, cj], gy[:, ci][:, :, cj]  # (P, len(rows), len(cols)) each


def warp_frames(cur: torch.Tensor, guess: torch.Tensor, border: int, factor: int) -> torch.Tensor:
    """(P, H, W) frames ``cur`` sampled at x + g(x) with the whole-pixel offsets of ``guess``
    (border clamped): an exact copy of the source values, in ``cur``'s dtype."""
    P, H, W = cur.shape
    rows = torch.arange(H, device=cur.device)
    cols = torch.arange(W, device=cur.device)
    gx, gy = guess_offsets(guess, rows, cols, (H, W), border, factor)
    src_y = torch.clamp(rows[None, :, None] + gy.long(), 0, H - 1)
    src_x = torch.clamp(cols[None, None, :] + gx.long(), 0, W - 1)
    return torch.gather(cur.reshape(P, H * W), 1, (src_y * W + src_x).reshape(P, H * W)).reshape(P, H, W)


def flow_fields(avg: torch.Tensor, min_eig: float, guess: torch.Tensor | None = None,
                level_hw: tuple[int, int] | None = None, factor: int = 2) -> torch.Tensor:
    """(P, 4, Ho, Wo) per-pixel fields |flow|, u, v, valid (1.0 or 0.0) of window-averaged products.

    With ``guess`` (a coarser level's smoothed flow, ``factor`` times coarser) the products
    were computed on the pair warped by its whole-pixel offsets g: a pixel is valid when
    textured and its displaced window stays inside the ``level_hw`` frame, and its flow is
    ``g + d`` (valid) or ``g``.
    """
    du, dv, ok = solve_lk(avg.permute(0, 2, 3, 1), min_eig)
    if guess is None:
        u, v, valid = du, dv, ok
    else:
        H, W = level_hw
        Ho, Wo = avg.shape[2:]
        border = 1 + (H - 1 - Ho) // 2  # 1 + window // 2: output (i, j) is pixel (i + border, j + border)
        rows = torch.arange(border, border + Ho, device=avg.device)
        cols = torch.arange(border, border + Wo, device=avg.device)
        gx, gy = guess_offsets(guess, rows, cols, (H, W), border, factor)
        xs = cols.to(torch.float32)[None, None, :] + gx
        ys = rows.to(torch.float32)[None, :, None] + gy
        inside = (xs >= border) & (xs <= W - 1 - border) & (ys >= border) & (ys <= H - 1 - border)
        valid = ok & inside
        u = torch.where(valid, gx + du, gx)
        v = torch.where(valid, gy + dv, gy)
    return torch.stack((sqrt_rn(u * u + v * v), u, v, valid.to(torch.float32)), dim=1)


def guess_field(fields: torch.Tensor) -> torch.Tensor:
    """(P, 2, Ho, Wo) flow of a level smoothed for the next finer level's guess.

    The mean of (u, v) over the valid pixels of each ``GUESS_BOX`` x ``GUESS_BOX``
    neighbourhood (zero padded; ``avg_pool2d`` sums of u*valid, v*valid, valid, each
    divided by 25, then their ratio); a pixel without a valid neighbour keeps its own flow.
    """
    valid = fields[:, 3:4]
    box = F.avg_pool2d(torch.cat((fields[:, 1:3] * valid, valid), dim=1), GUESS_BOX, stride=1,
                       padding=GUESS_BOX // 2)
    den = box[:, 2:3]
    has = den > 0
    return torch.where(has, box[:, :2] / torch.where(has, den, torch.ones_like(den)), fields[:, 1:3])


def reduce_level(frames: torch.Tensor) -> torch.Tensor:
    """(T, (H+1)//2, (W+1)//2) float32 next pyramid level of (T, H, W) uint8/float32 frames.

    Binomial [1 2 1] / 4 along rows, then along columns, at every second pixel, edges
    replicated: ``((x[2j-1] + 2 x[2j]) + x[2j+1]) * 0.25`` in that order.
    """
    x = to_unit_float(frames)
    H, W = x.shape[1:]
    Hn, Wn = (H + 1) // 2, (W + 1) // 2
    xp = torch.cat((x[:, :, :1], x, x[:, :, -1:]), dim=2)  # column -1 and W replicated
    h = ((xp[:, :, 0:2 * Wn:2] + 2.0 * xp[:, :, 1:2 * Wn:2]) + xp[:, :, 2:2 * Wn + 1:2]) * 0.25
    hp = torch.cat((h[:, :1], h, h[:, -1:]), dim=1)
    return ((hp[:, 0:2 * Hn:2] + 2.0 * hp[:, 1:2 * Hn:2]) + hp[:, 2:2 * Hn + 1:2]) * 0.25


def summarise_fields(fields: torch.Tensor, statistic: str = "textured"):
    """(flow_px (P,), mean_uv (P, 2)): weighted means of (P, 4, Ho, Wo) fields.

    "textured": weight = valid.  "moving": weight = valid * clamp((|flow| - lo) / (hi - lo),
    0, 1) with ``(lo, hi) = MOVING_FLOOR_PX``, and the denominator is at least
    ``MOVING_MIN_AREA * Ho * Wo``.  Sums run in float64 over the whole frame in one
    reduction; a pair with no weight gets 0.
    """
    mag, valid = fields[:, 0], fields[:, 3]
    if statistic == "moving":
        lo, hi = MOVING_FLOOR_PX
        weight = valid * torch.clamp((mag - lo) / (hi - lo), 0.0, 1.0)
        floor = max(1.0, MOVING_MIN_AREA * fields.shape[2] * fields.shape[3])
    else:
        weight = valid
        floor = 1.0
    sums = (torch.stack((mag, fields[:, 1], fields[:, 2], torch.ones_like(mag)), dim=1)
            * weight[:, None]).double().sum(dim=(2, 3))  # (P, 4): weighted |flow|, u, v, total weight
    count = sums[:, 3].clamp_min(floor)
    return (sums[:, 0] / count).float(), (sums[:, 1:3] / count[:, None]).float()


def global_flow(prods: torch.Tensor, min_eig: float):
    """(flow_px (P,), mean_uv (P, 2)) of the paper's Eq. 1: one 2x2 system per pair over all pixels."""
    sums = prods.double().mean(dim=(2, 3)).float()  # (P, 5)
    u, v, _ = solve_lk(sums, min_eig)
    return sqrt_rn(u * u + v * v), torch.stack((u, v), dim=1)


def solved_levels(levels: int) -> list[int]:
    """The LK steps of a pyramid of ``levels``, coarsest first, one per level: every level but
    level 1 when there are three or more (level 1's image only feeds level 2; level 2's flow, 4x,
    is within level 0's capture, and solving level 1 cost a quarter of level 0 and changed
    results by < 0.5 %).  The coarsest step starts from :func:`search_shift`."""
    if levels == 1:
        return [0]
    return [lv for lv in range(levels - 1, -1, -1) if not (lv == 1 and levels >= 3)]


def search_radius(shape) -> tuple[int, int]:
    """(ry, rx): the coarsest level's search tries whole-pixel shifts up to a quarter of each side,
    at most ``SEARCH_RADIUS``."""
    return min(shape[0] // 4, SEARCH_RADIUS), min(shape[1] // 4, SEARCH_RADIUS)


def search_sads(prev: torch.Tensor, cur: torch.Tensor, radius) -> torch.Tensor:
    """(P, K) int64 sums of absolute differences of frame pairs (P, H, W) under every whole-pixel
    shift (dx, dy) in [-rx, rx] x [-ry, ry], K = (2 ry + 1)(2 rx + 1) in row-major order (dy, then dx).

    Each shift compares the central region of ``prev``, rows [ry, H - ry) and columns
    [rx, W - rx) (the same pixels for every shift), with ``cur`` at (y + dy, x + dx); a difference
    counts ``|floor(SEARCH_QUANT * (cur - prev) + 0.5)|``, an integer, so that the sums are exact
    in any order (every backend finds the same shift)."""
    ry, rx = radius
    a, b = to_unit_float(prev), to_unit_float(cur)
    H, W = a.shape[1:]
    centre = a[:, ry:H - ry, rx:W - rx]
    sads = []
    for dy in range(-ry, ry + 1):
        # Every dx at once: rows [ry + dy, H - ry + dy) of cur, as (P, 2 rx + 1, H - 2 ry, W - 2 rx) windows
        # whose [:, rx + dx] starts at column rx + dx.
        rows = b[:, ry + dy:H - ry + dy].unfold(2, W - 2 * rx, 1).transpose(1, 2)
        d = rows - centre[:, None]
        sads.append(torch.floor(d * SEARCH_QUANT + 0.5).abs().to(torch.int64).sum(dim=(2, 3)))
    return torch.cat(sads, dim=1)


def shift_of_sads(sads: torch.Tensor, radius) -> torch.Tensor:
    """(P, 2, 1, 1) float32 shift (dx, dy) of the smallest sum, as a one-cell guess field: ties go
    to no shift, then to the first in row-major order (the key ``2 sad + (shift != 0)``)."""
    ry, rx = radius
    k = torch.arange(sads.shape[1], device=sads.device)
    key = 2 * sads + (k != ry * (2 * rx + 1) + rx).to(torch.int64)
    best = torch.argmin(key, dim=1)  # the first of equal keys
    dx = torch.remainder(best, 2 * rx + 1) - rx
    dy = torch.div(best, 2 * rx + 1, rounding_mode="floor") - ry
    return torch.stack((dx, dy), dim=1).to(torch.float32)[:, :, None, None]


def search_shift(prev: torch.Tensor, cur: torch.Tensor, radius) -> torch.Tensor:
    """(P, 2, 1, 1) float32 whole-pixel shift of each pair that minimises the sum of absolute
    differences (:func:`search_sads`, :func:`shift_of_sads`): the coarsest level's start."""
    return shift_of_sads(search_sads(prev, cur, radius), radius)


def pyramid_flow(gray: torch.Tensor, window: int, min_eig: float, levels: int, statistic: str, ops):
    """Coarse-to-fine LK of every consecutive pair, from per-level stages ``ops`` (a backend's
    ``products(prev, cur)``, ``fields(prods, window, min_eig, guess, level_hw, factor)``,
    ``guess(fields)``, ``warp(cur, guess, border, factor)``, ``reduce(frames)``,
    ``search(prev, cur, radius)``); the
    reference's are the spec, and every backend that supplies bit-identical stages gets
    bit-identical results through this driver."""
    if window == 0:
        return global_flow(ops.products(gray[:-1], gray[1:]), min_eig)
    pyramid = [gray]
    for _ in range(levels - 1):
        pyramid.append(ops.reduce(pyramid[-1]))
    border = 1 + window // 2
    guess, above = None, None
    if levels > 1:  # the coarsest step starts from the best whole-pixel shift (factor 1)
        top = pyramid[-1]
        guess, above = ops.search(top[:-1], top[1:], search_radius(top.shape[1:])), levels - 1
    for level in solved_levels(levels):
        frames = pyramid[level]
        factor = 0 if above is None else 2 ** (above - level)
        cur = frames[1:] if guess is None else ops.warp(frames[1:], guess, border, factor)
        prods = ops.products(frames[:-1], cur)
        fields = ops.fields(prods, window, min_eig, guess, tuple(frames.shape[1:]), factor)
        if level > 0:
            guess, above = ops.guess(fields), level
    return summarise_fields(fields, statistic)


TORCH_STAGES = SimpleNamespace(
    products=pair_products,
    fields=lambda prods, window, min_eig, guess, level_hw, factor: flow_fields(
        window_average(prods, window), min_eig, guess, level_hw, factor),
    guess=guess_field,
    warp=warp_frames,
    reduce=reduce_level,
    search=search_shift,
)


# --------------------------------------------------------------------------
# The "streamchat" statistic: StreamChat's gate reading, single scale
# --------------------------------------------------------------------------
def streamchat_gray(channels: torch.Tensor) -> torch.Tensor:
    """(T, H, W) float32 gray of (T, H, W, C) channels, C in {1, 3}, as StreamChat computes it:
    ``(0.2989 R + 0.5870 G) + 0.1140 B`` of the channels as given (StreamChat: CLIP-normalised),
    in float32, in that order; one channel is its own gray."""
    x = channels.to(torch.float32)
    if x.shape[-1] == 1:
        return x[..., 0]
    wr, wg, wb = STREAMCHAT_GRAY_WEIGHTS
    return (wr * x[..., 0] + wg * x[..., 1]) + wb * x[..., 2]


def streamchat_products(prev: torch.Tensor, cur: torch.Tensor) -> torch.Tensor:
    """(P, 5, H, W) products Ix^2, IxIy, Iy^2, IxIt, IyIt of float32 gray pairs (P, H, W), StreamChat's way.

    Ix, Iy: the 3x3 Sobel of ``prev`` alone, unscaled (no 1/8), zero padded (the frame keeps its
    size), written as differences of shifted slices in the order ``(d0 + 2 d1) + d2`` over the
    three rows (Ix) or columns (Iy); It = cur - prev.
    """
    p = F.pad(prev, (1, 1, 1, 1))  # (P, H+2, W+2), zeros outside the frame
    across = p[:, :, 2:] - p[:, :, :-2]  # (P, H+2, W): right minus left
    down = p[:, 2:, :] - p[:, :-2, :]  # (P, H, W+2): bottom minus top
    ix = (across[:, :-2] + 2.0 * across[:, 1:-1]) + across[:, 2:]
    iy = (down[:, :, :-2] + 2.0 * down[:, :, 1:-1]) + down[:, :, 2:]
    it = cur - prev
    return torch.stack((ix * ix, ix * iy, iy * iy, ix * it, iy * it), dim=1)


def streamchat_fields(sums: torch.Tensor, eps: float) -> torch.Tensor:
    """(P, 3, Ho, Wo) per-window fields reading, u, v of window sums (P, 5, Ho, Wo).

    The 2x2 system with ``eps`` added to both diagonal entries, solved in closed form
    ``u = (c rx - b ry) / (a c - b^2)``, ``v = (a ry - b rx) / (a c - b^2)`` (rx = -sum IxIt,
    ry = -sum IyIt), without a validity test: a system that rounds to singular reads inf or NaN,
    as in StreamChat's code.  The reading is ``sqrt(u^2 + u^2)`` (StreamChat's magnitude uses u
    twice), correctly rounded.
    """
    a, b, c = sums[:, 0] + eps, sums[:, 1], sums[:, 2] + eps
    rx, ry = -sums[:, 3], -sums[:, 4]
    det = a * c - b * b
    u = (c * rx - b * ry) / det
    v = (a * ry - b * rx) / det
    return torch.stack((sqrt_rn(u * u + u * u), u, v), dim=1)


def summarise_streamchat(fields: torch.Tensor):
    """(flow_px (P,), mean_uv (P, 2)): the mean over every window of the reading, u and v (float64 sums
    over the whole frame in one reduction, divided by the number of windows)."""
    count = fields.shape[2] * fields.shape[3]
    sums = fields.double().sum(dim=(2, 3)) / count  # (P, 3)
    return sums[:, 0].float(), sums[:, 1:3].float()


def streamchat_flow(gray: torch.Tensor, window: int, eps: float = STREAMCHAT_EPS):
    """(flow_px (T-1,), mean_uv (T-1, 2)) of StreamChat's reading of every consecutive pair of
    (T, H, W) float32 gray frames (:func:`streamchat_gray`).

    Window sums are StreamChat's ``avg_pool2d(x, window, stride=1) * window**2`` (valid windows
    only): :func:`window_average`'s row-major mean from 0, times ``window**2`` in float32.
    """
    gray = gray.to(torch.float32)
    sums = window_average(streamchat_products(gray[:-1], gray[1:]), window) * float(window * window)
    return summarise_streamchat(streamchat_fields(sums, eps))


def lk_flow_reference(gray: torch.Tensor, window: int, min_eig: float, levels: int, statistic: str):
    if statistic == "streamchat":
        return streamchat_flow(gray, window)
    return pyramid_flow(gray, window, min_eig, levels, statistic, TORCH_STAGES)
