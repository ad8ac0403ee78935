"""Depth-score event boundaries for video and dialogue streams (StreamRAG sec. 3.2, ProStream sec. 5.1).

Frames ``v_0 .. v_{T-1}`` of each stream are cut into events, inclusive ranges ``(start, end)`` of frame
indices, by the depth scores of the adjacent cosine similarities inside a sliding window (or, in drift
mode, by a cosine threshold), optionally capped at ``max_event`` frames; transients of up to ``flash`` frames
(a camera flash, a black frame, a burst of glitched frames) are not boundaries.  :func:`detect_boundaries`
(offline) and :class:`~streammem_kernels.boundaries.streaming.StreamingSegmenter` (one push per frame)
emit the same events; ``docs/ops/boundaries.md`` states the rule and its numerics, and
``reference.py`` is the spec every backend is tested against.

Backends: ``torch`` (the reference), ``cpp`` (OpenMP over streams), ``triton``; the streaming push also
``cuda``.  Every backend makes identical decisions (integer results are compared exactly; similarities
within one float32 rounding, equal on CPU).  :func:`event_ends` and the segmenter's ``push_tensors`` /
``flush_tensors`` return tensors and never synchronise with the host on CUDA tensors.
"""
from __future__ import annotations

import numpy as np
import torch

from ..runtime.dispatch import Op, call_op, eager_only, load_native
from ..runtime.native import NativeChecks, view
from ..runtime.validate import (as_tensor, check_dtype, check_finite, check_nonempty, check_rank, check_values,
                                cpu_fast_path)
from .reference import (DEFAULT_FLASH, FEATURE_DTYPES, MAX_WINDOW, PEAK_CODE, Event, Params, SegmentStep,
                        adjacent_cosine_torch, check_params, check_peak, scan_events_torch, to_kernel_dtype,
                        window_choices_torch, window_depth_torch)

__all__ = ["Event", "SegmentStep", "adjacent_cosine", "depth_scores", "detect_boundaries", "event_ends"]

