"""``streammem prostream``: ProStream over a dialogue stream (JSONL or synthetic), with recall accuracy.

The recipe is ``streammem.recipes.prostream``; this module parses the options,
streams the dialogue through it (and the baselines with ``--compare``) and
prints the report.  The arguments are checked before the recipe (and torch)
is imported.
"""
from __future__ import annotations

import json

from .command import Subcommand, check_input_file

__all__ = ["COMMAND"]

PROSTREAM_DESCRIPTION = """\
Streams dialogue turns into ProStream's bounded hierarchical memory (drift
segments, extractive turn -> segment -> session summaries in a CosineTree,
utility-based eviction within --budget tokens) and answers every question of the
stream when it comes, from the memory at that moment.  DIALOGUE is JSONL: turns
{"t": 12.5, "speaker": "user", "text": "..."} and questions {"t": 14.0,
"question": "...", optional ground truth "answer", "turn"} in stream order.
Without DIALOGUE: a synthetic STEM-like stream with planted facts, later
updates and questions about near, far and updated facts, scored against its
ground truth.  Summaries and answers are extractive (no language model)."""


def add_arguments(parser) -> None:
    """The options of ``streammem prostream``."""
    parser.add_argument("dialogue", nargs="?", default=None,
                        help="JSONL dialogue (turns and questions in stream order); default: a synthetic stream")
    parser.add_argument("--generate", type=int, default=1000, metavar="TURNS",
                        help="turns of the synthetic stream used without DIALOGUE (default: 1000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic stream (default: 0)")
    parser.add_argument("--write", default=None, metavar="PATH",
                        help="write the stream (DIALOGUE or the synthetic one) as JSONL to PATH and exit")
    parser.add_argument("--ask", action="append", default=None, metavar='"QUESTION"',
                        help="a question asked at the end of the stream (repeatable)")
    parser.add_argument("--text-encoder", default="auto", choices=("auto", "minilm", "hashing"),
                        help="embeds turns, summaries and questions: all-MiniLM-L6-v2, or hashing (bag of words, no "
                             "model); auto (default): MiniLM, else hashing with a notice")
    parser.add_argument("--budget", type=int, default=None, help="memory token budget (default: 6000)")
    parser.add_argument("--drift", type=float, default=None,
                        help="cut a segment where consecutive turns' cosine drops below this (default: calibrated "
                             "for the text encoder)")
    parser.add_argument("--beam", default=None, metavar="SESSIONS,SEGMENTS",
                        help="recall's beam widths over sessions, then segments (default: 20,100)")
    parser.add_argument("-k", type=int, default=None, help="turns recalled per question (default: 5)")
    parser.add_argument("--compare", action="store_true",
                        help="also run the retrieve-everything and recent-window baselines on the same embeddings")
    parser.add_argument("--show", type=int, default=5, help="questions printed with their recalled turns (default: 5)")


