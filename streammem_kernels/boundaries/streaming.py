"""StreamingSegmenter: the boundaries rule one frame at a time, with bounded state per stream.

Emits exactly the events of :func:`~streammem_kernels.detect_boundaries` on the frames pushed so far
(``docs/ops/boundaries.md`` states the rule).  Backends: ``torch`` and ``triton`` run the tensor step
below (the reference of the fused ones) on their core ops, ``cpp`` and ``cuda`` one fused native step
per push for all streams; decisions are identical on every backend.
"""
from __future__ import annotations

import functools

import numpy as np
import torch

from .. import checkpoint
from ..runtime.dispatch import Op, call_op, load_native
from ..runtime.native import NativeChecks, view
from ..runtime.validate import as_tensor, check_dtype, check_finite, check_nonempty, check_rank, cpu_fast_path
from . import ADJACENT_COSINE, WINDOW_CHOICES, _NOT_FINITE, _select
from .reference import FEATURE_DTYPES, Event, SegmentStep, check_params, to_kernel_dtype

__all__ = ["StreamingSegmenter"]

# The fused step's one value check: the pushed frame holds NaN or Inf (the general path's message).
_FRAME_CHECKS = NativeChecks(_NOT_FINITE.format(name="features"))


def _state_field(name: str) -> property:
    """A state field of :class:`StreamingSegmenter` whose assignment drops the binding of the native
    step (it holds DLPack views of the state tensors, see ``_bind_step``)."""
    slot = "_state" + name

    def get(self):
        return self.__dict__[slot]

    def set(self, value):
        self.__dict__[slot] = value
        self.__dict__["_fast_step"] = None

    return property(get, set, doc=f"state field {name} (assigning it unbinds the native step)")


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
        paper's literal rule; ``docs/ops/boundaries.md`` says how to calibrate it).
    peak : {"climb", "max"}
        How the depth score finds its left and right peaks.
    max_event : int >= 1, optional
        Close an open event as soon as it holds this many frames.
    drift : float in [-1, 1], optional
        ProStream mode: cut after frame t-1 when ``cos(v_t, v_{t-1}) < drift``
        (replaces the window rule).
    flash : int in [0, (window - 1) // 2], optional
        The flash rule of the window rule: a drop of similarity followed within
        ``flash`` similarities by a second drop at least half as deep is a
        transient (a camera flash, a black frame, a burst of glitched frames),
        not a boundary; the best candidate is decided once ``flash``
        similarities follow it.  0 turns the rule off; None (the default) is
        ``min(3, (window - 1) // 2)``.  Ignored in drift mode.
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
                 max_event: int | None = None, drift: float | None = None, flash: int | None = None, *,
                 backend: str = "auto"):
        self.params = check_params(window, tau, min_depth, peak, max_event, drift, flash)
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
        # The C++ backend's step with the state bound (_bind_step): the native entry with the views of
        # the state tensors and of the events scratch, and the parameters, as its first arguments.
        self._fast_step = None
        self._fast_shape: tuple | None = None
        self._events: np.ndarray | None = None  # (2B, 3) int64 rows (stream, start, end) the step closed
        self._num_events: np.ndarray | None = None  # (1,) int64: how many

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
        fast = STREAM_STEP.run_fast(self._backend_name, self, features)
        if fast is not None:
            return fast
        x = self._admit(features)
        if self._backend_name == "cpp":
            return self._push_cpp(x)
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
        check_dtype(x, "features", FEATURE_DTYPES)
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
        x = to_kernel_dtype(x)
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
                                 self._window_sims, p.window, p.tau, p.min_depth, p.peak_code, p.flash)[:, 0]
                full = fiw == p.window + 1
                cut = full & (choice >= 0)
                boundary = t - p.window + choice  # left frame of the chosen similarity
                # A transient (choice -2 - r) restarts the window after its last edge r, closing nothing.
                restart = torch.where(choice <= -2, t - p.window + (-2 - choice), boundary)
                restarts = full & (choice != -1)
            else:
                cut = in_window & (sim.double() < p.drift)
                boundary = none + t  # frame t - 1
                restart, restarts = boundary, cut
            rule_start = torch.where(cut, last_end + 1, none)
            rule_end = torch.where(cut, boundary, none)
            last_end = torch.where(cut, boundary, last_end)
            fiw = torch.where(restarts, t - restart, fiw)
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

    def _bind_step(self) -> None:
        """Bind the C++ step to this segmenter's state: its DLPack views are made once, here.

        The step updates the state tensors in place, so the views stay valid until a state field is
        assigned (by this class, :meth:`push_many` or a checkpoint restore): every such assignment goes
        through :func:`_state_field`'s setter, which drops the binding, and the next push binds again.
        """
        B, D = self._last_frame.shape
        state = []
        for name, dtype in _STATE_LAYOUT:
            t = getattr(self, name)
            if not (t.dtype == dtype and t.is_cpu and t.is_contiguous()):  # a restored checkpoint's strides
                t = t.to(device="cpu", dtype=dtype).contiguous()
                setattr(self, name, t)
            state.append(view(t))
        # Read by Python only, so numpy arrays (numpy speaks DLPack too) rather than tensors.
        self._events, self._num_events = np.empty((2 * B, 3), np.int64), np.zeros(1, np.int64)
        p = self.params
        module = load_native("cpu", "boundaries")[0]
        self._fast_step = functools.partial(module.stream_step, *state, self._events.__dlpack__(),
                                            self._num_events.__dlpack__(), p.window, p.tau, p.min_depth, p.peak_code,
                                            p.max_event or 0, float("nan") if p.drift is None else p.drift, p.flash)
        self._fast_shape = (B, D) if self._batched else (D,)

    def _push_cpp(self, x: torch.Tensor) -> list[Event]:
        # One fused native call: similarity, window shift, decision and state
        # update for every stream; the state tensors are updated in place.
        if self._fast_step is None:
            self._bind_step()
        return _run_bound_step(self, x.contiguous())

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

    def load_state_dict(self, state) -> None:
        """Restore :meth:`state_dict` output into a segmenter built with the same parameters.

        ``state`` is a dict or a ``checkpoint.StateReader`` (a segmenter nested in another object's
        checkpoint).  Every field is checked before the segmenter changes, each failure a
        ``ValueError`` naming the field: the counter, the layout flag and backend name, and the state
        tensors (dtypes, one row per stream, ``window`` similarities that are finite cosines, window
        counts in ``[0, window + 1]``, event ends before the current frame, a finite last frame and, for
        the C++ backend, its squared norm); all of them absent before the first push.
        """
        reader = checkpoint.reader_for(state, "StreamingSegmenter")
        window = self.params.window
        seen = reader.int("frames_seen", low=0)
        batched = reader.get("batched")
        reader.require(batched is None or isinstance(batched, bool), "batched",
                       f"must be None or a bool, got {batched!r:.40}")
        name = reader.str("backend_name", choices=tuple(STREAM_STEP.impls), optional=True)
        floats, ints = (torch.float32, torch.float64), (torch.int64, torch.int32)
        sims = reader.tensor("window_sims", dtype=floats, ndim=2, finite=True, low=-1.001, high=1.001,
                             optional=True)
        tensors = {}
        if sims is None:
            for field in ("last_frame", "frames_in_window", "last_end", "last_norm"):
                reader.require(reader.get(field) is None, field, "must be None before the first push (window_sims is)")
            reader.require(seen == 0, "frames_seen", "must be 0 before the first push (window_sims is None)")
        else:
            B = sims.shape[0]
            reader.require(B >= 1 and sims.shape[1] == window, "window_sims",
                           f"must have shape (B, window={window}) with B >= 1, got {tuple(sims.shape)}")
            reader.require(batched is not None and name is not None, "batched",
                           "and backend_name must be set once window_sims is")
            reader.require(batched or B == 1, "window_sims", f"must hold one stream when batched is False, got {B}")
            tensors["frames_in_window"] = reader.tensor("frames_in_window", dtype=ints, shape=(B,), low=0,
                                                        high=window + 1)
            tensors["last_end"] = reader.tensor("last_end", dtype=ints, shape=(B,), low=-1,
                                                high=max(seen - 1, -1))
            tensors["last_frame"] = reader.tensor("last_frame", dtype=floats, ndim=2, finite=True,
                                                  optional=seen == 0)
            if tensors["last_frame"] is not None:
                reader.require(tensors["last_frame"].shape[0] == B and tensors["last_frame"].shape[1] >= 1,
                               "last_frame", f"must have shape (B={B}, D), got {tuple(tensors['last_frame'].shape)}")
            tensors["last_norm"] = reader.tensor("last_norm", dtype=floats, shape=(B,), finite=True, low=0.0,
                                                 optional=name != "cpp")
            reader.require(name != "cpp" or tensors["last_frame"] is not None, "last_frame",
                           "must be present for the C++ backend")
        # The state layout's dtypes (a restored state may hold others: they are converted once, here).
        layout = dict(_STATE_LAYOUT)
        self.frames_seen = seen
        self._batched = batched
        self._backend_name = name
        self._window_sims = None if sims is None else sims.detach().to(torch.float32, copy=True)
        for field in ("last_frame", "frames_in_window", "last_end", "last_norm"):
            t = tensors.get(field)
            setattr(self, "_" + field, None if t is None else t.detach().to(layout["_" + field], copy=True))

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
        x = to_kernel_dtype(features).contiguous()
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
        batch = StreamingSegmenter(p.window, p.tau, p.min_depth, p.peak, p.max_event, p.drift, p.flash,
                                   backend=first.backend)
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



