"""Depth-score event boundaries for video and dialogue streams.

StreamRAG's Stream Event Segmentation (sec. 3.2) decides when a stream's
knowledge base is updated: cosine similarity of adjacent frame features, depth
scores inside a sliding window of ``w`` frames (TextTiling's depth score as used
by VideoLLaMB), and a boundary where a depth score exceeds ``mu + tau * sigma``
of the window's depth scores.  ProStream (sec. 5.1) instead cuts a dialogue
stream where the cosine of consecutive utterance embeddings drops below
``tau_drift``, or when the buffer reaches capacity.  This module gives both as
exact, bounded-state kernels: a streaming segmenter (:class:`StreamingSegmenter`)
and an offline detector (:func:`detect_boundaries`) that emit the same events.

Semantics (every backend, streaming and offline)
------------------------------------------------
* Frames are indexed from 0 per stream.  ``s_i = cos(v_i, v_{i+1})`` lies
  between frames i and i+1 (a zero vector has similarity 0 with anything).
  An event is an inclusive range ``(start, end)`` of frame indices.
* Depth score of similarity i inside a sequence ``s``:
  ``d_i = ((c_l - s_i) + (c_r - s_i)) / 2`` where, for ``peak="climb"``, c_l is
  found by walking left from i while values do not decrease (stopping at the
  first drop, as TextTiling and VideoLLaMB do) and c_r likewise to the right;
  for ``peak="max"`` c_l and c_r are the maxima of ``s[0..i]`` and
  ``s[i..M-1]``.  Depth scores are computed in float64.
* The analysis window holds the frames after the last boundary, at most the
  newest ``window + 1`` of them (so at most ``window`` similarities).  Nothing
  is decided until it holds ``window + 1`` frames.
* When it is full: the depth score of each similarity in the window is computed
  with peaks searched only inside the window; mu and sigma (population) are
  taken over those ``window`` depth scores; candidates are similarities with
  ``d > mu + tau * sigma`` and ``d > min_depth`` (both strict; sigma = 0, i.e.
  all depth scores equal, gives none).  If there is a candidate, the one with
  the largest depth (earliest on ties), at similarity j, gives a boundary at its
  left frame ``b = j``: the event ``(previous end + 1, b)`` is emitted and the
  window keeps only the frames after b.  Otherwise the oldest frame leaves the
  window when the next one arrives.
* ``max_event=n``: an open event that reaches n frames is closed at once (after
  the window rule has been applied for that frame).
* ``drift=tau_d`` (ProStream mode): the window rule is replaced by a boundary
  at frame t-1 whenever ``cos(v_t, v_{t-1}) < tau_d`` and frame t-1 is after
  the last boundary; still combined with ``max_event``.
* ``flush()`` closes the open event; afterwards the events are contiguous,
  non-overlapping and cover every pushed frame exactly once, for every stream.

Why ``min_depth``
-----------------
The paper's relative rule alone fires in almost every full window: the largest
of eight depth scores nearly always lies above ``mu + 0.7 sigma``.  On real
clips with EfficientNet-lite0 features the literal rule finds every cut at a
precision of about 0.1; the absolute floor ``d > 0.2`` keeps the cuts and drops
the rest.  ``min_depth=0`` is the paper's literal rule.  To calibrate the floor
for another encoder, compute :func:`adjacent_cosine` on a few clips without
cuts and set ``min_depth`` above the largest depth score that
:func:`depth_scores` gives there (and below the depth of the cuts you want).

Backends: ``torch`` (the reference), ``cpp`` (OpenMP over streams: fused
normalise + dot in one pass over the features, per-window decisions, the
sequential event scan), ``triton`` (one program per (stream, time tile) for the
similarity pass and the window decisions, one program per stream block for the
event scan).

Identical decisions on every backend.  Similarities are dot products and
squared norms summed in float64 (exact products of float32 values, no
overflow for any finite float32 feature), rounded once to float32.  Every
decision is then float64 arithmetic in the reference's operation order:
depth scores, mu and sigma summed left to right, correctly rounded division
and square root, no fused multiply-add (the Triton kernels are launched with
floating-point fusion off, and ``streammem_kernels.runtime.aot`` checks their PTX),
and ``tau``, ``min_depth`` and ``drift`` compared as the float64 values given.
Given the same similarities, the backends therefore make the same decisions
bit for bit; the similarities themselves are equal unless a float64 sum lies
within its last bits of a float32 rounding boundary.

Device-resident forms.  :func:`detect_boundaries`, :meth:`StreamingSegmenter.push`
and :meth:`~StreamingSegmenter.flush` return Python :class:`Event` objects,
which reads the decisions on the host.  :func:`event_ends`,
:meth:`StreamingSegmenter.push_tensors` and
:meth:`~StreamingSegmenter.flush_tensors` return tensors instead and, on CUDA
tensors, never synchronise with the host (value checks are device-side
assertions), so a GPU pipeline can keep them inside a CUDA graph; the
Python-returning functions are thin wrappers around them.

Per-call fast path: :func:`detect_boundaries` on C-contiguous float32 CPU
features without autograd, with plain Python parameters and the ``cpp``
backend (``auto`` without a ``STREAMMEM_BACKEND`` override, or ``"cpp"``),
is one native call (cosines, finiteness check, window rule and scan of the
three C++ kernels, fused) returning the same events and raising the same
``ValueError``; every other input takes the general path.
"""
from __future__ import annotations

import functools

from typing import NamedTuple

import torch

from ..runtime.validate import cpu_fast_path
from ..runtime.dispatch import Op, call_op, load_native
from ..runtime.validate import (as_tensor, check_dtype, check_finite, check_float, check_int, check_nonempty, check_rank,
                     check_values)

__all__ = ["Event", "SegmentStep", "adjacent_cosine", "depth_scores", "StreamingSegmenter", "detect_boundaries",
           "event_ends"]

