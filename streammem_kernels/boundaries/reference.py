"""The torch reference of the boundaries op: the spec every backend is tested against.

``docs/ops/boundaries.md`` states the rule in prose (similarities, depth scores, the window rule,
``max_event``, drift mode) and says why every backend makes the same decisions bit for bit.
Here: the rule's parameters and their domain, the event types, and the four core steps in torch
(adjacent cosines, depth scores, the window choices with the flash rule, the sequential event scan).
Imports nothing of the op.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..runtime.launch import block_elements
from ..runtime.validate import check_float, check_int

FEATURE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
PEAKS = ("climb", "max")
PEAK_CODE = {"climb": 0, "max": 1}
# Largest analysis window.  Each push costs O(window) per stream and the offline pass O(T * window), so a
# window beyond this is a mistake rather than a configuration (StreamRAG uses 8); checked before any
# state or native scratch is allocated.
MAX_WINDOW = 1 << 16
# The default flash length (similarities): transients of up to 3 frames (a camera flash, a black or
# dropped frame, a burst of blocky frames) are not boundaries.  ``flash=None`` takes this, capped at the
# most the window can check, (window - 1) // 2.
DEFAULT_FLASH = 3
# float64 values of the frames widened at once by adjacent_cosine_torch on a CPU (1 MB; block_elements):
# its products stay in cache (widening a whole (1, 3600, 384) clip made 11 MB temporaries, each a fresh
# mmap and a page fault per 4 KB).
COSINE_BLOCK = 1 << 17


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


class Params(NamedTuple):
    """The rule's parameters, validated (:func:`check_params`); ``peak_code`` is ``PEAK_CODE[peak]``."""

    window: int
    tau: float
    min_depth: float
    peak: str
    peak_code: int
    max_event: int | None
    drift: float | None
    flash: int


def check_peak(peak) -> str:
    if peak not in PEAKS:
        raise ValueError(f"peak must be one of {PEAKS}, got {peak!r}")
    return peak


def max_flash(window: int) -> int:
    """The longest transient a window of ``window`` similarities can check: both edges of the transient
    must be inside the window when the later one has ``flash`` similarities after it."""
    return (window - 1) // 2


def check_params(window, tau, min_depth, peak, max_event, drift, flash=None) -> Params:
    """The parameters of :class:`StreamingSegmenter` and :func:`detect_boundaries`, or ValueError naming one.

    ``flash=None`` resolves to ``min(DEFAULT_FLASH, max_flash(window))``."""
    window = check_int(window, "window", minimum=2)
    if window > MAX_WINDOW:
        raise ValueError(f"window must be <= {MAX_WINDOW} (similarities per analysis window), got {window}")
    tau = check_float(tau, "tau", low=0.0)
    min_depth = check_float(min_depth, "min_depth", low=0.0)
    peak = check_peak(peak)
    if max_event is not None:
        # Any cap beyond 2**62 frames never closes an event; clamped so native int64 arithmetic cannot overflow.
        max_event = min(check_int(max_event, "max_event", minimum=1), 1 << 62)
    if drift is not None:
        drift = check_float(drift, "drift", low=-1.0, high=1.0)
    if flash is None:
        flash = min(DEFAULT_FLASH, max_flash(window))
    else:
        flash = check_int(flash, "flash", minimum=0)
        if flash > max_flash(window):
            raise ValueError(f"flash must be <= (window - 1) // 2 = {max_flash(window)} for window={window} "
                             f"(both edges of a transient must fit in the window), got {flash}")
    return Params(window, tau, min_depth, peak, PEAK_CODE[peak], max_event, drift, flash)


def to_kernel_dtype(x: torch.Tensor) -> torch.Tensor:
    # Kernels read float32 (float16/bfloat16 are widened once; float64 is
    # rounded so every path sees the same numbers).
    return x.to(torch.float32) if x.dtype != torch.float32 else x


