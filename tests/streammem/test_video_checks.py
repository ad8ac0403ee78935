"""VideoSource refuses files FFmpeg decodes that are no video (text, a still image), and FFmpeg's own
messages about damaged files stay off stderr (VideoSource says what went wrong itself)."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

cv2 = pytest.importorskip("cv2")

from streammem.io.video import VideoSource, sample_video_path  # noqa: E402

README = Path(__file__).resolve().parents[2] / "README.md"


def _write_avi(path, frames: int):
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 25.0, (64, 48))
    for i in range(frames):
        writer.write(np.full((48, 64, 3), (10 * i) % 256, np.uint8))
    writer.release()
    return path


def test_a_text_file_is_not_a_video(tmp_path):
    # FFmpeg's tty demuxer reads any .txt as ANSI art: this README decoded as a 25 fps, 640x400 "video".
    text = tmp_path / "readme.txt"
    text.write_text(README.read_text())
    with pytest.raises(ValueError, match=r"readme\.txt' is not a video: FFmpeg reads it as text.*codec 'ansi'"):
        VideoSource(text)


@pytest.mark.parametrize("name", ["picture.png", "picture.jpg"])
def test_a_still_image_is_not_a_video(tmp_path, name):
    image = tmp_path / name
    assert cv2.imwrite(str(image), np.zeros((48, 64, 3), np.uint8))
    with pytest.raises(ValueError, match=rf"{name}' is not a video: it holds a single frame, a still image"):
        VideoSource(image)


def test_a_single_frame_file_is_refused_and_two_frames_are_a_video(tmp_path):
    with pytest.raises(ValueError, match="single frame"):
        VideoSource(_write_avi(tmp_path / "one.avi", 1))
    source = VideoSource(_write_avi(tmp_path / "two.avi", 2))
    assert source.native_frame_count == 2 and len(list(source)) == 2


def test_a_cut_video_that_declares_more_frames_is_a_damaged_video_not_an_image(tmp_path):
    """One frame left of a clip that declares 250 is reported as truncated, not refused as a picture."""
    whole = _write_avi(tmp_path / "whole.avi", 250)
    data = whole.read_bytes()
    for cut in range(len(data) // 250, len(data), len(data) // 250):  # the shortest prefix that still decodes
        path = tmp_path / "cut.avi"
        path.write_bytes(data[:cut])
        try:
            source = VideoSource(path, on_truncation="ignore")
        except ValueError as exc:
            assert "single frame" not in str(exc)
            continue
        assert len(list(source)) >= 1 and source.decode_report.truncated
        break
    else:
        pytest.fail("no prefix of the clip decoded")


def _damaged_copies(folder: Path) -> tuple[Path, Path]:
    """The sample clip cut to its first third (its index, the moov atom, is at the end) and with bytes
    overwritten in the middle (h264 decoding errors while reading)."""
    data = sample_video_path().read_bytes()
    cut = folder / "cut.mp4"
    cut.write_bytes(data[: len(data) // 3])
    corrupt = bytearray(data)
    rng = np.random.default_rng(0)
    for offset in rng.integers(len(data) // 10, 8 * len(data) // 10, size=50):
        corrupt[offset:offset + 64] = rng.integers(0, 256, 64, dtype=np.uint8).tobytes()
    damaged = folder / "corrupt.mp4"
    damaged.write_bytes(bytes(corrupt))
    return cut, damaged


def _stderr_of(code: str, *args) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OPENCV_FFMPEG_LOGLEVEL"}
    proc = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stderr


def test_ffmpeg_messages_stay_off_stderr(tmp_path):
    cut, corrupt = _damaged_copies(tmp_path)
    # This FFmpeg build does talk about both files when OpenCV is used directly ...
    plain = _stderr_of("import sys, cv2\nfor path in sys.argv[1:]:\n    cap = cv2.VideoCapture(path)\n"
                       "    while cap.isOpened() and cap.read()[0]:\n        pass\n", cut, corrupt)
    assert "moov atom not found" in plain and "[h264 @" in plain
    # ... and says nothing through VideoSource, which reports the damage itself.
    ours = _stderr_of(
        "import sys\nfrom streammem.io.video import VideoSource\n"
        "try:\n    VideoSource(sys.argv[1])\nexcept ValueError as exc:\n    assert 'cannot open' in str(exc), exc\n"
        "source = VideoSource(sys.argv[2], on_truncation='ignore')\n"
        "frames = sum(1 for _ in source)\nassert source.decode_report.truncated and 0 < frames < 250, frames\n",
        cut, corrupt)
    assert ours == ""
