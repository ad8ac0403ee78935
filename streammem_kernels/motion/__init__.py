"""Motion magnitude (pyramidal Lucas-Kanade) for selective frame stacking.

StreamChat (sec. 3.1.1) keeps a frame only when its Lucas-Kanade motion against
the previous frame exceeds a threshold t in [0, 1].  This module computes, for
every consecutive frame pair, a dense windowed LK flow and summarises it:

* gray = 0.299 R + 0.587 G + 0.114 B, intensities in [0, 1] (uint8 / 255;
  floating frames must already be in [0, 1], which is checked);
* optional working resolution ``size`` (long side; area interpolation when
  shrinking, bilinear when enlarging);
* gradients: 3x3 Sobel / 8 (intensity per pixel) on the mean of the two frames;
  the temporal difference ``It = current - previous`` smoothed by the same
  [1 2 1] x [1 2 1] / 16 that the Sobel applies across its derivative, so that
  gradient and It see the same spatial frequencies (an unsmoothed It
  overestimates the motion of fine texture: +19 % on a texture blurred by
  sigma = 1.5 px, against 1-5 % with it); only the valid (H-2, W-2) region is used;
* ``window=w`` (odd >= 3): the structure tensor averaged over each w x w window
  (valid region), a closed-form 2x2 solve per pixel; a pixel is *textured*
  (valid) when its window-averaged structure tensor has smallest eigenvalue
  ``> min_eig`` (flat regions and pure edges are left out, as OpenCV's LK does);
* ``levels``: coarse-to-fine over an image pyramid (below), so that large
  motion is measured, not saturated;
* ``statistic``: how the per-pixel flow becomes one number per pair (below);
* ``window=None``: the paper's Eq. 1, one 2x2 system over the whole frame
  (single scale; ``flow_px`` is the magnitude of that one vector).

``score = flow_px / (1 + flow_px)`` maps pixels to [0, 1) (1 px -> 0.5).

Pyramid (``levels``, default "auto")
------------------------------------
LK linearises the image around each pixel, so one step measures a shift only
up to about the scale of the texture (1-4 px at 224 px: single-scale reads
3.4 px for a true 16 px).  Level 0 is the working frame; level l+1 blurs level
l with the binomial [1 2 1] / 4 in each direction (edges replicated) and keeps
every second pixel, ``((H+1)//2, (W+1)//2)``.  The blur matters: plain 2x2
averaging aliases fine texture and lost 40 % at 32 px.  From the coarsest
level down, each level runs one LK step on a *warped* pair:

0. search (coarsest level only): the whole-pixel shift (dx, dy), |dx| <= rx,
   |dy| <= ry (a quarter of each side, at most ``SEARCH_RADIUS`` = 4), that
   minimises the sum of absolute differences between the previous frame's
   central region (rows [ry, H-ry), columns [rx, W-rx): the same pixels for
   every shift) and the current frame moved by it (``search_shift``).  Each
   difference counts ``|floor(4096 * (cur - prev) + 0.5)|``, an integer, so the
   sums are exact in any order; ties go to no shift, then to the first in
   row-major order.  This one vector per pair is the coarsest step's guess
   (factor 1): at 224 x 224 the coarsest level is 14 x 14 and 4 px there is
   64 px at level 0, at 224 x 126 (4 levels, 16 x 28) 32 px;
1. guess (finer levels): the coarser level's flow, smoothed by a 5 x 5 box
   normalised by the valid pixels (``guess_field``; a pixel with no valid
   neighbour keeps its own flow), times the level ratio f (2, or 4 from level
   2 to level 0), read at each pixel's coarse parent (nearest), and rounded to
   whole pixels: ``g = floor(f * guess + 0.5)``;
2. warp: the current frame sampled at ``x + g`` (border clamped) -- whole
   pixels, so the warp is an exact copy (no interpolation blur, which biased
   small motions by +12 %) and LK solves the residual of at most ~0.5 px plus
   the coarse error;
3. one LK step on (previous, warped current) exactly as at a single scale,
   giving ``d``; a pixel is valid when it is textured *and* its displaced
   window stays inside the frame (``c <= x + g <= W-1-c``, c = 1 + w//2);
   its flow is ``g + d`` when valid, else the guess ``g`` (carried down).

Why the search: one LK step at the coarsest level captures about 1 px there; a
32 px shift is 2 px at 14 x 14 and 4 px at 16 x 28, which LK steps from zero read
as 26.9 px (a vertical 32 px on one test texture) and 7 px (224 x 126).  Two LK
steps from zero were the previous remedy; more drifted on scene cuts until no
level-0 window stayed inside the frame (a cut read 0).  The search is bounded
(at least half of each side stays compared), cheap (at most 81 shifts of a tiny
frame), finds no shift on a static scene, and on a cut returns some shift whose
LK steps read a large flow, so cuts are kept (tests/test_motion_gate.py).  It is
global: a small object moving in a static scene gets no shift from it, and the
LK steps below measure it as they would from zero.  One step per finer level is
enough: the symmetric (mean-frame) gradient makes a step accurate to a few per
cent within its capture range, and a second step on a dense, unregularised
field amplified per-pixel noise.  The smoothing of the guess removes the
outliers of the coarsest levels, which otherwise never recover.  The window is
the same at every level, so a level-l window covers 2^l times more of the
scene; the statistic is computed at level 0 only, on its own valid pixels.
"auto" uses as many levels as keep both sides of the coarsest at least
``window + 4`` (three window outputs), at most 5; ``levels=1`` is single-scale
LK.  Cost: the levels above 0 add a third of level 0's pixels (level 1 is
reduced, not solved).

Statistic (``statistic``, default "moving")
--------------------------------------------
* ``"textured"`` -- StreamChat's literal statistic: mean |flow| over the
  textured (valid) pixels.  A small object moving in a static scene barely
  moves it (a 45 px object at 5.6 px/frame reads 0.5 px at 224 x 126).
* ``"moving"`` -- mean |flow| over the *moving* pixels: each valid pixel
  weighs ``clamp((|flow| - 0.25) / 0.25, 0, 1)`` (a soft noise floor: sensor
  noise of 2 grey levels gives |flow| below 0.23 px at 224 px, so a static scene
  reads 0), and the weights are divided by ``max(sum of weights, 0.2 % of
  the window outputs)``, so that a region smaller than that (a few noisy
  pixels, a speck) counts in proportion to its size.  A uniform pan of s px
  reads s under both statistics; an object of at least 0.2 % of the frame
  moving s px reads about s.  Calibration: bench/calibrate_motion_gate.py.

``mean_uv`` is the mean (u, v) under the same weights (so |mean_uv| <= flow_px).

Numerics (shared by every backend)
----------------------------------
float32 throughout; the smallest eigenvalue is computed as ``det / lambda_max``
(no cancellation), and a pixel is textured iff ``lambda_max > 0 and
det / lambda_max > min_eig``.  The seed code's ``sqrt(u^2 + u^2)`` typo and its
missing normalisation are not reproduced.

The reference fixes every rounding step: the Sobel and It differences in the
order written in :func:`pair_products`, the window sum in row-major order from
0 then divided by ``w*w`` (``avg_pool2d``), the pyramid's [1 2 1] sums in
:func:`reduce_level`, the guess in :func:`guess_field`, correctly rounded
square roots, and float64 sums over each frame.  The ``triton`` and ``cuda``
backends reproduce it **bit for bit** (same order, no FMA contraction,
correctly rounded sqrt and division, integer warps, the same torch summary),
so their scores and keep/drop decisions are those of the reference.  The
``cpp`` backend sums windows in another order and agrees within float32
rounding (tolerances declared on ``LK_FLOW``); with a pyramid, a rounding
difference can move a coarse guess across a whole-pixel boundary, which
changes that pixel's level-0 estimate by its LK error (~0.01 px).

Backends: ``torch`` (slices + box sums), ``cpp`` (one fused pass per row
strip and level, OpenMP over pairs and strips), ``triton`` and ``cuda``
(kernels per level stage: pyramid reduce, guess, warp, products, window solve).

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

from ..runtime.dispatch import Op, call_op, load_native
from ..runtime.validate import as_tensor, check_dtype, check_float, check_int, check_nonempty, check_rank, check_values
from .reference import (FRAME_DTYPES, GUESS_BOX, MAX_AUTO_LEVELS, MOVING_FLOOR_PX, MOVING_MIN_AREA, SEARCH_RADIUS, STATISTICS,
                        gray_resize, level_shapes, lk_flow_reference, pyramid_flow)

__all__ = ["MotionResult", "motion_magnitude", "select_frames", "select_frames_mask", "lk_flow", "STATISTICS"]


class MotionResult(NamedTuple):
    """Per-pair motion of a clip of T frames.

    Attributes
    ----------
    flow_px : (T-1,) float32
        The chosen statistic of the flow magnitude, in pixels at the working
        resolution ("moving": mean over the moving pixels; "textured": mean over
        the textured pixels; global mode: the magnitude of the one solve).
    score : (T-1,) float32
        ``flow_px / (1 + flow_px)``, monotone, in [0, 1).
    mean_uv : (T-1, 2) float32
        Mean (u, v) under the statistic's weights (window mode) or the global solve.
    """

    flow_px: torch.Tensor
    score: torch.Tensor
    mean_uv: torch.Tensor


# --------------------------------------------------------------------------
# Public functions: contract, validation, preparation
# --------------------------------------------------------------------------
def motion_magnitude(frames, *, size: int | None = None, window: int | None = 5, min_eig: float = 1e-5,
                     levels: int | str = "auto", statistic: str = "moving", backend: str = "auto") -> MotionResult:
    """Lucas-Kanade motion magnitude of every consecutive frame pair.

    Parameters
    ----------
    frames : (T, H, W) or (T, H, W, C) tensor or array, C in {1, 3}
        uint8 (0..255) or floating frames with intensities in [0, 1] (checked:
        NaN, Inf and values outside raise ``ValueError``), T >= 2.  RGB is
        converted to gray.  Not modified.
    size : int, optional
        Working resolution: the long side is resized to ``size`` (aspect kept).
        ``None`` keeps the input size.
    window : int or None
        Odd LK window >= 3 (default 5), or ``None`` for one global 2x2 system.
    min_eig : float
        Threshold on the smallest eigenvalue of the window-averaged structure
        tensor (intensities in [0, 1]); ill-conditioned pixels are skipped.
    levels : int >= 1 or "auto"
        Pyramid levels including the working frame (module docstring): "auto"
        (default) uses as many as the frame size allows, up to 5; 1 is
        single-scale LK.  Window mode only (``window=None`` is single-scale).
    statistic : {"moving", "textured"}
        "moving" (default): mean |flow| over the moving pixels (a soft 0.25-0.5 px
        noise floor, a minimum region of 0.2 % of the frame), which sees a small
        object move in a static scene; "textured": StreamChat's mean over all
        textured pixels.  Ignored with ``window=None``.
    backend : {"auto", "torch", "cpp", "triton", "cuda"}

    Returns
    -------
    MotionResult with ``flow_px (T-1,)``, ``score (T-1,)``, ``mean_uv (T-1, 2)``,
    on the device of ``frames``.

    Notes
    -----
    On CUDA tensors nothing synchronises with the host (the range check of
    floating frames is a device-side assertion), so a call can be captured in a
    CUDA graph.
    """
    fused = _motion_uint8_cpp(frames, size, window, min_eig, levels, statistic, backend)
    if fused is not None:
        return fused
    gray, window, min_eig, levels, statistic = _prepare(frames, size, window, min_eig, levels, statistic, backend)
    return _motion_of_gray(gray, window, min_eig, levels, statistic, _select(backend, gray))


def _motion_uint8_cpp(frames, size, window, min_eig, levels, statistic, backend) -> MotionResult | None:
    """The common case in one native call: C-contiguous uint8 CPU frames (a tensor or an array),
    gray or RGB, shrunk or kept, on the C++ backend.  Gray, resize, LK and score are the general
    path's own native steps (bit for bit); each Python step between them cost microseconds, the
    whole of a single pair's overhead (issue 15).  None outside this case (see
    :func:`_uint8_cpp_plan`)."""
    planned = _uint8_cpp_plan(frames, size, window, min_eig, levels, statistic, backend)
    if planned is None:
        return None
    mod, (window, min_eig, levels, statistic, (oh, ow)) = planned
    flow_px, score, mean_uv = mod.motion_u8(frames.numpy() if isinstance(frames, torch.Tensor) else frames, oh, ow,
                                            *_cpp_lk_args(window, min_eig, levels, statistic))
    return MotionResult(torch.from_numpy(flow_px), torch.from_numpy(score), torch.from_numpy(mean_uv))


def _uint8_cpp_plan(frames, size, window, min_eig, levels, statistic, backend, min_frames=2):
    """(``_cpu_motion`` module, :func:`_plan`'s validated arguments) when ``frames`` are C-contiguous
    uint8 CPU frames ((T, H, W) or (T, H, W, 3), a tensor or an array, T >= ``min_frames``) that
    the C++ backend prepares (shrunk or kept, not enlarged), for the fused native entry points;
    None otherwise, or when they or the arguments are not valid: the general path (``_prepare``)
    then validates and explains.  Every check that path would pass is made here, and the
    arguments go through the same cached :func:`_plan`, whose errors are the general path's."""
    if isinstance(frames, torch.Tensor):
        if frames.dtype is not torch.uint8 or not frames.is_cpu or not frames.is_contiguous():
            return None
    elif not (isinstance(frames, np.ndarray) and frames.dtype == np.uint8 and frames.flags.c_contiguous):
        return None
    shape = tuple(frames.shape)
    if not ((len(shape) == 4 and shape[3] == 3) or len(shape) == 3) or shape[0] < min_frames or 0 in shape:
        return None
    mod = LK_FLOW.cpp_module(backend)
    if mod is None or torch.compiler.is_compiling():
        return None
    try:
        plan = _plan(shape[1:3], size, window, min_eig, levels, statistic)
    except TypeError:  # unhashable arguments: the general path validates (and rejects) them
        return None
    oh, ow = plan[4]
    if oh > shape[1] or ow > shape[2]:  # enlarging: bilinear, torch only
        return None
    return mod, plan


def _cpp_lk_args(window, min_eig, levels, statistic) -> tuple:
    """The C++ lk_flow arguments after the frames, from validated ones."""
    return (window, min_eig, levels, statistic == "moving", MOVING_FLOOR_PX[0], MOVING_FLOOR_PX[1], MOVING_MIN_AREA,
            GUESS_BOX, SEARCH_RADIUS)


def _motion_of_gray(gray, window, min_eig, levels, statistic, backend) -> MotionResult:
    """MotionResult of prepared gray frames (``_prepare``'s output) with a resolved backend."""
    flow_px, mean_uv = _lk_flow(gray, window, min_eig, levels, statistic, backend)
    if backend == "cpp":
        # Same float32 division as the tensor expression below, without two small torch ops (~6 us each).
        f = flow_px.numpy()
        return MotionResult(flow_px, torch.from_numpy(f / (np.float32(1.0) + f)), mean_uv)
    return MotionResult(flow_px, flow_px / (1.0 + flow_px), mean_uv)


def select_frames(frames, threshold: float, *, reference: str = "previous", size: int | None = None,
                  window: int | None = 5, min_eig: float = 1e-5, levels: int | str = "auto",
                  statistic: str = "moving", backend: str = "auto") -> list[int]:
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
                              levels=levels, statistic=statistic, backend=backend)
    return [t for t, k in enumerate(keep.tolist()) if k]


