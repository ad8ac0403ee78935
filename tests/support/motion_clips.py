"""Synthetic frames with known motion, for the motion tests, benchmarks and the gate's calibration.

* ``smooth_texture`` / ``fourier_shift`` / ``shifted_pair``: a blurred random
  texture and the same texture moved by an exact, known (sub-pixel) amount --
  the ground truth of the flow estimate itself.
* ``moving_object_clip``: a static camera (fixed textured background, sensor
  noise, 8-bit quantisation) in which textured objects of known size move along
  known straight paths, bouncing off the borders, during known frame ranges --
  the ground truth of the gate (which pairs contain motion, how fast, how big).

Nothing here is shipped; bench/ imports it through ``sys.path`` as it does
``motion_baselines``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np
import torch


# --------------------------------------------------------------------------
# Known global shifts
# --------------------------------------------------------------------------
def smooth_texture(h, w, sigma=3.0, seed=0, pad=16):
    """A random texture blurred by a Gaussian of ``sigma`` px, in [0.1, 0.9], (h + 2 pad, w + 2 pad) float64."""
    g = torch.Generator().manual_seed(seed)
    noise = torch.rand(h + 2 * pad, w + 2 * pad, generator=g, dtype=torch.float64)
    fy = torch.fft.fftfreq(noise.shape[0], dtype=torch.float64)[:, None]
    fx = torch.fft.fftfreq(noise.shape[1], dtype=torch.float64)[None, :]
    lowpass = torch.exp(-2 * (math.pi * sigma) ** 2 * (fx**2 + fy**2))
    tex = torch.fft.ifft2(torch.fft.fft2(noise) * lowpass).real
    tex = (tex - tex.min()) / (tex.max() - tex.min())
    return 0.1 + 0.8 * tex


def fourier_shift(img, dx, dy):
    """Content moved by (+dx, +dy) pixels (exact band-limited, periodic)."""
    fy = torch.fft.fftfreq(img.shape[0], dtype=torch.float64)[:, None]
    fx = torch.fft.fftfreq(img.shape[1], dtype=torch.float64)[None, :]
    phase = torch.exp(-2j * math.pi * (fx * dx + fy * dy))
    return torch.fft.ifft2(torch.fft.fft2(img) * phase).real


def shifted_pair(dx, dy, h=96, w=96, sigma=3.0, seed=0, pad=16):
    """(2, h, w) float32: a texture and the same texture moved by (dx, dy); ``pad`` must exceed the
    shift so that the periodic wrap stays outside the crop."""
    tex = smooth_texture(h, w, sigma, seed, pad)
    moved = fourier_shift(tex, dx, dy)
    crop = (slice(pad, pad + h), slice(pad, pad + w))
    return torch.stack((tex[crop], moved[crop])).float()


# --------------------------------------------------------------------------
# Static camera, moving objects
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class MovingObject:
    """A textured square of ``size`` source pixels moving ``speed`` source px per frame at ``angle``
    degrees (0 = rightwards, 90 = downwards) between frames ``start`` and ``stop`` (the pairs
    (t-1, t) with start < t <= stop; ``stop=None``: to the end), still but visible otherwise."""

    size: int
    speed: float
    start: int = 0
    stop: int | None = None
    angle: float = 30.0


class Clip(NamedTuple):
    """frames: (T, H, W, 3) uint8.  displacement: (T, n) float64, how far object i moved between
    frames t-1 and t in source pixels (row 0 is 0).  moving: (T,) bool, any object moved into frame t."""

    frames: np.ndarray
    displacement: np.ndarray
    moving: np.ndarray


def _multiscale_texture(h, w, rng, scales=(1.5, 6.0, 24.0), weights=(0.3, 0.4, 0.6)):
    """Background with detail at several scales (as natural scenes have), in [0, 1]."""
    out = np.zeros((h, w))
    fy = np.fft.fftfreq(h)[:, None]
    fx = np.fft.fftfreq(w)[None, :]
    for s, wt in zip(scales, weights):
        noise = rng.standard_normal((h, w))
        layer = np.fft.ifft2(np.fft.fft2(noise) * np.exp(-2 * (np.pi * s) ** 2 * (fx**2 + fy**2))).real
        out += wt * layer / layer.std()
    out = (out - out.min()) / (out.max() - out.min())
    return out


def _positions(obj: MovingObject, num_frames, height, width, rng):
    """Top-left corner of the object in every frame: a straight path from a random start, mirrored
    at the borders, advancing only while the object moves."""
    span = np.array([width - obj.size - 2, height - obj.size - 2], dtype=np.float64)
    pos = rng.uniform(0.2, 0.8, 2) * span
    step = obj.speed * np.array([math.cos(math.radians(obj.angle)), math.sin(math.radians(obj.angle))])
    stop = num_frames if obj.stop is None else obj.stop
    out = np.empty((num_frames, 2))
    travelled = np.zeros(2)
    for t in range(num_frames):
        if obj.start < t <= stop:  # moved between frames t-1 and t
            travelled += step
        unfolded = pos + travelled
        folded = np.mod(unfolded, 2 * span)
        out[t] = np.where(folded > span, 2 * span - folded, folded)  # bounce off the borders
    return out


def moving_object_clip(num_frames: int, objects: Sequence[MovingObject], *, height: int = 360, width: int = 640,
                       noise: float = 2.0, seed: int = 0) -> Clip:
    """A static-camera clip with known moving objects.

    Background: a fixed multi-scale texture; every frame gets fresh Gaussian
    sensor noise of ``noise`` grey levels and is rounded to uint8 (gray
    replicated to RGB).  Object i is a textured square (its own texture, a
    soft one-pixel edge) rendered at sub-pixel positions by bilinear
    interpolation, so it moves exactly ``speed`` px per frame between
    ``start`` and ``stop`` and is still (but visible) outside that range.
    """
    rng = np.random.default_rng(seed)
    background = 0.15 + 0.7 * _multiscale_texture(height, width, rng)
    sprites = []
    for obj in objects:
        s = int(obj.size)
        tex = 0.1 + 0.8 * _multiscale_texture(s + 2, s + 2, rng, scales=(1.0, 3.0), weights=(0.5, 0.5))
        alpha = np.zeros((s + 2, s + 2))
        alpha[1:-1, 1:-1] = 1.0
        sprites.append((tex, alpha, _positions(obj, num_frames, height, width, rng)))
    frames = np.empty((num_frames, height, width, 3), dtype=np.uint8)
    displacement = np.zeros((num_frames, len(objects)))
    for t in range(num_frames):
        img = background.copy()
        for i, (tex, alpha, pos) in enumerate(sprites):
            x, y = pos[t]
            ix, iy = int(math.floor(x)), int(math.floor(y))
            fx, fy = x - ix, y - iy
            # Bilinear resampling of colour * alpha and alpha at the sub-pixel offset.
            h, w = tex.shape
            pre = np.zeros((h + 1, w + 1, 2))
            pre[1:, 1:, 0] = tex * alpha
            pre[1:, 1:, 1] = alpha
            sampled = ((1 - fx) * (1 - fy) * pre[1:, 1:] + fx * (1 - fy) * pre[1:, :-1]
                       + (1 - fx) * fy * pre[:-1, 1:] + fx * fy * pre[:-1, :-1])
            region = img[iy:iy + h, ix:ix + w]
            a = sampled[: region.shape[0], : region.shape[1], 1]
            region[:] = region * (1 - a) + sampled[: region.shape[0], : region.shape[1], 0]
            if t > 0:
                displacement[t, i] = float(np.hypot(*(pos[t] - pos[t - 1])))
        img = img * 255.0 + rng.normal(0.0, noise, img.shape)
        frames[t] = np.clip(np.rint(img), 0, 255).astype(np.uint8)[..., None]
    return Clip(frames, displacement, (displacement > 0).any(axis=1))
