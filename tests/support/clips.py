"""Video files with known content for the CLI and report tests (written with OpenCV, MJPG in AVI).

Each scene is a palette colour (``streammem.encoders.COLOUR_NAMES``, which
``PixelEncoder`` names in its labels) under a random texture that drifts two
pixels per frame, or stays still: the motion gate drops every frame of a still
scene after its first, so such a clip has known kept and dropped stretches.
"""
from __future__ import annotations

import numpy as np

# (colour, seconds, moving): what is on screen at any time is known.
SCENES = (("red", 10.0, True), ("green", 10.0, True), ("blue", 10.0, False), ("yellow", 10.0, True))


def write_clip(path, scenes=SCENES, *, fps: float = 25.0, size=(96, 64), seed: int = 0):
    """Write the scenes to ``path`` (.avi) at ``fps``; returns ``path``."""
    import cv2

    from streammem.models.encoders import COLOUR_NAMES

    w, h = size
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), fps, (w, h))
    if not writer.isOpened():
        raise RuntimeError("OpenCV cannot write MJPG video here")
    rng = np.random.default_rng(seed)
    try:
        for colour, seconds, moving in scenes:
            texture = rng.integers(-60, 61, size=(2 * h, 2 * w, 1)).astype(np.int16)
            base = np.asarray(COLOUR_NAMES[colour], np.int16)[None, None, :]
            for i in range(int(round(seconds * fps))):
                step = 2 * i if moving else 0
                dy, dx = step % h, (2 * step) % w
                rgb = np.clip(base + texture[dy:dy + h, dx:dx + w], 0, 255).astype(np.uint8)
                writer.write(cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    finally:
        writer.release()
    return path


def scene_at(t: float, scenes=SCENES) -> str:
    """Colour on screen at stream time ``t``."""
    end = 0.0
    for colour, seconds, _ in scenes:
        end += seconds
        if t < end:
            return colour
    return scenes[-1][0]
