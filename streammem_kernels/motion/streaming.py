"""``StreamingMotionGate``: the motion gate over a stream, one batch of frames at a time.

:func:`~streammem_kernels.select_frames_mask` decides which frames of a whole clip
the gate keeps; this class makes the same decisions for a stream that arrives in
batches, keeping only the reference frame's working-size gray between pushes.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from .. import checkpoint
from ..runtime.validate import check_float, check_int
from . import (LK_FLOW, _BoundGateStep, _float32_below, _gate_step_cpp, _motion_of_gray, _prepare, _select,
               _uint8_plan)
from .reference import MAX_SIZE, STATISTICS

__all__ = ["StreamingMotionGate", "MAX_GATE_SIZE", "GATE_STATE_VERSION"]

# The working size's upper bound (8K), motion_magnitude's: a typo stops here instead of allocating
# frames of that size.
MAX_GATE_SIZE = MAX_SIZE
# The kind of a gate's own checkpoint file (save / load).
GATE_KIND = "MotionGate"
_FRAME_DTYPE_NAMES = ("uint8", "float16", "bfloat16", "float32", "float64")
# Version of state_dict()'s layout.  Version 1 held the full-size reference frame under "anchor";
# version 2 holds its working-size gray under "anchor_gray".
GATE_STATE_VERSION = 2


def _dtype_name(dtype) -> str:
    """A frame dtype as a string a ``weights_only`` checkpoint can hold ("uint8", "torch.uint8")."""
    return str(dtype)


def _dtype_of(name: str, is_numpy: bool):
    """The frame dtype ``_dtype_name`` wrote (numpy's for numpy streams, torch's for tensor streams)."""
    if is_numpy:
        return np.dtype(name)
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"state's frame_dtype must name a torch dtype, got {name!r}")
    return dtype


class StreamingMotionGate:
    """Streaming motion gate over RGB/gray frames (StreamChat's selective frame stacking).

    Parameters
    ----------
    threshold : float in [0, 1]
        Keep frame t when ``score(reference, t) > threshold`` (the keep rule of
        :func:`~streammem_kernels.select_frames_mask`, decided on float32 scores;
        with ``statistic="streamchat"`` the score is StreamChat's reading, so
        StreamChat's thresholds apply as they are).
    size : int in [8, 8192], optional
        Working resolution (long side) of the flow computation; 224 by default,
        ``None`` keeps the frames' size.
    reference : {"previous", "last_kept"}
        Compare with the previous frame (StreamChat) or with the last kept frame
        (slow drift accumulates until it crosses the threshold).
    window : int or None
        Lucas-Kanade window (odd >= 3) or None for the paper's global solve.
    statistic : {"moving", "textured", "streamchat"}
        How per-pixel flow becomes the score (:func:`~streammem_kernels.motion_magnitude`);
        "streamchat" reads the frames at their own size (``size`` None or their
        long side, e.g. 224 for CLIP crops) with one level.
    levels : int or "auto"
        Pyramid levels (``motion_magnitude``); 1 is single-scale LK.
    backend : str
        Passed to ``motion_magnitude``.
    channels, value_range, mean, std
        The frames' layout and value convention, when not (n, H, W[, C]) uint8
        or [0, 1] floats (:func:`~streammem_kernels.motion_magnitude`): for
        instance CLIP-normalised channel-first frames.  Declared frames take the
        general path.

    ``push(frames)`` takes a batch ``(n, H, W[, 3])`` (or as declared) of consecutive frames and
    returns ``(scores, kept)`` as two length-n lists; the score of the very first
    frame of the stream is reported as 1.0 (kept by definition).  Every frame of
    a stream has one shape and dtype.  The caller may reuse its frame buffer
    (the gate keeps nothing of it).  Not thread-safe: one caller at a time.

    Each frame is converted to the working-size gray once: the gate keeps its
    reference frame's gray, and scores a push from the gray of the reference and
    of the new frames, so the scores are those of ``motion_magnitude`` on the
    stacked full-size frames.  Contiguous uint8 CPU frames on the C++ backend
    take one C++ gate step (gray, then LK and score) per push ("previous") or per
    frame ("last_kept"): the same numbers without Python between the steps.
    """

    def __init__(self, threshold: float = 0.4, *, size: int | None = 224, reference: str = "previous",
                 window: int | None = 5, statistic: str = "moving", levels: int | str = "auto",
                 backend: str = "auto", channels: str = "last", value_range=None, mean=None, std=None):
        threshold = check_float(threshold, "threshold", low=0.0, high=1.0)
        if size is not None:
            size = check_int(size, "size", minimum=8)
            if size > MAX_GATE_SIZE:
                raise ValueError(f"size must be <= {MAX_GATE_SIZE}, got {size}")
        if window is not None:
            window = check_int(window, "window", minimum=3, odd=True)
        if not isinstance(reference, str) or reference not in ("previous", "last_kept"):
            raise ValueError(f"reference must be 'previous' or 'last_kept', got {reference!r}")
        if not isinstance(statistic, str) or statistic not in STATISTICS:
            raise ValueError(f"statistic must be one of {STATISTICS}, got {statistic!r}")
        if levels != "auto":
            levels = check_int(levels, "levels", minimum=1)
        if not isinstance(channels, str) or channels not in ("last", "first"):
            raise ValueError(f"channels must be 'last' ((n, H, W, C) frames) or 'first' ((n, C, H, W)), "
                             f"got {channels!r}")
        if (mean is None) != (std is None):
            raise ValueError(f"mean and std undo one normalisation and go together, got only "
                             f"{'mean' if std is None else 'std'}")
        # (channels, value_range, mean, std), checked against the frames on each push.
        self._convention = (channels, value_range, mean, std)
        self._declared = self._convention != ("last", None, None, None)
        self.threshold = threshold
        self._above = _float32_below(threshold)  # score > threshold  <=>  score > above, for float32 scores
        self.statistic = statistic
        self.levels = levels
        self.size = size
        self.reference = reference
        self.window = window
        self.backend = backend
        # Working-size gray of the previous frame ("previous") or of the last kept frame
        # ("last_kept"); None before a stream's first frame.
        self._anchor_gray = None
        self._frame_spec = None  # (shape, dtype) of the stream's frames, which every push must keep
        self._bound_step = None  # the C++ one-frame step, made on the first push that takes it
        self.frames_seen = 0
        self.frames_kept = 0

    def _gray(self, frames):
        """Working-size gray of (n, H, W[, C]) frames, validated (n >= 1), and the resolved arguments."""
        gray, window, min_eig, levels, statistic = _prepare(frames, self.size, self.window, 1e-5, self.levels,
                                                            self.statistic, self.backend, min_frames=1,
                                                            convention=self._convention)
        if isinstance(frames, torch.Tensor):
            shared = gray.untyped_storage().data_ptr() == frames.untyped_storage().data_ptr()
        else:
            shared = gray.device.type == "cpu" and np.may_share_memory(gray.numpy(), frames)
        if shared:
            gray = gray.clone()  # gray frames at the working size come back as views of the caller's buffer
        return gray, (window, min_eig, levels, statistic, _select(self.backend, gray))

    def _scores(self, gray, args) -> list[float]:
        """Scores of the reference gray (H', W') followed by ``gray`` (m, H', W')."""
        res = _motion_of_gray(torch.cat((self._anchor_gray[None], gray)), *args)
        return res.score.tolist()

    def push(self, frames: Sequence[np.ndarray] | np.ndarray) -> tuple[list[float], list[bool]]:
        """Score and gate a batch of consecutive frames: ``(scores, kept)``, two lists of length n."""
        batch = np.asarray(frames) if not isinstance(frames, torch.Tensor) else frames
        if batch.ndim not in (3, 4):
            raise ValueError(f"frames must have shape (n, H, W) or (n, H, W, C), got {tuple(batch.shape)}")
        n = batch.shape[0]
        if n == 0:
            return [], []
        spec = self._frame_spec
        if spec is not None and (spec[0] != tuple(batch.shape[1:]) or spec[1] != batch.dtype):
            raise ValueError(f"frames must keep the stream's frame shape {spec[0]} and dtype {spec[1]}, got "
                             f"{tuple(batch.shape[1:])} {batch.dtype} (reset() starts a new stream)")
        native = self._native_plan(batch)
        scores, kept = self._push_native(batch, *native) if native is not None else self._push_general(batch)
        if self._frame_spec is None:
            self._frame_spec = (tuple(batch.shape[1:]), batch.dtype)
        self.frames_seen += n
        self.frames_kept += sum(kept)
        return scores, kept

    def _push_general(self, batch) -> tuple[list[float], list[bool]]:
        gray, args = self._gray(batch)  # validates every frame, the first of a stream included
        scores: list[float] = []
        kept: list[bool] = []
        start = 0
        if self._anchor_gray is None:
            scores.append(1.0)
            kept.append(True)
            self._anchor_gray = gray[0]
            start = 1
        elif self._anchor_gray.device != gray.device:  # restored from a CPU checkpoint into a GPU stream
            self._anchor_gray = self._anchor_gray.to(gray.device)
        if self.reference == "previous" and start < len(gray):
            s = self._scores(gray[start:], args)
            scores.extend(s)
            kept.extend(v > self._above for v in s)
            self._anchor_gray = gray[-1]
        else:
            for t in range(start, len(gray)):
                s = self._scores(gray[t:t + 1], args)[0]
                scores.append(s)
                keep = s > self._above
                kept.append(keep)
                if keep:
                    self._anchor_gray = gray[t]
        anchor = self._anchor_gray
        if anchor.untyped_storage().nbytes() != anchor.numel() * anchor.element_size():
            self._anchor_gray = anchor.clone()  # one frame of the batch's gray: do not hold on to the rest
        return scores, kept

    def _native_plan(self, batch):
        """(module, working size, lk_flow's scalar arguments) when the push runs on the C++ gate step:
        uint8 CPU frames that the C++ backend shrinks or converts to float32 gray (gray uint8 frames
        kept at their size stay on the general path, whose gray is uint8), and a float32 CPU
        reference gray of that size, or none yet; else None."""
        mod = LK_FLOW.cpp_module(self.backend)
        if mod is None or self._declared or torch.compiler.is_compiling():
            return None
        plan = _uint8_plan(batch, self.size, self.window, 1e-5, self.levels, self.statistic, 1)
        if plan is None or plan[0] is None:
            return None
        _, _, out_hw, lk = plan
        anchor, bound = self._anchor_gray, self._bound_step
        if anchor is not None and (bound is None or anchor is not bound.anchor) and (
                anchor.dtype != torch.float32 or anchor.device.type != "cpu" or tuple(anchor.shape) != out_hw
                or not anchor.is_contiguous()):
            return None
        return mod, out_hw, lk

    def _push_native(self, batch, mod, out_hw, lk) -> tuple[list[float], list[bool]]:
        """``push`` in one C++ gate step per batch ("previous") or per frame ("last_kept"): gray of the
        new frames written after the reference's, LK and score (motion_magnitude's numbers bit for bit).
        A single frame after a reference takes the step bound to this working size, which keeps the
        reference gray in its own stack."""
        frames = batch.numpy() if isinstance(batch, torch.Tensor) else batch
        steps = (frames,) if self.reference == "previous" else (frames[t:t + 1] for t in range(len(frames)))
        scores: list[float] = []
        kept: list[bool] = []
        for step in steps:
            anchor = self._anchor_gray
            if anchor is not None and len(step) == 1:
                bound = self._bound_step
                if bound is None or bound.out_hw != out_hw or bound.lk != lk:
                    bound = self._bound_step = _BoundGateStep(mod, out_hw, lk)
                score = bound.score(step, anchor)
                keep = score > self._above
                if keep or self.reference == "previous":
                    bound.keep_new()
                self._anchor_gray = bound.anchor
                scores.append(score)
                kept.append(keep)
                continue
            stack, score = _gate_step_cpp(mod, step, None if anchor is None else anchor.numpy(), out_hw, lk)
            s = score.tolist()
            keep = [v > self._above for v in s]
            if anchor is None:  # a stream's first frame is kept
                s, keep = [1.0] + s, [True] + keep
            scores.extend(s)
            kept.extend(keep)
            if self.reference == "previous" or keep[-1]:
                # The stack's last gray; a copy when the stack holds more than the pair (a batch).
                self._anchor_gray = torch.from_numpy(stack[-1] if len(stack) <= 2 else stack[-1].copy())
        return scores, kept

    def state_dict(self) -> dict:
        """The reference frame's working-size gray, the stream's frame shape and dtype, and the counters
        (tensors, strings and numbers only, so ``weights_only`` loading works).

        ``anchor_gray`` is ``(H', W')`` (uint8 for gray uint8 frames kept at their size, else
        float32 in [0, 1]; with ``statistic="streamchat"`` float32 StreamChat gray of the channels as
        normalised, any finite value), ``None`` before the first frame; ``version`` is
        :data:`GATE_STATE_VERSION`.
        """
        gray, spec = self._anchor_gray, self._frame_spec
        return {"version": GATE_STATE_VERSION,
                "anchor_gray": None if gray is None else gray.detach().clone(),
                "frame_shape": None if spec is None else list(spec[0]),
                "frame_dtype": None if spec is None else _dtype_name(spec[1]),
                "anchor_is_numpy": spec is not None and not isinstance(spec[1], torch.dtype),
                "frames_seen": self.frames_seen, "frames_kept": self.frames_kept}

    def load_state_dict(self, state) -> None:
        """Restore ``state_dict()`` output (a dict, or a ``checkpoint.StateReader`` of the gate's state
        inside another object's checkpoint).

        Every field is checked before the gate changes, each failure a ``ValueError`` naming the
        field: the layout version (a state of layout version 1 holds the full-size reference frame
        under ``anchor``), the counters (``0 <= frames_kept <= frames_seen``, a reference frame exactly
        when frames were seen), the frame shape and dtype, and the reference gray: this gate's working
        size and dtype for such a frame (a state saved by a gate with another ``size`` would be
        compared at the wrong scale) and finite intensities in [0, 1] (any finite gray for the
        "streamchat" statistic, whose gray is of the channels as normalised).
        """
        reader = checkpoint.reader_for(state, GATE_KIND)
        if not reader.has("anchor_gray"):
            version = reader.state.get("version", 1)
            raise reader.error("anchor_gray", (
                f"is missing: a motion gate state of layout version {version!r:.20} (the full-size reference "
                f"frame under 'anchor'); this version reads layout {GATE_STATE_VERSION} only: start the stream "
                "anew (reset()) or save the state again with this version"))
        reader.int("version", low=GATE_STATE_VERSION, high=GATE_STATE_VERSION)
        is_numpy = reader.bool("anchor_is_numpy")
        seen = reader.int("frames_seen", low=0)
        kept = reader.int("frames_kept", low=0, high=seen)
        gray = reader.tensor("anchor_gray", dtype=(torch.uint8, torch.float32), ndim=2, finite=True, optional=True)
        spec = None
        reader.require((gray is None) == (seen == 0), "anchor_gray",
                       f"must be present exactly when frames were seen (frames_seen={seen})")
        reader.require(seen == 0 or kept >= 1, "frames_kept", "must be >= 1 once frames were seen (the first is kept)")
        if gray is not None:
            shape = reader.ints("frame_shape", low=1, high=1 << 20)
            first = self._convention[0] == "first"  # this gate takes (C, H, W) frames
            channel = shape[0] if first else shape[-1]
            reader.require(len(shape) in (2, 3) and (len(shape) == 2 or channel in (1, 3)), "frame_shape",
                           f"must be (H, W) or {'(C, H, W)' if first else '(H, W, C)'} with C in (1, 3), got {shape}")
            name = reader.str("frame_dtype")
            known = name.removeprefix("torch.") in _FRAME_DTYPE_NAMES and is_numpy != name.startswith("torch.")
            reader.require(known, "frame_dtype",
                           f"must name a {'numpy' if is_numpy else 'torch'} frame dtype, got {name!r:.40}")
            spec = (tuple(shape), _dtype_of(name, is_numpy))
            want = self._anchor_like(spec)
            reader.require(tuple(gray.shape) == tuple(want.shape) and gray.dtype == want.dtype, "anchor_gray",
                           f"must be this gate's working-size gray of a {tuple(shape)} frame, {tuple(want.shape)} "
                           f"{want.dtype}, got {tuple(gray.shape)} {gray.dtype} (saved by a gate with another size?)")
            if gray.is_floating_point() and self.statistic != "streamchat":
                reader.tensor("anchor_gray", low=0.0, high=1.0)
            gray = gray.clone()
        self._anchor_gray, self._frame_spec, self._bound_step = gray, spec, None
        self.frames_seen, self.frames_kept = seen, kept

    def _anchor_like(self, spec) -> torch.Tensor:
        """The gray this gate makes of one frame of ``spec`` = (shape, dtype): its working size and dtype."""
        shape, dtype = spec
        probe = np.zeros((1, *shape), dtype) if isinstance(dtype, np.dtype) else torch.zeros((1, *shape), dtype=dtype)
        # The reference preparation (any device, any backend) makes grays of the same shape and dtype.
        # The layout decides the gray's shape; a declared value convention keeps float32 gray float32.
        return _prepare(probe, self.size, self.window, 1e-5, self.levels, self.statistic, "torch", min_frames=1,
                        convention=(self._convention[0], None, None, None))[0][0]

    def params(self) -> dict:
        """The constructor's arguments (what :meth:`save` writes beside the state)."""
        channels, value_range, mean, std = self._convention
        return {"threshold": self.threshold, "size": self.size, "reference": self.reference, "window": self.window,
                "statistic": self.statistic, "levels": self.levels, "backend": self.backend, "channels": channels,
                "value_range": value_range, "mean": mean, "std": std}

    def save(self, path) -> None:
        """Write the gate (its parameters and :meth:`state_dict`) to one checkpoint file, atomically
        (``streammem_kernels.checkpoint``: a header, a SHA-256 of the payload, a temporary renamed
        over ``path``)."""
        checkpoint.save(path, GATE_KIND, {"params": self.params(), "state": self.state_dict()},
                        version=GATE_STATE_VERSION)

    @classmethod
    def load(cls, path) -> "StreamingMotionGate":
        """A gate saved with :meth:`save`; every damaged or invalid file is one ``ValueError`` naming
        ``path`` (and the field, for a readable file holding an invalid state)."""
        state, _ = checkpoint.load(path, GATE_KIND, versions=(GATE_STATE_VERSION,))
        reader = checkpoint.StateReader(path, GATE_KIND, state)
        params = reader.dict("params")
        try:
            gate = cls(**params)
        except (TypeError, ValueError) as exc:
            raise reader.error("params", f"are not a gate's parameters ({exc})") from None
        gate.load_state_dict(reader.sub("state"))
        return gate

    def reset(self) -> None:
        """Forget the stream: the next push starts a new one (its first frame is kept)."""
        self._anchor_gray = None
        self._frame_spec = None
        self._bound_step = None
        self.frames_seen = 0
        self.frames_kept = 0