def select_frames_mask(frames, threshold: float, *, reference: str = "previous", size: int | None = None,
                       window: int | None = 5, min_eig: float = 1e-5, levels: int | str = "auto",
                       statistic: str = "moving", backend: str = "auto") -> torch.Tensor:
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
    size, window, min_eig, levels, statistic, backend
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
    gray, window, min_eig, levels, statistic = _prepare(frames, size, window, min_eig, levels, statistic, backend)
    name = _select(backend, gray)
    above = _float32_below(threshold)  # score > threshold  <=>  score > above, for float32 scores
    flow = functools.partial(_lk_flow, window=window, min_eig=min_eig, levels=levels, statistic=statistic,
                             backend=name)
    if reference == "previous":
        flow_px, _ = flow(gray)
        keep = torch.empty(gray.shape[0], dtype=torch.bool, device=gray.device)
        keep[0] = True
        torch.gt(flow_px / (1.0 + flow_px), above, out=keep[1:])
        return keep
    if gray.device.type == "cpu" and name != "triton":
        return _last_kept_on_host(gray, above, flow)
    # The index of the last kept frame stays on the device: reading it would stall the stream.
    # (Triton takes this path under the interpreter too, so the CPU tests run it.)
    keep = torch.ones(gray.shape[0], dtype=torch.bool, device=gray.device)
    last = torch.zeros(1, dtype=torch.long, device=gray.device)
    for t in range(1, gray.shape[0]):
        flow_px, _ = flow(torch.cat((gray.index_select(0, last), gray[t:t + 1])))
        kept = flow_px / (1.0 + flow_px) > above
        keep[t:t + 1] = kept
        last = torch.where(kept, t, last)
    return keep