# The C++ step's state: (field, dtype), in the order of the native entry's arguments.
_STATE_LAYOUT = (("_last_frame", torch.float32), ("_last_norm", torch.float64), ("_window_sims", torch.float32),
                 ("_frames_in_window", torch.int64), ("_last_end", torch.int64))


_new_tuple = tuple.__new__  # an Event from a tuple without its Python-level __new__


def _run_bound_step(seg: StreamingSegmenter, frame: torch.Tensor) -> list[Event]:
    """The bound C++ step on a C-contiguous float32 CPU ``frame`` of the segmenter's (B, D) layout."""
    status = seg._fast_step(view(frame), seg.frames_seen)
    if status:
        _FRAME_CHECKS.raise_for(status)  # nothing was updated
    seg.frames_seen += 1
    n = seg._num_events[0]
    return [_new_tuple(Event, row) for row in seg._events[:n].tolist()] if n else []


def _push_fast(module, seg: StreamingSegmenter, features):
    """push() on a C-contiguous float32 CPU frame of the segmenter's layout once its C++ step is bound: the
    bound entry (the one the cpp backend's push calls), which also checks the frame (ValueError on NaN/Inf,
    state untouched).  None for anything else."""
    if seg._fast_step is None or not (cpu_fast_path(features) and features.shape == seg._fast_shape):
        return None
    return _run_bound_step(seg, features)


# The streaming push (StreamingSegmenter.push / push_tensors): impls take (segmenter, (B, D) float32
# features) and return the SegmentStep.  torch and triton run the tensor step (the reference, with
# each backend's core ops), cpp and cuda one fused native step each (decisions identical).
_EXACT = {dt: (0.0, 0.0) for dt in FEATURE_DTYPES}
STREAM_STEP = Op("boundaries", {"torch": StreamingSegmenter._step, "triton": StreamingSegmenter._step,
                                "cpp": StreamingSegmenter._step_cpp, "cuda": StreamingSegmenter._step_cuda},
                 tolerances={b: _EXACT for b in ("torch", "cpp", "triton", "cuda")}, fast=_push_fast)


def _cloned(t):
    return None if t is None else t.detach().clone()