_FEATURE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_PEAKS = ("climb", "max")
_PEAK_CODE = {"climb": 0, "max": 1}
# Largest analysis window.  Each push costs O(window) per stream and the offline pass O(T * window), so a
# window beyond this is a mistake rather than a configuration (StreamRAG uses 8); checked before any
# state or native scratch is allocated.
MAX_WINDOW = 1 << 16


class Event(NamedTuple):
    """One closed event: frames ``start..end`` (inclusive) of stream ``stream``."""

    stream: int
    start: int
    end: int


class SegmentStep(NamedTuple):
    """The events one push (or flush) closed, as tensors on the features' device.

    ``start`` and ``end`` are ``(B, 2)`` int64 (``(2,)`` for a single stream):
    slot 0 holds the event closed by the window rule (or the drift rule), slot 1
    the event closed by ``max_event`` (or by ``flush``); both are ``-1`` where
    that slot closed nothing, so ``end >= 0`` are the per-stream event-end
    flags.  A push closes at most one event per slot, and slot 0's event
    precedes slot 1's.  :meth:`events` turns it into :class:`Event` objects
    (one host round trip).
    """

    start: torch.Tensor
    end: torch.Tensor

    def events(self) -> list[Event]:
        """The closed events, sorted by (stream, start): reads the tensors on the host."""
        start, end = self.start.reshape(-1, 2), self.end.reshape(-1, 2)
        rows = torch.stack((start, end), dim=-1).tolist()  # the one host synchronisation
        return [Event(s, a, b) for s, slots in enumerate(rows) for a, b in slots if b >= 0]


# --------------------------------------------------------------------------
# Public functions: contract, validation, preparation
# --------------------------------------------------------------------------
def adjacent_cosine(features, *, backend: str = "auto") -> torch.Tensor:
    """Cosine similarity of every pair of adjacent frames.

    Parameters
    ----------
    features : (T, D) or (B, T, D) tensor or array, floating
        Frame features of one stream or of B streams.  Not modified.
    backend : {"auto", "torch", "cpp", "triton"}

    Returns
    -------
    (T-1,) or (B, T-1) float32 tensor, ``s_i = cos(v_i, v_{i+1})`` clamped to
    [-1, 1]; a pair with a zero vector gives 0.
    """
    x, batched = _prepare_features(features, "features")
    sims = _checked_cosines(x, _select(backend, x), "features")
    return sims if batched else sims[0]


def depth_scores(sim, *, peak: str = "climb", backend: str = "auto") -> torch.Tensor:
    """TextTiling depth score of every similarity of a sequence.

    ``d_i = ((c_l - s_i) + (c_r - s_i)) / 2``; ``peak="climb"`` walks left
    (right) from i while values do not decrease and takes the value where it
    stops; ``peak="max"`` takes the maximum of ``s[0..i]`` (``s[i..M-1]``).
    Peaks are searched over the whole given sequence (the segmenters call this
    on each window).

    Parameters
    ----------
    sim : (M,) or (B, M) floating tensor or array
    peak : {"climb", "max"}
    backend : {"auto", "torch", "cpp", "triton"}

    Returns
    -------
    Same shape as ``sim``; float64 when ``sim`` is float64, else float32
    (computed in float64).
    """
    sim = as_tensor(sim, "sim")
    check_rank(sim, "sim", (1, 2), "(M,) or (B, M)")
    check_dtype(sim, "sim", _FEATURE_DTYPES)
    check_finite(sim, "sim")
    peak = _check_peak(peak)
    x = sim if sim.dim() == 2 else sim[None]
    x = x.to(torch.float32).contiguous()
    out_dtype = torch.float64 if sim.dtype == torch.float64 else torch.float32
    # The decision arithmetic is float64 on float32 similarities; a float64
    # input is rounded to float32 first so every entry point sees one precision.
    name = _select(backend, x)
    d = call_op(torch.ops.streammem.window_depth, WINDOW_DEPTH.impls, name, x, _PEAK_CODE[peak]).to(out_dtype)
    return d if sim.dim() == 2 else d[0]


def detect_boundaries(features, *, window: int = 8, tau: float = 0.7, min_depth: float = 0.2,
                      peak: str = "climb", max_event: int | None = None, drift: float | None = None,
                      backend: str = "auto") -> list[Event]:
    """Offline event segmentation: exactly the events :class:`StreamingSegmenter`
    emits when the same frames are pushed one at a time and then flushed.

    Parameters
    ----------
    features : (T, D) or (B, T, D) tensor or array, floating, T >= 1
    window, tau, min_depth, peak, max_event, drift
        As for :class:`StreamingSegmenter` (the module docstring gives the rule).
    backend : {"auto", "torch", "cpp", "triton"}

    Returns
    -------
    list of :class:`Event` sorted by (stream, start); ``stream`` is 0 for a
    (T, D) input.  Per stream the events cover frames 0..T-1 exactly once.
    Building Python objects reads the result on the host; :func:`event_ends`
    is the same computation with a tensor result that stays on the device.
    """
    if cpu_fast_path(features):
        shape = features.shape
        nd = len(shape)
        if (nd == 2 or nd == 3) and features.numel() and _plain_params(window, tau, min_depth, peak, max_event, drift):
            mod = None if _is_compiling() else ADJACENT_COSINE.cpp_module(backend)  # no import while tracing
            if mod is not None:
                # One native call: cosines, the finiteness check (same message), window rule, scan.
                B, T, D = shape if nd == 3 else (1, *shape)
                rows = mod.detect_events_ptr(features.data_ptr(), B, T, D, window, tau, min_depth, _PEAK_CODE[peak],
                                             0 if max_event is None else min(max_event, 1 << 62),
                                             _NAN if drift is None else drift)
                return [Event(*row) for row in rows.tolist()]
    return _events_from_ends(_event_ends(features, window, tau, min_depth, peak, max_event, drift, backend))


