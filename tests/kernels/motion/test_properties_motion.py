"""Property-based suite (Hypothesis) for motion_magnitude / select_frames.

Generated frame stacks: T, odd and tiny sizes, 0/1/3 channels, every frame dtype, layouts (contiguous,
sliced, channels-first transposed back, stride-0 repeated frames), working size, window, pyramid levels,
gate statistic, and extreme values (NaN/Inf, float intensities outside [0, 1]).  The property: every CPU
backend returns the reference's flow within the op's declared tolerance (bit for bit where declared) and the
same keep/drop decisions, or raises the same ValueError the reference raises.  The input is never modified.

Derandomised and few examples: the Triton backend runs through the interpreter here.
"""
import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.support.device_checks import cpu_backends  # noqa: E402
from streammem_kernels import motion_magnitude, select_frames  # noqa: E402
from streammem_kernels.motion import LK_FLOW  # noqa: E402
from test_motion import assert_matches_reference  # noqa: E402

PROPERTY = settings(max_examples=12, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
BACKENDS = cpu_backends(LK_FLOW)
FRAME_DTYPES = [torch.uint8, torch.float16, torch.bfloat16, torch.float32, torch.float64]


@st.composite
def frame_stacks(draw):
    """(frames, kwargs): a stack of shifted smooth textures in a drawn dtype/layout, maybe poisoned."""
    t = draw(st.integers(2, 3))
    h, w = draw(st.integers(9, 29)), draw(st.integers(9, 29))
    channels = draw(st.sampled_from([None, 1, 3]))
    dtype = draw(st.sampled_from(FRAME_DTYPES))
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    # A smooth texture shifted by a drawn sub-pixel/whole-pixel step per frame (bilinear, in [0, 1]).
    base = torch.nn.functional.avg_pool2d(torch.rand(1, 1, h + 12, w + 12, generator=g), 3, 1)[0, 0]
    step = draw(st.sampled_from([0.0, 0.5, 1.0, 3.0]))
    frames = torch.stack([torch.roll(base, shifts=int(round(i * step)), dims=1)[:h, :w] for i in range(t)])
    if channels is not None:
        frames = frames[..., None].expand(t, h, w, channels) * torch.linspace(0.6, 1.0, channels)
    frames = frames.clamp(0, 1)
    frames = (frames * 255).round().to(torch.uint8) if dtype == torch.uint8 else frames.to(dtype)
    poison = draw(st.sampled_from([None, None, None, "nan", "inf", "above", "below"]))
    if poison is not None and dtype != torch.uint8:
        frames = frames.contiguous().clone()
        value = {"nan": float("nan"), "inf": float("inf"), "above": 1.5, "below": -0.25}[poison]
        frames.view(-1)[draw(st.integers(0, frames.numel() - 1))] = value
    layout = draw(st.sampled_from(["contiguous", "sliced", "transposed", "repeated"]))
    if layout == "sliced":
        frames = torch.cat([frames, frames], dim=2)[:, :, ::2]
    elif layout == "transposed":
        frames = frames.transpose(1, 2).contiguous().transpose(1, 2)
    elif layout == "repeated":  # stride 0 along time: every frame the same memory
        frames = frames[:1].expand(t, *frames.shape[1:])
    kwargs = {
        "size": draw(st.sampled_from([None, 16, 24])),
        "window": draw(st.sampled_from([None, 3, 5])),
        "levels": draw(st.sampled_from([1, "auto"])),
        "statistic": draw(st.sampled_from(["moving", "textured"])),
    }
    if kwargs["window"] is None:
        kwargs["levels"] = 1
    return frames, kwargs


def _outcome(call):
    try:
        return "ok", call()
    except ValueError as exc:
        return "error", str(exc)
    except Exception as exc:  # noqa: BLE001 -- any other class fails the property
        return "raised", repr(exc)


@PROPERTY
@given(frame_stacks())
def test_every_backend_matches_the_reference_or_raises_the_same_error(case):
    frames, kwargs = case
    before = frames.clone()
    ref = _outcome(lambda: motion_magnitude(frames, backend="torch", **kwargs))
    assert ref[0] != "raised", f"reference raised a non-ValueError: {ref[1]}"
    for backend in BACKENDS[1:]:
        got = _outcome(lambda: motion_magnitude(frames, backend=backend, **kwargs))
        assert got[0] == ref[0], f"{backend}: reference {ref}, backend {got}"
        if ref[0] == "error":
            assert got[1] == ref[1], f"{backend}: a different message: {got[1]!r} vs {ref[1]!r}"
        else:
            assert_matches_reference(got[1], ref[1], backend, frames.dtype)
            assert torch.isfinite(got[1].flow_px).all() and bool((got[1].score >= 0).all())
    torch.testing.assert_close(frames, before, rtol=0, atol=0, equal_nan=True)  # input not modified


@PROPERTY
@given(frame_stacks(), st.sampled_from([0.0, 0.05, 0.3, 0.9]), st.sampled_from(["previous", "last_kept"]))
def test_keep_decisions_identical_on_every_bit_exact_backend(case, threshold, reference):
    frames, kwargs = case
    ref = _outcome(lambda: select_frames(frames, threshold, reference=reference, backend="torch", **kwargs))
    for backend in BACKENDS[1:]:
        got = _outcome(lambda: select_frames(frames, threshold, reference=reference, backend=backend, **kwargs))
        assert got[0] == ref[0], f"{backend}: reference {ref}, backend {got}"
        if ref[0] == "ok" and LK_FLOW.tolerance(backend, torch.float32) == (0.0, 0.0):
            assert got[1] == ref[1], f"{backend} kept {got[1]}, the reference {ref[1]}"
