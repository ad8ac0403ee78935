"""Motion magnitude (Lucas-Kanade) for selective frame stacking.

StreamChat (sec. 3.1.1) keeps a frame only when its Lucas-Kanade motion against
the previous frame exceeds a threshold t in [0, 1].  This module computes, for
every consecutive frame pair, a dense windowed LK flow and summarises it:

* gray = 0.299 R + 0.587 G + 0.114 B, intensities in [0, 1] (uint8 / 255;
  floating frames are taken as already in [0, 1]);
* optional working resolution ``size`` (long side; area interpolation when
  shrinking, bilinear when enlarging);
* gradients: 3x3 Sobel / 8 (intensity per pixel) on the mean of the two frames,
  ``It = current - previous``; only the valid (H-2, W-2) region is used;
* ``window=w`` (odd >= 3): the structure tensor averaged over each w x w window
  (valid region), a closed-form 2x2 solve per pixel, and
  ``flow_px = mean sqrt(u^2 + v^2)`` over the pixels whose window-averaged
  structure tensor has smallest eigenvalue ``> min_eig`` (flat regions and pure
  edges are left out, as OpenCV's LK does); a pair with no such pixel gets 0;
* ``window=None``: the paper's Eq. 1, one 2x2 system over the whole frame.

``score = flow_px / (1 + flow_px)`` maps pixels to [0, 1) (1 px -> 0.5).

Numerics (shared by every backend): float32 throughout; the smallest
eigenvalue is computed as ``det / lambda_max`` (no cancellation), and a pixel is
valid iff ``lambda_max > 0 and det / lambda_max > min_eig``.  The seed code's
``sqrt(u^2 + u^2)`` typo and its missing normalisation are not reproduced.

The reference fixes every rounding step: the Sobel differences in the order
written in :func:`structure_products`, the window sum in row-major order from 0
then divided by ``w*w`` (``avg_pool2d``), correctly rounded square roots, and
float64 sums over each frame.  The ``triton`` backend reproduces it **bit for
bit** (same order, no FMA contraction, correctly rounded sqrt and division, the
same torch summary), so its scores and keep/drop decisions are those of the
reference.  The ``cpp`` and ``cuda`` backends sum windows in another order and
agree within float32 rounding (tolerances declared on ``LK_FLOW``).

Backends: ``torch`` (slices + box sums), ``cpp`` (one fused pass per row
strip, OpenMP over pairs and strips), ``triton`` (products kernel + window
kernel writing per-pixel fields), ``cuda`` (same two stages, per-block partials).

GPU path: on CUDA tensors no function here synchronises with the host
(value checks are device-side assertions) except :func:`select_frames`, which
returns a Python list; :func:`select_frames_mask` is its device-resident
counterpart (a boolean tensor), and everything it runs can be captured in a
CUDA graph.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from ._dispatch import Op, call_op, load_native
from ._utils import as_tensor, check_dtype, check_finite, check_float, check_int, check_nonempty, check_rank

__all__ = ["MotionResult", "motion_magnitude", "select_frames", "select_frames_mask", "lk_flow"]

_GRAY_WEIGHTS = (0.299, 0.587, 0.114)
_FRAME_DTYPES = (torch.uint8, torch.float16, torch.bfloat16, torch.float32, torch.float64)


class MotionResult(NamedTuple):
    """Per-pair motion of a clip of T frames.

    Attributes
    ----------
    flow_px : (T-1,) float32
        Mean flow magnitude in pixels at the working resolution.
    score : (T-1,) float32
        ``flow_px / (1 + flow_px)``, monotone, in [0, 1).
    mean_uv : (T-1, 2) float32
        Mean (u, v) over the valid pixels (window mode) or the global solve.
    """

    flow_px: torch.Tensor
    score: torch.Tensor
    mean_uv: torch.Tensor


# --------------------------------------------------------------------------
# Public functions: contract, validation, preparation
# --------------------------------------------------------------------------
def motion_magnitude(frames, *, size: int | None = None, window: int | None = 5, min_eig: float = 1e-5,
                     backend: str = "auto") -> MotionResult:
    """Lucas-Kanade motion magnitude of every consecutive frame pair.

    Parameters
    ----------
    frames : (T, H, W) or (T, H, W, C) tensor or array, C in {1, 3}
        uint8 (0..255) or floating (taken as [0, 1]) frames, T >= 2.  RGB is
        converted to gray.  Not modified.
    size : int, optional
        Working resolution: the long side is resized to ``size`` (aspect kept).
        ``None`` keeps the input size.
    window : int or None
        Odd LK window >= 3 (default 5), or ``None`` for one global 2x2 system.
    min_eig : float
        Threshold on the smallest eigenvalue of the window-averaged structure
        tensor (intensities in [0, 1]); ill-conditioned pixels are skipped.
    backend : {"auto", "torch", "cpp", "triton", "cuda"}

    Returns
    -------
    MotionResult with ``flow_px (T-1,)``, ``score (T-1,)``, ``mean_uv (T-1, 2)``,
    on the device of ``frames``.

    Notes
    -----
    On CUDA tensors nothing synchronises with the host (the finiteness check of
    floating frames is a device-side assertion), so a call can be captured in a
    CUDA graph.
    """
    gray, window, min_eig = _prepare(frames, size, window, min_eig, backend)
    flow_px, mean_uv = _lk_flow(gray, window, min_eig, _select(backend, gray))
    return MotionResult(flow_px, flow_px / (1.0 + flow_px), mean_uv)


def select_frames(frames, threshold: float, *, reference: str = "previous", size: int | None = None,
                  window: int | None = 5, min_eig: float = 1e-5, backend: str = "auto") -> list[int]:
    """Indices of the frames kept by the motion gate (the first is always kept).

    ``reference="previous"``: frame t is kept when ``score(t-1, t) > threshold``.
    ``reference="last_kept"``: frame t is compared with the last kept frame
    instead, so slow drift accumulates until it crosses the threshold.
    Raising ``threshold`` never keeps more frames in "previous" mode.

    Arguments as in :func:`select_frames_mask`, of which this is a thin wrapper:
    returning a Python list, it synchronises with the GPU once, at the end (use
    :func:`select_frames_mask` to stay on the device).
    """
    keep = select_frames_mask(frames, threshold, reference=reference, size=size, window=window, min_eig=min_eig,
                              backend=backend)
    return [t for t, k in enumerate(keep.tolist()) if k]


def select_frames_mask(frames, threshold: float, *, reference: str = "previous", size: int | None = None,
                       window: int | None = 5, min_eig: float = 1e-5, backend: str = "auto") -> torch.Tensor:
    """Which frames the motion gate keeps, as a device-resident boolean mask.

    Parameters
    ----------
    frames : (T, H, W) or (T, H, W, C) tensor or array
        As in :func:`motion_magnitude` (T >= 2).  Not modified.
    threshold : float in [0, 1]
        Frame t is kept when its score (``motion_magnitude(...).score``, float32)
        is strictly greater than ``threshold``.
    reference : {"previous", "last_kept"}
        Score frame t against frame t-1, or against the last kept frame (slow
        drift accumulates until it crosses the threshold).
    size, window, min_eig, backend
        As in :func:`motion_magnitude`.

    Returns
    -------
    keep : (T,) bool tensor on the device of ``frames``; ``keep[0]`` is True.

    Notes
    -----
    On CUDA tensors nothing here synchronises with the host, so the whole gate
    can run inside a CUDA graph: "last_kept" chooses each pair's first frame
    with a device-side index (one LK call per frame, T-1 in all).  The CPU
    backends read that index on the host, where it costs nothing.
    """
    threshold = check_float(threshold, "threshold", low=0.0, high=1.0)
    if reference not in ("previous", "last_kept"):
        raise ValueError(f"reference must be 'previous' or 'last_kept', got {reference!r}")
    gray, window, min_eig = _prepare(frames, size, window, min_eig, backend)
    name = _select(backend, gray)
    above = _float32_below(threshold)  # score > threshold  <=>  score > above, for float32 scores
    if reference == "previous":
        flow_px, _ = _lk_flow(gray, window, min_eig, name)
        keep = torch.empty(gray.shape[0], dtype=torch.bool, device=gray.device)
        keep[0] = True
        torch.gt(flow_px / (1.0 + flow_px), above, out=keep[1:])
        return keep
    if gray.device.type == "cpu" and name != "triton":
        return _last_kept_on_host(gray, above, window, min_eig, name)
    # The index of the last kept frame stays on the device: reading it would stall the stream.
    # (Triton takes this path under the interpreter too, so the CPU tests run it.)
    keep = torch.ones(gray.shape[0], dtype=torch.bool, device=gray.device)
    last = torch.zeros(1, dtype=torch.long, device=gray.device)
    for t in range(1, gray.shape[0]):
        flow_px, _ = _lk_flow(torch.cat((gray.index_select(0, last), gray[t:t + 1])), window, min_eig, name)
        kept = flow_px / (1.0 + flow_px) > above
        keep[t:t + 1] = kept
        last = torch.where(kept, t, last)
    return keep


def _last_kept_on_host(gray, above, window, min_eig, name):
    """"last_kept" on the CPU backends: reading a CPU score is free, and numpy scalars spare tiny
    torch ops per frame (same float32 arithmetic)."""
    keep = [True]
    last = 0
    for t in range(1, gray.shape[0]):
        flow_px, _ = _lk_flow(torch.cat((gray[last:last + 1], gray[t:t + 1])), window, min_eig, name)
        f = np.float32(flow_px.item())
        keep.append(bool(f / (np.float32(1.0) + f) > above))
        if keep[-1]:
            last = t
    return torch.tensor(keep)


def _float32_below(threshold: float) -> float:
    """The largest float32 <= ``threshold``: a float32 score exceeds it iff it exceeds ``threshold``
    (so comparisons run in float32 and still decide as an exact comparison would)."""
    down = np.float32(threshold)
    if float(down) > threshold:
        down = np.nextafter(down, np.float32(-np.inf))
    return float(down)


def _prepare(frames, size, window, min_eig, backend="auto"):
    """Validate and convert to contiguous gray (T, H, W): uint8 kept, else float32."""
    if isinstance(frames, (list, tuple)):
        frames = [as_tensor(f, f"frames[{i}]") for i, f in enumerate(frames)]
        if not frames:
            raise ValueError("frames must not be empty")
        for i, f in enumerate(frames):
            if f.shape != frames[0].shape or f.dtype != frames[0].dtype:
                raise ValueError(
                    f"frames[{i}] has shape {tuple(f.shape)} and dtype {f.dtype}, expected the shape "
                    f"{tuple(frames[0].shape)} and dtype {frames[0].dtype} of frames[0]"
                )
        frames = torch.stack(frames)
    frames = as_tensor(frames, "frames")
    check_rank(frames, "frames", (3, 4), "(T, H, W) or (T, H, W, C)")
    check_dtype(frames, "frames", _FRAME_DTYPES)
    check_nonempty(frames, "frames")
    if frames.dim() == 4 and frames.shape[-1] not in (1, 3):
        raise ValueError(f"frames must have 1 or 3 channels in the last dimension, got {frames.shape[-1]}")
    if frames.shape[0] < 2:
        raise ValueError(f"frames must hold at least 2 frames (T >= 2), got T={frames.shape[0]}")
    check_finite(frames, "frames")
    if window is None:
        window = 0
    else:
        window = check_int(window, "window", minimum=3, odd=True)
    min_eig = check_float(min_eig, "min_eig", low=0.0)
    if size is not None:
        size = check_int(size, "size", minimum=3)

    if frames.dim() == 4 and frames.shape[-1] == 1:
        frames = frames[..., 0]
    h, w_ = frames.shape[1:3]
    out_hw = (h, w_)
    if size is not None:
        scale = size / max(h, w_)
        out_hw = (max(1, round(h * scale)), max(1, round(w_ * scale)))
    native_prep = (
        frames.dtype == torch.uint8 and frames.device.type == "cpu" and out_hw[0] <= h and out_hw[1] <= w_
        and (frames.dim() == 4 or out_hw != (h, w_)) and LK_FLOW.select(backend, frames.device) == "cpp"
    )
    if native_prep:
        # Fused uint8 -> gray -> area resize in one pass (same bins as the torch path below).
        mod, _ = load_native("cpu", "motion")
        gray = torch.from_numpy(mod.gray_area(frames.contiguous().numpy(), out_hw[0], out_hw[1]))
    else:
        gray = _gray_resize_torch(frames, out_hw)
    need = (window or 1) + 2
    if gray.shape[1] < need or gray.shape[2] < need:
        raise ValueError(
            f"frames must be at least {need}x{need} pixels at the working size for window={window or None} "
            f"(3x3 gradients plus the window), got {tuple(gray.shape[1:])}"
        )
    return gray.contiguous(), window, min_eig


def _gray_resize_torch(frames: torch.Tensor, out_hw) -> torch.Tensor:
    """Reference preparation: gray (uint8 kept when no resize), area/bilinear resize."""
    if frames.dim() == 4:
        gray = frames.to(torch.float32) @ _gray_weights(frames.device)
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
def _gray_weights(device: torch.device) -> torch.Tensor:
    """The RGB weights on ``device``, made once per device: building them from Python numbers is a
    host-to-device copy, which a CUDA graph cannot capture."""
    return torch.tensor(_GRAY_WEIGHTS, dtype=torch.float32, device=device)


def _select(backend: str, gray: torch.Tensor) -> str:
    return LK_FLOW.select(backend, gray.device)


def _lk_flow(gray, window, min_eig, backend):
    return call_op(torch.ops.streammem.lk_flow, LK_FLOW.impls, backend, gray, window, min_eig)


# --------------------------------------------------------------------------
# Custom op (works under torch.compile; opcheck-tested)
# --------------------------------------------------------------------------
@torch.library.custom_op("streammem::lk_flow", mutates_args=())
def lk_flow(gray: torch.Tensor, window: int, min_eig: float, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Core op on prepared input.

    gray: contiguous (T, H, W) uint8 (scaled by 1/255 on load) or float32 in [0, 1];
    window: odd >= 3, or 0 for the global system.  Returns (flow_px (T-1,), mean_uv (T-1, 2)).
    """
    return LK_FLOW.impls[backend](gray, window, min_eig)