def event_ends(features, *, window: int = 8, tau: float = 0.7, min_depth: float = 0.2, peak: str = "climb",
               max_event: int | None = None, drift: float | None = None, backend: str = "auto") -> torch.Tensor:
    """Device-resident :func:`detect_boundaries`: which frames end an event.

    Parameters are those of :func:`detect_boundaries`.

    Returns
    -------
    (T,) or (B, T) bool tensor on the device of ``features``: ``True`` at the
    last frame of every event (the last frame always is), i.e. the events of
    a stream are the runs between consecutive ``True`` entries.  On CUDA
    tensors nothing synchronises with the host (the finiteness check is a
    device-side assertion), so this can run inside a CUDA graph.
    """
    ends = _event_ends(features, window, tau, min_depth, peak, max_event, drift, backend)
    return ends if as_tensor(features, "features").dim() == 3 else ends[0]


def _event_ends(features, window, tau, min_depth, peak, max_event, drift, backend) -> torch.Tensor:
    params = _check_params(window, tau, min_depth, peak, max_event, drift)
    x, _ = _prepare_features(features, "features")
    return _detect_ends(x, params, _select(backend, x))


def _state_field(name: str) -> property:
    """A state field of :class:`StreamingSegmenter` whose assignment drops push()'s fast-path
    binding (it holds the state tensors' data pointers)."""
    slot = "_state" + name

    def get(self):
        return self.__dict__[slot]

    def set(self, value):
        self.__dict__[slot] = value
        self.__dict__["_fast_step"] = None

    return property(get, set, doc=f"state field {name} (assigning it unbinds push()'s fast path)")