# The one finiteness message of the op (the general path raises it from Python, the C++ entries by status).
_NOT_FINITE = "{name} must be finite, found NaN or Inf"


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

    Raises
    ------
    ValueError
        ``features`` of the wrong rank or dtype, empty, or holding NaN/Inf.
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
    sim : (M,) or (B, M) floating tensor or array, finite
    peak : {"climb", "max"}
    backend : {"auto", "torch", "cpp", "triton"}

    Returns
    -------
    Same shape as ``sim``; float64 when ``sim`` is float64, else float32
    (computed in float64 on the float32-rounded similarities).
    """
    fast = WINDOW_DEPTH.run_fast(backend, sim, peak)
    if fast is not None:
        return fast
    sim = as_tensor(sim, "sim")
    check_rank(sim, "sim", (1, 2), "(M,) or (B, M)")
    check_dtype(sim, "sim", FEATURE_DTYPES)
    peak = check_peak(peak)
    x = sim if sim.dim() == 2 else sim[None]
    x = x.to(torch.float32).contiguous()
    out_dtype = torch.float64 if sim.dtype == torch.float64 else torch.float32
    # The decision arithmetic is float64 on float32 similarities; a float64
    # input is rounded to float32 first so every entry point sees one precision.
    name = _select(backend, x)
    if name != "cpp":  # the C++ kernel checks the values in its own pass
        check_finite(sim, "sim")
    d = call_op(torch.ops.streammem.window_depth, WINDOW_DEPTH.impls, name, x, PEAK_CODE[peak]).to(out_dtype)
    return d if sim.dim() == 2 else d[0]


_DETECT_BOUNDARIES_EAGER = eager_only(
    "detect_boundaries returns a Python list of Event objects read from the tensors; inside torch.compile "
    "use event_ends (the same events as a bool tensor of event ends)")


def detect_boundaries(features, *, window: int = 8, tau: float = 0.7, min_depth: float = 0.2,
                      peak: str = "climb", max_event: int | None = None, drift: float | None = None,
                      flash: int | None = None, backend: str = "auto") -> list[Event]:
    """Offline event segmentation: exactly the events :class:`StreamingSegmenter`
    emits when the same frames are pushed one at a time and then flushed.

    Parameters
    ----------
    features : (T, D) or (B, T, D) tensor or array, floating, T >= 1
    window, tau, min_depth, peak, max_event, drift, flash
        As for :class:`StreamingSegmenter`.
    backend : {"auto", "torch", "cpp", "triton"}

    Returns
    -------
    list of :class:`Event` sorted by (stream, start); ``stream`` is 0 for a
    (T, D) input.  Per stream the events cover frames 0..T-1 exactly once.
    Building Python objects reads the result on the host; :func:`event_ends`
    is the same computation with a tensor result that stays on the device.  Not traceable by
    torch.compile for the same reason: with ``fullgraph=True`` it raises, without it the graph breaks
    and it runs eagerly (``docs/compile.md``).

    Raises
    ------
    ValueError
        A parameter out of its range, ``features`` of the wrong rank or dtype, empty, or holding NaN/Inf.
    """
    _DETECT_BOUNDARIES_EAGER()
    fast = EVENT_ENDS.run_fast(backend, features, window, tau, min_depth, peak, max_event, drift, flash)
    if fast is not None:
        return fast
    return _events_from_ends(_event_ends(features, window, tau, min_depth, peak, max_event, drift, flash, backend))


def event_ends(features, *, window: int = 8, tau: float = 0.7, min_depth: float = 0.2, peak: str = "climb",
               max_event: int | None = None, drift: float | None = None, flash: int | None = None,
               backend: str = "auto") -> torch.Tensor:
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
    ends = _event_ends(features, window, tau, min_depth, peak, max_event, drift, flash, backend)
    return ends if as_tensor(features, "features").dim() == 3 else ends[0]


def _event_ends(features, window, tau, min_depth, peak, max_event, drift, flash, backend) -> torch.Tensor:
    params = check_params(window, tau, min_depth, peak, max_event, drift, flash)
    x, _ = _prepare_features(features, "features")
    return _detect_ends(x, params, _select(backend, x))


# The names python/streammem's segmenter uses (private to the kernels' packages).
_to_kernel_dtype = to_kernel_dtype


def _prepare_features(features, name: str) -> tuple[torch.Tensor, bool]:
    x = as_tensor(features, name)
    check_rank(x, name, (2, 3), "(T, D) or (B, T, D)")
    check_dtype(x, name, FEATURE_DTYPES)
    check_nonempty(x, name)
    batched = x.dim() == 3
    x = x if batched else x[None]
    x = to_kernel_dtype(x).contiguous()
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
        check_values(torch.isfinite(sims).all(), _NOT_FINITE.format(name=arg))
    return sims


def _select(backend: str, x: torch.Tensor) -> str:
    """The backend of every core op of the boundaries (they share one native module) on ``x``'s device."""
    return ADJACENT_COSINE.select(backend, x.device)


def _detect_ends(x: torch.Tensor, p: Params, name: str) -> torch.Tensor:
    """(B, T) bool: frame t ends an event (the last frame always does)."""
    drift = float("nan") if p.drift is None else p.drift
    return call_op(torch.ops.streammem.event_ends, EVENT_ENDS.impls, name, x, p.window, p.tau, p.min_depth,
                   p.peak_code, p.max_event or 0, drift, p.flash)


def _events_from_ends(ends: torch.Tensor) -> list[Event]:
    return _events_of(ends.cpu().numpy().reshape(-1), ends.shape[1])


_new_tuple = tuple.__new__  # a NamedTuple from a tuple without its Python-level __new__ (latency paths)


def _events_of(ends: np.ndarray, frames: int) -> list[Event]:
    """The events of flat (B * T) bool event ends, T = ``frames``: per stream, the runs up to each True
    (the last frame of a stream always is one)."""
    events: list[Event] = []
    stream, first, start = 0, 0, 0  # first: the flat index of the stream's frame 0
    for i in ends.nonzero()[0].tolist():
        if i - first >= frames:
            stream = i // frames
            first, start = stream * frames, 0
        events.append(_new_tuple(Event, (stream, start, i - first)))
        start = i - first + 1
    return events


# --------------------------------------------------------------------------
# Custom ops (work under torch.compile; opcheck-tested)
# --------------------------------------------------------------------------
@torch.library.custom_op("streammem::adjacent_cosine", mutates_args=())
def _adjacent_cosine_op(x: torch.Tensor, backend: str) -> torch.Tensor:
    """``torch.ops.streammem.adjacent_cosine`` (its schema: docs/compile.md).

    x: contiguous (B, T, D) float32 -> (B, T-1) float32; NaN where a pair holds NaN/Inf."""
    return ADJACENT_COSINE.impls[backend](x)


