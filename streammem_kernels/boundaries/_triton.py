"""Triton kernels of the boundaries op: adjacent cosines, depth scores, window choices and the event scan.

Contract: ``reference.py`` (the same functions in torch); every kernel makes the reference's decisions bit
for bit (float64, no fused multiply-add: launched with ``enable_fp_fusion=False``, ``KERNEL_CONTRACTS``
marks them exact for the AOT check).  ``docs/ops/boundaries.md`` describes the tiling and the numerics.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

KERNEL_CONTRACTS = {
    "_adjacent_cosine_kernel": {"hot": True, "exact": True},
    "_window_choices_kernel": {"hot": True, "exact": True},
    "_window_depth_kernel": {"hot": False, "exact": True},
    "_scan_events_kernel": {"hot": False, "exact": True},
}

# One launch configuration on every target (GPU and interpreter alike).
_COS_BLOCK_T = 16
_COS_MAX_BLOCK_D = 64
_COS_WARPS = 8  # 16 x 64 float64 tiles: 4 values per thread and accumulator (64 registers; 4 warps: 124)
_CHOICE_BLOCK_P = 32
_ROW_BLOCK = 16
_SCAN_BLOCK_B = 32
_WARPS = 4


@triton.jit
def _adjacent_cosine_kernel(x_ptr, out_ptr, T, D, M, n_pairs,
                            BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    # Pairs of all streams are one flat index (stream * M + t), so a streaming
    # push of B streams (M = 1) fills tiles with B pairs rather than one.
    pair = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    pair_ok = pair < n_pairs
    stream = pair // M
    first = (stream * T + (pair - stream * M)) * D  # offset of frame t; frame t + 1 follows at + D
    dot = tl.zeros((BLOCK_T, BLOCK_D), dtype=tl.float64)
    norm_a = tl.zeros((BLOCK_T, BLOCK_D), dtype=tl.float64)
    norm_b = tl.zeros((BLOCK_T, BLOCK_D), dtype=tl.float64)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        m = pair_ok[:, None] & (d < D)[None, :]
        offs = first[:, None] + d[None, :]
        a = tl.load(x_ptr + offs, mask=m, other=0.0).to(tl.float64)
        b = tl.load(x_ptr + offs + D, mask=m, other=0.0).to(tl.float64)
        dot += a * b
        norm_a += a * a
        norm_b += b * b
    dot_s = tl.sum(dot, axis=1)
    na = tl.sum(norm_a, axis=1)
    nb = tl.sum(norm_b, axis=1)
    nonzero = (na > 0.0) & (nb > 0.0)
    denom = tl.where(nonzero, tl.sqrt(na) * tl.sqrt(nb), 1.0)
    cos = tl.minimum(tl.maximum(dot_s / denom, -1.0), 1.0)
    cos = tl.where(nonzero, cos, 0.0)
    # Squares of float32 values cannot overflow a float64 sum: a non-finite
    # term means a NaN/Inf input, reported as NaN (the caller raises).
    finite = (tl.abs(dot_s) < float("inf")) & (na < float("inf")) & (nb < float("inf"))
    cos = tl.where(finite, cos, float("nan"))
    tl.store(out_ptr + pair, cos.to(tl.float32), mask=pair_ok)


def adjacent_cosine_triton(x: torch.Tensor) -> torch.Tensor:
    B, T, D = x.shape
    M = max(T - 1, 0)
    out = torch.empty((B, M), dtype=torch.float32, device=x.device)
    if M == 0 or B == 0:
        return out
    block_d = min(triton.next_power_of_2(D), _COS_MAX_BLOCK_D)
    grid = (triton.cdiv(B * M, _COS_BLOCK_T),)
    _adjacent_cosine_kernel[grid](x, out, T, D, M, B * M, BLOCK_T=_COS_BLOCK_T, BLOCK_D=block_d,
                                  num_warps=_COS_WARPS, enable_fp_fusion=False)
    return out


@triton.jit
def _keep_unless_reset(value_a, reset_a, value_b, reset_b):
    # Segmented "last reset value" scan: b is the newer element.
    return tl.where(reset_b != 0, value_b, value_a), reset_a | reset_b


@triton.jit
def _larger(a, b):
    return tl.maximum(a, b)


@triton.jit
def _window_column(tile, i, k):
    # Column k of a (rows, W_PAD) tile: a sum of one value and zeros, so exact.
    return tl.sum(tl.where(i[None, :] == k, tile, 0.0), axis=1)


@triton.jit
def _window_choices_kernel(sim_ptr, out_ptr, M, P, n_windows, tau: tl.float64, min_depth: tl.float64, flash,
                           WINDOW: tl.constexpr, W_PAD: tl.constexpr, CLIMB: tl.constexpr,
                           BLOCK_P: tl.constexpr):
    # Windows of all streams are one flat index (stream * P + p), so a
    # streaming push of B streams (P = 1) fills tiles with B windows rather than one.
    window_id = tl.program_id(0).to(tl.int64) * BLOCK_P + tl.arange(0, BLOCK_P)
    p_ok = window_id < n_windows
    stream = window_id // P
    start = stream * M + (window_id - stream * P)  # first similarity of the window
    i = tl.arange(0, W_PAD)
    valid = p_ok[:, None] & (i < WINDOW)[None, :]
    idx = start[:, None] + i[None, :]
    s = tl.load(sim_ptr + idx, mask=valid, other=0.0).to(tl.float64)
    if CLIMB:
        has_prev = valid & (i > 0)[None, :]
        prev = tl.load(sim_ptr + idx - 1, mask=has_prev, other=0.0).to(tl.float64)
        reset_l = (~has_prev | (prev < s)).to(tl.int32)
        left, _ = tl.associative_scan((s, reset_l), 1, _keep_unless_reset)
        has_next = valid & (i < WINDOW - 1)[None, :]
        nxt = tl.load(sim_ptr + idx + 1, mask=has_next, other=0.0).to(tl.float64)
        reset_r = (~has_next | (nxt < s)).to(tl.int32)
        right, _ = tl.associative_scan((s, reset_r), 1, _keep_unless_reset, reverse=True)
    else:
        lowest = tl.where(valid, s, float("-inf"))
        left = tl.associative_scan(lowest, 1, _larger)
        right = tl.associative_scan(lowest, 1, _larger, reverse=True)
    depth = 0.5 * ((left - s) + (right - s))
    depth = tl.where(valid, depth, 0.0)
    # mu and sigma summed left to right, as the reference does: a tree
    # reduction rounds differently and could move a depth across the threshold.
    window = tl.full((BLOCK_P,), WINDOW, tl.float64)
    total = tl.zeros((BLOCK_P,), tl.float64)
    for k in range(WINDOW):
        total = total + _window_column(depth, i, k)
    mu = total / window
    sq = tl.zeros((BLOCK_P,), tl.float64)
    for k in range(WINDOW):
        centred = _window_column(depth, i, k) - mu
        sq = sq + centred * centred
    sigma = tl.sqrt(sq / window)
    hi = tl.max(tl.where(valid, depth, float("-inf")), axis=1)
    lo = tl.min(tl.where(valid, depth, float("inf")), axis=1)
    # tl.full keeps the float64 parameters float64 under the interpreter too (a bare Python float
    # in an expression is a float32 constant there).
    threshold = mu + tl.full((BLOCK_P,), tau, tl.float64) * sigma
    floor = tl.full((BLOCK_P,), min_depth, tl.float64)
    cand = valid & (depth > threshold[:, None]) & (depth > floor[:, None]) & (hi > lo)[:, None]
    score = tl.where(cand, depth, -1.0)
    best = tl.max(score, axis=1)
    first = tl.min(tl.where(cand & (score == best[:, None]), i[None, :], W_PAD), axis=1)
    # The flash rule (flash = 0 leaves `first`): decided once `flash` similarities follow the best
    # candidate; a drop within `flash` of it below s_j + d_j / 2 makes it an edge of a transient.
    s_best = tl.sum(tl.where(i[None, :] == first[:, None], s, 0.0), axis=1)  # one value and zeros: exact
    level = s_best + tl.full((BLOCK_P,), 0.5, tl.float64) * best
    near = valid & (tl.abs(i[None, :] - first[:, None]) <= flash) & (i[None, :] != first[:, None]) & \
        (s < level[:, None])
    last_edge = tl.max(tl.where(near | (i[None, :] == first[:, None]), i[None, :], -1), axis=1)
    transient = tl.max(near.to(tl.int32), axis=1) > 0
    decided = tl.where(first > WINDOW - 1 - flash, -1, tl.where(transient, -2 - last_edge, first))
    choice = tl.where(best >= 0.0, decided, -1).to(tl.int64)
    tl.store(out_ptr + window_id, choice, mask=p_ok)


def window_choices_triton(sim: torch.Tensor, window: int, tau: float, min_depth: float, peak_code: int, flash: int):
    B, M = sim.shape
    P = max(M - window + 1, 0)
    out = torch.empty((B, P), dtype=torch.int64, device=sim.device)
    if P == 0 or B == 0:
        return out
    sim = sim.contiguous()
    grid = (triton.cdiv(B * P, _CHOICE_BLOCK_P),)
    _window_choices_kernel[grid](sim, out, M, P, B * P, float(tau), float(min_depth), int(flash), WINDOW=window,
                                 W_PAD=triton.next_power_of_2(window), CLIMB=peak_code == 0,
                                 BLOCK_P=_CHOICE_BLOCK_P, num_warps=_WARPS, enable_fp_fusion=False)
    return out


@triton.jit
def _window_depth_kernel(sim_ptr, out_ptr, B, M, CLIMB: tl.constexpr, BLOCK_B: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    ok = rows < B
    base = rows.to(tl.int64) * M
    # Left peaks, stored in the output, then the right sweep finishes each depth.
    peak = tl.load(sim_ptr + base, mask=ok, other=0.0).to(tl.float64)
    prev = peak
    tl.store(out_ptr + base, peak, mask=ok)
    for i in range(1, M):
        s = tl.load(sim_ptr + base + i, mask=ok, other=0.0).to(tl.float64)
        if CLIMB:
            peak = tl.where(prev >= s, peak, s)
        else:
            peak = tl.maximum(peak, s)
        prev = s
        tl.store(out_ptr + base + i, peak, mask=ok)
    peak = tl.load(sim_ptr + base + (M - 1), mask=ok, other=0.0).to(tl.float64)
    nxt = peak
    for j in range(0, M):
        i = M - 1 - j
        s = tl.load(sim_ptr + base + i, mask=ok, other=0.0).to(tl.float64)
        if CLIMB:
            peak = tl.where(nxt >= s, peak, s)
        else:
            peak = tl.maximum(peak, s)
        nxt = s
        left = tl.load(out_ptr + base + i, mask=ok, other=0.0)
        tl.store(out_ptr + base + i, 0.5 * ((left - s) + (peak - s)), mask=ok)


def window_depth_triton(sim: torch.Tensor, peak_code: int) -> torch.Tensor:
    B, M = sim.shape
    out = torch.empty((B, M), dtype=torch.float64, device=sim.device)
    if M == 0 or B == 0:
        return out
    grid = (triton.cdiv(B, _ROW_BLOCK),)
    _window_depth_kernel[grid](sim.contiguous(), out, B, M, CLIMB=peak_code == 0, BLOCK_B=_ROW_BLOCK,
                               num_warps=_WARPS, enable_fp_fusion=False)
    return out


@triton.jit
def _scan_events_kernel(sims_ptr, choices_ptr, ends_ptr, B, T, P, window, max_event, drift: tl.float64,
                        DRIFT_MODE: tl.constexpr, BLOCK_B: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    ok = rows < B
    rows64 = rows.to(tl.int64)
    M = T - 1
    last_end = tl.full((BLOCK_B,), -1, tl.int64)
    in_window = tl.zeros((BLOCK_B,), tl.int64)
    for t in range(0, T):
        in_window = tl.minimum(in_window + 1, window + 1)
        if DRIFT_MODE:
            if t >= 1:
                s = tl.load(sims_ptr + rows64 * M + (t - 1), mask=ok, other=1.0).to(tl.float64)
                cut = ok & (in_window >= 2) & (s < tl.full((BLOCK_B,), drift, tl.float64))
                tl.store(ends_ptr + rows64 * T + (t - 1), tl.full((BLOCK_B,), 1, tl.int8), mask=cut)
                last_end = tl.where(cut, t - 1, last_end)
                in_window = tl.where(cut, 1, in_window)
        else:
            if t >= window:
                choice = tl.load(choices_ptr + rows64 * P + (t - window), mask=ok, other=-1)
                full = ok & (in_window == window + 1)
                cut = full & (choice >= 0)
                boundary = t - window + choice
                tl.store(ends_ptr + rows64 * T + boundary, tl.full((BLOCK_B,), 1, tl.int8), mask=cut)
                last_end = tl.where(cut, boundary, last_end)
                # A transient (choice -2 - r) restarts the window after its last edge r, closing nothing.
                restart = tl.where(choice <= -2, t - window + (-2 - choice), boundary)
                in_window = tl.where(full & (choice != -1), t - restart, in_window)
        if max_event > 0:
            cap = ok & ((t - last_end) >= max_event)
            tl.store(ends_ptr + rows64 * T + t, tl.full((BLOCK_B,), 1, tl.int8), mask=cap)
            last_end = tl.where(cap, t, last_end)
            in_window = tl.where(cap, 0, in_window)
    tl.store(ends_ptr + rows64 * T + (T - 1), tl.full((BLOCK_B,), 1, tl.int8), mask=ok)


def scan_events_triton(sims: torch.Tensor, choices: torch.Tensor, window: int, max_event: int, drift: float):
    B, M = sims.shape
    T = M + 1
    ends = torch.zeros((B, T), dtype=torch.int8, device=sims.device)
    if B == 0:
        return ends.bool()
    drift_mode = drift == drift
    P = choices.shape[1]
    if P == 0:  # the kernel needs a valid pointer even when no window ever fills
        choices = torch.full((B, 1), -1, dtype=torch.int64, device=sims.device)
        P = 1
    grid = (triton.cdiv(B, _SCAN_BLOCK_B),)
    _scan_events_kernel[grid](sims.contiguous(), choices.contiguous(), ends, B, T, P, window, max_event,
                              float(drift) if drift_mode else 0.0, DRIFT_MODE=drift_mode,
                              BLOCK_B=_SCAN_BLOCK_B, num_warps=_WARPS, enable_fp_fusion=False)
    return ends.bool()