class StreamingSegmenter:
    """Bounded-state event segmentation of one stream or B independent streams.

    Parameters
    ----------
    window : int in [2, 65536]
        Similarities in the analysis window (the window holds ``window + 1``
        frames).  StreamRAG uses 8.
    tau : float >= 0
        Relative threshold: candidates have ``d > mu + tau * sigma``.
    min_depth : float >= 0
        Absolute floor: candidates also have ``d > min_depth`` (0 is the
        paper's literal rule; see the module docstring for calibration).
    peak : {"climb", "max"}
        How the depth score finds its left and right peaks.
    max_event : int >= 1, optional
        Close an open event as soon as it holds this many frames.
    drift : float in [-1, 1], optional
        ProStream mode: cut after frame t-1 when ``cos(v_t, v_{t-1}) < drift``
        (replaces the window rule).
    backend : {"auto", "torch", "cpp", "triton", "cuda"}
        ``cuda``: one fused launch per push for all streams (CUDA tensors).

    Notes
    -----
    State per stream: the last frame's features, the window's similarities
    (``window`` floats) and three counters, so memory does not grow with the
    stream and each push costs O(D + window) per stream (one adjacent cosine and
    one window decision).  The first push fixes the layout: ``(D,)`` for a
    single stream or ``(B, D)`` for B streams; later pushes must match.
    ``flush()`` closes every open event; pushing afterwards starts new events
    (frame indices keep counting).  :meth:`push_tensors` and
    :meth:`flush_tensors` are the device-resident forms of :meth:`push` and
    :meth:`flush` (a :class:`SegmentStep` of tensors, no host synchronisation).

    Thread safety: a segmenter is a sequential state machine (frame order is
    its input), so one instance must not be pushed from two threads at once;
    give each stream source its own segmenter (several segmenters in several
    threads are safe, interpreted Triton launches included, which
    ``streammem_kernels`` serialises), or serialise pushes with a lock.
    """

    _batched = _state_field("_batched")
    _last_frame = _state_field("_last_frame")
    _last_norm = _state_field("_last_norm")
    _window_sims = _state_field("_window_sims")
    _frames_in_window = _state_field("_frames_in_window")
    _last_end = _state_field("_last_end")
    _backend_name = _state_field("_backend_name")

    def __init__(self, window: int = 8, tau: float = 0.7, min_depth: float = 0.2, peak: str = "climb",
                 max_event: int | None = None, drift: float | None = None, *, backend: str = "auto"):
        self.params = _check_params(window, tau, min_depth, peak, max_event, drift)
        if backend is not None and (not isinstance(backend, str)):
            raise ValueError(f"backend must be a string, got {backend!r}")
        self.backend = backend
        self.frames_seen = 0
        self._batched: bool | None = None
        self._last_frame: torch.Tensor | None = None  # (B, D) as pushed (converted like offline input)
        self._window_sims: torch.Tensor | None = None  # (B, window) float32, newest on the right
        self._frames_in_window: torch.Tensor | None = None  # (B,) int64, 0..window+1
        self._last_end: torch.Tensor | None = None  # (B,) int64, -1 before the first event
        self._last_norm: torch.Tensor | None = None  # (B,) float64 squared norm of the last frame (cpp only)
        self._depth_scratch: torch.Tensor | None = None  # (B, window) float64 (cuda only)
        self._backend_name: str | None = None
        # push()'s per-frame fast path (C++ backend): the native step with the state's pointers bound.
        self._fast_step = None
        self._fast_shape: tuple | None = None

    @property
    def num_streams(self) -> int | None:
        return None if self._last_frame is None else self._last_frame.shape[0]

    def push(self, features) -> list[Event]:
        """Push one frame (``(D,)``) or one frame per stream (``(B, D)``).

        Returns the events closed by this push, sorted by (stream, start).
        Returning Python objects reads the decisions on the host (one
        synchronisation per push on a GPU); :meth:`push_tensors` is the
        device-resident form, which this wraps.
        """
        fast = self._fast_step
        if (fast is not None and type(features) is torch.Tensor and features.dtype is torch.float32
                and features.shape == self._fast_shape and features.is_cpu and not features.requires_grad
                and features.is_contiguous()):
            # The C++ backend on a float32 contiguous CPU frame of the fixed layout: one native call
            # that checks the frame (ValueError on NaN/Inf, state untouched) and steps every stream.
            rows = fast(features.data_ptr(), self.frames_seen)
            self.frames_seen += 1
            return [Event(*row) for row in rows.tolist()] if len(rows) else []
        x = self._admit(features)
        if self._backend_name == "cpp":
            events = self._push_cpp(x)
            if self._fast_step is None:
                self._bind_fast_step()
            return events
        return STREAM_STEP.impls[self._backend_name](self, x).events()

    def push_tensors(self, features) -> SegmentStep:
        """Device-resident :meth:`push`: the closed events as a :class:`SegmentStep` of tensors.

        Same input and state update as :meth:`push`.  On CUDA tensors (backend
        ``torch`` or ``triton``) nothing synchronises with the host: decisions
        are made for every stream as tensors (no data-dependent subsets), and
        the finiteness check is a device-side assertion.  The frame index is
        host state (a counter of pushes), so a CUDA graph captured around
        pushes replays those frame indices.
        """
        x = self._admit(features)
        return STREAM_STEP.impls[self._backend_name](self, x)

    def _admit(self, features) -> torch.Tensor:
        """Validate a push, fix the layout and backend on the first one; (B, D) float32 features."""
        x = as_tensor(features, "features")
        check_rank(x, "features", (1, 2), "(D,) for one stream or (B, D) for B streams")
        check_dtype(x, "features", _FEATURE_DTYPES)
        check_nonempty(x, "features")
        check_finite(x, "features")
        batched = x.dim() == 2
        x = x if batched else x[None]
        if self._batched is None:
            self._batched = batched
        elif batched != self._batched:
            raise ValueError(
                f"features must keep the layout of the first push ({'(B, D)' if self._batched else '(D,)'}), "
                f"got shape {tuple(features.shape)}"
            )
        if self._last_frame is not None:
            if x.shape[1] != self._last_frame.shape[1]:
                raise ValueError(
                    f"features must have D={self._last_frame.shape[1]} like earlier pushes, got D={x.shape[1]}")
            if x.shape[0] != self._last_frame.shape[0]:
                raise ValueError(f"features must hold B={self._last_frame.shape[0]} streams like earlier pushes, "
                                 f"got {x.shape[0]}")
        x = _to_kernel_dtype(x)
        if self._window_sims is None:
            B = x.shape[0]
            self._backend_name = STREAM_STEP.select(self.backend, x.device)  # fixed for the segmenter's life
            self._window_sims = torch.zeros((B, self.params.window), dtype=torch.float32, device=x.device)
            self._frames_in_window = torch.zeros(B, dtype=torch.int64, device=x.device)
            self._last_end = torch.full((B,), -1, dtype=torch.int64, device=x.device)
            if self._backend_name == "cpp":
                self._last_frame = torch.zeros_like(x, memory_format=torch.contiguous_format)
                self._last_norm = torch.zeros(B, dtype=torch.float64)
            elif self._backend_name == "cuda":
                self._last_frame = torch.zeros_like(x, memory_format=torch.contiguous_format)
                self._depth_scratch = torch.empty((B, self.params.window), dtype=torch.float64, device=x.device)
        return x

    def _step(self, x: torch.Tensor) -> SegmentStep:
        """One push on the torch/Triton backends: tensors only, every stream decided at once (the
        reference of the fused C++ and CUDA steps)."""
        p = self.params
        name = self._backend_name
        t = self.frames_seen
        none = torch.full((x.shape[0],), -1, dtype=torch.int64, device=x.device)
        fiw = torch.clamp(self._frames_in_window + 1, max=p.window + 1)
        last_end = self._last_end
        rule_start, rule_end = none, none
        if self._last_frame is not None:
            # The same core op as the offline pass on a (B, 2, D) pair, so both
            # paths see bit-identical similarities.
            pair = torch.stack((self._last_frame, x), dim=1)
            sim = call_op(torch.ops.streammem.adjacent_cosine, ADJACENT_COSINE.impls, name, pair)[:, 0]
            in_window = fiw >= 2  # frame t-1 is after the last boundary
            if p.drift is None:
                shifted = torch.cat((self._window_sims[:, 1:], sim[:, None]), dim=1)
                self._window_sims = torch.where(in_window[:, None], shifted, self._window_sims)
                # Every stream's window is decided; only the full ones count.
                choice = call_op(torch.ops.streammem.window_choices, WINDOW_CHOICES.impls, name,
                                 self._window_sims, p.window, p.tau, p.min_depth, p.peak_code)[:, 0]
                cut = (fiw == p.window + 1) & (choice >= 0)
                boundary = t - p.window + choice  # left frame of the chosen similarity
            else:
                cut = in_window & (sim.double() < p.drift)
                boundary = none + t  # frame t - 1
            rule_start = torch.where(cut, last_end + 1, none)
            rule_end = torch.where(cut, boundary, none)
            last_end = torch.where(cut, boundary, last_end)
            fiw = torch.where(cut, t - boundary, fiw)
        cap_start, cap_end = none, none
        if p.max_event is not None:
            cap = (t - last_end) >= p.max_event
            cap_start = torch.where(cap, last_end + 1, none)
            cap_end = torch.where(cap, t, none)
            last_end = torch.where(cap, t, last_end)
            fiw = torch.where(cap, 0, fiw)
        self._frames_in_window = fiw
        self._last_end = last_end
        self._last_frame = x.clone()
        self.frames_seen = t + 1
        return self._shaped(SegmentStep(torch.stack((rule_start, cap_start), dim=1),
                                        torch.stack((rule_end, cap_end), dim=1)))

    def _shaped(self, step: SegmentStep) -> SegmentStep:
        return step if self._batched else SegmentStep(step.start[0], step.end[0])

    def _step_from_events(self, events: list[Event], B: int, t: int) -> SegmentStep:
        # The C++ step returns Python rows: at most a rule event and an event ending at t per stream.
        start = torch.full((B, 2), -1, dtype=torch.int64)
        end = torch.full((B, 2), -1, dtype=torch.int64)
        for e in events:
            slot = 1 if e.end == t else 0
            start[e.stream, slot], end[e.stream, slot] = e.start, e.end
        return self._shaped(SegmentStep(start, end))

    def _step_cpp(self, x: torch.Tensor) -> SegmentStep:
        return self._step_from_events(self._push_cpp(x), x.shape[0], self.frames_seen - 1)

    def _step_cuda(self, x: torch.Tensor) -> SegmentStep:
        from ._cuda import stream_step_cuda

        p = self.params
        start, end = stream_step_cuda(x, self._last_frame, self._window_sims, self._depth_scratch,
                                      self._frames_in_window, self._last_end, self.frames_seen, p,
                                      has_last=self.frames_seen > 0)
        self.frames_seen += 1
        return self._shaped(SegmentStep(start, end))

    def _bind_fast_step(self) -> None:
        """Bind the state's data pointers to the native step (push()'s fast path).

        Only when every state tensor is a C-contiguous CPU tensor of the layout the kernel reads.
        The C++ step updates them in place, so the pointers stay valid until one of the state
        fields is assigned (by this class or by a checkpoint restore): every such assignment goes
        through :func:`_state_field`'s setter, which drops the binding, and the next general
        push binds again.
        """
        state = (self._last_frame, self._last_norm, self._window_sims, self._frames_in_window, self._last_end)
        if self._batched is None or any(t is None for t in state):
            return
        B, D = self._last_frame.shape if self._last_frame.dim() == 2 else (0, 0)
        layout = ((torch.float32, (B, D)), (torch.float64, (B,)), (torch.float32, (B, self.params.window)),
                  (torch.int64, (B,)), (torch.int64, (B,)))
        if B < 1 or not all(type(t) is torch.Tensor and t.is_cpu and t.dtype == dtype and tuple(t.shape) == shape
                            and t.is_contiguous() for t, (dtype, shape) in zip(state, layout)):
            return
        mod, _ = load_native("cpu", "boundaries")
        step = getattr(mod, "stream_step_ptr", None)
        if step is None:  # an extension built before the fast path: the general path still works
            return
        p = self.params
        fast = functools.partial(step, *(t.data_ptr() for t in state), B, D, p.window, p.tau, p.min_depth,
                                 p.peak_code, p.max_event or 0, float("nan") if p.drift is None else p.drift)
        self._fast_shape = (B, D) if self._batched else (D,)
        self._fast_step = fast

    def _push_cpp(self, x: torch.Tensor) -> list[Event]:
        # One fused native call: similarity, window shift, decision and state
        # update for every stream; the state tensors are updated in place.
        mod, _ = load_native("cpu", "boundaries")
        p = self.params
        rows = mod.stream_step(
            x.contiguous().numpy(), self._last_frame.numpy(), self._last_norm.numpy(), self._window_sims.numpy(),
            self._frames_in_window.numpy(), self._last_end.numpy(), self.frames_seen, p.window, p.tau,
            p.min_depth, p.peak_code, p.max_event or 0, float("nan") if p.drift is None else p.drift,
        )
        self.frames_seen += 1
        return [Event(*row) for row in rows.tolist()]

    # ------------------------------------------------------------------
    # State: checkpoints and cross-stream batching
    # ------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything the segmenter needs to continue exactly: tensors (cloned), numbers and strings
        only, so ``torch.load(weights_only=True)`` reads it back.

        Keys: ``frames_seen``, ``batched`` (None before the first push), ``backend_name``, and the
        state tensors ``last_frame`` (B, D), ``window_sims`` (B, window) float32,
        ``frames_in_window`` (B,) int64, ``last_end`` (B,) int64 and ``last_norm`` (B,) float64
        (the C++ backend's; None elsewhere), each None before the first push.
        """
        return {
            "frames_seen": int(self.frames_seen),
            "batched": self._batched,
            "backend_name": self._backend_name,
            "last_frame": _cloned(self._last_frame),
            "window_sims": _cloned(self._window_sims),
            "frames_in_window": _cloned(self._frames_in_window),
            "last_end": _cloned(self._last_end),
            "last_norm": _cloned(self._last_norm),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` output into a segmenter built with the same parameters."""
        self.frames_seen = int(state["frames_seen"])
        self._batched = state["batched"]
        self._backend_name = state["backend_name"]
        for name in ("last_frame", "window_sims", "frames_in_window", "last_end", "last_norm"):
            setattr(self, "_" + name, _cloned(state[name]))

    @staticmethod
    def push_many(segmenters, features) -> list[list[Event]]:
        """Push row b of ``features`` (B, D) into single-stream segmenter b, in one kernel call.

        Returns, per segmenter, the events its push closed (frame numbers in that segmenter's
        own stream).  Segmenters must share their parameters and backend; otherwise (or for
        B = 1) they are pushed one by one.  The result equals pushing each on its own.

        The batched step needs a common frame counter, while independent streams have seen
        different numbers of frames.  Every decision of the step is invariant under shifting a
        stream's frame numbers (``t - last_end``, ``t - window + choice``, ``frames_in_window``),
        so each stream's ``last_end`` is shifted to the common counter (the largest one) for the
        call and shifted back afterwards.  A stream that has not seen a frame yet gets a zero
        last frame with ``frames_in_window = 0``, so its (meaningless) first similarity is
        ignored exactly as in its own first push.
        """
        segs = list(segmenters)
        if not all(isinstance(seg, StreamingSegmenter) for seg in segs):
            raise ValueError("segmenters must all be StreamingSegmenter instances")
        if not isinstance(features, torch.Tensor) or features.dim() != 2 or features.shape[0] != len(segs):
            shape = tuple(features.shape) if hasattr(features, "shape") else type(features).__name__
            raise ValueError(f"features must be (B, D) with B = {len(segs)} segmenters, got {shape}")
        for seg in segs:
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
        out: list[list[Event]] = [[] for _ in segs]
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

    def flush(self) -> list[Event]:
        """Close every open event; returns them sorted by stream."""
        if self._last_end is None:
            return []
        return self.flush_tensors().events()

    def flush_tensors(self) -> SegmentStep:
        """Device-resident :meth:`flush`: the closed events in slot 1 of a :class:`SegmentStep`.

        Raises ValueError before the first push (the layout is not known yet).
        """
        if self._last_end is None:
            raise ValueError("flush_tensors needs a first push (the number of streams is not known yet)")
        t_last = self.frames_seen - 1
        none = torch.full_like(self._last_end, -1)
        open_ = self._last_end < t_last
        start = torch.stack((none, torch.where(open_, self._last_end + 1, none)), dim=1)
        end = torch.stack((none, torch.where(open_, t_last, none)), dim=1)
        self._last_end.fill_(t_last)
        self._frames_in_window.zero_()
        return self._shaped(SegmentStep(start, end))


class _Params(NamedTuple):
    window: int
    tau: float
    min_depth: float
    peak: str
    peak_code: int
    max_event: int | None
    drift: float | None


def _cloned(t):
    return None if t is None else t.detach().clone()


def _check_peak(peak) -> str:
    if peak not in _PEAKS:
        raise ValueError(f"peak must be one of {_PEAKS}, got {peak!r}")
    return peak


_INF, _NAN = float("inf"), float("nan")
_is_compiling = torch.compiler.is_compiling


def _plain_params(window, tau, min_depth, peak, max_event, drift) -> bool:
    """Parameters of the plain types and ranges :func:`_check_params` accepts (the fast path's check; anything
    else goes through ``_check_params``, which names what is wrong)."""
    return (type(window) is int and 2 <= window <= MAX_WINDOW and type(tau) is float and 0.0 <= tau < _INF
            and type(min_depth) is float and 0.0 <= min_depth < _INF and type(peak) is str and peak in _PEAK_CODE
            and (max_event is None or (type(max_event) is int and max_event >= 1))
            and (drift is None or (type(drift) is float and -1.0 <= drift <= 1.0)))


def _check_params(window, tau, min_depth, peak, max_event, drift) -> _Params:
    window = check_int(window, "window", minimum=2)
    if window > MAX_WINDOW:
        raise ValueError(f"window must be <= {MAX_WINDOW} (similarities per analysis window), got {window}")
    tau = check_float(tau, "tau", low=0.0)
    min_depth = check_float(min_depth, "min_depth", low=0.0)
    peak = _check_peak(peak)
    if max_event is not None:
        # Any cap beyond 2**62 frames never closes an event; clamped so native int64 arithmetic cannot overflow.
        max_event = min(check_int(max_event, "max_event", minimum=1), 1 << 62)
    if drift is not None:
        drift = check_float(drift, "drift", low=-1.0, high=1.0)
    return _Params(window, tau, min_depth, peak, _PEAK_CODE[peak], max_event, drift)


def _to_kernel_dtype(x: torch.Tensor) -> torch.Tensor:
    # Kernels read float32 (float16/bfloat16 are widened once; float64 is
    # rounded so every path sees the same numbers).
    return x.to(torch.float32) if x.dtype != torch.float32 else x


def _prepare_features(features, name: str) -> tuple[torch.Tensor, bool]:
    x = as_tensor(features, name)
    check_rank(x, name, (2, 3), "(T, D) or (B, T, D)")
    check_dtype(x, name, _FEATURE_DTYPES)
    check_nonempty(x, name)
    batched = x.dim() == 3
    x = x if batched else x[None]
    x = _to_kernel_dtype(x).contiguous()
    if x.shape[1] == 1:
        check_finite(x, name)  # no pair to carry a NaN into the similarities
    return x, batched


def _checked_cosines(x: torch.Tensor, name: str, arg: str) -> torch.Tensor:
    """Adjacent cosines, raising ValueError if ``x`` holds NaN/Inf.

    Every frame is in some pair and a pair with a non-finite input yields a NaN
    similarity (every backend sums in float64, where squares of float32 values
    cannot overflow), so scanning the (B, T-1) similarities replaces a full
    scan of the features (torch.isfinite over a large (B, T, D) block costs
    more than the similarity pass itself).  A device-side assertion on CUDA.
    """
    sims = call_op(torch.ops.streammem.adjacent_cosine, ADJACENT_COSINE.impls, name, x)
    if sims.numel():
        check_values(torch.isfinite(sims).all(), f"{arg} must be finite, found NaN or Inf")
    return sims


def _select(backend: str, x: torch.Tensor) -> str:
    return ADJACENT_COSINE.select(backend, x.device)


def _detect_ends(x: torch.Tensor, p: _Params, name: str) -> torch.Tensor:
    """(B, T) bool: frame t ends an event (the last frame always does)."""
    sims = _checked_cosines(x, name, "features")
    if p.drift is None:
        choices = call_op(torch.ops.streammem.window_choices, WINDOW_CHOICES.impls, name, sims, p.window, p.tau,
                          p.min_depth, p.peak_code)
    else:
        choices = sims.new_empty((sims.shape[0], 0), dtype=torch.int64)
    drift = float("nan") if p.drift is None else p.drift
    return call_op(torch.ops.streammem.scan_events, SCAN_EVENTS.impls, name, sims, choices, p.window,
                   p.max_event or 0, drift)


def _events_from_ends(ends: torch.Tensor) -> list[Event]:
    events: list[Event] = []
    for s, row in enumerate(ends.cpu()):
        start = 0
        for end in row.nonzero()[:, 0].tolist():
            events.append(Event(s, start, end))
            start = end + 1
    return events


# --------------------------------------------------------------------------
# Custom ops (work under torch.compile; opcheck-tested)
# --------------------------------------------------------------------------
@torch.library.custom_op("streammem::adjacent_cosine", mutates_args=())
def _adjacent_cosine_op(x: torch.Tensor, backend: str) -> torch.Tensor:
    """x: contiguous (B, T, D) float32 -> (B, T-1) float32; NaN where a pair holds NaN/Inf."""
    return ADJACENT_COSINE.impls[backend](x)


@_adjacent_cosine_op.register_fake
def _(x, backend):
    return x.new_empty((x.shape[0], max(x.shape[1] - 1, 0)), dtype=torch.float32)


@torch.library.custom_op("streammem::window_depth", mutates_args=())
def _window_depth_op(sim: torch.Tensor, peak_code: int, backend: str) -> torch.Tensor:
    """sim: contiguous (B, M) float32 -> (B, M) float64 depth scores over the whole row."""
    return WINDOW_DEPTH.impls[backend](sim, peak_code)


@_window_depth_op.register_fake
def _(sim, peak_code, backend):
    return sim.new_empty(sim.shape, dtype=torch.float64)


@torch.library.custom_op("streammem::window_choices", mutates_args=())
def _window_choices_op(sim: torch.Tensor, window: int, tau: float, min_depth: float, peak_code: int,
                       backend: str) -> torch.Tensor:
    """sim: (B, M) float32 -> (B, max(M - window + 1, 0)) int64.

    Entry p decides the full window of similarities ``p .. p+window-1`` (frames
    p .. p+window, complete when frame p+window is pushed): the window-relative
    index of the chosen similarity, or -1 for no boundary.
    """
    return WINDOW_CHOICES.impls[backend](sim, window, tau, min_depth, peak_code)


@_window_choices_op.register_fake
def _(sim, window, tau, min_depth, peak_code, backend):
    return sim.new_empty((sim.shape[0], max(sim.shape[1] - window + 1, 0)), dtype=torch.int64)


@torch.library.custom_op("streammem::scan_events", mutates_args=())
def _scan_events_op(sims: torch.Tensor, choices: torch.Tensor, window: int, max_event: int, drift: float,
                    backend: str) -> torch.Tensor:
    """The sequential event scan of each stream -> (B, T) bool event ends.

    sims (B, T-1) float32; choices (B, P) from ``window_choices`` (ignored in
    drift mode, i.e. when ``drift`` is not NaN); ``max_event`` 0 means none.
    """
    return SCAN_EVENTS.impls[backend](sims, choices, window, max_event, drift)


@_scan_events_op.register_fake
def _(sims, choices, window, max_event, drift, backend):
    return sims.new_empty((sims.shape[0], sims.shape[1] + 1), dtype=torch.bool)


# --------------------------------------------------------------------------
# Backend: torch reference (the spec)
# --------------------------------------------------------------------------
def _adjacent_cosine_torch(x: torch.Tensor) -> torch.Tensor:
    a, b = x[:, :-1].double(), x[:, 1:].double()
    dot = (a * b).sum(-1)
    norm_a, norm_b = (a * a).sum(-1).sqrt(), (b * b).sum(-1).sqrt()
    nonzero = (norm_a > 0) & (norm_b > 0)
    cos = dot / torch.where(nonzero, norm_a * norm_b, torch.ones_like(dot))
    cos = torch.where(nonzero, cos.clamp(-1.0, 1.0), torch.zeros_like(cos))
    finite = torch.isfinite(dot) & torch.isfinite(norm_a) & torch.isfinite(norm_b)
    return torch.where(finite, cos, torch.full_like(cos, float("nan"))).float()


def _depth_torch(s: torch.Tensor, peak_code: int) -> torch.Tensor:
    """(..., M) float64 -> (..., M) float64 depth scores, peaks searched along the last dim."""
    M = s.shape[-1]
    left = s.clone()
    right = s.clone()
    for i in range(1, M):
        if peak_code == 0:  # climb: keep walking while the neighbour does not drop
            left[..., i] = torch.where(s[..., i - 1] >= s[..., i], left[..., i - 1], s[..., i])
        else:
            left[..., i] = torch.maximum(left[..., i - 1], s[..., i])
    for i in range(M - 2, -1, -1):
        if peak_code == 0:
            right[..., i] = torch.where(s[..., i + 1] >= s[..., i], right[..., i + 1], s[..., i])
        else:
            right[..., i] = torch.maximum(right[..., i + 1], s[..., i])
    return 0.5 * ((left - s) + (right - s))


def _window_depth_torch(sim: torch.Tensor, peak_code: int) -> torch.Tensor:
    return _depth_torch(sim.double(), peak_code)


def _window_choices_torch(sim: torch.Tensor, window: int, tau: float, min_depth: float,
                          peak_code: int) -> torch.Tensor:
    B, M = sim.shape
    P = max(M - window + 1, 0)
    if P == 0:
        return torch.empty((B, 0), dtype=torch.int64, device=sim.device)
    windows = sim.double().unfold(1, window, 1)  # (B, P, window)
    d = _depth_torch(windows, peak_code)
    # Sums in a fixed left-to-right order (the kernels do the same).
    total = torch.zeros_like(d[..., 0])
    for i in range(window):
        total = total + d[..., i]
    mu = total / window
    sq = torch.zeros_like(mu)
    for i in range(window):
        sq = sq + (d[..., i] - mu) * (d[..., i] - mu)
    sigma = torch.sqrt(sq / window)
    varied = d.amax(-1) > d.amin(-1)  # sigma = 0 exactly when every depth is equal
    candidate = (d > (mu + tau * sigma)[..., None]) & (d > min_depth) & varied[..., None]
    score = torch.where(candidate, d, torch.full_like(d, -1.0))
    best = score.amax(-1, keepdim=True)
    index = torch.arange(window, device=sim.device).expand_as(d)
    first_best = torch.where(candidate & (score == best), index, torch.full_like(index, window)).amin(-1)
    return torch.where(candidate.any(-1), first_best, torch.full_like(first_best, -1))


def _scan_events_torch(sims: torch.Tensor, choices: torch.Tensor, window: int, max_event: int,
                       drift: float) -> torch.Tensor:
    """The streaming state machine, run over all frames (vectorised over streams)."""
    B, T = sims.shape[0], sims.shape[1] + 1
    drift_mode = drift == drift  # not NaN
    ends = torch.zeros((B, T), dtype=torch.bool, device=sims.device)
    streams = torch.arange(B, device=sims.device)
    last_end = torch.full((B,), -1, dtype=torch.int64, device=sims.device)
    frames_in_window = torch.zeros(B, dtype=torch.int64, device=sims.device)
    # Masks are or-ed into ends (no boolean-mask indexing: on CUDA that waits for the host).
    for t in range(T):
        frames_in_window = torch.clamp(frames_in_window + 1, max=window + 1)
        if drift_mode:
            if t >= 1:
                cut = (frames_in_window >= 2) & (sims[:, t - 1].double() < drift)
                ends[:, t - 1] |= cut
                last_end = torch.where(cut, t - 1, last_end)
                frames_in_window = torch.where(cut, 1, frames_in_window)
        elif t >= window:
            choice = choices[:, t - window]
            cut = (frames_in_window == window + 1) & (choice >= 0)
            boundary = t - window + choice
            ends[streams, boundary.clamp(min=0)] |= cut
            last_end = torch.where(cut, boundary, last_end)
            frames_in_window = torch.where(cut, t - boundary, frames_in_window)
        if max_event > 0:
            cap = (t - last_end) >= max_event
            ends[:, t] |= cap
            last_end = torch.where(cap, t, last_end)
            frames_in_window = torch.where(cap, 0, frames_in_window)
    ends[:, T - 1] = True  # flush
    return ends


# --------------------------------------------------------------------------
# Backend: C++ (csrc/cpu/boundaries.cpp)
# --------------------------------------------------------------------------
def _adjacent_cosine_cpp(x: torch.Tensor) -> torch.Tensor:
    mod, _ = load_native("cpu", "boundaries")
    return torch.from_numpy(mod.adjacent_cosine(x.numpy()))


def _window_depth_cpp(sim: torch.Tensor, peak_code: int) -> torch.Tensor:
    mod, _ = load_native("cpu", "boundaries")
    return torch.from_numpy(mod.depth_scores(sim.numpy(), int(peak_code)))


def _window_choices_cpp(sim, window, tau, min_depth, peak_code):
    mod, _ = load_native("cpu", "boundaries")
    return torch.from_numpy(mod.window_choices(sim.contiguous().numpy(), int(window), float(tau),
                                               float(min_depth), int(peak_code)))


def _scan_events_cpp(sims, choices, window, max_event, drift):
    mod, _ = load_native("cpu", "boundaries")
    ends = mod.scan_events(sims.contiguous().numpy(), choices.contiguous().numpy(), int(window),
                           int(max_event), float(drift))
    return torch.from_numpy(ends).bool()


# --------------------------------------------------------------------------
# Backend: Triton (streammem_kernels/_boundaries_triton.py)
# --------------------------------------------------------------------------
def _adjacent_cosine_triton(x):
    from ._triton import adjacent_cosine_triton

    return adjacent_cosine_triton(x)


def _window_depth_triton(sim, peak_code):
    from ._triton import window_depth_triton

    return window_depth_triton(sim, peak_code)


def _window_choices_triton(sim, window, tau, min_depth, peak_code):
    from ._triton import window_choices_triton

    return window_choices_triton(sim, window, tau, min_depth, peak_code)


def _scan_events_triton(sims, choices, window, max_event, drift):
    from ._triton import scan_events_triton

    return scan_events_triton(sims, choices, window, max_event, drift)


# One Op table per core op; they share the native module, so the same backend
# is available to all four and dispatch is resolved once through ADJACENT_COSINE.
# Tolerances against the reference on the same (float32-rounded) features:
# similarities within one float32 rounding (every backend sums in float64 and
# rounds once, so they are equal unless a double sum lies within its last bits
# of a float32 rounding boundary; the tests on CPU check equality), decisions
# (window choices, event ends) exact.
_SIM_TOL = {dt: (1.2e-7, 0.0) for dt in _FEATURE_DTYPES}
_EXACT = {dt: (0.0, 0.0) for dt in _FEATURE_DTYPES}
_BACKENDS = ("torch", "cpp", "triton")
ADJACENT_COSINE = Op("boundaries", {"torch": _adjacent_cosine_torch, "cpp": _adjacent_cosine_cpp,
                                    "triton": _adjacent_cosine_triton},
                     tolerances={b: _SIM_TOL for b in _BACKENDS})
WINDOW_DEPTH = Op("boundaries", {"torch": _window_depth_torch, "cpp": _window_depth_cpp,
                                 "triton": _window_depth_triton},
                  tolerances={b: _EXACT for b in _BACKENDS})
WINDOW_CHOICES = Op("boundaries", {"torch": _window_choices_torch, "cpp": _window_choices_cpp,
                                   "triton": _window_choices_triton},
                    tolerances={b: _EXACT for b in _BACKENDS})
SCAN_EVENTS = Op("boundaries", {"torch": _scan_events_torch, "cpp": _scan_events_cpp,
                                "triton": _scan_events_triton},
                 tolerances={b: _EXACT for b in _BACKENDS})
# The streaming push (StreamingSegmenter.push / push_tensors): impls take (segmenter, (B, D) float32
# features) and return the SegmentStep.  torch and triton run the tensor step (the reference, with
# each backend's core ops), cpp and cuda one fused native step each (decisions identical).
STREAM_STEP = Op("boundaries", {"torch": StreamingSegmenter._step, "triton": StreamingSegmenter._step,
                                "cpp": StreamingSegmenter._step_cpp, "cuda": StreamingSegmenter._step_cuda},
                 tolerances={b: _EXACT for b in _BACKENDS + ("cuda",)})