@lk_flow.register_fake
def _(gray, window, min_eig, backend):
    pairs = gray.shape[0] - 1
    return gray.new_empty((pairs,), dtype=torch.float32), gray.new_empty((pairs, 2), dtype=torch.float32)


# --------------------------------------------------------------------------
# Backend: torch reference (the spec)
# --------------------------------------------------------------------------
def _to_unit_float(gray: torch.Tensor) -> torch.Tensor:
    if gray.dtype == torch.uint8:
        return gray.to(torch.float32) * (1.0 / 255.0)
    return gray.to(torch.float32)


def structure_products(gray: torch.Tensor) -> torch.Tensor:
    """(P, 5, H-2, W-2) per-pixel products Ix^2, IxIy, Iy^2, IxIt, IyIt of each pair.

    The 3x3 Sobel / 8 is written out as differences of shifted slices so that
    its rounding is defined here, in this order (``((d0 + 2 d1) + d2) / 8`` over
    the three rows or columns), not by a convolution library.
    """
    x = _to_unit_float(gray)
    prev, cur = x[:-1], x[1:]
    mean = 0.5 * (prev + cur)
    across = mean[:, :, 2:] - mean[:, :, :-2]  # (P, H, W-2): right minus left
    down = mean[:, 2:, :] - mean[:, :-2, :]  # (P, H-2, W): bottom minus top
    ix = ((across[:, :-2] + 2.0 * across[:, 1:-1]) + across[:, 2:]) * 0.125
    iy = ((down[:, :, :-2] + 2.0 * down[:, :, 1:-1]) + down[:, :, 2:]) * 0.125
    it = (cur - prev)[:, 1:-1, 1:-1]
    return torch.stack((ix * ix, ix * iy, iy * iy, ix * it, iy * it), dim=1)


