"""Selective frame stacking (StreamChat sec. 3.1.1) and the Slow / Base / Fast presets.

A frame enters the vision buffer only when its Lucas-Kanade motion score
against the previous frame exceeds the threshold t.  StreamChat's presets use
t = 0.13 / 0.35 / 0.58 on a [0, 1] score; ``streammem_kernels.motion_magnitude``
maps mean flow to ``flow_px / (1 + flow_px)`` in [0, 1), so the same numbers
apply.  The first frame of a stream is always kept (there is nothing to compare
it with, and memory must start somewhere).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from streammem_kernels import motion_magnitude

__all__ = ["Preset", "PRESETS", "MotionGate"]


@dataclass(frozen=True)
class Preset:
    """StreamChat's speed presets: motion threshold t, chunk length L, group size g, centres C."""

    name: str
    threshold: float
    chunk: int
    group: int
    centres: int


PRESETS = {
    "slow": Preset("slow", 0.13, 35, 15, 5),
    "base": Preset("base", 0.35, 25, 10, 5),
    "fast": Preset("fast", 0.58, 30, 15, 5),
}


class MotionGate:
    """Streaming motion gate over RGB/gray frames.

    Parameters
    ----------
    threshold : float in [0, 1]
        Keep frame t when ``score(reference, t) > threshold``.
    size : int, optional
        Working resolution (long side) of the flow computation; 224 by default.
    reference : {"previous", "last_kept"}
        Compare with the previous frame (StreamChat) or with the last kept frame
        (slow drift accumulates until it crosses the threshold).
    backend : str
        Passed to ``motion_magnitude``.

    ``push(frames)`` takes a batch ``(n, H, W[, 3])`` of consecutive frames and
    returns ``(scores, kept)`` as two length-n lists; the score of the very first
    frame of the stream is reported as 1.0 (kept by definition).
    """

    def __init__(self, threshold: float = 0.35, *, size: int | None = 224, reference: str = "previous",
                 window: int | None = 5, backend: str = "auto"):
        if isinstance(threshold, bool) or not 0.0 <= float(threshold) <= 1.0:
            raise ValueError(f"threshold must be a number in [0, 1], got {threshold!r}")
        if reference not in ("previous", "last_kept"):
            raise ValueError(f"reference must be 'previous' or 'last_kept', got {reference!r}")
        self.threshold = float(threshold)
        self.size = size
        self.reference = reference
        self.window = window
        self.backend = backend
        self._anchor = None  # previous frame ("previous") or last kept frame ("last_kept")
        self.frames_seen = 0
        self.frames_kept = 0

    @classmethod
    def from_preset(cls, preset: str | Preset, **kwargs) -> "MotionGate":
        p = PRESETS[preset] if isinstance(preset, str) else preset
        return cls(p.threshold, **kwargs)

    def _scores(self, stack: np.ndarray | torch.Tensor) -> list[float]:
        res = motion_magnitude(stack, size=self.size, window=self.window, backend=self.backend)
        return res.score.tolist()

    def push(self, frames: Sequence[np.ndarray] | np.ndarray) -> tuple[list[float], list[bool]]:
        batch = np.asarray(frames) if not isinstance(frames, torch.Tensor) else frames
        if batch.ndim not in (3, 4):
            raise ValueError(f"frames must have shape (n, H, W) or (n, H, W, C), got {tuple(batch.shape)}")
        n = batch.shape[0]
        if n == 0:
            return [], []
        scores: list[float] = []
        kept: list[bool] = []
        start = 0
        if self._anchor is None:
            scores.append(1.0)
            kept.append(True)
            self._anchor = batch[0]
            start = 1
        if self.reference == "previous" and start < n:
            if isinstance(batch, torch.Tensor):
                stack = torch.cat([torch.as_tensor(self._anchor)[None], batch[start:]])
            else:
                stack = np.concatenate([self._anchor[None], batch[start:]])
            s = self._scores(stack)
            scores.extend(s)
            kept.extend(v > self.threshold for v in s)
            self._anchor = batch[-1]
        else:
            for t in range(start, n):
                pair = np.stack([np.asarray(self._anchor), np.asarray(batch[t])])
                s = self._scores(pair)[0]
                scores.append(s)
                keep = s > self.threshold
                kept.append(keep)
                if keep:
                    self._anchor = batch[t]
        self.frames_seen += n
        self.frames_kept += sum(kept)
        return scores, kept

    def state_dict(self) -> dict:
        """The reference frame and the counters (the frame as a tensor, so ``weights_only`` loading works)."""
        anchor = self._anchor
        is_numpy = anchor is not None and not isinstance(anchor, torch.Tensor)
        if is_numpy:
            anchor = torch.from_numpy(np.array(anchor, copy=True))
        elif anchor is not None:
            anchor = anchor.detach().clone()
        return {"anchor": anchor, "anchor_is_numpy": is_numpy, "frames_seen": self.frames_seen,
                "frames_kept": self.frames_kept}

    def load_state_dict(self, state: dict) -> None:
        anchor = state["anchor"]
        self._anchor = anchor.numpy() if anchor is not None and state["anchor_is_numpy"] else anchor
        self.frames_seen = int(state["frames_seen"])
        self.frames_kept = int(state["frames_kept"])

    def reset(self) -> None:
        self._anchor = None
        self.frames_seen = 0
        self.frames_kept = 0
