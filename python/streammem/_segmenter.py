"""Checkpointing and cross-stream batching of ``streammem_kernels.StreamingSegmenter``.

The kernel class has no public state API yet, so this module is the one place
that reads and writes its state fields (the last frame, the window's
similarities, frames in the window, the last event end, the cpp backend's last
squared norm, the frame counter).  Everything else in ``streammem`` goes
through the three functions here; if the kernel's fields change, this module
fails loudly (``RuntimeError`` naming the field) instead of misbehaving.

``push_many`` pushes one frame for each of B *independent* single-stream
segmenters in one kernel call.  The kernel's batched mode needs a common frame
counter, while independent streams have seen different numbers of frames; every
decision of the step is invariant under shifting a stream's frame numbers
(``t - last_end``, ``t - window + choice``, ``frames_in_window``), so each
stream's ``last_end`` is shifted to the common counter (the largest one) for the
call and shifted back afterwards.  A stream that has not seen a frame yet gets
a zero last frame with ``frames_in_window = 0``, so its (meaningless) first
similarity is ignored exactly as in its own first push.  The result equals
pushing each segmenter on its own (tested on every CPU backend).
"""
from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["segmenter_state", "load_segmenter_state", "push_many"]

_FIELDS = ("frames_seen", "_batched", "_last_frame", "_window_sims", "_frames_in_window", "_last_end",
           "_last_norm", "_backend_name", "params", "backend")


def _check(seg) -> None:
    missing = [f for f in _FIELDS if not hasattr(seg, f)]
    if missing:
        raise RuntimeError(f"StreamingSegmenter lacks the state fields {missing} that streammem._segmenter "
                           "reads; update streammem/_segmenter.py for the new kernel API")


def _clone(t):
    return None if t is None else t.detach().clone()


def segmenter_state(seg) -> dict:
    """Everything a ``StreamingSegmenter`` needs to continue exactly (tensors, numbers, strings)."""
    _check(seg)
    return {
        "frames_seen": int(seg.frames_seen),
        "batched": seg._batched,
        "backend_name": seg._backend_name,
        "last_frame": _clone(seg._last_frame),
        "window_sims": _clone(seg._window_sims),
        "frames_in_window": _clone(seg._frames_in_window),
        "last_end": _clone(seg._last_end),
        "last_norm": _clone(seg._last_norm),
    }


def load_segmenter_state(seg, state: dict) -> None:
    """Restore ``segmenter_state`` output into a segmenter built with the same parameters."""
    _check(seg)
    seg.frames_seen = int(state["frames_seen"])
    seg._batched = state["batched"]
    seg._backend_name = state["backend_name"]
    for name in ("last_frame", "window_sims", "frames_in_window", "last_end", "last_norm"):
        setattr(seg, "_" + name, _clone(state[name]))


def push_many(segmenters: Sequence, features: torch.Tensor) -> list[list]:
    """Push row b of ``features`` (B, D) into single-stream segmenter b, in one kernel call.

    Returns, per segmenter, the events its push closed (frame numbers in that
    segmenter's own stream).  Segmenters must share their parameters and
    backend; otherwise (or for B = 1) they are pushed one by one.
    """
    from streammem_kernels import StreamingSegmenter
    from streammem_kernels.boundaries import Event, _select, _to_kernel_dtype

    segs = list(segmenters)
    if features.dim() != 2 or features.shape[0] != len(segs):
        raise ValueError(f"features must be (B, D) with B = {len(segs)} segmenters, got {tuple(features.shape)}")
    for seg in segs:
        _check(seg)
        if seg._batched:
            raise ValueError("push_many takes single-stream segmenters; got one already used with (B, D) pushes")
    x = _to_kernel_dtype(features).contiguous()
    first = segs[0]
    names = {seg._backend_name for seg in segs if seg._backend_name is not None}
    name = names.pop() if len(names) == 1 else (_select(first.backend, x) if not names else None)
    same = name is not None and all(seg.params == first.params and seg.backend == first.backend for seg in segs)
    if len(segs) == 1 or not same:
        return [seg.push(x[b]) for b, seg in enumerate(segs)]

    B, D = x.shape
    p = first.params
    common = max(seg.frames_seen for seg in segs)
    shift = torch.tensor([common - seg.frames_seen for seg in segs], dtype=torch.int64)
    batch = StreamingSegmenter(p.window, p.tau, p.min_depth, p.peak, p.max_event, p.drift, backend=first.backend)
    batch._batched = True
    batch._backend_name = name
    batch.frames_seen = common
    if common > 0:  # else the batch segmenter's own first push sets everything up
        fresh = [seg._last_frame is None for seg in segs]

        def rows(field, empty):
            return torch.cat([empty() if f else getattr(seg, field) for seg, f in zip(segs, fresh)])

        batch._last_frame = rows("_last_frame", lambda: torch.zeros(1, D)).contiguous()
        batch._window_sims = rows("_window_sims", lambda: torch.zeros(1, p.window)).contiguous()
        batch._frames_in_window = rows("_frames_in_window", lambda: torch.zeros(1, dtype=torch.int64))
        batch._last_end = rows("_last_end", lambda: torch.full((1,), -1, dtype=torch.int64)) + shift
        if name == "cpp":
            batch._last_norm = rows("_last_norm", lambda: torch.zeros(1, dtype=torch.float64)).contiguous()
    events = batch.push(x)
    out: list[list] = [[] for _ in segs]
    for e in events:
        s = int(shift[e.stream])
        out[e.stream].append(Event(0, e.start - s, e.end - s))
    last_end = batch._last_end - shift
    for b, seg in enumerate(segs):
        seg._batched = False
        seg._backend_name = name
        seg.frames_seen += 1
        seg._last_frame = batch._last_frame[b:b + 1].clone()
        seg._window_sims = batch._window_sims[b:b + 1].clone()
        seg._frames_in_window = batch._frames_in_window[b:b + 1].clone()
        seg._last_end = last_end[b:b + 1].clone()
        seg._last_norm = batch._last_norm[b:b + 1].clone() if batch._last_norm is not None else None
    return out