def _last_kept_on_host(gray, above, flow):
    """"last_kept" on the CPU backends: reading a CPU score is free, and numpy scalars spare tiny
    torch ops per frame (same float32 arithmetic)."""
    keep = [True]
    last = 0
    for t in range(1, gray.shape[0]):
        flow_px, _ = flow(torch.cat((gray[last:last + 1], gray[t:t + 1])))
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


def _resolve_levels(levels, hw, window: int) -> int:
    """The number of pyramid levels for frames of size ``hw`` (validated)."""
    if window == 0:
        if levels == "auto" or levels == 1:
            return 1
        raise ValueError(f"levels must be 1 or 'auto' with window=None (the global system is single-scale), "
                         f"got {levels!r}")
    smallest = window + 4  # three window outputs per side at the coarsest level
    fits = 1
    for h, w in level_shapes(*hw, 16)[1:]:
        if min(h, w) < smallest:
            break
        fits += 1
    if levels == "auto":
        return min(fits, MAX_AUTO_LEVELS)
    levels = check_int(levels, "levels", minimum=1)
    if levels > fits:
        raise ValueError(f"levels={levels} needs every level at least {smallest}x{smallest} pixels "
                         f"(window + 4); frames of {hw[0]}x{hw[1]} at the working size allow at most {fits}")
    return levels


