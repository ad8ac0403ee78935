"""Motion magnitude: every backend against the reference on every device, the
Triton backend bit for bit, ground-truth shifts, a real clip against OpenCV DIS,
bad inputs, the GPU path free of host synchronisation (CUDA-graph capture on a
GPU), opcheck and torch.compile."""
import functools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.support.device_checks import cpu_backends
from tests.support.device_checks import DEVICES, HostSync, capture_in_cuda_graph, device_backends, guard_backend, no_host_sync
from tests.support.motion_baselines import seed_style_flow
from tests.support.motion_clips import fourier_shift, shifted_pair, smooth_texture
from streammem_kernels import motion_magnitude, select_frames, select_frames_mask
from streammem_kernels.motion import LK_FLOW
from streammem_kernels.motion.reference import window_average
from streammem_kernels.runtime.dispatch import load_native

BACKENDS = cpu_backends(LK_FLOW)
FAST = [b for b in BACKENDS if b != "triton"]  # the interpreter is ~0.5 ms per program


def random_clip(t, h, w, channels=None, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (t, h, w) if channels is None else (t, h, w, channels)
    x = torch.rand(shape, generator=g)
    # Smooth spatially so most windows are well conditioned but not all.
    flat = x if channels is None else x.permute(0, 3, 1, 2).reshape(-1, h, w)
    flat = F.avg_pool2d(flat[:, None], 3, 1, 1)[:, 0]
    x = flat if channels is None else flat.reshape(t, channels, h, w).permute(0, 2, 3, 1).contiguous()
    if dtype == torch.uint8:
        return (x * 255).round().to(torch.uint8)
    return x.to(dtype)


def assert_bitwise_equal(out, ref, what):
    assert out.dtype == ref.dtype and out.shape == ref.shape, what
    if out.dtype.is_floating_point:
        out, ref = out.view(torch.int32), ref.view(torch.int32)  # also tells -0.0 from 0.0
    same = out == ref
    assert bool(same.all()), f"{what}: {int((~same).sum())} of {same.numel()} values differ"


def assert_matches_reference(out, ref, backend, dtype):
    atol, rtol = LK_FLOW.tolerance(backend, dtype)
    for name in ("flow_px", "score", "mean_uv"):
        torch.testing.assert_close(getattr(out, name), getattr(ref, name), atol=atol, rtol=rtol,
                                   msg=lambda m: f"{backend} {name}: {m}")
        if (atol, rtol) == (0.0, 0.0):
            assert_bitwise_equal(getattr(out, name), getattr(ref, name), f"{backend} {name}")


# --------------------------------------------------------------------------
# Every backend matches the reference, on every device
# --------------------------------------------------------------------------
GRID = [
    # (T, H, W, channels, dtype, window)
    (2, 17, 23, None, torch.float32, 3),
    (2, 17, 23, None, torch.uint8, 5),
    (3, 17, 23, 3, torch.uint8, 7),
    (3, 17, 23, 3, torch.float32, None),
    (2, 33, 19, None, torch.float16, 5),
    (2, 21, 30, 3, torch.bfloat16, 3),
    (2, 19, 25, None, torch.float64, 5),
    (5, 40, 41, 1, torch.uint8, None),
    (4, 31, 64, 3, torch.float32, 5),
    (2, 20, 75, None, torch.uint8, 5),  # 69 output columns: two column tiles
    (6, 9, 9, None, torch.float32, 5),  # smallest frame for window 5: 7x7 gradients -> 3x3 outputs
    (2, 9, 9, None, torch.uint8, 7),  # one output pixel
    (2, 30, 40, None, torch.float32, 11),  # a large window
]


def _case_id(c):
    return f"T{c[0]}_{c[1]}x{c[2]}_c{c[3]}_{str(c[4])[6:]}_w{c[5]}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", GRID, ids=_case_id)