@_adjacent_cosine_op.register_fake
def _(x, backend):
    return x.new_empty((x.shape[0], max(x.shape[1] - 1, 0)), dtype=torch.float32)


@torch.library.custom_op("streammem::window_depth", mutates_args=())
def _window_depth_op(sim: torch.Tensor, peak_code: int, backend: str) -> torch.Tensor:
    """``torch.ops.streammem.window_depth`` (its schema: docs/compile.md).

    sim: contiguous (B, M) float32 -> (B, M) float64 depth scores over the whole row."""
    return WINDOW_DEPTH.impls[backend](sim, peak_code)


@_window_depth_op.register_fake
def _(sim, peak_code, backend):
    return sim.new_empty(sim.shape, dtype=torch.float64)


@torch.library.custom_op("streammem::window_choices", mutates_args=())
def _window_choices_op(sim: torch.Tensor, window: int, tau: float, min_depth: float, peak_code: int, flash: int,
                       backend: str) -> torch.Tensor:
    """``torch.ops.streammem.window_choices`` (its schema: docs/compile.md).

    sim: (B, M) float32 -> (B, max(M - window + 1, 0)) int64.

    Entry p decides the full window of similarities ``p .. p+window-1`` (frames
    p .. p+window, complete when frame p+window is pushed): the window-relative
    index j of the chosen similarity (a boundary), -1 for none, or ``-2 - r``
    for a transient whose last edge is similarity r (``window_choices_torch``).
    """
    return WINDOW_CHOICES.impls[backend](sim, window, tau, min_depth, peak_code, flash)


@_window_choices_op.register_fake
def _(sim, window, tau, min_depth, peak_code, flash, backend):
    return sim.new_empty((sim.shape[0], max(sim.shape[1] - window + 1, 0)), dtype=torch.int64)


@torch.library.custom_op("streammem::scan_events", mutates_args=())
def _scan_events_op(sims: torch.Tensor, choices: torch.Tensor, window: int, max_event: int, drift: float,
                    backend: str) -> torch.Tensor:
    """``torch.ops.streammem.scan_events`` (its schema: docs/compile.md).

    The sequential event scan of each stream -> (B, T) bool event ends.

    sims (B, T-1) float32; choices (B, P) from ``window_choices`` (ignored in
    drift mode, i.e. when ``drift`` is not NaN); ``max_event`` 0 means none.
    """
    return SCAN_EVENTS.impls[backend](sims, choices, window, max_event, drift)


@_scan_events_op.register_fake
def _(sims, choices, window, max_event, drift, backend):
    return sims.new_empty((sims.shape[0], sims.shape[1] + 1), dtype=torch.bool)


@torch.library.custom_op("streammem::event_ends", mutates_args=())
def _event_ends_op(x: torch.Tensor, window: int, tau: float, min_depth: float, peak_code: int, max_event: int,
                   drift: float, flash: int, backend: str) -> torch.Tensor:
    """``torch.ops.streammem.event_ends`` (its schema: docs/compile.md).

    The offline pass: contiguous (B, T, D) float32 features -> (B, T) bool event ends; ValueError when
    the features hold NaN/Inf (a device-side assertion on CUDA).  ``max_event`` 0 means none, ``drift``
    NaN means the window rule, ``flash`` 0 turns the flash rule off."""
    return EVENT_ENDS.impls[backend](x, window, tau, min_depth, peak_code, max_event, drift, flash)


@_event_ends_op.register_fake
def _(x, window, tau, min_depth, peak_code, max_event, drift, flash, backend):
    return x.new_empty((x.shape[0], x.shape[1]), dtype=torch.bool)