def _parse_beam(text: str) -> tuple[int, int]:
    try:
        a, b = (int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--beam must be SESSIONS,SEGMENTS (two ints), got {text!r}") from None
    if a < 1 or b < 1:
        raise ValueError(f"--beam must be SESSIONS,SEGMENTS, two ints >= 1, got {text!r}")
    return a, b


def _check_args(args) -> None:
    """Every check that needs no torch: done first, so a mistake is reported at once."""
    from ..checks import check_int, check_real

    for flag, value, low in (("--generate", args.generate, 1), ("--show", args.show, 0)):
        if value < low:
            raise ValueError(f"{flag} must be >= {low}, got {value}")
    if args.budget is not None:
        check_int(args.budget, "--budget", 1)
    if args.k is not None:
        check_int(args.k, "-k", 1)
    if args.drift is not None:
        check_real(args.drift, "--drift", -1.0, 1.0)
    if args.beam is not None:
        _parse_beam(args.beam)
    for question in args.ask or ():
        if not question.strip():
            raise ValueError(f"--ask must be a non-empty question, got {question!r}")
    if args.dialogue is not None:
        check_input_file(args.dialogue, "dialogue")


def _config_from_args(args, encoder_name: str):
    from ..recipes.prostream import ProStreamConfig

    changes = {}
    if args.budget is not None:
        changes["budget"] = args.budget
    if args.drift is not None:
        changes["drift"] = args.drift
    if args.beam is not None:
        changes["beam"] = _parse_beam(args.beam)
    if args.k is not None:
        changes["k"] = args.k
    name = "hashing" if encoder_name == "hashing" else "minilm"
    return ProStreamConfig.for_encoder(name, **changes)


def _print_report(report: dict, show: int) -> None:
    print(f"stream: {report['source']} ({report['turns']} turns, {report['questions']} questions)")
    print(f"text encoder: {report['text_encoder']}; distiller: extractive (no model); answers: extractive (no model)")
    s = report["methods"]["prostream"]["summary"]
    st = s["stored"]
    print(f"segments closed: {s['segments']} (drift), sessions: {s['sessions']}; cited turns: {s['cited']}, "
          f"superseded: {s['superseded']}")
    print(f"memory: {s['memory_tokens']} / {s['budget']} tokens (peak {s['peak_tokens']}); stored: {st['turns']} "
          f"turns, {st['segments']} segments, {st['sessions']} sessions; evicted {s['evicted_turns']} turns")
    if report["questions"] and any(m["by_kind"]["all"]["n"] for m in report["methods"].values()):
        print()
        print(f"{'method':22s} {'kind':8s} {'n':>4s} {'top-1':>6s} {'hit@k':>6s} {'stale':>6s} "
              f"{'p50 ms':>8s} {'stored turns':>12s}")
        for name, m in report["methods"].items():
            label = {"prostream": "ProStream", "everything": "retrieve-everything", "recent": "recent-window"}[name]
            for kind, row in m["by_kind"].items():
                print(f"{label:22s} {kind:8s} {row['n']:4d} {row['correct']:6.2f} {row['hit']:6.2f} "
                      f"{row['stale']:6.2f} {m['latency_ms']['p50']:8.3f} {m['stored_turns']:12d}")
    for rec in report["shown"][:show]:
        print()
        at = "" if rec["stream_time"] is None else f" (at {rec['stream_time']:.0f} s)"
        print(f"Q: {rec['question']}{at}")
        for u in rec["units"][:3]:
            print(f"   turn {u['first_turn']} [{u['t']:.0f} s] {u['text']}  (cos {u['cosine']}, u {u['utility']})")
        truth = rec.get("truth")
        verdict = "" if truth is None else ("  [correct]" if rec["correct"] else f"  [expected: {truth}]")
        decision = f"confidence {rec['confidence']:.2f}" if rec["outcome"] == "answered" else \
            f"not in memory: confidence {rec['confidence']:.2f} < threshold {report['calibration']['threshold']:.2f}"
        print(f"A: {rec['answer']}  [extractive; {decision}]{verdict}")


def run(args) -> int:
    """``streammem prostream``: stream, answer, print a report.

    Bad input raises ValueError / FileNotFoundError (``streammem``'s ``main``
    turns them into one line and exit code 2).
    """
    _check_args(args)
    from ..components.answers import extractive_answer
    from ..models.encoders import load_text_encoder
    from ..recipes.prostream.answering import decide, default_calibration
    from ..recipes.prostream import (
        Question, Turn, evaluate, read_dialogue, recalls_answer, synthetic_dialogue, write_dialogue,
    )

    if args.dialogue is not None:
        items, source = read_dialogue(args.dialogue), args.dialogue
    else:
        items = synthetic_dialogue(args.generate, seed=args.seed).items
        source = f"synthetic_dialogue({args.generate}, seed={args.seed})"
    if args.write is not None:
        write_dialogue(args.write, items)
        print(f"wrote {len(items)} lines to {args.write}")
        return 0
    if not any(isinstance(x, Turn) for x in items):
        raise ValueError(f"{source} holds no turns")
    if args.ask:
        end = max(x.t for x in items)
        items = list(items) + [Question(end, q) for q in args.ask]
    encoder = load_text_encoder(args.text_encoder)
    config = _config_from_args(args, getattr(encoder, "name", ""))
    methods = ("prostream", "everything", "recent") if args.compare else ("prostream",)
    report = evaluate(items, encoder, config=config, methods=methods, keep_recalls=True)
    questions = [x for x in items if isinstance(x, Question)]
    shown = []
    calibration = default_calibration(encoder)
    for q, rec in zip(questions, report["methods"]["prostream"].pop("recalls")):
        decide(rec, calibration)
        d = rec.to_dict()
        d["answer"] = extractive_answer(rec)
        d["truth"] = q.answer
        d["correct"] = rec.outcome == "answered" and recalls_answer(rec.best, q)
        shown.append(d)
    for m in report["methods"].values():
        m.pop("recalls", None)
    report.update(source=source, text_encoder=getattr(encoder, "name", type(encoder).__name__),
                  config=config.to_dict(), calibration=calibration.to_dict(), shown=shown)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        _print_report(report, args.show)
    return 0


COMMAND = Subcommand("prostream", help="ProStream bounded memory over a dialogue stream, with recall accuracy",
                     description=PROSTREAM_DESCRIPTION, add_arguments=add_arguments, run=run)