def window_average(prods: torch.Tensor, window: int) -> torch.Tensor:
    """(P, 5, Ho, Wo) mean of each product over every ``window`` x ``window`` window (valid region).

    ``avg_pool2d`` sums each window in row-major order, starting from 0, in
    float32, then divides by ``window**2`` (on CPU and CUDA alike; pinned by a
    test): the order a kernel reproducing the reference bit for bit follows.
    """
    return F.avg_pool2d(prods, window, stride=1)


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


def flow_fields(avg: torch.Tensor, min_eig: float) -> torch.Tensor:
    """(P, 4, Ho, Wo) per-pixel fields |flow|, u, v, valid (1.0 or 0.0) of window-averaged products."""
    u, v, valid = solve_lk(avg.permute(0, 2, 3, 1), min_eig)
    return torch.stack((sqrt_rn(u * u + v * v), u, v, valid.to(torch.float32)), dim=1)


def summarise_fields(fields: torch.Tensor):
    """(flow_px (P,), mean_uv (P, 2)): means over the valid pixels of (P, 4, Ho, Wo) fields.

    Sums run in float64 over the whole frame in one reduction; a pair with no
    valid pixel gets 0.
    """
    sums = fields.double().sum(dim=(2, 3))  # (P, 4): sum |flow|, sum u, sum v, count
    count = sums[:, 3].clamp_min(1.0)
    return (sums[:, 0] / count).float(), (sums[:, 1:3] / count[:, None]).float()