# --------------------------------------------------------------------------
# The core steps (the torch backend)
# --------------------------------------------------------------------------
def adjacent_cosine_torch(x: torch.Tensor) -> torch.Tensor:
    """(B, T, D) float32 -> (B, T-1) float32 ``cos(v_t, v_{t+1})``, summed in float64 and rounded once;
    0 where a vector is zero, NaN where a pair holds NaN/Inf.  Frames are widened to float64 a block at a
    time (:data:`COSINE_BLOCK`); each sum along D is the same whatever the block."""
    B, T, D = x.shape
    dot = torch.empty((B, max(T - 1, 0)), dtype=torch.float64, device=x.device)
    norm = torch.empty((B, T), dtype=torch.float64, device=x.device)  # each frame's, shared by its two pairs
    step = max(1, block_elements(x.device, COSINE_BLOCK) // max(1, B * D))
    for lo in range(0, T, step):  # frames lo .. lo + step - 1 and their pairs with the next frame
        block = x[:, lo:lo + step + 1].double()
        norm[:, lo:lo + step] = (block[:, :step] * block[:, :step]).sum(-1).sqrt()
        dot[:, lo:lo + block.shape[1] - 1] = (block[:, :-1] * block[:, 1:]).sum(-1)
    norm_a, norm_b = norm[:, :-1], norm[:, 1:]
    nonzero = (norm_a > 0) & (norm_b > 0)
    cos = dot / torch.where(nonzero, norm_a * norm_b, torch.ones_like(dot))
    cos = torch.where(nonzero, cos.clamp(-1.0, 1.0), torch.zeros_like(cos))
    finite = torch.isfinite(dot) & torch.isfinite(norm_a) & torch.isfinite(norm_b)
    return torch.where(finite, cos, torch.full_like(cos, float("nan"))).float()


def depth_torch(s: torch.Tensor, peak_code: int) -> torch.Tensor:
    """(..., M) float64 -> (..., M) float64 depth scores, peaks searched along the last dim.

    ``left[i]`` is the peak left of i: for "climb" where a walk left from i stops (:func:`climb_peak`),
    for "max" the running maximum of ``s[..i]``; ``right[i]`` the same walk to the right, taken on
    the reversed row.  Both copy values of ``s``, so only the last line does arithmetic.
    """
    if peak_code == 0:
        left, right = climb_peak(s), climb_peak(s.flip(-1)).flip(-1)
    else:
        left, right = torch.cummax(s, -1).values, torch.cummax(s.flip(-1), -1).values.flip(-1)
    return 0.5 * ((left - s) + (right - s))


def climb_peak(s: torch.Tensor) -> torch.Tensor:
    """``s[j]`` for every i, j the index where a walk left from i stops: it steps from m to m - 1
    while ``s[m - 1] >= s[m]``, so j is the last rise at or before i (``s[j - 1] < s[j]``), or 0."""
    if s.shape[-1] == 0:
        return s.clone()
    index = torch.arange(s.shape[-1], device=s.device).expand(s.shape)
    rises = torch.zeros(s.shape, dtype=torch.bool, device=s.device)
    rises[..., 1:] = s[..., :-1] < s[..., 1:]
    start = torch.cummax(torch.where(rises, index, torch.zeros_like(index)), -1).values
    return s.gather(-1, start)


def window_depth_torch(sim: torch.Tensor, peak_code: int) -> torch.Tensor:
    """(B, M) float32 -> (B, M) float64 depth scores over the whole row."""
    return depth_torch(sim.double(), peak_code)


def window_choices_torch(sim: torch.Tensor, window: int, tau: float, min_depth: float,
                         peak_code: int, flash: int) -> torch.Tensor:
    """(B, M) float32 -> (B, max(M - window + 1, 0)) int64: for every full window of similarities
    ``p .. p+window-1`` the decision, as a window-relative index: ``j >= 0`` a boundary at similarity j,
    ``-1`` none (no candidate, or the best one still waits for ``flash`` similarities after it),
    ``-2 - r`` a transient whose last edge is similarity r (the window restarts after it, no boundary)."""
    B, M = sim.shape
    P = max(M - window + 1, 0)
    if P == 0:
        return torch.empty((B, 0), dtype=torch.int64, device=sim.device)
    windows = sim.double().unfold(1, window, 1)  # (B, P, window)
    d = depth_torch(windows, peak_code)
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
    choice = torch.where(candidate.any(-1), first_best, torch.full_like(first_best, -1))
    if flash == 0:
        return choice
    # The flash rule: the best candidate j is decided once `flash` similarities follow it in the window;
    # a similarity within `flash` of j below s_j + d_j / 2 (a second drop at least half as deep) makes
    # j an edge of a transient, and the window restarts after the transient's last edge.
    j = first_best.clamp(max=window - 1)[..., None]
    s = windows
    s_j, d_j = s.gather(-1, j), d.gather(-1, j)
    near = ((index - j).abs() <= flash) & (index != j) & (s < s_j + 0.5 * d_j)
    last_edge = torch.where(near | (index == j), index, torch.full_like(index, -1)).amax(-1)
    waits = first_best > window - 1 - flash
    decided = torch.where(near.any(-1), -2 - last_edge, first_best)
    return torch.where((choice >= 0) & ~waits, decided, torch.where(choice >= 0, -1, choice))


def scan_events_torch(sims: torch.Tensor, choices: torch.Tensor, window: int, max_event: int,
                      drift: float) -> torch.Tensor:
    """The torch backend of the event scan: :func:`scan_events_loop`'s ends, without its loop over frames
    when there is no ``max_event`` (:func:`scan_events_unbounded`)."""
    if max_event == 0:
        return scan_events_unbounded(sims, choices, window, drift)
    return scan_events_loop(sims, choices, window, max_event, drift)


def scan_events_loop(sims: torch.Tensor, choices: torch.Tensor, window: int, max_event: int,
                     drift: float) -> torch.Tensor:
    """The streaming state machine, run over all frames (vectorised over streams): (B, T) bool event ends
    from (B, T-1) similarities and the window choices (ignored in drift mode, i.e. when ``drift`` is not
    NaN; a choice ``-2 - r`` restarts the window after similarity r without a boundary); ``max_event`` 0
    means none.  The spec of the scan."""
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
            full = frames_in_window == window + 1
            cut = full & (choice >= 0)
            boundary = t - window + choice
            ends[streams, boundary.clamp(min=0)] |= cut
            last_end = torch.where(cut, boundary, last_end)
            restart = torch.where(choice <= -2, t - window + (-2 - choice), boundary)  # left frame of the edge
            frames_in_window = torch.where(full & (choice != -1), t - restart, frames_in_window)
        if max_event > 0:
            cap = (t - last_end) >= max_event
            ends[:, t] |= cap
            last_end = torch.where(cap, t, last_end)
            frames_in_window = torch.where(cap, 0, frames_in_window)
    ends[:, T - 1] = True  # flush
    return ends


def scan_events_unbounded(sims: torch.Tensor, choices: torch.Tensor, window: int, drift: float) -> torch.Tensor:
    """:func:`scan_events_loop` without ``max_event``, in O(log T) steps over all frames at once.

    Without the cap, the state machine's state after a restart is only where it restarted.  Drift mode:
    every pair has two frames in its window, so pair s ends an event exactly when ``sims[s] < drift``.
    Window mode: after a restart at similarity R (a boundary, or a transient's last edge; R = -1 at the
    start) the window is full again at the decision on window p = R + 1, and decisions of choice -1
    change nothing; so the next decision that acts is on the first window ``p >= R + 1`` whose choice is
    not -1, and it restarts at ``p + j`` (j: the boundary's, or the transient's last edge's, index in the
    window).  Those windows are the orbit of the first one under ``p -> next(p)``, found by pointer
    doubling (the orbit's first 2^(i+1) windows from its first 2^i and ``next`` composed 2^i times).
    """
    B, T = sims.shape[0], sims.shape[1] + 1
    device = sims.device
    ends = torch.zeros((B, T), dtype=torch.bool, device=device)
    if drift == drift:  # not NaN: drift mode
        ends[:, :-1] = sims.double() < drift
    elif choices.shape[1] > 0:
        P = choices.shape[1]
        index = torch.arange(P, device=device).expand(B, P)
        acts = choices != -1
        # first_acting[:, x]: the first window p >= x whose choice acts, P (the sink) when none.
        first_acting = torch.full((B, P + 1), P, dtype=torch.int64, device=device)
        first_acting[:, :P] = torch.cummin(torch.where(acts, index, P).flip(-1), -1).values.flip(-1)
        restart = index + torch.where(choices >= 0, choices, -2 - choices)  # p + j; only read where acting
        jump = torch.full((B, P + 1), P, dtype=torch.int64, device=device)
        jump[:, :P] = first_acting.gather(1, (restart + 1).clamp(max=P))
        decided = torch.zeros((B, P + 1), dtype=torch.bool, device=device)
        decided.scatter_(1, first_acting[:, :1], True)
        for _ in range((P + 1).bit_length()):
            decided.scatter_(1, torch.where(decided, jump, P), True)
            jump = jump.gather(1, jump)
        cut = decided[:, :P] & (choices >= 0)
        ends.scatter_(1, torch.where(cut, index + choices, T - 1), True)  # the boundary, similarity p + j
    ends[:, T - 1] = True  # flush
    return ends
