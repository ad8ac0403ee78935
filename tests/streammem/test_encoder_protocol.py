"""The encoder protocol: a user's frame or text encoder may return EncodedFrames, or bare (n, dim) arrays,
tensors or rows; anything else is refused with one line saying what to return.  The module docstring's
and the example in docs/streaming.md run."""
import doctest
from pathlib import Path

import numpy as np
import pytest
import torch

import streammem as sm
from streammem import (EncodedFrames, HashingTextEncoder, MemoryConfig, PixelEncoder, Preset, StreamMemory,
                       SyntheticVideo)
from streammem.models import encoders
from streammem.models.encoders import encode_frames, encode_texts

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

STREAMING_DOC = Path(__file__).resolve().parents[2] / "docs" / "streaming.md"


class Returning:
    """A frame or text encoder whose ``encode`` returns what ``make(pixel features or hashed texts)`` gives."""

    def __init__(self, inner, make):
        self.inner, self.make, self.dim, self.name = inner, make, inner.dim, "returning"

    def encode(self, items):
        out = self.inner.encode(items)
        return self.make(out.features if isinstance(out, EncodedFrames) else out)


def _clip():
    video = SyntheticVideo(["red", "green", "blue", "yellow"], [12, 12, 12, 12], size=(16, 16), fps=10.0, seed=0)
    frames = np.stack([f for _, f in video])
    return [i / 10.0 for i in range(len(frames))], frames


def _memory(frame_encoder, text_encoder):
    config = MemoryConfig(preset=Preset("t", 0.1, 6, 3, 2), motion_size=None)
    return StreamMemory(config, frame_encoder, text_encoder, answer_fn=lambda ctx: "ok")


def _run(memory):
    times, frames = _clip()
    for i in range(0, len(frames), 8):
        memory.push(times[i:i + 8], frames[i:i + 8])
    memory.finish()
    return memory.ask("when was the screen green?").to_dict()


_ARRAY_FORMS = {
    "numpy float64": lambda f: f.double().numpy(),
    "numpy float32": lambda f: f.numpy(),
    "tensor float64": lambda f: f.double(),
    "list of rows": lambda f: f.tolist(),
}


@pytest.mark.parametrize("form", list(_ARRAY_FORMS))
def test_encoders_returning_bare_arrays_run_the_memory_like_the_built_in_ones(form):
    # The failure this protocol fixes: a frame encoder returning a numpy array died with
    # "AttributeError: 'numpy.ndarray' object has no attribute 'labels'".  Bare features are wrapped with no
    # labels; the memory then equals that of the built-in encoders fed the same features without labels.
    make = _ARRAY_FORMS[form]
    frames_only = Returning(PixelEncoder(), lambda f: EncodedFrames(f, []))
    expected = _run(_memory(frames_only, HashingTextEncoder()))
    got = _run(_memory(Returning(PixelEncoder(), make), Returning(HashingTextEncoder(), make)))
    assert got["tree_best"] == expected["tree_best"] and got["short_term"] == expected["short_term"]


def test_encode_frames_wraps_arrays_and_keeps_encoded_frames():
    frames = np.zeros((3, 8, 8, 3), np.uint8)
    pixel = PixelEncoder(grid=2)
    own = pixel.encode(frames)
    assert encode_frames(Returning(pixel, lambda f: own), frames) is own  # float32 features: as they are
    wrapped = encode_frames(Returning(pixel, lambda f: f.double().numpy()), frames)
    assert wrapped.features.dtype == torch.float32 and wrapped.features.shape == (3, pixel.dim)
    assert wrapped.labels == []
    inner = encode_frames(Returning(pixel, lambda f: EncodedFrames(f.numpy(), [("a",)] * 3)), frames)
    assert isinstance(inner.features, torch.Tensor) and inner.labels == [("a",)] * 3
    texts = encode_texts(Returning(HashingTextEncoder(dim=16), lambda e: e.numpy()), ["a b", "c"])
    assert texts.dtype == torch.float32 and texts.shape == (2, 16)


_BAD_FRAMES = {
    "a dict": (lambda f: {"features": f}, "returned a builtins.dict"),
    "one row too few": (lambda f: f[1:], r"returned shape \(2, 15\) for n = 3"),
    "a flat vector": (lambda f: f.flatten(), r"returned shape \(45,\) for n = 3"),
    "another width": (lambda f: f[:, :4], "returned 4 features per row but its dim is 15"),
    "strings": (lambda f: np.array([["x"] * 15] * 3), "returned an array of dtype <U1"),
    "complex": (lambda f: f.to(torch.complex64), "returned a tensor of dtype complex64"),
    "ragged rows": (lambda f: [[0.0] * 15, [0.0] * 14, [0.0] * 15], "returned rows of different lengths"),
    "labels for other frames": (lambda f: EncodedFrames(f, [("a",)]), "returned 1 labels for 3 frames"),
}


@pytest.mark.parametrize("case", list(_BAD_FRAMES))
def test_anything_else_is_refused_with_one_line_saying_what_to_return(case):
    make, match = _BAD_FRAMES[case]
    frames = np.zeros((3, 8, 8, 3), np.uint8)
    with pytest.raises(ValueError, match=match) as info:
        encode_frames(Returning(PixelEncoder(grid=2), make), frames)
    message = str(info.value)
    assert "\n" not in message and "return EncodedFrames(features, labels) or an (n, dim) float array" in message


def test_a_text_encoder_returning_the_wrong_thing_is_refused_in_one_line():
    for make, match in ((lambda e: e[0], r"returned shape \(16,\) for n = 2"), (lambda e: "text", "builtins.str")):
        with pytest.raises(ValueError, match=match) as info:
            encode_texts(Returning(HashingTextEncoder(dim=16), make), ["a", "b"])
        assert "\n" not in str(info.value) and "return an (n, dim) float array or tensor" in str(info.value)
    # Through a memory: the caption embedding of the first long-term node asks the text encoder.
    with pytest.raises(ValueError, match="text_encoder.encode"):
        _run(_memory(PixelEncoder(), Returning(HashingTextEncoder(), lambda e: e[:, :3])))


def test_module_docstring_example_runs():
    result = doctest.testmod(encoders, verbose=False)
    assert result.attempted >= 5 and result.failed == 0


def test_docs_encoder_snippet_runs(capsys):
    section = STREAMING_DOC.read_text().split("<!-- encoder protocol -->", 1)[1].split("<!-- end encoder protocol -->", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, "docs/streaming.md (encoder protocol)", "exec"), {"sm": sm})
    assert "ValueError: frame_encoder.encode(frames) returned" in capsys.readouterr().out