def global_flow(prods: torch.Tensor, min_eig: float):
    """(flow_px (P,), mean_uv (P, 2)) of the paper's Eq. 1: one 2x2 system per pair over all pixels."""
    sums = prods.double().mean(dim=(2, 3)).float()  # (P, 5)
    u, v, _ = solve_lk(sums, min_eig)
    return sqrt_rn(u * u + v * v), torch.stack((u, v), dim=1)


def _lk_flow_torch(gray: torch.Tensor, window: int, min_eig: float):
    prods = structure_products(gray)
    if window == 0:
        return global_flow(prods, min_eig)
    return summarise_fields(flow_fields(window_average(prods, window), min_eig))


# --------------------------------------------------------------------------
# Backend: C++ (csrc/cpu/motion.cpp)
# --------------------------------------------------------------------------
def _lk_flow_cpp(gray: torch.Tensor, window: int, min_eig: float):
    mod, _ = load_native("cpu", "motion")
    flow_px, mean_uv = mod.lk_flow(gray.numpy(), int(window), float(min_eig))
    return torch.from_numpy(flow_px), torch.from_numpy(mean_uv)


# --------------------------------------------------------------------------
# Backend: CUDA (csrc/cuda/motion.cu)
# --------------------------------------------------------------------------
def _lk_flow_cuda(gray: torch.Tensor, window: int, min_eig: float):
    from ._motion_cuda import lk_flow_cuda

    return lk_flow_cuda(gray, window, min_eig)


# --------------------------------------------------------------------------
# Backend: Triton
# --------------------------------------------------------------------------
def _lk_flow_triton(gray: torch.Tensor, window: int, min_eig: float):
    from ._motion_triton import lk_flow_triton

    return lk_flow_triton(gray, window, min_eig)


# (atol, rtol) of flow_px and mean_uv against the reference, per frame dtype.  Every
# backend starts from the same float32 gray frames, so the dtype changes nothing:
# triton reproduces the reference bit for bit; cpp and cuda sum windows in another
# order (float32 rounding of sums of w*w products, amplified by the 2x2 solve).
_BIT_FOR_BIT = {dtype: (0.0, 0.0) for dtype in _FRAME_DTYPES}
_SUMMATION_ORDER = {dtype: (2e-5, 2e-4) for dtype in _FRAME_DTYPES}

LK_FLOW = Op(
    "motion",
    {"torch": _lk_flow_torch, "cpp": _lk_flow_cpp, "triton": _lk_flow_triton, "cuda": _lk_flow_cuda},
    tolerances={"torch": _BIT_FOR_BIT, "triton": _BIT_FOR_BIT, "cuda": _BIT_FOR_BIT, "cpp": _SUMMATION_ORDER},
)