# --------------------------------------------------------------------------
# Backends: torch and Triton compose the core steps; C++ runs the offline pass fused
# --------------------------------------------------------------------------
def _composed_event_ends(backend: str):
    """The offline pass of ``backend`` from its core steps: cosines (checked), window choices, scan."""

    def event_ends_of(x, window, tau, min_depth, peak_code, max_event, drift, flash):
        sims = _checked_cosines(x, backend, "features")
        if drift != drift:  # NaN: the window rule
            choices = call_op(torch.ops.streammem.window_choices, WINDOW_CHOICES.impls, backend, sims, window, tau,
                              min_depth, peak_code, flash)
        else:
            choices = sims.new_empty((sims.shape[0], 0), dtype=torch.int64)
        return call_op(torch.ops.streammem.scan_events, SCAN_EVENTS.impls, backend, sims, choices, window, max_event,
                       drift)

    event_ends_of.__name__ = f"_event_ends_{backend}"
    return event_ends_of


def _adjacent_cosine_triton(x):
    from ._triton import adjacent_cosine_triton

    return adjacent_cosine_triton(x)


def _window_depth_triton(sim, peak_code):
    from ._triton import window_depth_triton

    return window_depth_triton(sim, peak_code)


def _window_choices_triton(sim, window, tau, min_depth, peak_code, flash):
    from ._triton import window_choices_triton

    return window_choices_triton(sim, window, tau, min_depth, peak_code, flash)


def _scan_events_triton(sims, choices, window, max_event, drift):
    from ._triton import scan_events_triton

    return scan_events_triton(sims, choices, window, max_event, drift)


# C++ (csrc/cpu/boundaries.cpp): every entry writes into tensors allocated here and returns a status.
_NO_CHECKS = NativeChecks()
_FEATURE_CHECKS = NativeChecks(_NOT_FINITE.format(name="features"))


def _module():
    return load_native("cpu", "boundaries")[0]


