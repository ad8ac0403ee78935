"""Synthetic video with known scene cuts, for tests, benchmarks and soak runs.

Each scene is a solid palette colour (``encoders.COLOUR_NAMES``) overlaid with a
fixed random texture that drifts a few pixels per frame, so the motion gate
sees motion inside a scene, the scene's features stay close together, and a
cut changes both colour and texture.
"""
from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from ..models.encoders import COLOUR_NAMES

__all__ = ["SyntheticVideo"]


class SyntheticVideo:
    """Iterable of ``(timestamp, frame)`` for scenes of given colours and lengths.

    Parameters
    ----------
    colours : sequence of str
        Palette names, one per scene (``COLOUR_NAMES``); repeats allowed.
    scene_frames : int or sequence of int
        Frames per scene.
    size : (H, W)
        Frame size.
    fps : float
        Frame rate of the timestamps.
    shift : int
        Texture drift in pixels per frame.
    seed : int
    total_frames : int, optional
        Cycle through the scenes until this many frames were produced.

    Thread-safe: each iteration is independent (the textures are only read), so
    several threads may iterate one instance at once.
    """

    def __init__(self, colours: Sequence[str], scene_frames: int | Sequence[int] = 40, *, size=(32, 32),
                 fps: float = 10.0, shift: int = 2, seed: int = 0, total_frames: int | None = None):
        unknown = [c for c in colours if c not in COLOUR_NAMES]
        if unknown or not colours:
            raise ValueError(f"colours must be non-empty names from COLOUR_NAMES, got unknown {unknown}")
        lengths = [int(scene_frames)] * len(colours) if np.isscalar(scene_frames) else [int(n) for n in scene_frames]
        if len(lengths) != len(colours) or min(lengths) < 1:
            raise ValueError("scene_frames must be a positive int or one positive int per colour")
        self.colours = list(colours)
        self.lengths = lengths
        self.size = tuple(int(s) for s in size)
        self.fps = float(fps)
        self.shift = int(shift)
        self.seed = int(seed)
        self.total_frames = sum(lengths) if total_frames is None else int(total_frames)
        rng = np.random.default_rng(seed)
        h, w = self.size
        self._textures = [rng.integers(-60, 61, size=(2 * h, 2 * w, 1)).astype(np.int16) for _ in colours]

    @property
    def cuts(self) -> list[int]:
        """Frame indices where a new scene starts (within one pass over the scenes)."""
        return list(np.cumsum(self.lengths)[:-1])

    def scene_of(self, index: int) -> int:
        """Scene number (position in ``colours``) of frame ``index``."""
        pos = index % sum(self.lengths)
        return int(np.searchsorted(np.cumsum(self.lengths), pos, side="right"))

    def __len__(self) -> int:
        return self.total_frames

    def __iter__(self) -> Iterator[tuple[float, np.ndarray]]:
        h, w = self.size
        period = sum(self.lengths)
        starts = np.concatenate([[0], np.cumsum(self.lengths)[:-1]])
        for i in range(self.total_frames):
            scene = self.scene_of(i)
            step = (i % period - starts[scene]) * self.shift
            tex = self._textures[scene]
            dy, dx = step % h, (step * 2) % w
            patch = tex[dy:dy + h, dx:dx + w]
            base = np.asarray(COLOUR_NAMES[self.colours[scene]], dtype=np.int16)[None, None, :]
            yield i / self.fps, np.clip(base + patch, 0, 255).astype(np.uint8)