@functools.lru_cache(maxsize=256, typed=True)
def _plan(shape, size, window, min_eig, levels, statistic):
    """Validated scalar arguments and working size for frames of ``shape`` (T excluded), cached:
    a stream calls with the same arguments every frame, and these checks cost ~10 us."""
    if window is None:
        window = 0
    else:
        window = check_int(window, "window", minimum=3, odd=True)
    min_eig = check_float(min_eig, "min_eig", low=0.0)
    if size is not None:
        size = check_int(size, "size", minimum=3)
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {STATISTICS}, got {statistic!r}")
    if not (levels == "auto" or (isinstance(levels, (int, np.integer)) and not isinstance(levels, bool))):
        raise ValueError(f"levels must be an int >= 1 or 'auto', got {levels!r}")
    h, w_ = shape[:2]
    out_hw = (h, w_)
    if size is not None:
        scale = size / max(h, w_)
        out_hw = (max(1, round(h * scale)), max(1, round(w_ * scale)))
    need = (window or 1) + 2
    if out_hw[0] < need or out_hw[1] < need:
        raise ValueError(
            f"frames must be at least {need}x{need} pixels at the working size for window={window or None} "
            f"(3x3 gradients plus the window), got {out_hw}"
        )
    levels = _resolve_levels(levels, out_hw, window)
    return window, min_eig, levels, statistic, out_hw


