"""Motion on frames in the seed systems' conventions, declared by the caller: channel-first layout
(``channels="first"``), floats in another range (``value_range``) and per-channel normalisation
(``mean`` / ``std``, CLIP's).  Each declaration gives the readings of the same frames in the default
convention; a missing or contradicted declaration raises ValueError naming the argument."""
import numpy as np
import pytest
import torch

from tests.support.device_checks import cpu_backends
from streammem_kernels import StreamingMotionGate, motion_magnitude, select_frames, select_frames_mask
from streammem_kernels.motion import LK_FLOW

BACKENDS = [b for b in cpu_backends(LK_FLOW) if b != "triton"]  # the interpreter adds nothing here
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@pytest.fixture(scope="module")
def rgb_u8():
    """Four smooth random RGB frames (T, H, W, 3), uint8, odd sizes."""
    g = torch.Generator().manual_seed(3)
    x = torch.rand(4, 3, 37, 53, generator=g)
    x = torch.nn.functional.avg_pool2d(x.reshape(-1, 1, 37, 53), 3, 1, 1).reshape(4, 3, 37, 53)
    return (x * 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous()


def flow_of(frames, backend, **convention):
    return motion_magnitude(frames, backend=backend, **convention).flow_px


@pytest.mark.parametrize("backend", BACKENDS)
def test_channel_first_reads_as_channel_last(rgb_u8, backend):
    expected = flow_of(rgb_u8, backend)
    for frames in (rgb_u8, rgb_u8.float() / 255):
        first = frames.permute(0, 3, 1, 2)  # a non-contiguous view, as a CLIP batch often is
        torch.testing.assert_close(flow_of(first, backend, channels="first"), expected, rtol=0, atol=0)
        torch.testing.assert_close(flow_of(first.contiguous(), backend, channels="first"), expected, rtol=0, atol=0)
    gray = rgb_u8[..., :1]
    torch.testing.assert_close(flow_of(gray.permute(0, 3, 1, 2), backend, channels="first"), flow_of(gray, backend))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("low, high", [(0.0, 255.0), (-1.0, 1.0)])
def test_value_range_maps_to_unit_intensities(rgb_u8, backend, low, high):
    unit = rgb_u8.double() / 255
    frames = (unit * (high - low) + low).to(torch.float32)
    torch.testing.assert_close(flow_of(frames, backend, value_range=(low, high)), flow_of(unit.float(), backend),
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_clip_normalised_channel_first(rgb_u8, backend):
    """StreamChat's input: CLIP-normalised float frames, channel-first; the caller's tensor untouched."""
    unit = rgb_u8.float() / 255
    clip = ((unit - torch.tensor(CLIP_MEAN)) / torch.tensor(CLIP_STD)).permute(0, 3, 1, 2).contiguous()
    before = clip.clone()
    got = flow_of(clip, backend, channels="first", mean=CLIP_MEAN, std=CLIP_STD)
    torch.testing.assert_close(got, flow_of(unit, backend), rtol=1e-4, atol=1e-5)
    assert torch.equal(clip, before)
    # The same declaration through the selection functions, numpy arrays too.
    keep = select_frames_mask(clip.numpy(), 0.1, channels="first", mean=np.array(CLIP_MEAN), std=CLIP_STD,
                              backend=backend)
    assert keep.tolist() == select_frames_mask(unit, 0.1, backend=backend).tolist()
    assert select_frames(clip, 0.1, channels="first", mean=CLIP_MEAN, std=CLIP_STD, backend=backend) == \
        [t for t, k in enumerate(keep.tolist()) if k]


def test_scalar_mean_std_on_gray(rgb_u8):
    unit = rgb_u8[..., 0].float() / 255
    torch.testing.assert_close(flow_of((unit - 0.5) / 0.5, "torch", mean=0.5, std=0.5), flow_of(unit, "torch"),
                               rtol=1e-4, atol=1e-5)


def test_undeclared_conventions_are_refused_with_the_way_out(rgb_u8):
    clip = ((rgb_u8.float() / 255 - 0.5) / 0.25).permute(0, 3, 1, 2)
    with pytest.raises(ValueError, match="channels='first'"):
        motion_magnitude(clip.contiguous())
    with pytest.raises(ValueError, match="value_range=, mean= and std="):
        motion_magnitude(clip, channels="first")


@pytest.mark.parametrize("kwargs, match", [
    (dict(channels="middle"), "channels must be 'last'"),
    (dict(channels="first", mean=CLIP_MEAN), "mean and std .* go together"),
    (dict(channels="first", std=CLIP_STD), "mean and std .* go together"),
    (dict(channels="first", mean=(0.5, 0.5), std=CLIP_STD), "mean must be a number or 3 numbers"),
    (dict(channels="first", mean=CLIP_MEAN, std=(0.2, 0.0, 0.2)), "std must be > 0"),
    (dict(channels="first", mean=CLIP_MEAN, std=float("nan")), "std must be finite"),
    (dict(channels="first", value_range=(1.0, 0.0)), "value_range must be .* low < high"),
    (dict(channels="first", value_range=255), r"value_range must be \(low, high\)"),
    (dict(channels="first", value_range=(0, float("inf"))), r"value_range\[1\] must be finite"),
    # A wrong declaration: CLIP-normalised frames declared as 0..1 floats in (-1, 1).
    (dict(channels="first", value_range=(-1.0, 1.0)), "undone by value_range"),
])
def test_bad_declarations_name_the_argument(rgb_u8, kwargs, match):
    clip = ((rgb_u8.float() / 255 - torch.tensor(CLIP_MEAN)) / torch.tensor(CLIP_STD)).permute(0, 3, 1, 2)
    with pytest.raises(ValueError, match=match):
        motion_magnitude(clip, backend="torch", **kwargs)


def test_declaration_on_uint8_is_refused(rgb_u8):
    with pytest.raises(ValueError, match="value_range describes floating frames"):
        motion_magnitude(rgb_u8, value_range=(0, 255))
    with pytest.raises(ValueError, match="mean and std describe floating frames"):
        motion_magnitude(rgb_u8, mean=0.5, std=0.5)


def test_channel_first_needs_one_or_three_channels(rgb_u8):
    with pytest.raises(ValueError, match="1 or 3 channels in dimension 1"):
        motion_magnitude(rgb_u8, channels="first")  # (T, H, W, 3) read as (T, C=37, H, W)


def test_streaming_gate_on_clip_normalised_channel_first(rgb_u8):
    """The gate on CLIP tensors makes the decisions it makes on the uint8 frames (within the float32
    rounding of undoing the normalisation), and its state restores into a gate with the same declaration."""
    unit = rgb_u8.float() / 255
    clip = ((unit - torch.tensor(CLIP_MEAN)) / torch.tensor(CLIP_STD)).permute(0, 3, 1, 2).contiguous()
    plain = StreamingMotionGate(0.1, size=None, backend="torch")
    declared = StreamingMotionGate(0.1, size=None, backend="torch", channels="first", mean=CLIP_MEAN, std=CLIP_STD)
    want = plain.push(unit[:2])
    got = declared.push(clip[:2])
    restored = StreamingMotionGate(0.1, size=None, backend="torch", channels="first", mean=CLIP_MEAN, std=CLIP_STD)
    restored.load_state_dict(declared.state_dict())
    want_rest, got_rest, restored_rest = plain.push(unit[2:]), declared.push(clip[2:]), restored.push(clip[2:])
    np.testing.assert_allclose(got[0] + got_rest[0], want[0] + want_rest[0], rtol=1e-4, atol=1e-5)
    assert got[1] + got_rest[1] == want[1] + want_rest[1]
    assert restored_rest == got_rest


@pytest.mark.parametrize("kwargs, match", [
    (dict(channels="middle"), "channels must be 'last'"),
    (dict(mean=CLIP_MEAN), "mean and std .* go together"),
])
def test_streaming_gate_bad_declarations(kwargs, match):
    with pytest.raises(ValueError, match=match):
        StreamingMotionGate(0.1, **kwargs)
