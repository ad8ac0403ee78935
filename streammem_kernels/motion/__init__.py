"""Motion magnitude (pyramidal Lucas-Kanade) for selective frame stacking: the door of the motion op.

StreamChat (sec. 3.1.1) keeps a frame only when its Lucas-Kanade motion against the previous frame
exceeds a threshold t in [0, 1].  :func:`motion_magnitude` measures every consecutive frame pair of
a clip (a dense windowed LK flow, coarse to fine over an image pyramid, summarised into one number
per pair, ``score = flow_px / (1 + flow_px)``); :func:`select_frames` and :func:`select_frames_mask`
apply the gate to a clip and :class:`~streammem_kernels.StreamingMotionGate` (``streaming.py``) to a
stream.  ``reference.py`` is the spec; ``docs/ops/motion.md`` explains the algorithm, its numerics,
the backends and their performance.

Backends (``LK_FLOW``): ``torch`` (the reference), ``cpp`` (csrc/cpu/motion/, within the float32
rounding tolerances declared on ``LK_FLOW``), ``triton`` and ``cuda`` (bit for bit with the
reference).  Contiguous uint8 CPU frames on the C++ backend take a declared latency path
(``LK_FLOW.run_fast``): the general path's native steps without Python between them.

On CUDA tensors no function here synchronises with the host (value checks are device-side
assertions) except :func:`select_frames`, which returns a Python list; :func:`select_frames_mask` is
its device-resident counterpart, and everything it runs can be captured in a CUDA graph.
"""
from __future__ import annotations

import functools
import operator
from typing import NamedTuple

import numpy as np
import torch

from ..runtime.dispatch import Op, call_op, eager_only, load_native
from ..runtime.native import NativeChecks, view
from ..runtime.validate import as_tensor, check_dtype, check_float, check_int, check_nonempty, check_rank, check_values
from .reference import (FRAME_DTYPES, GUESS_BOX, MAX_AUTO_LEVELS, MAX_SIZE, MOVING_FLOOR_PX, MOVING_MIN_AREA,
                        SEARCH_QUANT, SEARCH_RADIUS, STATISTICS, STREAMCHAT_EPS, gray_resize, level_shapes,
                        lk_flow_reference, pyramid_flow, streamchat_gray)

__all__ = ["MotionResult", "motion_magnitude", "select_frames", "select_frames_mask", "lk_flow", "STATISTICS"]


class MotionResult(NamedTuple):
    """Per-pair motion of a clip of T frames.

    Attributes
    ----------
    flow_px : (T-1,) float32
        The chosen statistic of the flow magnitude, in pixels at the working
        resolution ("moving": mean over the moving pixels; "textured": mean over
        the textured pixels; "streamchat": StreamChat's reading, the mean over
        every window of sqrt(2 u^2); global mode: the magnitude of the one solve).
    score : (T-1,) float32
        ``flow_px / (1 + flow_px)``, monotone, in [0, 1); with
        ``statistic="streamchat"`` the reading itself (StreamChat's scale, which
        its thresholds read; not bounded by 1).
    mean_uv : (T-1, 2) float32
        Mean (u, v) under the statistic's weights (window mode; "streamchat":
        over every window) or the global solve.
    """

    flow_px: torch.Tensor
    score: torch.Tensor
    mean_uv: torch.Tensor