def _adjacent_cosine_cpp(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty((x.shape[0], max(x.shape[1] - 1, 0)), dtype=torch.float32)
    _NO_CHECKS.raise_for(_module().adjacent_cosine(view(x), view(out)))
    return out


_SIM_CHECKS = NativeChecks(_NOT_FINITE.format(name="sim"))
# Results of the latency paths allocated through numpy (cheaper than torch.empty for a few values).
_np_empty, _NP_BOOL, _NP_F32, _from_numpy = np.empty, np.bool_, np.float32, torch.from_numpy


def _window_depth_cpp(sim: torch.Tensor, peak_code: int) -> torch.Tensor:
    out = torch.empty(sim.shape, dtype=torch.float64)
    _SIM_CHECKS.raise_for(_module().depth_scores(view(sim), int(peak_code), view(out)))
    return out


def _depth_scores_fast(mod, sim, peak):
    """depth_scores of a C-contiguous float32 CPU tensor (M,) or (B, M), M >= 1, and a plain peak: one
    call of the C++ entry (which takes either shape), which also checks the values (same ValueError).
    None for anything else."""
    if not (cpu_fast_path(sim) and type(peak) is str and peak in PEAK_CODE):
        return None
    shape = sim.shape
    nd = len(shape)
    if not (1 <= nd <= 2 and shape[-1] >= 1):
        return None
    # float32: the entry rounds its float64 depths once, as the general path does.  Plain ints for the
    # shape: numpy converts a torch.Size three times slower.
    out = _np_empty(shape[0] if nd == 1 else (shape[0], shape[1]), _NP_F32)
    status = mod.depth_scores(view(sim), PEAK_CODE[peak], out.__dlpack__())
    if status:
        _SIM_CHECKS.raise_for(status)
    return _from_numpy(out)


def _window_choices_cpp(sim, window, tau, min_depth, peak_code, flash):
    sim = sim.contiguous()
    out = torch.empty((sim.shape[0], max(sim.shape[1] - window + 1, 0)), dtype=torch.int64)
    _NO_CHECKS.raise_for(_module().window_choices(view(sim), int(window), float(tau), float(min_depth),
                                                  int(peak_code), view(out), flash=int(flash)))
    return out


def _scan_events_cpp(sims, choices, window, max_event, drift):
    sims, choices = sims.contiguous(), choices.contiguous()
    ends = torch.empty((sims.shape[0], sims.shape[1] + 1), dtype=torch.bool)
    _NO_CHECKS.raise_for(_module().scan_events(view(sims), view(choices), int(window), int(max_event), float(drift),
                                               view(ends)))
    return ends


def _event_ends_cpp(x, window, tau, min_depth, peak_code, max_event, drift, flash):
    ends = torch.empty((x.shape[0], x.shape[1]), dtype=torch.bool)
    _FEATURE_CHECKS.raise_for(_module().event_ends(view(x), int(window), float(tau), float(min_depth), int(peak_code),
                                                   int(max_event), float(drift), view(ends), int(flash)))
    return ends


_INF, _NAN = float("inf"), float("nan")


def _plain_params(window, tau, min_depth, peak, max_event, drift, flash) -> bool:
    """Parameters of the plain types and ranges :func:`check_params` accepts (anything else goes through
    ``check_params``, which names what is wrong)."""
    return (type(window) is int and 2 <= window <= MAX_WINDOW and type(tau) is float and 0.0 <= tau < _INF
            and type(min_depth) is float and 0.0 <= min_depth < _INF and type(peak) is str and peak in PEAK_CODE
            and (max_event is None or (type(max_event) is int and max_event >= 1))
            and (drift is None or (type(drift) is float and -1.0 <= drift <= 1.0))
            and (flash is None or (type(flash) is int and 0 <= flash <= (window - 1) // 2)))


def _detect_boundaries_fast(mod, features, window, tau, min_depth, peak, max_event, drift, flash):
    """detect_boundaries on C-contiguous float32 CPU features and plain parameters: the C++ backend's
    ``event_ends`` entry, which also checks the features (same ValueError).  None for anything else."""
    if not cpu_fast_path(features):
        return None
    shape = features.shape
    nd = len(shape)
    if not ((nd == 2 or nd == 3) and features.numel() and _plain_params(window, tau, min_depth, peak, max_event,
                                                                         drift, flash)):
        return None
    # Read by Python only, so a numpy array (numpy speaks DLPack too) rather than a tensor.
    frames = shape[-2]
    ends = _np_empty(shape[0] * frames if nd == 3 else frames, _NP_BOOL)
    status = mod.event_ends(view(features), window, tau, min_depth, PEAK_CODE[peak],
                            0 if max_event is None else min(max_event, 1 << 62), _NAN if drift is None else drift,
                            ends.__dlpack__(), min(DEFAULT_FLASH, (window - 1) // 2) if flash is None else flash)
    if status:
        _FEATURE_CHECKS.raise_for(status)
    return _events_of(ends, frames)


# --------------------------------------------------------------------------
# The Op tables
# --------------------------------------------------------------------------
# The core ops share the native module, so one backend serves all of them and dispatch is resolved
# once through ADJACENT_COSINE.  Tolerances against the reference on the same (float32-rounded)
# features: similarities within one float32 rounding (every backend sums in float64 and rounds once,
# so they are equal unless a double sum lies within its last bits of a float32 rounding boundary; the
# tests on CPU check equality), decisions (window choices, event ends) exact.
_SIM_TOL = {dt: (1.2e-7, 0.0) for dt in FEATURE_DTYPES}
_EXACT = {dt: (0.0, 0.0) for dt in FEATURE_DTYPES}
_BACKENDS = ("torch", "cpp", "triton")
ADJACENT_COSINE = Op("boundaries", {"torch": adjacent_cosine_torch, "cpp": _adjacent_cosine_cpp,
                                    "triton": _adjacent_cosine_triton},
                     tolerances={b: _SIM_TOL for b in _BACKENDS})
WINDOW_DEPTH = Op("boundaries", {"torch": window_depth_torch, "cpp": _window_depth_cpp,
                                 "triton": _window_depth_triton},
                  tolerances={b: _EXACT for b in _BACKENDS}, fast=_depth_scores_fast)
WINDOW_CHOICES = Op("boundaries", {"torch": window_choices_torch, "cpp": _window_choices_cpp,
                                   "triton": _window_choices_triton},
                    tolerances={b: _EXACT for b in _BACKENDS})
SCAN_EVENTS = Op("boundaries", {"torch": scan_events_torch, "cpp": _scan_events_cpp,
                                "triton": _scan_events_triton},
                 tolerances={b: _EXACT for b in _BACKENDS})
# The whole offline pass (event_ends, detect_boundaries): the C++ backend fuses the core steps in one
# native call, which detect_boundaries' latency path calls too.
EVENT_ENDS = Op("boundaries", {"torch": _composed_event_ends("torch"), "cpp": _event_ends_cpp,
                               "triton": _composed_event_ends("triton")},
                tolerances={b: _EXACT for b in _BACKENDS}, fast=_detect_boundaries_fast)