def _prepare(frames, size, window, min_eig, levels="auto", statistic="moving", backend="auto", min_frames=2):
    """Validate and convert to contiguous gray (T, H, W): uint8 kept, else float32.

    ``min_frames=1`` prepares single frames (the streaming gate keeps its reference frame's gray).
    """
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
    check_dtype(frames, "frames", FRAME_DTYPES)
    check_nonempty(frames, "frames")
    if frames.dim() == 4 and frames.shape[-1] not in (1, 3):
        raise ValueError(f"frames must have 1 or 3 channels in the last dimension, got {frames.shape[-1]}")
    if frames.shape[0] < min_frames:
        raise ValueError(f"frames must hold at least {min_frames} frames (T >= {min_frames}), got T={frames.shape[0]}")
    if frames.is_floating_point():
        # Floating frames are intensities in [0, 1]: one min/max pass rejects NaN/Inf (they fail both
        # comparisons) and out-of-range data (0..255 floats, 1e20) that would otherwise overflow the
        # products into NaN on one backend and 0 on another.  Device-side on CUDA.
        low, high = torch.aminmax(frames)
        check_values((low >= 0) & (high <= 1),
                     "frames must be finite and, for a floating dtype, intensities in [0, 1] (NaN, Inf and values "
                     "outside are rejected); divide 0..255 data by 255 or pass uint8 frames")
    if frames.dim() == 4 and frames.shape[-1] == 1:
        frames = frames[..., 0]
    h, w_ = frames.shape[1:3]
    args = (tuple(frames.shape[1:3]), size, window, min_eig, levels, statistic)
    if torch.compiler.is_compiling():  # dynamo traces through the cache wrapper (and warns): skip it
        window, min_eig, levels, statistic, out_hw = _plan.__wrapped__(*args)
    else:
        try:
            window, min_eig, levels, statistic, out_hw = _plan(*args)
        except TypeError:  # unhashable arguments: validated uncached (and rejected there)
            window, min_eig, levels, statistic, out_hw = _plan.__wrapped__(*args)
    native_prep = (
        frames.dtype == torch.uint8 and frames.device.type == "cpu" and out_hw[0] <= h and out_hw[1] <= w_
        and (frames.dim() == 4 or out_hw != (h, w_)) and LK_FLOW.select(backend, frames.device) == "cpp"
    )
    if native_prep:
        # Fused uint8 -> gray -> area resize in one pass (same bins as the torch path below).
        mod, _ = load_native("cpu", "motion")
        gray = torch.from_numpy(mod.gray_area(frames.contiguous().numpy(), out_hw[0], out_hw[1]))
    else:
        gray = gray_resize(frames, out_hw)
    return gray.contiguous(), window, min_eig, levels, statistic