# --------------------------------------------------------------------------
# Public functions: contract, validation, preparation
# --------------------------------------------------------------------------
def motion_magnitude(frames, *, size: int | None = None, window: int | None = 5, min_eig: float = 1e-5,
                     levels: int | str = "auto", statistic: str = "moving", backend: str = "auto",
                     channels: str = "last", value_range=None, mean=None, std=None) -> MotionResult:
    """Lucas-Kanade motion magnitude of every consecutive frame pair.

    Parameters
    ----------
    frames : (T, H, W) or (T, H, W, C) tensor or array, C in {1, 3}
        uint8 (0..255) or floating frames with intensities in [0, 1] (checked:
        NaN, Inf and values outside raise ``ValueError``), T >= 2.  RGB is
        converted to gray.  Not modified.  Other layouts and value
        conventions are accepted when declared (``channels``, ``value_range``,
        ``mean`` / ``std``), never guessed.
    size : int in [3, 8192], optional
        Working resolution: the long side is resized to ``size`` (aspect kept).
        ``None`` keeps the input size.
    window : int or None
        Odd LK window >= 3 (default 5), or ``None`` for one global 2x2 system.
    min_eig : float
        Threshold on the smallest eigenvalue of the window-averaged structure
        tensor (intensities in [0, 1]); ill-conditioned pixels are skipped.
    levels : int >= 1 or "auto"
        Pyramid levels including the working frame (docs/ops/motion.md): "auto"
        (default) uses as many as the frame size allows, up to 5; 1 is
        single-scale LK.  Window mode only (``window=None`` is single-scale).
    statistic : {"moving", "textured", "streamchat"}
        "moving" (default): mean |flow| over the moving pixels (a soft 0.25-0.5 px
        noise floor, a minimum region of 0.2 % of the frame), which sees a small
        object move in a static scene; "textured": StreamChat's mean over all
        textured pixels.  Ignored with ``window=None``.  "streamchat": StreamChat's
        own gate reading, on its scale (its thresholds, 0.13-0.58, select the
        frames its code selects): single scale at the frames' own size (``levels``
        1 or "auto", no resize: ``size`` None or the long side), ``window`` (5 in
        StreamChat) required, ``min_eig`` unused; the gray
        ``(0.2989 R + 0.5870 G) + 0.1140 B`` of the channels *as normalised*:
        with ``mean`` / ``std`` declared, the frames as given (StreamChat reads
        CLIP-normalised channels: declare CLIP's); otherwise the [0, 1]
        intensities (uint8 / 255, floats in [0, 1] or mapped by ``value_range``),
        whose readings differ from the CLIP-normalised ones (docs/ops/motion.md).
        Then the unscaled, zero-padded 3x3 Sobel of the previous gray, It = current
        - previous, window sums over the valid windows, each 2x2 system with 1e-6
        added to its diagonal solved in closed form (no validity test: a system
        that rounds to singular reads inf, as in StreamChat), and the mean over
        every window of ``sqrt(u^2 + u^2)``.  Backends: torch, cpp, triton (bit
        for bit with the reference up to the float64 sum's order on cpp,
        ``STREAMCHAT_TOLERANCES``); the CUDA backend does not run it ("auto"
        takes Triton on CUDA tensors).
    backend : {"auto", "torch", "cpp", "triton", "cuda"}
    channels : {"last", "first"}
        Where a 4-D ``frames`` keeps its channels: (T, H, W, C) (default) or
        (T, C, H, W) (torchvision, CLIP processors).
    value_range : (low, high), optional
        Floating frames whose intensities span [low, high] instead of [0, 1]
        (``(0, 255)`` for unscaled floats, ``(-1, 1)``): mapped to [0, 1] by
        ``(x - low) / (high - low)``.
    mean, std : float or sequence of C floats, optional
        Floating frames normalised per channel as ``(x - mean) / std`` (CLIP:
        ``mean=(0.48145466, 0.4578275, 0.40821073)``,
        ``std=(0.26862954, 0.26130258, 0.27577711)``), with x in [0, 1] or in
        ``value_range``: undone before the gray conversion.  Given together.
        After undoing, intensities may exceed [0, 1] by 1e-3 (the rounding of
        the normalisation; they are clipped); anything further raises
        ``ValueError`` naming these arguments.

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
    if channels == "last" and value_range is None and mean is None and std is None:
        fast = LK_FLOW.run_fast(backend, frames, size, window, min_eig, levels, statistic)
        if fast is not None:
            return fast
    gray, window, min_eig, levels, statistic = _prepare(frames, size, window, min_eig, levels, statistic, backend,
                                                        convention=(channels, value_range, mean, std))
    return _motion_of_gray(gray, window, min_eig, levels, statistic, _select(backend, gray, statistic))


def _motion_of_gray(gray, window, min_eig, levels, statistic, backend) -> MotionResult:
    """MotionResult of prepared gray frames (``_prepare``'s output) with a resolved backend."""
    if statistic == "streamchat":
        flow_px, mean_uv = _lk_flow(gray, window, min_eig, levels, statistic, backend)
        return MotionResult(flow_px, flow_px.clone(), mean_uv)  # the score is the reading (StreamChat's scale)
    if backend == "cpp" and not torch.compiler.is_compiling():
        # The C++ entry writes the score too (the same float32 division as the tensor expression
        # below, without two small torch ops of ~6 us each).
        return MotionResult(*_cpp_flow(gray, _cpp_lk_args(window, min_eig, levels, statistic), score=True))
    flow_px, mean_uv = _lk_flow(gray, window, min_eig, levels, statistic, backend)
    return MotionResult(flow_px, flow_px / (1.0 + flow_px), mean_uv)


_SELECT_FRAMES_EAGER = eager_only(
    "select_frames returns a Python list of frame indices read from the tensors; inside torch.compile "
    "use select_frames_mask (the same decision as a bool tensor)")


def select_frames(frames, threshold: float, *, reference: str = "previous", size: int | None = None,
                  window: int | None = 5, min_eig: float = 1e-5, levels: int | str = "auto",
                  statistic: str = "moving", backend: str = "auto", channels: str = "last", value_range=None,
                  mean=None, std=None) -> list[int]:
    """Indices of the frames kept by the motion gate (the first is always kept).

    ``reference="previous"``: frame t is kept when ``score(t-1, t) > threshold``.
    ``reference="last_kept"``: frame t is compared with the last kept frame
    instead, so slow drift accumulates until it crosses the threshold.
    Raising ``threshold`` never keeps more frames in "previous" mode.

    Arguments as in :func:`select_frames_mask`, of which this is a thin wrapper:
    returning a Python list, it synchronises with the GPU once, at the end (use
    :func:`select_frames_mask` to stay on the device).  Not traceable by torch.compile for the
    same reason: with ``fullgraph=True`` it raises, without it the graph breaks and it runs eagerly
    (``docs/compile.md``).
    """
    _SELECT_FRAMES_EAGER()
    keep = select_frames_mask(frames, threshold, reference=reference, size=size, window=window, min_eig=min_eig,
                              levels=levels, statistic=statistic, backend=backend, channels=channels,
                              value_range=value_range, mean=mean, std=std)
    return [t for t, k in enumerate(keep.tolist()) if k]


def select_frames_mask(frames, threshold: float, *, reference: str = "previous", size: int | None = None,
                       window: int | None = 5, min_eig: float = 1e-5, levels: int | str = "auto",
                       statistic: str = "moving", backend: str = "auto", channels: str = "last", value_range=None,
                       mean=None, std=None) -> torch.Tensor:
    """Which frames the motion gate keeps, as a device-resident boolean mask.

    Parameters
    ----------
    frames : (T, H, W) or (T, H, W, C) tensor or array
        As in :func:`motion_magnitude` (T >= 2).  Not modified.
    threshold : float in [0, 1]
        Frame t is kept when its score (``motion_magnitude(...).score``, float32)
        is strictly greater than ``threshold`` (with ``statistic="streamchat"``
        the score is StreamChat's reading, so its thresholds apply as they are).
    reference : {"previous", "last_kept"}
        Score frame t against frame t-1, or against the last kept frame (slow
        drift accumulates until it crosses the threshold).
    size, window, min_eig, levels, statistic, backend, channels, value_range, mean, std
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
    gray, window, min_eig, levels, statistic = _prepare(frames, size, window, min_eig, levels, statistic, backend,
                                                        convention=(channels, value_range, mean, std))
    name = _select(backend, gray, statistic)
    above = _float32_below(threshold)  # score > threshold  <=>  score > above, for float32 scores
    flow = functools.partial(_lk_flow, window=window, min_eig=min_eig, levels=levels, statistic=statistic,
                             backend=name)
    if reference == "previous":
        flow_px, _ = flow(gray)
        keep = torch.empty(gray.shape[0], dtype=torch.bool, device=gray.device)
        keep[:1].fill_(True)  # not keep[0] = True: that copies a host scalar (no CUDA graph capture)
        torch.gt(_score_of(flow_px, statistic), above, out=keep[1:])
        return keep
    if gray.device.type == "cpu" and name != "triton" and not torch.compiler.is_compiling():
        return _last_kept_on_host(gray, above, flow, statistic == "streamchat")
    # The index of the last kept frame stays on the device: reading it would stall the stream (and, while
    # torch.compile traces, end the graph).  (Triton takes this path under the interpreter too, so the CPU
    # tests run it.)
    keep = torch.ones(gray.shape[0], dtype=torch.bool, device=gray.device)
    last = torch.zeros(1, dtype=torch.long, device=gray.device)
    for t in range(1, gray.shape[0]):
        flow_px, _ = flow(torch.cat((gray.index_select(0, last), gray[t:t + 1])))
        kept = _score_of(flow_px, statistic) > above
        keep[t:t + 1] = kept
        last = torch.where(kept, t, last)
    return keep


def _score_of(flow_px: torch.Tensor, statistic: str) -> torch.Tensor:
    """MotionResult.score of ``flow_px``: ``flow_px / (1 + flow_px)``, or the reading itself for "streamchat"."""
    return flow_px if statistic == "streamchat" else flow_px / (1.0 + flow_px)


def _last_kept_on_host(gray, above, flow, reading_is_score: bool = False):
    """"last_kept" on the CPU backends: reading a CPU score is free, and numpy scalars spare tiny
    torch ops per frame (same float32 arithmetic)."""
    keep = [True]
    last = 0
    for t in range(1, gray.shape[0]):
        flow_px, _ = flow(torch.cat((gray[last:last + 1], gray[t:t + 1])))
        f = np.float32(flow_px.item())
        keep.append(bool((f if reading_is_score else f / (np.float32(1.0) + f)) > above))
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
        if size > MAX_SIZE:
            raise ValueError(f"size must be <= {MAX_SIZE} (the working size's bound, 8K), got {size}")
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {STATISTICS}, got {statistic!r}")
    if not (levels == "auto" or (isinstance(levels, (int, np.integer)) and not isinstance(levels, bool))):
        raise ValueError(f"levels must be an int >= 1 or 'auto', got {levels!r}")
    h, w_ = shape[:2]
    out_hw = (h, w_)
    if size is not None:
        scale = size / max(h, w_)
        out_hw = (max(1, round(h * scale)), max(1, round(w_ * scale)))
    if statistic == "streamchat":
        return _streamchat_plan((h, w_), size, window, min_eig, levels, out_hw)
    need = (window or 1) + 2
    if out_hw[0] < need or out_hw[1] < need:
        raise ValueError(
            f"frames must be at least {need}x{need} pixels at the working size for window={window or None} "
            f"(3x3 gradients plus the window), got {out_hw}"
        )
    levels = _resolve_levels(levels, out_hw, window)
    return window, min_eig, levels, statistic, out_hw


def _streamchat_plan(hw, size, window, min_eig, levels, out_hw):
    """:func:`_plan`'s result for the "streamchat" statistic: StreamChat's reading is single scale, of
    windows, at the frames' own size; ValueError naming the argument that asks for anything else."""
    if window == 0:
        raise ValueError("window must be an odd int >= 3 with statistic='streamchat' (StreamChat reads 5 x 5 "
                         "windows), got None")
    if out_hw != hw:
        raise ValueError(f"size={size} would resize the {hw[0]}x{hw[1]} frames; statistic='streamchat' reads them "
                         f"at their own size (StreamChat: 224 px CLIP crops): pass size=None or size={max(hw)}")
    if levels != "auto" and levels != 1:
        raise ValueError(f"levels must be 1 or 'auto' with statistic='streamchat' (StreamChat's reading is "
                         f"single scale), got {levels!r}")
    if min(hw) < window:
        raise ValueError(f"frames must be at least {window}x{window} pixels for window={window} "
                         f"(statistic='streamchat' reads the valid windows), got {hw}")
    return window, min_eig, 1, "streamchat", hw


def _prepare(frames, size, window, min_eig, levels="auto", statistic="moving", backend="auto", min_frames=2,
             convention=("last", None, None, None)):
    """Validate and convert to contiguous gray (T, H, W): uint8 kept, else float32.

    ``min_frames=1`` prepares single frames (the streaming gate keeps its reference frame's gray).
    ``convention``: the public functions' (channels, value_range, mean, std).
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
    channels, value_range, mean, std = convention
    if channels not in ("last", "first"):
        raise ValueError(f"channels must be 'last' ((T, H, W, C) frames) or 'first' ((T, C, H, W)), got {channels!r}")
    check_rank(frames, "frames", (3, 4), f"(T, H, W) or {'(T, H, W, C)' if channels == 'last' else '(T, C, H, W)'}")
    check_dtype(frames, "frames", FRAME_DTYPES)
    check_nonempty(frames, "frames")
    if frames.dim() == 4 and channels == "first":
        if frames.shape[1] not in (1, 3):
            raise ValueError(f"frames must have 1 or 3 channels in dimension 1 (channels='first'), "
                             f"got {frames.shape[1]}")
        frames = frames.permute(0, 2, 3, 1)  # a view: the caller's tensor is not touched
    if frames.dim() == 4 and frames.shape[-1] not in (1, 3):
        hint = "; for (T, C, H, W) frames pass channels='first'" if frames.shape[1] in (1, 3) else ""
        raise ValueError(f"frames must have 1 or 3 channels in the last dimension, got {frames.shape[-1]}{hint}")
    if frames.shape[0] < min_frames:
        raise ValueError(f"frames must hold at least {min_frames} frames (T >= {min_frames}), got T={frames.shape[0]}")
    if statistic == "streamchat":
        gray = _streamchat_channels_gray(frames, value_range, mean, std)
        planned = _plan.__wrapped__(tuple(gray.shape[1:]), size, window, min_eig, levels, statistic)
        return (gray.contiguous(),) + planned[:4]
    if value_range is not None or mean is not None or std is not None:
        frames = _to_unit_intensities(frames, value_range, mean, std)
    if frames.is_floating_point():
        # Floating frames are intensities in [0, 1]: one min/max pass rejects NaN/Inf (they fail both
        # comparisons) and out-of-range data (0..255 floats, 1e20) that would otherwise overflow the
        # products into NaN on one backend and 0 on another.  Device-side on CUDA.
        low, high = torch.aminmax(frames)
        check_values((low >= 0) & (high <= 1),
                     "frames must be finite and, for a floating dtype, intensities in [0, 1] (NaN, Inf and values "
                     "outside are rejected); divide 0..255 data by 255, pass uint8 frames, or declare the "
                     "convention (value_range=, mean= and std=)")
    if frames.dim() == 4 and frames.shape[-1] == 1:
        frames = frames[..., 0]
    h, w_ = frames.shape[1:3]
    args = (tuple(frames.shape[1:3]), size, window, min_eig, levels, statistic)
    if torch.compiler.is_compiling():  # dynamo traces through the cache wrapper (and warns): skip it
        # The frame size is specialised (operator.index makes Dynamo guard on its value: a graph per
        # frame size, T stays dynamic): Inductor cannot lower the area resize to a working size that
        # is a symbolic expression of it ("cannot determine truth value of Relational").
        args = ((operator.index(h), operator.index(w_)),) + args[1:]
        window, min_eig, levels, statistic, out_hw = _plan.__wrapped__(*args)
    else:
        try:
            window, min_eig, levels, statistic, out_hw = _plan(*args)
        except TypeError:  # unhashable arguments: validated uncached (and rejected there)
            window, min_eig, levels, statistic, out_hw = _plan.__wrapped__(*args)
    native_prep = (  # not while torch.compile traces: the graph holds gray_resize's torch ops instead
        frames.dtype == torch.uint8 and frames.device.type == "cpu" and not torch.compiler.is_compiling()
        and out_hw[0] <= h and out_hw[1] <= w_
        and (frames.dim() == 4 or out_hw != (h, w_)) and LK_FLOW.select(backend, frames.device) == "cpp"
    )
    if native_prep:
        gray = _gray_area_cpp(frames.contiguous(), out_hw)  # the same bins as gray_resize's area mode
    else:
        gray = gray_resize(frames, out_hw)
    return gray.contiguous(), window, min_eig, levels, statistic


# Undoing a normalisation rounds: CLIP's (x - mean) / std in float32, undone, lands up to a few 1e-7
# outside [0, 1]; anything beyond this slack is a wrong declaration, not rounding.
_UNIT_SLACK = 1e-3


def _per_channel(value, name: str, channels: int) -> list[float]:
    """``value`` (a number or a sequence of 1 or ``channels`` numbers) as ``channels`` floats."""
    items = list(value) if isinstance(value, (list, tuple, np.ndarray, torch.Tensor)) else [value]
    if len(items) not in (1, channels):
        raise ValueError(f"{name} must be a number or {channels} numbers (one per channel of frames), "
                         f"got {len(items)} numbers")
    items = [check_float(v.item() if isinstance(v, (np.ndarray, torch.Tensor)) else v, name) for v in items]
    return items * channels if len(items) == 1 else items


def _to_unit_intensities(frames: torch.Tensor, value_range, mean, std) -> torch.Tensor:
    """Floating (T, H, W[, C]) frames declared by ``value_range`` and/or ``mean`` / ``std`` as float32
    intensities in [0, 1] (a new tensor), checked: ValueError naming the declaration they contradict."""
    given = [name for name, v in (("value_range", value_range), ("mean", mean), ("std", std)) if v is not None]
    if not frames.is_floating_point():
        raise ValueError(f"{' and '.join(given)} {'describes' if len(given) == 1 else 'describe'} floating frames; "
                         f"frames of dtype {frames.dtype} are "
                         "read as 0..255 already: drop the argument or pass the floating frames")
    if (mean is None) != (std is None):
        raise ValueError(f"mean and std undo one normalisation and go together, got only {given[-1]}")
    x = frames.to(torch.float32)
    channels = frames.shape[-1] if frames.dim() == 4 else 1
    if mean is not None:
        mean_c = _per_channel(mean, "mean", channels)
        std_c = _per_channel(std, "std", channels)
        if min(std_c) <= 0:
            raise ValueError(f"std must be > 0 in every channel, got {std_c}")
        shape = (channels,) if frames.dim() == 4 else ()
        x = x * torch.tensor(std_c if shape else std_c[0], dtype=torch.float32, device=x.device).reshape(shape) \
            + torch.tensor(mean_c if shape else mean_c[0], dtype=torch.float32, device=x.device).reshape(shape)
    if value_range is not None:
        if not isinstance(value_range, (list, tuple)) or len(value_range) != 2:
            raise ValueError(f"value_range must be (low, high), got {value_range!r}")
        low = check_float(value_range[0], "value_range[0]")
        high = check_float(value_range[1], "value_range[1]")
        if not low < high:
            raise ValueError(f"value_range must be (low, high) with low < high, got {value_range!r}")
        x = (x - low) / (high - low)
    lowest, highest = torch.aminmax(x)
    check_values((lowest >= -_UNIT_SLACK) & (highest <= 1 + _UNIT_SLACK),
                 f"frames must be finite and, undone by {' and '.join(given)}, intensities in [0, 1]: values "
                 "outside (or NaN, Inf) mean that the declaration does not describe these frames")
    return x.clamp_(0.0, 1.0)


def _streamchat_channels_gray(frames: torch.Tensor, value_range, mean, std) -> torch.Tensor:
    """(T, H, W) float32 StreamChat gray (``reference.streamchat_gray``) of validated channel-last frames:
    of the frames as given when ``mean`` / ``std`` declare them normalised (the declaration checked as
    for the other statistics), else of their [0, 1] intensities (uint8 / 255, ``value_range`` mapped,
    floats checked in [0, 1])."""
    if mean is not None or std is not None:
        _to_unit_intensities(frames, value_range, mean, std)  # checks the declaration; the reading needs no undoing
        channels = frames.to(torch.float32)
    elif value_range is not None:
        channels = _to_unit_intensities(frames, value_range, None, None)
    elif frames.dtype == torch.uint8:
        channels = frames.to(torch.float32) * (1.0 / 255.0)
    else:
        low, high = torch.aminmax(frames)
        check_values((low >= 0) & (high <= 1),
                     "frames must be finite and, for a floating dtype, intensities in [0, 1] (NaN, Inf and values "
                     "outside are rejected); for CLIP-normalised frames declare mean= and std=")
        channels = frames.to(torch.float32)
    return streamchat_gray(channels if channels.dim() == 4 else channels[..., None])


def _select(backend: str, gray: torch.Tensor, statistic: str = "moving") -> str:
    # The statistic is passed only when it limits the backends: a selection with extra information is
    # not cached (Op.select), and the other statistics run everywhere.
    if statistic == "streamchat":
        return LK_FLOW.select(backend, gray.device, statistic=statistic)
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
    """``torch.ops.streammem.lk_flow`` (its schema: docs/compile.md).

    Core op on prepared input.

    gray: contiguous (T, H, W) uint8 (scaled by 1/255 on load) or float32 in [0, 1];
    window: odd >= 3, or 0 for the global system; levels: >= 1 (1 with window 0), every level
    at least window + 4 pixels a side beyond level 0; statistic: "moving" or "textured", or
    "streamchat" (then gray is StreamChat's float32 gray of any finite values, levels 1, window odd >= 3
    and at most the frame's sides; min_eig unused).
    Returns (flow_px (T-1,), mean_uv (T-1, 2)).
    """
    return LK_FLOW.impls[backend](gray, window, min_eig, levels, statistic)


@lk_flow.register_fake
def _(gray, window, min_eig, levels, statistic, backend):
    pairs = gray.shape[0] - 1
    return gray.new_empty((pairs,), dtype=torch.float32), gray.new_empty((pairs, 2), dtype=torch.float32)


# --------------------------------------------------------------------------
# Backend: C++ (csrc/cpu/motion/), and the latency path LK_FLOW declares
# --------------------------------------------------------------------------
# The motion entries check no values of their own (floating frames are range-checked before
# the call), so any status but 0 is a bug, which raise_for reports as such.
_MOTION_CHECKS = NativeChecks()
_TENSOR, _STRIDED, _U8 = torch.Tensor, torch.strided, torch.uint8
# Results and scratch buffers are allocated through numpy (about 0.7 us against 1.4 for torch.empty
# with a shape tuple and a dtype); a numpy buffer hands the border its own DLPack capsule
# (ndarray.__dlpack__, ~0.1 us), a tensor its view().
_from_numpy, _np_empty, _NP_F32, _NP_U8 = torch.from_numpy, np.empty, np.float32, np.dtype(np.uint8)


def _cpp_lk_args(window, min_eig, levels, statistic) -> tuple:
    """The C++ lk_flow's scalar arguments after the frames, from validated ones (the reference's
    constants passed down with them)."""
    return (window, min_eig, levels, statistic == "moving", MOVING_FLOOR_PX[0], MOVING_FLOOR_PX[1], MOVING_MIN_AREA,
            GUESS_BOX, SEARCH_RADIUS, SEARCH_QUANT)


def _gray_area_cpp(frames: torch.Tensor, out_hw) -> torch.Tensor:
    """(T, oh, ow) float32 gray in [0, 1] of C-contiguous uint8 CPU frames (T, H, W[, 3]), area resampled."""
    mod, _ = load_native("cpu", "motion")
    gray = _from_numpy(_np_empty((frames.shape[0], *out_hw), _NP_F32))
    _MOTION_CHECKS.raise_for(mod.gray_area(view(frames), view(gray)))
    return gray


def _cpp_flow(gray: torch.Tensor, lk: tuple, score: bool):
    """(flow_px, mean_uv) of contiguous (T, H, W) uint8/float32 CPU gray, and the score when asked."""
    mod, _ = load_native("cpu", "motion")
    pairs = gray.shape[0] - 1
    flow_px, mean_uv = _np_empty(pairs, _NP_F32), _np_empty((pairs, 2), _NP_F32)
    scores = _np_empty(pairs, _NP_F32) if score else None
    _MOTION_CHECKS.raise_for(mod.lk_flow(view(gray), *lk, flow_px.__dlpack__(), mean_uv.__dlpack__(),
                                         None if scores is None else scores.__dlpack__()))
    if score:
        return _from_numpy(flow_px), _from_numpy(scores), _from_numpy(mean_uv)
    return _from_numpy(flow_px), _from_numpy(mean_uv)


def _lk_flow_cpp(gray: torch.Tensor, window: int, min_eig: float, levels: int, statistic: str):
    # contiguous(): the custom op's callers may hand any layout (the public functions' gray already is)
    if statistic == "streamchat":
        return _streamchat_flow_cpp(gray.to(torch.float32).contiguous(), int(window))
    return _cpp_flow(gray.contiguous(), _cpp_lk_args(int(window), float(min_eig), int(levels), statistic),
                     score=False)


def _streamchat_flow_cpp(gray: torch.Tensor, window: int):
    """(flow_px, mean_uv) of StreamChat's reading of contiguous (T, H, W) float32 CPU gray."""
    mod, _ = load_native("cpu", "motion")
    pairs = gray.shape[0] - 1
    flow_px, mean_uv = _np_empty(pairs, _NP_F32), _np_empty((pairs, 2), _NP_F32)
    _MOTION_CHECKS.raise_for(mod.streamchat_flow(view(gray), window, STREAMCHAT_EPS, flow_px.__dlpack__(),
                                                 mean_uv.__dlpack__()))
    return _from_numpy(flow_px), _from_numpy(mean_uv)


def _uint8_plan(frames, size, window, min_eig, levels, statistic, min_frames: int):
    """:func:`_native_plan` of ``frames`` when they are C-contiguous uint8 CPU frames, a tensor or a
    writeable numpy array (DLPack cannot export a read-only one); None otherwise, or for arguments
    the C++ entries do not take: the general path (``_prepare``) then validates and explains."""
    if type(frames) is _TENSOR:
        if not (frames.dtype is _U8 and frames.is_cpu and frames.layout is _STRIDED and frames.is_contiguous()):
            return None
    elif not (isinstance(frames, np.ndarray) and frames.dtype == _NP_U8 and frames.flags.c_contiguous
              and frames.flags.writeable):
        return None
    try:
        return _native_plan(frames.shape, size, window, min_eig, levels, statistic, min_frames)
    except TypeError:  # unhashable arguments: the general path validates (and rejects) them
        return None


@functools.lru_cache(maxsize=256, typed=True)
def _native_plan(shape, size, window, min_eig, levels, statistic, min_frames: int):
    """(gray shape, pairs, working size, lk_flow's scalar arguments) for uint8 frames of ``shape``,
    (T, H, W) or (T, H, W, 3) with T >= ``min_frames``, that the C++ backend prepares (kept or shrunk,
    not enlarged: bilinear is the torch preparation's), with arguments :func:`_plan` accepts; the gray
    shape is None when LK reads the frames as they are (uint8 gray kept at its size).  None otherwise.
    Cached, like :func:`_plan` whose checks it reuses: a stream calls with the same arguments."""
    nd = len(shape)
    if statistic == "streamchat":  # float32 gray of its own (the general path)
        return None
    if not ((nd == 4 and shape[3] == 3) or nd == 3) or shape[0] < min_frames or not shape[1] or not shape[2]:
        return None
    hw = (shape[1], shape[2])
    try:
        window, min_eig, levels, statistic, out_hw = _plan(hw, size, window, min_eig, levels, statistic)
    except ValueError:  # the general path raises it
        return None
    if out_hw[0] > hw[0] or out_hw[1] > hw[1]:
        return None
    gray_shape = None if nd == 3 and out_hw == hw else (shape[0], *out_hw)
    return gray_shape, shape[0] - 1, out_hw, _cpp_lk_args(window, min_eig, levels, statistic)


def _motion_fast(mod, frames, size, window, min_eig, levels, statistic) -> MotionResult | None:
    """motion_magnitude on C-contiguous uint8 CPU frames (:func:`_uint8_plan`): the general path's
    native steps (gray_area when the frames are RGB or shrunk, then lk_flow with the score) on the
    same values, so the same results bit for bit, without Python between them.  None otherwise."""
    plan = _uint8_plan(frames, size, window, min_eig, levels, statistic, 2)
    if plan is None:
        return None
    gray_shape, pairs, _, lk = plan
    gray = view(frames) if type(frames) is _TENSOR else frames.__dlpack__()
    if gray_shape is not None:
        source, gray = gray, _np_empty(gray_shape, _NP_F32).__dlpack__()  # the capsule keeps the buffer alive
        _MOTION_CHECKS.raise_for(mod.gray_area(source, gray))
    flow_px, score, mean_uv = _np_empty(pairs, _NP_F32), _np_empty(pairs, _NP_F32), _np_empty((pairs, 2), _NP_F32)
    _MOTION_CHECKS.raise_for(mod.lk_flow(gray, *lk, flow_px.__dlpack__(), mean_uv.__dlpack__(), score.__dlpack__()))
    return MotionResult(_from_numpy(flow_px), _from_numpy(score), _from_numpy(mean_uv))


def _gate_step_cpp(mod, frames: np.ndarray, anchor: np.ndarray | None, out_hw, lk: tuple):
    """The streaming gate's step on the C++ backend: the (m, oh, ow) float32 stack of the reference
    gray ``anchor`` ((oh, ow), or None at a stream's start) followed by the gray of ``frames`` (a
    writeable C-contiguous uint8 array (n, H, W[, 3])), and the m - 1 scores of its consecutive
    pairs: gray_area and lk_flow as the general path runs them, so the same values bit for bit."""
    first = 0 if anchor is None else 1
    stack = _np_empty((first + frames.shape[0], *out_hw), _NP_F32)
    if first:
        stack[0] = anchor
    _MOTION_CHECKS.raise_for(mod.gray_area(frames.__dlpack__(), stack[first:].__dlpack__()))
    pairs = stack.shape[0] - 1
    score = _np_empty(pairs, _NP_F32)
    if pairs:
        status = mod.lk_flow(stack.__dlpack__(), *lk, _np_empty(pairs, _NP_F32).__dlpack__(),
                             _np_empty((pairs, 2), _NP_F32).__dlpack__(), score.__dlpack__())
        _MOTION_CHECKS.raise_for(status)
    return stack, score


class _BoundGateStep:
    """The streaming gate's step for one frame after a reference on the C++ backend, bound once per
    working size (a stateful latency path): the (2, oh, ow) float32 stack holding the reference gray
    and the new frame's, lk_flow's outputs and their DLPack capsules are made once (a capsule keeps
    its buffer alive).  ``anchor`` is the reference gray: a tensor view of the stack's first plane.
    The same entries on the same values as :func:`_gate_step_cpp`, so the same scores bit for bit."""

    __slots__ = ("mod", "out_hw", "lk", "stack", "anchor", "_new", "_pair", "_outputs", "_score")

    def __init__(self, mod, out_hw, lk: tuple):
        self.mod, self.out_hw, self.lk = mod, out_hw, lk
        self.stack = _np_empty((2, *out_hw), _NP_F32)
        self.anchor = _from_numpy(self.stack[0])
        self._new, self._pair = self.stack[1:].__dlpack__(), self.stack.__dlpack__()
        self._score = _np_empty(1, _NP_F32)
        self._outputs = (_np_empty(1, _NP_F32).__dlpack__(), _np_empty((1, 2), _NP_F32).__dlpack__(),
                         self._score.__dlpack__())

    def score(self, frame: np.ndarray, anchor: torch.Tensor) -> float:
        """The score of ``frame`` (a writeable C-contiguous uint8 array (1, H, W[, 3])) against the
        reference gray ``anchor`` ((oh, ow) contiguous float32 CPU; its values are copied into the
        stack unless it is ``self.anchor``).  The frame's gray stays in the stack's second plane."""
        if anchor is not self.anchor:
            self.stack[0] = anchor.numpy()
        _MOTION_CHECKS.raise_for(self.mod.gray_area(frame.__dlpack__(), self._new))
        _MOTION_CHECKS.raise_for(self.mod.lk_flow(self._pair, *self.lk, *self._outputs))
        return self._score.item()

    def keep_new(self) -> None:
        """The new frame's gray becomes the reference: ``anchor`` holds it."""
        self.stack[0] = self.stack[1]


# --------------------------------------------------------------------------
# Backend: CUDA (csrc/cuda/motion.cu)
# --------------------------------------------------------------------------
def _lk_flow_cuda(gray: torch.Tensor, window: int, min_eig: float, levels: int, statistic: str):
    from ._cuda import CUDA_STAGES

    if statistic == "streamchat":  # refused by _cuda_reasons before dispatch; the custom op may still be called
        raise RuntimeError("motion: the CUDA backend does not compute statistic='streamchat'; use backend='triton'")

    return pyramid_flow(gray, window, min_eig, levels, statistic, CUDA_STAGES)


# --------------------------------------------------------------------------
# Backend: Triton
# --------------------------------------------------------------------------
def _lk_flow_triton(gray: torch.Tensor, window: int, min_eig: float, levels: int, statistic: str):
    from ._triton import TRITON_STAGES, streamchat_flow_triton

    if statistic == "streamchat":
        return streamchat_flow_triton(gray.to(torch.float32).contiguous(), window, STREAMCHAT_EPS)

    return pyramid_flow(gray, window, min_eig, levels, statistic, TRITON_STAGES)


# (atol, rtol) of flow_px and mean_uv against the reference, per frame dtype.  Every
# backend starts from the same float32 gray frames, so the dtype changes nothing:
# triton and cuda reproduce the reference bit for bit; cpp sums windows in another
# order (float32 rounding of sums of w*w products, amplified by the 2x2 solve and, with
# a pyramid, by the rare coarse guess that rounds to the other whole pixel).
_BIT_FOR_BIT = {dtype: (0.0, 0.0) for dtype in FRAME_DTYPES}
_SUMMATION_ORDER = {dtype: (2e-5, 2e-4) for dtype in FRAME_DTYPES}
# The "streamchat" statistic, (atol, rtol) per backend and frame dtype: triton evaluates the reference's
# float32 operations in its order (bit for bit); cpp too, but adds the per-window readings in float64 in
# another order than torch's sum, which may move the float32 result by an ulp.
STREAMCHAT_TOLERANCES = {"torch": _BIT_FOR_BIT, "triton": _BIT_FOR_BIT,
                         "cpp": {dtype: (1e-7, 1e-6) for dtype in FRAME_DTYPES}}


def _cuda_reasons(device, statistic=None, **_):
    if statistic == "streamchat":
        return ["statistic='streamchat' is not implemented on the CUDA backend (the Triton backend computes it)"]
    return []


LK_FLOW = Op(
    "motion",
    {"torch": lk_flow_reference, "cpp": _lk_flow_cpp, "triton": _lk_flow_triton, "cuda": _lk_flow_cuda},
    extra_reasons={"cuda": _cuda_reasons},
    tolerances={"torch": _BIT_FOR_BIT, "triton": _BIT_FOR_BIT, "cuda": _BIT_FOR_BIT, "cpp": _SUMMATION_ORDER},
    fast=_motion_fast,
)
