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
from types import SimpleNamespace
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from ._dispatch import Op, call_op, load_native
from ._utils import as_tensor, check_dtype, check_float, check_int, check_nonempty, check_rank, check_values

__all__ = ["MotionResult", "motion_magnitude", "select_frames", "select_frames_mask", "lk_flow", "STATISTICS"]

_GRAY_WEIGHTS = (0.299, 0.587, 0.114)
_FRAME_DTYPES = (torch.uint8, torch.float16, torch.bfloat16, torch.float32, torch.float64)

STATISTICS = ("moving", "textured")
# The "moving" statistic's soft noise floor (px at the working size): weight 0 below the
# first, 1 above the second, linear between.  And its minimum region, a fraction of the
# window outputs.  Chosen on synthetic static-camera clips (bench/calibrate_motion_gate.py).
MOVING_FLOOR_PX = (0.25, 0.5)
MOVING_MIN_AREA = 0.002
MAX_AUTO_LEVELS = 5
GUESS_BOX = 5  # side of the box that smooths a coarse level's flow into the next level's guess
SEARCH_RADIUS = 4  # largest whole-pixel shift per axis tried by the coarsest level's search
SEARCH_QUANT = 4096.0  # the search's differences are counted in 1/4096ths of the intensity range


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


def level_shapes(h: int, w: int, levels: int) -> list[tuple[int, int]]:
    """(H, W) of each pyramid level, finest first: level l+1 is ((H+1)//2, (W+1)//2) of level l."""
    shapes = [(h, w)]
    for _ in range(levels - 1):
        h, w = (h + 1) // 2, (w + 1) // 2
        shapes.append((h, w))
    return shapes


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
    check_dtype(frames, "frames", _FRAME_DTYPES)
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
        gray = _gray_resize_torch(frames, out_hw)
    return gray.contiguous(), window, min_eig, levels, statistic


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
# Backend: torch reference (the spec)
# --------------------------------------------------------------------------
def _to_unit_float(gray: torch.Tensor) -> torch.Tensor:
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
    prev, cur = _to_unit_float(prev), _to_unit_float(cur)
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


def _clamp_nan_low(x: torch.Tensor, low: float, high: float) -> torch.Tensor:
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
    g = guess[:, :, ci][:, :, :, cj]  # (P, 2, len(rows), len(cols))
    g = torch.floor(float(factor) * g + 0.5)
    return _clamp_nan_low(g[:, 0], -float(W), float(W)), _clamp_nan_low(g[:, 1], -float(H), float(H))


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
    x = _to_unit_float(frames)
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
    a, b = _to_unit_float(prev), _to_unit_float(cur)
    H, W = a.shape[1:]
    centre = a[:, ry:H - ry, rx:W - rx]
    sads = []
    for dy in range(-ry, ry + 1):
        for dx in range(-rx, rx + 1):
            d = b[:, ry + dy:H - ry + dy, rx + dx:W - rx + dx] - centre
            sads.append(torch.floor(d * SEARCH_QUANT + 0.5).abs().to(torch.int64).sum(dim=(1, 2)))
    return torch.stack(sads, dim=1)


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


def _lk_flow_torch(gray: torch.Tensor, window: int, min_eig: float, levels: int, statistic: str):
    return pyramid_flow(gray, window, min_eig, levels, statistic, TORCH_STAGES)


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
    from ._motion_cuda import CUDA_STAGES

    return pyramid_flow(gray, window, min_eig, levels, statistic, CUDA_STAGES)


# --------------------------------------------------------------------------
# Backend: Triton
# --------------------------------------------------------------------------
def _lk_flow_triton(gray: torch.Tensor, window: int, min_eig: float, levels: int, statistic: str):
    from ._motion_triton import TRITON_STAGES

    return pyramid_flow(gray, window, min_eig, levels, statistic, TRITON_STAGES)


# (atol, rtol) of flow_px and mean_uv against the reference, per frame dtype.  Every
# backend starts from the same float32 gray frames, so the dtype changes nothing:
# triton and cuda reproduce the reference bit for bit; cpp sums windows in another
# order (float32 rounding of sums of w*w products, amplified by the 2x2 solve and, with
# a pyramid, by the rare coarse guess that rounds to the other whole pixel).
_BIT_FOR_BIT = {dtype: (0.0, 0.0) for dtype in _FRAME_DTYPES}
_SUMMATION_ORDER = {dtype: (2e-5, 2e-4) for dtype in _FRAME_DTYPES}

LK_FLOW = Op(
    "motion",
    {"torch": _lk_flow_torch, "cpp": _lk_flow_cpp, "triton": _lk_flow_triton, "cuda": _lk_flow_cuda},
    tolerances={"torch": _BIT_FOR_BIT, "triton": _BIT_FOR_BIT, "cuda": _BIT_FOR_BIT, "cpp": _SUMMATION_ORDER},
)