def _select(backend: str, gray: torch.Tensor) -> str:
    return LK_FLOW.select(backend, gray.device)


def _lk_flow(gray, window, min_eig, levels, statistic, backend):
    if backend == "cpp" and not torch.compiler.is_compiling():
        return _lk_flow_cpp(gray, window, min_eig, levels, statistic)  # numpy outputs: no grad context needed
    return call_op(torch.ops.streammem.lk_flow, LK_FLOW.impls, backend, gray, window, min_eig, levels, statistic)


# --------------------------------------------------------------------------
# Custom op (works under torch.compile; opcheck-tested)
# --------------------------------------------------------------------------
@torch.library.custom_op("streammem::lk_flow", mutates_args=())
def lk_flow(gray: torch.Tensor, window: int, min_eig: float, levels: int, statistic: str,
            backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Core op on prepared input.

    gray: contiguous (T, H, W) uint8 (scaled by 1/255 on load) or float32 in [0, 1];
    window: odd >= 3, or 0 for the global system; levels: >= 1 (1 with window 0), every level
    at least window + 4 pixels a side beyond level 0; statistic: "moving" or "textured".
    Returns (flow_px (T-1,), mean_uv (T-1, 2)).
    """
    return LK_FLOW.impls[backend](gray, window, min_eig, levels, statistic)


@lk_flow.register_fake
def _(gray, window, min_eig, levels, statistic, backend):
    pairs = gray.shape[0] - 1
    return gray.new_empty((pairs,), dtype=torch.float32), gray.new_empty((pairs, 2), dtype=torch.float32)


# --------------------------------------------------------------------------
# Backend: C++ (csrc/cpu/motion.cpp)
# --------------------------------------------------------------------------
def _lk_flow_cpp(gray: torch.Tensor, window: int, min_eig: float, levels: int, statistic: str):
    mod, _ = load_native("cpu", "motion")
    flow_px, mean_uv = mod.lk_flow(gray.numpy(), *_cpp_lk_args(int(window), float(min_eig), int(levels), statistic))
    return torch.from_numpy(flow_px), torch.from_numpy(mean_uv)


# --------------------------------------------------------------------------
# Backend: CUDA (csrc/cuda/motion.cu)
# --------------------------------------------------------------------------
def _lk_flow_cuda(gray: torch.Tensor, window: int, min_eig: float, levels: int, statistic: str):
    from ._cuda import CUDA_STAGES

    return pyramid_flow(gray, window, min_eig, levels, statistic, CUDA_STAGES)


# --------------------------------------------------------------------------
# Backend: Triton
# --------------------------------------------------------------------------
def _lk_flow_triton(gray: torch.Tensor, window: int, min_eig: float, levels: int, statistic: str):
    from ._triton import TRITON_STAGES

    return pyramid_flow(gray, window, min_eig, levels, statistic, TRITON_STAGES)


# (atol, rtol) of flow_px and mean_uv against the reference, per frame dtype.  Every
# backend starts from the same float32 gray frames, so the dtype changes nothing:
# triton and cuda reproduce the reference bit for bit; cpp sums windows in another
# order (float32 rounding of sums of w*w products, amplified by the 2x2 solve and, with
# a pyramid, by the rare coarse guess that rounds to the other whole pixel).
_BIT_FOR_BIT = {dtype: (0.0, 0.0) for dtype in FRAME_DTYPES}
_SUMMATION_ORDER = {dtype: (2e-5, 2e-4) for dtype in FRAME_DTYPES}

LK_FLOW = Op(
    "motion",
    {"torch": lk_flow_reference, "cpp": _lk_flow_cpp, "triton": _lk_flow_triton, "cuda": _lk_flow_cuda},
    tolerances={"torch": _BIT_FOR_BIT, "triton": _BIT_FOR_BIT, "cuda": _BIT_FOR_BIT, "cpp": _SUMMATION_ORDER},
)