def test_backends_match_reference(device, case):
    t, h, w, ch, dtype, window = case
    frames = random_clip(t, h, w, ch, dtype, seed=t * h + w).to(device)
    ref = motion_magnitude(frames, window=window, backend="torch")
    assert ref.flow_px.shape == (t - 1,) and ref.mean_uv.shape == (t - 1, 2)
    assert ref.flow_px.device == frames.device
    assert bool((ref.flow_px > 0).all()), "the grid must exercise non-trivial flow"
    for backend in device_backends(LK_FLOW, device):
        assert_matches_reference(motion_magnitude(frames, window=window, backend=backend), ref, backend, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_input(device):
    base = random_clip(6, 40, 50, 3, torch.uint8, seed=3).to(device)
    sliced = base[::2, 3:30, 5:45]  # strided in time and space
    assert not sliced.is_contiguous()
    channels_last = random_clip(3, 20, 30, None, torch.float32, seed=5).to(device).transpose(1, 2)
    for frames in (sliced, channels_last):
        ref = motion_magnitude(frames.contiguous(), backend="torch")
        for backend in device_backends(LK_FLOW, device):
            assert_matches_reference(motion_magnitude(frames, backend=backend), ref, backend, frames.dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_avg_pool2d_sums_windows_row_major_from_zero(device):
    """The reference's window mean is avg_pool2d (on a GPU; on CPU its order written out): pinned
    to the float32 row-major sum from 0 divided by w*w, the order the Triton window kernel
    reproduces (a torch release changing it would break bit-for-bit equality; this says why)."""
    g = torch.Generator().manual_seed(0)
    small = (torch.rand(2, 5, 23, 37, generator=g) ** 3 - 0.3).to(device)
    large = (torch.rand(1, 5, 72, 75, generator=g) ** 3 - 0.3).to(device)  # window_average's written-out sum
    for prods, w in ((small, 3), (small, 5), (small, 7), (large, 5)):
        ho, wo = prods.shape[2] - w + 1, prods.shape[3] - w + 1
        total = torch.zeros(prods.shape[0], 5, ho, wo, device=device)
        for dy in range(w):
            for dx in range(w):
                total = total + prods[:, :, dy:dy + ho, dx:dx + wo]
        # A tensor divisor: a Python one is a multiplication by its reciprocal on CUDA, not a division.
        divisor = torch.full_like(total, float(w * w))
        assert_bitwise_equal(F.avg_pool2d(prods, w, stride=1), total / divisor, f"window {w}")
        assert_bitwise_equal(window_average(prods, w), total / divisor, f"window_average, window {w}")


# --------------------------------------------------------------------------
# Triton: bit for bit with the reference, stage by stage, and its decisions
# --------------------------------------------------------------------------
BIT_CASES = [
    # (T, H, W, dtype, window): the public outputs of every GRID case are bit-for-bit too
    (2, 17, 23, torch.uint8, 5),
    (2, 12, 75, torch.float32, 5),  # two column tiles, partial row and column tiles
    (2, 9, 9, torch.uint8, 7),  # Ho = Wo = 1
]


def _triton_on(device):
    if "triton" not in device_backends(LK_FLOW, device):
        pytest.skip(f"the Triton backend cannot run on {device} here")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", BIT_CASES, ids=lambda c: f"T{c[0]}_{c[1]}x{c[2]}_{str(c[3])[6:]}_w{c[4]}")
def test_triton_is_bit_for_bit_with_reference(device, case):
    from streammem_kernels.motion import reference as motion
    from streammem_kernels.motion._triton import flow_fields_triton, structure_products_triton

    _triton_on(device)
    t, h, w, dtype, window = case
    gray = random_clip(t, h, w, None, dtype, seed=h * w).to(device)
    prods = motion.structure_products(gray)
    assert_bitwise_equal(structure_products_triton(gray), prods, "structure products")
    if window is not None:
        fields = motion.flow_fields(motion.window_average(prods, window), 1e-5)
        assert bool((fields[:, 3] == 1).any()), "some pixels must be valid"
        assert_bitwise_equal(flow_fields_triton(prods, window, 1e-5), fields, "per-pixel |flow|, u, v, valid")
    ref = motion_magnitude(gray, window=window, backend="torch")
    assert_matches_reference(motion_magnitude(gray, window=window, backend="triton"), ref, "triton", dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_triton_pyramid_stages_are_bit_for_bit_with_reference(device, dtype):
    """Every pyramid stage (reduce, the coarsest level's shift search, guess, whole-pixel warp at
    factors 2 and 1, fields composed with a guess) equals the reference's bit for bit, on odd
    sizes with a moving texture so that the offsets are non-zero, and so does the whole pyramid."""
    from streammem_kernels.motion import reference as motion
    from streammem_kernels.motion._triton import TRITON_STAGES as tri

    _triton_on(device)
    ref = motion.TORCH_STAGES
    tex = smooth_texture(21, 27, sigma=2.0, seed=5)
    frames = torch.stack([fourier_shift(tex, 1.7 * i, -0.8 * i)[16:37, 16:43] for i in range(3)])
    frames = (frames * 255).round().to(torch.uint8) if dtype == torch.uint8 else frames.float()
    frames = frames.to(device)
    coarse = ref.reduce(frames)
    assert_bitwise_equal(tri.reduce(frames), coarse, "reduce")  # 21 x 27 -> 11 x 14
    radius = motion.search_radius(coarse.shape[1:])
    shift = ref.search(coarse[:-1], coarse[1:], radius)
    assert shift.abs().sum() > 0, "the search must find a shift"
    assert_bitwise_equal(tri.search(coarse[:-1], coarse[1:], radius), shift, "search")
    fields = ref.fields(ref.products(coarse[:-1], coarse[1:]), 5, 1e-5, None, tuple(coarse.shape[1:]), 0)
    assert bool((fields[:, 3] == 1).any())
    guess = ref.guess(fields)
    assert_bitwise_equal(tri.guess(fields), guess, "guess")
    for factor, level in ((1, coarse), (2, frames)):
        warped = ref.warp(level[1:], guess, 3, factor)
        assert not torch.equal(warped, level[1:]), "the guess must move something"
        assert_bitwise_equal(tri.warp(level[1:], guess, 3, factor), warped, f"warp, factor {factor}")
        prods = ref.products(level[:-1], warped)
        assert_bitwise_equal(tri.products(level[:-1], warped), prods, f"products, factor {factor}")
        hw = tuple(level.shape[1:])
        assert_bitwise_equal(tri.fields(prods, 5, 1e-5, guess, hw, factor),
                             ref.fields(prods, 5, 1e-5, guess, hw, factor), f"fields, factor {factor}")
    for statistic in motion.STATISTICS:
        assert_matches_reference(motion_magnitude(frames, statistic=statistic, backend="triton"),
                                 motion_magnitude(frames, statistic=statistic, backend="torch"), "triton", dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reference", ["previous", "last_kept"])
def test_triton_decisions_equal_reference_at_the_threshold(device, reference):
    """Thresholds set exactly at reference scores: a score equal to the threshold is dropped,
    one float32 step above it is kept, and Triton decides every frame as the reference does."""
    _triton_on(device)
    tex = smooth_texture(12, 12, seed=4)
    frames = torch.stack([fourier_shift(tex, 0.4 * i, 0.1 * i * i)[16:28, 16:28] for i in range(3)])
    frames = frames.float().to(device)
    scores = motion_magnitude(frames, window=3, backend="torch").score
    assert_bitwise_equal(motion_magnitude(frames, window=3, backend="triton").score, scores, "scores")
    for threshold in (float(scores.min()), float(scores.max())):
        below = float(np.nextafter(np.float32(threshold), np.float32(0)))
        for th in (threshold, below):
            ref = select_frames_mask(frames, th, reference=reference, window=3, backend="torch")
            out = select_frames_mask(frames, th, reference=reference, window=3, backend="triton")
            assert torch.equal(out, ref), (th, out, ref)
            if reference == "previous":  # equal to the threshold: dropped; one float32 step above: kept
                assert torch.equal(out[1:], scores.double() > th)


def test_numpy_and_list_inputs_match_tensor():
    frames = random_clip(3, 20, 24, 3, torch.uint8, seed=9)
    ref = motion_magnitude(frames, backend="torch").flow_px
    torch.testing.assert_close(motion_magnitude(frames.numpy(), backend="torch").flow_px, ref)
    torch.testing.assert_close(motion_magnitude([f.numpy() for f in frames], backend="torch").flow_px, ref)


def test_input_not_mutated():
    frames = random_clip(3, 20, 24, None, torch.float32, seed=4)
    before = frames.clone()
    for backend in BACKENDS:
        motion_magnitude(frames, size=16, backend=backend)
    assert torch.equal(frames, before)


def test_frames_that_require_grad_are_read_on_every_backend():
    """Floating frames that require grad are accepted, as by every op, and read as they are (the C++
    backend's border takes them without a copy; its earlier numpy border raised a RuntimeError);
    outputs never require grad."""
    frames = random_clip(3, 17, 23, None, torch.float32, seed=2)
    ref = motion_magnitude(frames, backend="torch")
    for backend in BACKENDS:
        for source, size in ((frames, None), (frames, 12), (frames[..., None].expand(3, 17, 23, 3), None)):
            out = motion_magnitude(source.clone().requires_grad_(), size=size, backend=backend)
            assert not any(t.requires_grad for t in out), backend
            if source is frames and size is None:
                assert_matches_reference(out, ref, backend, torch.float32)
        keep = select_frames_mask(frames.clone().requires_grad_(), 0.3, reference="last_kept", backend=backend)
        assert torch.equal(keep, select_frames_mask(frames, 0.3, reference="last_kept", backend=backend))


def test_closed_form_matches_linalg_solve_oracle():
    """The seed-style unfold + linalg.solve baseline agrees with the closed form (single scale,
    StreamChat's mean over the textured pixels)."""
    frames = random_clip(4, 30, 36, None, torch.float32, seed=11)
    oracle = seed_style_flow(frames, window=5)
    for backend in FAST:
        out = motion_magnitude(frames, window=5, levels=1, statistic="textured", backend=backend).flow_px
        torch.testing.assert_close(out, oracle, atol=1e-4, rtol=1e-3)


# --------------------------------------------------------------------------
# Ground truth: known sub-pixel shifts
# --------------------------------------------------------------------------
SHIFTS = [(d, 0.0) for d in (0.25, 0.5, 1.0)] + [(0.0, d) for d in (0.25, 0.5, 1.0)] + \
         [(d / math.sqrt(2), d / math.sqrt(2)) for d in (0.25, 0.5, 1.0)]


@pytest.mark.parametrize("backend", FAST)
@pytest.mark.parametrize("dx,dy", SHIFTS, ids=lambda v: f"{v:.3f}")
def test_known_shift_window_mode(backend, dx, dy):
    pair = shifted_pair(dx, dy)
    truth = math.hypot(dx, dy)
    res = motion_magnitude(pair, window=5, statistic="textured", backend=backend)
    assert abs(float(res.flow_px[0]) - truth) <= 0.1 * truth + 0.02
    u, v = res.mean_uv[0].tolist()
    assert abs(u - dx) <= 0.1 * truth + 0.02 and abs(v - dy) <= 0.1 * truth + 0.02  # direction and sign


@pytest.mark.parametrize("backend", FAST)
@pytest.mark.parametrize("dx,dy", SHIFTS, ids=lambda v: f"{v:.3f}")
def test_known_shift_global_mode(backend, dx, dy):
    pair = shifted_pair(dx, dy)
    truth = math.hypot(dx, dy)
    u, v = motion_magnitude(pair, window=None, backend=backend).mean_uv[0].tolist()
    assert abs(u - dx) <= 0.1 * truth + 0.02
    assert abs(v - dy) <= 0.1 * truth + 0.02


def test_known_shift_triton():
    if "triton" not in BACKENDS:
        pytest.skip("Triton not available")
    pair = shifted_pair(0.5, 0.5, h=40, w=40)
    truth = math.hypot(0.5, 0.5)
    assert abs(float(motion_magnitude(pair, window=5, backend="triton").flow_px[0]) - truth) <= 0.1 * truth + 0.02


LARGE = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 24.0, 32.0)


@functools.lru_cache(maxsize=None)
def _pairs(sigma, h, w):
    """Textures blurred by ``sigma`` at h x w, each moved by every LARGE shift (x, then y)."""
    return {(d, axis): shifted_pair(d if axis == 0 else 0.0, d if axis == 1 else 0.0, h=h, w=w, sigma=sigma,
                                    pad=48, seed=int(sigma * 10) + axis)
            for d in LARGE for axis in (0, 1)}


@pytest.mark.parametrize("backend", FAST)
@pytest.mark.parametrize("sigma,hw", [(1.5, (224, 224)), (3.0, (224, 224)), (1.5, (126, 224)), (3.0, (126, 224))],
                         ids=["s1.5-224x224", "s3-224x224", "s1.5-224x126", "s3-224x126"])
def test_pyramid_measures_large_shifts_within_ten_percent(backend, sigma, hw, record_property):
    """At 224 px, square and 16:9 (224 x 126: 4 levels, coarsest 16 x 28), the default
    pyramid measures known shifts from 0.25 to 32 px within 10 % along both axes, in the right
    direction, and monotone in the shift (per-pixel flow: the textured mean); the default
    "moving" statistic too from 0.5 px (below its 0.25-0.5 px noise floor it reads less, by
    design).  Single-scale LK saturates (3.4 px for 16 px at sigma 1.5): what the pyramid is for.
    (Before the coarsest level's shift search: 26.9 px for a vertical 32 px, and 7 px for 24 and
    32 px at 224 x 126.)"""
    pairs = _pairs(sigma, *hw)
    for axis in (0, 1):
        textured, moving = [], []
        for d in LARGE:
            res = motion_magnitude(pairs[d, axis], statistic="textured", backend=backend)
            textured.append(float(res.flow_px[0]))
            uv = res.mean_uv[0].tolist()
            assert abs(uv[axis] - d) <= 0.1 * d and abs(uv[1 - axis]) <= 0.1 * d, (d, axis, uv)  # direction
            moving.append(float(motion_magnitude(pairs[d, axis], backend=backend).flow_px[0]))
            record_property(f"flow_px_axis{axis}_at_{d}px", round(textured[-1], 4))
        for d, t, m in zip(LARGE, textured, moving):
            assert abs(t - d) <= 0.1 * d, (axis, d, t)
            if d >= 0.5:
                assert abs(m - d) <= 0.1 * d, (axis, d, m)
        assert all(b > a for a, b in zip(textured, textured[1:])), textured
        assert all(b > a for a, b in zip(moving[1:], moving[2:])), moving
    single = float(motion_magnitude(pairs[16.0, 0], levels=1, statistic="textured", backend=backend).flow_px[0])
    assert single < 0.6 * 16.0, single


@pytest.mark.parametrize("backend", BACKENDS)
def test_coarsest_search_finds_whole_pixel_shifts_and_prefers_none(backend):
    """The coarsest level's start (motion.search_shift) finds a whole-pixel shift of the content
    (dx, dy) within its radius, and no shift on flat frames (every sum equal: ties go to none);
    through the public function a shift of 4 coarsest pixels (32 px at level 0 of a 4-level
    pyramid) is measured."""
    from streammem_kernels.motion import reference as motion

    tex = smooth_texture(20, 30, sigma=1.0, seed=2).float()
    for dx, dy in ((0, 0), (3, -2), (-4, 4), (1, 0)):
        moved = torch.roll(tex, (dy, dx), (0, 1))  # moved[y, x] = tex[y - dy, x - dx]
        pair = torch.stack((tex, moved))[:, 16:36, 16:46]
        radius = motion.search_radius(pair.shape[1:])
        assert radius == (4, 4)
        assert motion.search_shift(pair[:1], pair[1:], radius).flatten().tolist() == [dx, dy]
        if backend == "triton":
            from streammem_kernels.motion._triton import search_shift_triton
            assert_bitwise_equal(search_shift_triton(pair[:1], pair[1:], radius),
                                 motion.search_shift(pair[:1], pair[1:], radius), "search")
    flat = torch.full((2, 20, 30), 0.5)
    flat[1] = 0.6
    assert motion.search_shift(flat[:1], flat[1:], (4, 4)).flatten().tolist() == [0, 0]


def test_cpp_reads_a_pair_the_same_in_any_batch():
    """The C++ backend splits a pair's rows into strips that restart their running window sums;
    the split depends on the frame size only, so a pair reads bit for bit the same alone, in a
    batch of three or of eight (it depended on the batch and the thread count: a streaming gate
    fed frame by frame disagreed with one call on the whole clip in the last bit)."""
    if "cpp" not in BACKENDS:
        pytest.skip("C++ backend not built")
    for shape in ((24, 32), (72, 96)):
        for seed in range(3):  # uint8 noise: every pixel textured, rounding differences show
            frames = torch.from_numpy(np.random.default_rng(seed).integers(0, 256, (9, *shape), dtype=np.uint8))
            whole = motion_magnitude(frames, backend="cpp")
            for t in range(8):
                for batch in (frames[t:t + 2], frames[max(t - 2, 0):t + 2]):
                    part = motion_magnitude(batch, backend="cpp")
                    what = f"{shape}, seed {seed}, pair {t}, batch of {len(batch) - 1}"
                    assert_bitwise_equal(part.flow_px[-1:], whole.flow_px[t:t + 1], what)
                    assert_bitwise_equal(part.mean_uv[-1:], whole.mean_uv[t:t + 1], what)


def test_pyramid_levels_resolve_and_validate():
    from streammem_kernels.motion import _resolve_levels
    from streammem_kernels.motion.reference import solved_levels

    assert _resolve_levels("auto", (224, 224), 5) == 5  # 14 x 14 coarsest, at most 5
    assert _resolve_levels("auto", (126, 224), 5) == 4  # 16 x 28; the next, 8 x 14, is below window + 4
    assert _resolve_levels("auto", (16, 16), 5) == 1  # 9 x 9 is the smallest level for window 5
    assert _resolve_levels("auto", (17, 17), 5) == 2
    assert _resolve_levels(1, (224, 224), 5) == 1
    assert _resolve_levels("auto", (224, 224), 0) == 1
    assert solved_levels(1) == [0] and solved_levels(2) == [1, 0] and solved_levels(5) == [4, 3, 2, 0]
    for levels, match in ((0, "levels"), (6, "at most 4"), (2.0, "levels"), (True, "levels"), ("two", "levels")):
        with pytest.raises(ValueError, match=match):
            motion_magnitude(torch.zeros(2, 126, 224), levels=levels)
    with pytest.raises(ValueError, match="window=None"):
        motion_magnitude(torch.zeros(2, 32, 32), window=None, levels=2)
    with pytest.raises(ValueError, match="statistic"):
        motion_magnitude(torch.zeros(2, 32, 32), statistic="mean")


@pytest.mark.parametrize("backend", BACKENDS)
def test_identical_and_flat_frames_give_exact_zero(backend):
    frame = random_clip(1, 20, 24, None, torch.float32, seed=2)[0]
    same = torch.stack((frame, frame, frame))
    res = motion_magnitude(same, backend=backend)
    assert torch.equal(res.flow_px, torch.zeros(2)) and torch.equal(res.mean_uv, torch.zeros(2, 2))
    flat = torch.full((3, 20, 24), 0.5)
    flat[2] = 0.7  # a global brightness change on a flat image: no texture, no flow
    for window in (5, None):
        res = motion_magnitude(flat, window=window, backend=backend)
        assert torch.isfinite(res.flow_px).all() and torch.equal(res.flow_px, torch.zeros(2))


def test_size_resizes_long_side():
    pair = shifted_pair(1.0, 0.0, h=64, w=128)
    full = float(motion_magnitude(pair, backend="torch").flow_px[0])
    half = float(motion_magnitude(pair, size=64, backend="torch").flow_px[0])
    # Flow is measured in pixels of the working resolution: halving halves it.
    assert abs(half - full / 2) < 0.1 * full


# --------------------------------------------------------------------------
# Real clip vs OpenCV DIS
# --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bikes_224():
    pytest.importorskip("cv2")
    from streammem_kernels.samples import read_video, sample_video_path

    return read_video(sample_video_path("bikes.mp4"), size=224, gray=True)


def test_real_clip_rank_correlates_with_opencv_dis(bikes_224):
    import cv2
    from scipy.stats import spearmanr

    frames = bikes_224
    dis = cv2.DISOpticalFlow_create(cv2.DISOPTICAL_FLOW_PRESET_ULTRAFAST)
    dis_mag = []
    for prev, cur in zip(frames[:-1], frames[1:]):
        flow = dis.calc(prev, cur, None)
        dis_mag.append(float(np.linalg.norm(flow, axis=2).mean()))
    ours = motion_magnitude(frames, backend="auto").score.numpy()
    rho = spearmanr(ours, dis_mag).statistic
    assert rho >= 0.8, rho
    ref = motion_magnitude(frames, backend="torch").score.numpy()  # the spec itself
    assert spearmanr(ref, dis_mag).statistic >= 0.8


def test_threshold_monotone_on_real_clip(bikes_224):
    counts = [len(select_frames(bikes_224, t)) for t in (0.0, 0.13, 0.35, 0.58, 0.8, 0.99)]
    assert all(b <= a for a, b in zip(counts, counts[1:])), counts
    assert counts[0] > counts[-1], counts


def test_select_frames_semantics():
    tex = smooth_texture(48, 48)
    still = tex[16:64, 16:64].float()
    frames = [still, still, fourier_shift(tex, 1.0, 0.0)[16:64, 16:64].float(), still]
    kept = select_frames(frames, 0.2, backend="torch")
    assert kept == [0, 2, 3]  # frame 1 is a repeat; 2 moved; 3 moves back
    # last_kept: slow drift accumulates against the last kept frame.
    drift = [fourier_shift(tex, 0.15 * i, 0.0)[16:64, 16:64].float() for i in range(8)]
    prev = select_frames(drift, 0.3, backend="torch")
    last = select_frames(drift, 0.3, reference="last_kept", backend="torch")
    assert prev == [0] and len(last) > 1 and last[0] == 0


@pytest.mark.parametrize("backend", FAST)  # Triton: test_triton_decisions_equal_reference_at_the_threshold
@pytest.mark.parametrize("reference", ["previous", "last_kept"])
def test_select_frames_mask_is_the_list_as_a_mask(backend, reference):
    """The device-resident gate and its Python-list wrapper agree, and the mask is what
    the scores say: frame t kept iff its score (against t-1, or the last kept frame) > t."""
    tex = smooth_texture(32, 32, seed=2)
    shifts = [0.0, 0.0, 0.6, 0.7, 0.7, 0.75, 2.0, 2.1]
    frames = torch.stack([fourier_shift(tex, d, 0.0)[16:48, 16:48] for d in shifts]).float()
    keep = select_frames_mask(frames, 0.2, reference=reference, backend=backend)
    assert keep.dtype == torch.bool and keep.shape == (len(shifts),) and bool(keep[0])
    assert torch.nonzero(keep).flatten().tolist() == select_frames(frames, 0.2, reference=reference,
                                                                   backend=backend)
    last = 0
    for t in range(1, len(shifts)):
        anchor = t - 1 if reference == "previous" else last
        score = motion_magnitude(frames[[anchor, t]], backend=backend).score[0]
        assert bool(keep[t]) == (float(score) > 0.2), (t, float(score))
        last = t if keep[t] else last
    assert 0 < int(keep.sum()) < len(shifts)


# --------------------------------------------------------------------------
# GPU path: no host synchronisation; CUDA-graph capture
# --------------------------------------------------------------------------
@pytest.mark.host_sync
def test_triton_path_never_syncs_with_the_host(monkeypatch):
    """Each public function's Triton path, run on CPU tensors through the interpreter inside a
    mode that raises on every tensor-to-host conversion: whole calls for uint8 frames (no value
    check), the backend alone for float frames (their finiteness check is a host check on CPU
    and a device-side assertion on CUDA)."""
    if "triton" not in BACKENDS:
        pytest.skip("Triton is not available")
    rgb = random_clip(2, 24, 36, 3, torch.uint8, seed=7)  # resized to 12 x 8: the gate's preparation
    gray = random_clip(3, 10, 12, None, torch.uint8, seed=8)
    with no_host_sync():
        motion_magnitude(rgb, size=12, backend="triton")
        motion_magnitude(gray, window=None, backend="triton")
        select_frames_mask(gray, 0.3, window=3, backend="triton")
        select_frames_mask(gray, 0.3, reference="last_kept", window=3, backend="triton")
        pyramid = random_clip(2, 19, 24, None, torch.uint8, seed=10)  # 2 levels: reduce, guess, warp kernels
        motion_magnitude(pyramid, backend="triton")
        select_frames_mask(pyramid, 0.3, statistic="textured", backend="triton")
        with pytest.raises(HostSync):  # the guard is live: the Python-list wrapper syncs, by design
            select_frames(gray, 0.3, window=3, backend="triton")
    guard_backend(monkeypatch, LK_FLOW, "triton")
    floats = random_clip(3, 10, 12, None, torch.float32, seed=9)
    motion_magnitude(floats, window=3, backend="triton")
    select_frames_mask(floats, 0.3, reference="last_kept", window=3, backend="triton")


@pytest.mark.parametrize("device", DEVICES[1:])
def test_cuda_graph_capture(device):
    """Every CUDA backend of every public function captured in a CUDA graph (no host sync), and
    the replay equals the eager call."""
    rgb = random_clip(4, 45, 80, 3, torch.uint8, seed=11).to(device)
    gray = random_clip(5, 21, 30, None, torch.float32, seed=12).to(device)
    for backend in device_backends(LK_FLOW, device):
        calls = {
            "motion_magnitude rgb": lambda: tuple(motion_magnitude(rgb, size=32, backend=backend)),
            "motion_magnitude global": lambda: tuple(motion_magnitude(gray, window=None, backend=backend)),
            "select_frames_mask": lambda: (select_frames_mask(gray, 0.3, backend=backend),),
            "select_frames_mask last_kept": lambda: (select_frames_mask(gray, 0.3, reference="last_kept",
                                                                        backend=backend),),
        }
        for what, fn in calls.items():
            eager, replayed = capture_in_cuda_graph(fn)
            for e, r in zip(eager, replayed):
                assert torch.equal(e, r), f"{backend} {what}"


# --------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------
BAD = [
    (dict(frames=torch.zeros(5, 8)), "frames"),
    (dict(frames=torch.zeros(2, 8, 8, 8, 1)), "frames"),
    (dict(frames=torch.zeros(3, 16, 16, 2)), "channels"),
    (dict(frames=torch.zeros(1, 16, 16)), "T >= 2"),
    (dict(frames=torch.zeros(0, 16, 16)), "frames"),
    (dict(frames=torch.zeros(3, 0, 16)), "empty"),
    (dict(frames=torch.zeros(3, 16, 16, dtype=torch.int32)), "dtype"),
    (dict(frames=torch.zeros(3, 16, 16, dtype=torch.bool)), "dtype"),
    (dict(frames=torch.full((3, 16, 16), float("nan"))), "finite"),
    (dict(frames=torch.full((3, 16, 16), float("inf"))), "finite"),
    (dict(frames=torch.zeros(3, 16, 16), window=4), "odd"),
    (dict(frames=torch.zeros(3, 16, 16), window=1), "window"),
    (dict(frames=torch.zeros(3, 16, 16), window=2.0), "window"),
    (dict(frames=torch.zeros(3, 16, 16), window=15), "at least"),
    (dict(frames=torch.zeros(3, 16, 16), min_eig=-1.0), "min_eig"),
    (dict(frames=torch.zeros(3, 16, 16), size=2), "size"),
    (dict(frames=[np.zeros((16, 16)), np.zeros((16, 17))]), "frames\\[1\\]"),
    (dict(frames="video.mp4"), "frames"),
    # uint8 frames: what the latency path declines (it never raises), the general path rejects
    (dict(frames=torch.zeros(1, 16, 16, dtype=torch.uint8)), "T >= 2"),
    (dict(frames=np.zeros((1, 16, 16, 3), dtype=np.uint8)), "T >= 2"),
    (dict(frames=torch.zeros(3, 16, 16, 2, dtype=torch.uint8)), "channels"),
    (dict(frames=torch.zeros(3, 0, 16, 3, dtype=torch.uint8)), "empty"),
    (dict(frames=torch.zeros(3, 16, 16, 3, dtype=torch.uint8), window=4), "odd"),
    (dict(frames=torch.zeros(3, 16, 16, 3, dtype=torch.uint8), size=2), "size"),
    (dict(frames=torch.zeros(3, 16, 16, dtype=torch.uint8), levels=3), "levels=3"),
    (dict(frames=torch.zeros(3, 16, 16, dtype=torch.uint8), statistic="median"), "statistic"),
    (dict(frames=torch.zeros(3, 8, 16, dtype=torch.uint8), window=7), "at least"),
    (dict(frames=torch.zeros(3, 16, 16, dtype=torch.uint8), backend="bogus"), "bogus"),
]


@pytest.mark.parametrize("kwargs,match", BAD, ids=[m for _, m in BAD])
def test_bad_input_raises_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        motion_magnitude(**kwargs)


@pytest.mark.parametrize("backend", ["torch", "cpp", "triton"])
@pytest.mark.parametrize("value", [1e20, 255.0, -1e-3, 1.0 + 1e-6], ids=["1e20", "0-255", "negative", "above-1"])
def test_float_frames_outside_unit_range_rejected_on_every_backend(backend, value):
    # Unchecked, float frames ~1e20 gave NaN on cpp and 0 on torch/triton, and 0..255 floats a wrong flow.
    frames = torch.rand(3, 16, 16, generator=torch.Generator().manual_seed(0))
    frames[1, 3, 5] = value
    before = frames.clone()
    with pytest.raises(ValueError, match=r"frames must be finite and, for a floating dtype, intensities in \[0, 1\]"):
        motion_magnitude(frames, backend=backend)
    assert torch.equal(frames, before)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_float_frames_at_the_unit_range_edges_accepted(dtype):
    frames = torch.zeros(3, 16, 16, dtype=dtype)
    frames[1:, 4:12, 4:12] = 1.0
    res = motion_magnitude(frames, backend="torch")
    assert torch.isfinite(res.flow_px).all()


def test_select_frames_bad_arguments():
    frames = torch.zeros(3, 16, 16)
    with pytest.raises(ValueError, match="threshold"):
        select_frames(frames, 1.5)
    with pytest.raises(ValueError, match="reference"):
        select_frames(frames, 0.5, reference="first")


# --------------------------------------------------------------------------
# Custom op: opcheck and torch.compile
# --------------------------------------------------------------------------
@pytest.mark.parametrize("backend", FAST)
@pytest.mark.parametrize("window", [5, 0])
def test_opcheck(backend, window):
    gray = random_clip(3, 20, 22, None, torch.float32, seed=1)
    levels = 1 if window == 0 else 2
    for stat in ("moving", "textured"):
        torch.library.opcheck(torch.ops.streammem.lk_flow.default, (gray, window, 1e-5, levels, stat, backend))
    gray_u8 = random_clip(3, 20, 22, None, torch.uint8, seed=1)
    torch.library.opcheck(torch.ops.streammem.lk_flow.default, (gray_u8, window, 1e-5, levels, "moving", backend))


def test_cpp_custom_op_reads_any_layout():
    """The lk_flow custom op on the C++ backend reads a non-contiguous gray as its contiguous copy
    (the C++ border takes C-contiguous tensors; the backend's glue makes them)."""
    if "cpp" not in BACKENDS:
        pytest.skip("the C++ backend is not built")
    gray = random_clip(3, 20, 30, seed=8).transpose(1, 2)
    out = torch.ops.streammem.lk_flow(gray, 5, 1e-5, 2, "moving", "cpp")
    ref = torch.ops.streammem.lk_flow(gray.contiguous(), 5, 1e-5, 2, "moving", "cpp")
    for name, a, b in zip(("flow_px", "mean_uv"), out, ref):
        assert_bitwise_equal(a, b, name)


def test_torch_compile_on_cpu():
    frames = random_clip(3, 20, 22, None, torch.float32, seed=6)

    @torch.compile(backend="aot_eager", fullgraph=True)
    def gate(gray):
        flow_px, _ = torch.ops.streammem.lk_flow(gray, 5, 1e-5, 2, "moving", "cpp" if "cpp" in BACKENDS else "torch")
        return flow_px / (1 + flow_px)

    torch.testing.assert_close(gate(frames), motion_magnitude(frames, backend="torch").score, atol=2e-5, rtol=2e-4)

    @torch.compile(backend="aot_eager", fullgraph=True)  # validation and all: one graph
    def score(x):
        return motion_magnitude(x).score * 2

    torch.testing.assert_close(score(frames), motion_magnitude(frames, backend="torch").score * 2,
                               atol=2e-5, rtol=2e-4)


@pytest.mark.parametrize("backend", FAST)
@pytest.mark.parametrize("shape,size", [((3, 37, 53, 3), 24), ((3, 40, 30), 17), ((2, 23, 29, 3), None),
                                        ((2, 16, 16, 3), 16)])
def test_prepared_resize_matches_reference(backend, shape, size):
    """The C++ path fuses gray conversion and area resizing; it must match torch's."""
    g = torch.Generator().manual_seed(sum(shape))
    frames = torch.randint(0, 256, shape, dtype=torch.uint8, generator=g)
    ref = motion_magnitude(frames, size=size, backend="torch")
    out = motion_magnitude(frames, size=size, backend=backend)
    torch.testing.assert_close(out.flow_px, ref.flow_px, atol=2e-5, rtol=2e-4)
    torch.testing.assert_close(out.mean_uv, ref.mean_uv, atol=2e-5, rtol=2e-4)


@pytest.mark.parametrize("shape,out_hw", [((3, 136, 320, 3), (95, 224)), ((2, 97, 61), (40, 25)),
                                          ((1, 9, 9, 3), (9, 9)), ((2, 50, 50, 3), (1, 1)),
                                          ((2, 64, 48, 3), (64, 47))])
def test_native_gray_area_equals_torch_preparation(shape, out_hw):
    """The fused C++ uint8 -> gray -> area resize against F.interpolate(mode="area") on the
    same gray image: overlapping bins (H not a multiple of out_h), one band and many bands
    of output rows, a 1x1 output and an unchanged height."""
    from streammem_kernels.runtime.dispatch import load_native
    from streammem_kernels.motion.reference import gray_resize as _gray_resize_torch

    from streammem_kernels.runtime.native import view

    mod, why = load_native("cpu", "motion")
    if mod is None:
        pytest.skip(why)
    g = torch.Generator().manual_seed(sum(shape))
    frames = torch.randint(0, 256, shape, dtype=torch.uint8, generator=g)
    out = torch.empty((shape[0], *out_hw))
    assert mod.gray_area(view(frames), view(out)) == 0
    ref = _gray_resize_torch(frames.float() if frames.dim() == 3 else frames, out_hw)
    if frames.dim() == 3:
        ref = ref / 255.0
    assert out.shape == (shape[0], *out_hw)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


FUSED_CASES = [  # (shape, size): uint8 gray kept, gray shrunk, RGB kept, RGB shrunk, odd sizes, T > 2
    ((2, 17, 23), None), ((3, 40, 30), 17), ((2, 23, 29, 3), None), ((3, 37, 53, 3), 24), ((4, 31, 64, 3), 40),
]


@pytest.mark.parametrize("as_numpy", [False, True], ids=["tensor", "numpy"])
@pytest.mark.parametrize("window,statistic", [(5, "moving"), (3, "textured"), (None, "moving")])
@pytest.mark.parametrize("shape,size", FUSED_CASES)
def test_fused_uint8_path_is_bit_for_bit_the_general_path(monkeypatch, shape, size, window, statistic, as_numpy):
    """Contiguous uint8 CPU frames on the C++ backend take the latency path LK_FLOW declares (the
    general path's native steps, gray_area and lk_flow, without Python between them); it must be
    the general path's result bit for bit and leave the frames untouched.  A spy checks that the
    latency path answered, so the test cannot pass through the general path alone."""
    from streammem_kernels import motion
    from streammem_kernels.runtime.dispatch import load_native

    mod, why = load_native("cpu", "motion")
    if mod is None:
        pytest.skip(why)
    frames = random_clip(shape[0], shape[1], shape[2], shape[3] if len(shape) == 4 else None, torch.uint8,
                         seed=sum(shape))
    frames = frames.numpy() if as_numpy else frames
    before = frames.copy() if as_numpy else frames.clone()
    answers = []
    fast = LK_FLOW.fast
    monkeypatch.setattr(LK_FLOW, "fast", lambda *a: answers.append(fast(*a)) or answers[-1])
    out = motion_magnitude(frames, size=size, window=window, statistic=statistic)
    assert len(answers) == 1 and answers[0] is out, "contiguous uint8 CPU frames must take the latency path"
    prepared = motion._prepare(frames, size, window, 1e-5, "auto", statistic, "cpp")
    ref = motion._motion_of_gray(*prepared, "cpp")
    for name in ("flow_px", "score", "mean_uv"):
        assert_bitwise_equal(getattr(out, name), getattr(ref, name), name)
    assert bool((out.flow_px > 0).all()), "the cases must exercise non-trivial flow"
    np.testing.assert_array_equal(np.asarray(frames), np.asarray(before))
    # Outside the fused case (enlarging, a non-contiguous view, the torch backend): the general path.
    bigger = max(shape[1:3]) + 7
    sliced = torch.as_tensor(frames)[:, :, 1:]
    for kwargs in (dict(frames=frames, size=bigger), dict(frames=sliced, size=size), dict(frames=frames, size=size,
                                                                                          backend="torch")):
        motion_magnitude(window=window, statistic=statistic, **kwargs)
    assert sum(a is not None for a in answers) == 1


LATENCY_ARGS = dict(size=None, window=5, min_eig=1e-5, levels="auto", statistic="moving")


@pytest.mark.parametrize("bad", [dict(size=2), dict(size=[224]), dict(window=4), dict(window=1), dict(window=2.0),
                                 dict(window=31), dict(min_eig=-1.0), dict(levels=0), dict(levels=9),
                                 dict(levels="all"), dict(statistic="median")], ids=repr)
def test_latency_path_declines_bad_arguments_with_the_general_paths_error(bad):
    """The latency path never raises: on arguments it does not take it answers None, and the public
    function raises the general path's error, word for word the one raised for the same frames as a
    non-contiguous view (which the latency path never sees)."""
    mod, why = load_native("cpu", "motion")
    if mod is None:
        pytest.skip(why)
    frames = random_clip(2, 24, 32, 3, torch.uint8, seed=4)
    assert LK_FLOW.fast(mod, frames, *{**LATENCY_ARGS, **bad}.values()) is None
    with pytest.raises(ValueError) as plain:
        motion_magnitude(frames, **bad)
    with pytest.raises(ValueError) as strided:
        motion_magnitude(torch.cat((frames, frames), dim=2)[:, :, :32], **bad)
    assert str(plain.value) == str(strided.value)


@pytest.mark.filterwarnings("ignore:The given NumPy array is not writable")  # torch's, for any read-only array
def test_latency_path_declines_inputs_it_does_not_take():
    """Frames the C++ entries do not read as they are (read-only or non-contiguous arrays, a channel
    dimension of 1, floating frames, a tensor subclass, one frame, an enlarged working size) get
    None from the latency path and the general path's answer from the public function."""
    mod, why = load_native("cpu", "motion")
    if mod is None:
        pytest.skip(why)

    class Frames(torch.Tensor):
        pass

    rgb = random_clip(3, 24, 32, 3, torch.uint8, seed=6)
    read_only = rgb.numpy().copy()
    read_only.setflags(write=False)
    strided = rgb.numpy()[:, :, ::2]
    cases = [  # (frames, arguments, the same values as a tensor the general path takes)
        (read_only, {}, rgb), (strided, {}, torch.from_numpy(strided.copy())),
        (rgb[..., :1].contiguous(), {}, rgb[..., 0]), (rgb.float() / 255, {}, rgb.float() / 255),
        (rgb.as_subclass(Frames), {}, rgb), (rgb, dict(size=40), rgb)]
    assert LK_FLOW.fast(mod, rgb[:1], *LATENCY_ARGS.values()) is None
    for frames, kwargs, same in cases:
        assert LK_FLOW.fast(mod, frames, *{**LATENCY_ARGS, **kwargs}.values()) is None
        out = motion_magnitude(frames, **kwargs)
        ref = motion_magnitude(same, backend="cpp", **kwargs)
        for name in ("flow_px", "score", "mean_uv"):
            assert_bitwise_equal(getattr(out, name), getattr(ref, name), name)
