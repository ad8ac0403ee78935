"""Calibrated abstention: fit each system's calibration on planted questions, evaluate it on others.

Run:  nice .venv/bin/python -m bench.bench_abstention [--system pipeline videoagent memverse prostream]
          [--encoder hashing minilm] [--quick] [--write]

For each system (the ``StreamMemory`` pipeline and the recipes VideoAgent, MemVerse, ProStream) and text
encoder, two disjoint sets of planted questions are built from the recipes' synthetic data, each with as
many questions whose answer was never in the stream as answerable ones:

* **calibration set** (seeds 101, 102, ...): the answers' features (``answer_features``: ``cosine``,
  ``grounding``, ``names``; VideoAgent adds ``supported``) and whether the answer the system gives is right
  fit the logistic map of ``Calibration.fit``; the threshold is the lowest confidence at which at most 2 % of
  the calibration set's unanswerable questions are answered;
* **evaluation set** (seeds 201, 202, ...): the system runs with the fitted calibration; reported are the
  false-answer rate on the unanswerable questions, the accuracy on the answerable ones before (the answer the
  system gave before abstention existed) and after (answered and right), and their ratio.

Planted data per system (sizes in ``SETS``):

* pipeline -- ``PlantedEventVideo`` label streams pushed as features (label-text embeddings) into a
  ``StreamMemory`` ("base" preset), asked after the stream: the video's questions ("What was next to the
  Border Terrier?") and "When did you see the <cue>?" (right = the answer's basis overlaps the planted
  event), time questions (the beginning, the end, "at T s", "right before / after the <cue> appeared":
  right = the basis lies in that span); unanswerable: the same forms about animals that never appear, and
  times after the end of the stream;
* videoagent -- the same videos through ``VideoAgent`` (multiple choice: right = the right option;
  "What happened at the beginning?" open: right = the evidence frame lies in the first 10 %);
  unanswerable: multiple choice about animals that never appear, times after the end;
* memverse -- ``PlantedFactMemory`` (16 of its 24 people): its single, two-hop and cross-modal questions
  (right = the answer's chunk is the one holding the answer); unanswerable: the same questions about the 8
  people never mentioned, and about kin nobody has;
* prostream -- ``synthetic_dialogue`` streams asked at their question times (right = the best recalled turn
  is the ground-truth turn, ``recalls_answer``) and "What was said in the last minute?" (right = a turn of
  the last minute); unanswerable: "What is <entity>'s <attribute>?" for subjects never stated, and a time
  after the end of the stream.

With ``--write`` the tables go to ``bench/results/abstention_summary[_quick].md`` (``--system`` naming some of the
systems: ``abstention_summary_<systems>[_quick].md``, the whole table stays as it is) and the fitted constants
(printed as Python) are what ``stream/calibration.py`` and the recipes' ``calibration`` modules hold.  The
reported cases on real clips (the sample clips and the CLI demos, real models) are run at the end unless
``--no-clips``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch


from streammem import HashingTextEncoder, StreamMemory  # noqa: E402
from streammem.components.answers import (  # noqa: E402
    AbstentionRow, Calibration, Outcome, abstention_report, choose_basis,
)
from streammem.models.encoders import EncodedFrames  # noqa: E402

try:
    from bench import quality  # the record's answer-quality figures (python -m bench.quality run abstention)
except ImportError:  # run as a script, `python bench/bench_abstention.py`: prints its tables, saves none
    quality = None

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
SYSTEMS = ("pipeline", "videoagent", "memverse", "prostream")
MAX_FALSE_ANSWER = 0.02
# Absent cues besides the unused members of the video's cue families: ImageNet animals in no family.
FAR_CUES = ("zebra", "hippopotamus", "koala", "flamingo", "king penguin", "ostrich", "gorilla", "orangutan",
            "meerkat", "armadillo", "llama", "bison", "otter", "skunk", "porcupine", "sea lion")
# ProStream: how the synthetic dialogue asks, and people it never mentions.
ASK_FORMS = ("What is {E}'s {A}?", "Remind me, what is {E}'s {A}?", "Do you know {E}'s {A}?")
NEVER_MENTIONED = ("Ottoline", "Barnaby", "Clementine", "Ambrose", "Philippa", "Lysander", "Seraphina", "Thaddeus")
# (seeds of the calibration set, seeds of the evaluation set, size)
SETS = {
    "pipeline": ((101, 102, 103, 104), (201, 202, 203, 204), dict(frames=1800, questions=16)),
    "videoagent": (tuple(range(101, 109)), tuple(range(201, 209)), dict(frames=1800, questions=16)),
    "memverse": ((101, 102, 103, 104), (201, 202, 203, 204), dict(people=16, sessions=6, fillers=30)),
    "prostream": ((101, 102), (201, 202), dict(turns=3000, questions=120)),
}
QUICK = {
    "pipeline": ((101, 102), (201, 202), dict(frames=900, questions=8)),
    "videoagent": ((101, 102), (201, 202), dict(frames=900, questions=8)),
    "memverse": ((101,), (201,), dict(people=12, sessions=3, fillers=15)),
    "prostream": ((101,), (201,), dict(turns=1500, questions=60)),
}


def text_encoder(name: str):
    if name == "hashing":
        return HashingTextEncoder()
    from streammem import MiniLMTextEncoder

    return MiniLMTextEncoder()


# --------------------------------------------------------------------------
# Planted questions on label videos (pipeline, VideoAgent)
# --------------------------------------------------------------------------
def _absent_cues(video, rng, n):
    from streammem.recipes.videoagent.synthetic import CUE_FAMILIES

    shown = {label for labels in video.labels for label in labels}
    near = [c for family in CUE_FAMILIES.values() for c in family if c not in shown]
    far = [c for c in FAR_CUES if c not in shown]
    pool = near + far
    return [pool[i] for i in rng.permutation(len(pool))[:n]] if n <= len(pool) else list(rng.choice(pool, n))


# Categories: a word for each cue family and scene of PlantedEventVideo (the labels never say it), and
# categories that never appear.
FAMILY_WORDS = {"terriers": "dog", "retrievers": "dog", "spaniels": "dog", "hounds": "dog", "sheepdogs": "dog",
                "cats": "cat", "big cats": "big cat", "bears": "bear", "wild dogs": "wolf", "small birds": "bird",
                "parrots": "parrot", "snakes": "snake", "lizards": "lizard", "crabs": "crab"}
ABSENT_CATEGORIES = ("monkey", "elephant", "horse", "whale", "frog", "shark", "butterfly", "cow")
ABSENT_PLACES = ("swimming pool", "classroom", "forest", "beach", "hospital", "airport", "garage", "library")
CATEGORY_FORMS = ("When did we see a {c}?", "Was there a {c}?", "When were we in the {c}?")
SCENE_FORMS = ("Did we see a {c}?", "Where was the {c}?", "When was the {c} on screen?")
_ABSENT_FORMS = ("What was next to the {c}?", "Which object appeared together with the {c}?",
                 "What did the {c} have with it?", "When did you see the {c}?")


def _overlaps(basis, lo, hi) -> bool:
    return basis is not None and basis["t_start"] < hi and basis["t_end"] >= lo


def category_questions(video, rng, n: int = 4) -> list[tuple]:
    """(question, answerable, spans, "category") about what the frames show by a word their labels never use
    ("When were we in the kitchen?", "Was there a dog?"), and as many about categories never shown."""
    from streammem.recipes.videoagent.synthetic import CUE_FAMILIES, SCENES

    times = video.timestamps.tolist()
    out = []
    scenes = list(SCENES)
    for name in [scenes[i] for i in rng.permutation(len(scenes))[: n // 2]]:
        shown = set(SCENES[name])
        spans = [(t, t + 1.0) for t, labels in zip(times, video.labels) if shown & set(labels)]
        out.append((f"When were we in the {name}?", True, spans, "category"))
    families = sorted({FAMILY_WORDS[f] for f in CUE_FAMILIES})
    for word in [families[i] for i in rng.permutation(len(families))]:
        members = {c for f, cues in CUE_FAMILIES.items() if FAMILY_WORDS[f] == word for c in cues}
        spans = [(t, t + 1.0) for t, labels in zip(times, video.labels) if members & set(labels)]
        if spans and len(out) < n:
            out.append((f"When did we see a {word}?", True, spans, "category"))
    for place in [ABSENT_PLACES[i] for i in rng.permutation(len(ABSENT_PLACES))[: n // 2]]:
        out.append((f"When were we in the {place}?", False, None, "absent"))
    for word in [ABSENT_CATEGORIES[i] for i in rng.permutation(len(ABSENT_CATEGORIES))[: n - n // 2]]:
        out.append((CATEGORY_FORMS[int(rng.integers(2))].format(c=word), False, None, "absent"))
    return out


def pipeline_rows(seed, size, encoder, calibration) -> list[AbstentionRow]:
    """Rows of one planted label stream through a StreamMemory, every question asked after the stream."""
    from streammem.recipes.videoagent import LabelTextEmbedder, PlantedEventVideo

    key = ("pipeline", seed, encoder.name, tuple(size.items()))
    if key not in _BUILT:
        video = PlantedEventVideo(size["frames"], size["questions"], seed=seed)
        features = LabelTextEmbedder(encoder)(EncodedFrames(torch.zeros(len(video), 0), video.labels))
        memory = StreamMemory("base", None, encoder, calibration=calibration)
        memory.push_encoded(video.timestamps, features, video.labels)
        memory.finish()
        _BUILT[key] = video, memory
    video, memory = _BUILT[key]
    memory.calibration = calibration  # asking changes nothing an answer depends on (no budget: no eviction)
    end = float(video.timestamps[-1])
    rng = np.random.default_rng(seed)
    asked = []  # (question, answerable, (lo, hi) where a right basis lies, kind)
    for pq in video.questions:
        lo, hi = pq.span[0] / video.fps, pq.span[1] / video.fps
        asked.append((pq.question, True, [(lo, hi)], "planted"))
        asked.append((f"When did you see the {pq.cue}?", True, [(lo, hi)], "planted"))
    # Scene objects: shown for many frames, what a memory of chunk and event captions keeps.
    for _ in range(2 * len(video.questions)):
        label = video.labels[int(rng.integers(len(video)))][int(rng.integers(3))]
        spans = [(t, t + 1.0) for t, labels in zip(video.timestamps.tolist(), video.labels) if label in labels]
        asked.append((SCENE_FORMS[int(rng.integers(len(SCENE_FORMS)))].format(c=label), True, spans, "scene"))
    asked += category_questions(video, rng)
    asked.append(("What happened at the beginning?", True, [(0.0, 0.1 * end)], "time"))
    asked.append(("What did we see at the end of the video?", True, [(0.9 * end, end + 1)], "time"))
    for pq in video.questions[:2]:
        t = (pq.span[0] + pq.span[1] - 1) / 2 / video.fps
        asked.append((f"What did you see at {t:.0f} s?", True, [(t - 2, t + 2)], "time"))
    for pq in video.questions[2:4]:
        lo = pq.span[0] / video.fps
        asked.append((f"What happened right before the {pq.cue} appeared?", True, [(lo - 30, lo)], "time"))
    n_neg = sum(a[1] for a in asked) - 4 - sum(not a[1] for a in asked)
    forms = _ABSENT_FORMS + SCENE_FORMS
    for c in _absent_cues(video, rng, n_neg):
        asked.append((forms[int(rng.integers(len(forms)))].format(c=c), False, None, "absent"))
    for c in _absent_cues(video, rng, 2):
        asked.append((f"What happened right before the {c} appeared?", False, None, "time"))
    asked += [(f"What happened at {end + 100 * (i + 1):.0f} s?", False, None, "time") for i in range(2)]
    rows = []
    for question, answerable, span, kind in asked:
        ctx = memory.ask(question, answer=False)
        old_source, old_item = choose_basis(dict(ctx.to_dict(), knowledge_best=None, basis=None))
        old = None if old_source in ("none", "short_term") else old_item
        if old_source == "short_term":
            old = {"t_start": old_item[0]["t"], "t_end": old_item[-1]["t"]}
        right = answerable and any(_overlaps(ctx.basis, *s) for s in span)
        rows.append(AbstentionRow(ctx.features, answerable, bool(right), ctx.outcome, ctx.confidence,
                                  bool(answerable and any(_overlaps(old, *s) for s in span)), kind))
    return rows


def videoagent_rows(seed, size, encoder, calibration) -> list[AbstentionRow]:
    """Rows of one planted video through VideoAgent (the default loop, budget 16)."""
    from streammem.recipes.videoagent import PlantedEventVideo, VideoAgent
    from streammem.recipes.videoagent.synthetic import OBJECTS

    key = ("videoagent", seed, encoder.name, tuple(size.items()))
    if key not in _BUILT:
        video = PlantedEventVideo(size["frames"], size["questions"], seed=seed)
        _BUILT[key] = video, video.index(encoder)
    video, index = _BUILT[key]
    agent = VideoAgent(index, encoder, calibration=calibration)
    end = float(video.timestamps[-1])
    rng = np.random.default_rng(seed)
    rows = []

    def run(question, options, answerable, right, kind):
        agent.clear_captions()
        res = agent.ask(question, options)
        a = res.answer
        option = a.option if a.outcome == Outcome.ANSWERED else a.candidate_option
        ok = bool(answerable and right(res, option))
        before = ok
        if answerable and kind == "time":  # today's agent read no time reference
            agent.clear_captions()
            old = agent.ask(question, options, time_references=False)
            before = bool(right(old, old.answer.option if old.answer.outcome == Outcome.ANSWERED
                                else old.answer.candidate_option))
        rows.append(AbstentionRow(a.features, answerable, ok, a.outcome, a.confidence, before, kind))

    for pq in video.questions:
        run(pq.question, pq.options, True, lambda res, option, pq=pq: option == pq.answer, "planted")
    first = 0.1 * end

    def early(res, option):
        evidence = res.answer.evidence
        return bool(evidence) and float(video.timestamps[evidence[0]]) < first

    run("What happened at the beginning?", None, True, early, "time")
    for question, answerable, spans, kind in category_questions(video, rng):
        def shown(res, option, spans=spans):
            evidence = res.answer.evidence
            return bool(evidence) and any(lo <= float(video.timestamps[evidence[0]]) < hi for lo, hi in spans)

        run(question, None, answerable, shown, kind)
    for c in _absent_cues(video, rng, len(video.questions)):
        options = tuple(OBJECTS[i] for i in rng.permutation(len(OBJECTS))[:video.n_options])
        run(_ABSENT_FORMS[int(rng.integers(3))].format(c=c), options, False, None, "absent")
    run(f"What happened at {end + 100:.0f} s?", None, False, None, "time")
    return rows


# --------------------------------------------------------------------------
# MemVerse: planted facts, and questions about people and kin never mentioned
# --------------------------------------------------------------------------
def memverse_rows(seed, size, encoder, calibration) -> list[AbstentionRow]:
    """Rows of one planted-fact memory, every question asked after the last session."""
    from streammem.recipes.memverse import MemVerse, PlantedFactMemory
    from streammem.recipes.memverse.synthetic import ATTRIBUTES, KIN, PEOPLE

    key = ("memverse", seed, encoder.name, tuple(size.items()))
    if key not in _BUILT:
        data = PlantedFactMemory(people=size["people"], sessions=size["sessions"], fillers=size["fillers"],
                                 seed=seed)
        memory = MemVerse(encoder)
        _BUILT[key] = data, memory, data.feed(memory)
    data, memory, chunks = _BUILT[key]
    memory.calibration = calibration  # asking only counts uses (no budget: nothing is evicted)
    rng = np.random.default_rng(seed)
    present = PEOPLE[:size["people"]]
    absent = PEOPLE[size["people"]:]
    asked = [(q.question, True, chunks[q.evidence[-1]].chunk_id, q.kind) for q in data.questions]
    negatives = []
    for p in absent:
        for _, _, single, double in ATTRIBUTES.values():
            negatives.append(single.format(p=p))
            negatives.append(double.format(p=p, kin=KIN[int(rng.integers(len(KIN)))]))
        negatives.append(f"What car does {p} drive?")
    kin_of = {}
    for q in data.questions:
        if q.kind == "two-hop":
            for kin in KIN:
                if f"'s {kin} " in q.question:
                    kin_of[q.question.split("'s ")[0].split()[-1]] = kin
    for p in present:
        other = [k for k in KIN if k != kin_of.get(p)]
        for _, _, _, double in ATTRIBUTES.values():
            negatives.append(double.format(p=p, kin=other[int(rng.integers(len(other)))]))
    picked = [negatives[i] for i in rng.permutation(len(negatives))[:len(asked)]]
    asked += [(q, False, None, "absent") for q in picked]
    rows = []
    for question, answerable, truth, kind in asked:
        ctx = memory.ask(question, answer=False)
        before = bool(answerable and ctx.chunks and ctx.chunks[0]["chunk"] == truth)
        right = bool(answerable and ctx.basis is not None and ctx.basis["chunk"] == truth)
        rows.append(AbstentionRow(ctx.features, answerable, right, ctx.outcome, ctx.confidence, before, kind))
    return rows


# --------------------------------------------------------------------------
# ProStream: the synthetic dialogue's questions, subjects never stated
# --------------------------------------------------------------------------
def prostream_rows(seed, size, encoder, calibration) -> list[AbstentionRow]:
    """Rows of one synthetic dialogue through ProStream, each question asked when it comes."""
    from streammem.recipes.prostream import ProStream, ProStreamConfig, Turn, recalls_answer, synthetic_dialogue

    data = synthetic_dialogue(size["turns"], seed=seed, questions=size["questions"])
    stated = {fact.subject for fact in data.facts}
    entities = sorted({fact.entity for fact in data.facts})
    attributes = sorted({fact.attribute for fact in data.facts})
    strangers = NEVER_MENTIONED
    rng = np.random.default_rng(seed)
    config = ProStreamConfig.for_encoder("hashing" if getattr(encoder, "name", "") == "hashing" else "minilm")
    memory = ProStream(encoder, config, calibration=calibration)
    turns = [x for x in data.items if isinstance(x, Turn)]
    key = ("prostream", seed, encoder.name, tuple(size.items()))
    if key not in _BUILT:
        _BUILT[key] = encoder.encode([t.text for t in turns])
    embeddings = _BUILT[key]
    rows, pending, ti, asked = [], [], 0, 0

    def flush():
        nonlocal pending, ti
        if pending:
            memory.push(pending, embeddings[ti:ti + len(pending)])
            ti += len(pending)
            pending = []

    def never_stated():
        for _ in range(1000):
            e = entities[int(rng.integers(len(entities)))] if rng.random() < 0.5 else \
                strangers[int(rng.integers(len(strangers)))]
            a = attributes[int(rng.integers(len(attributes)))]
            if f"{e}'s {a}" not in stated:
                return ASK_FORMS[int(rng.integers(len(ASK_FORMS)))].format(E=e, A=a)
        raise RuntimeError("no unstated subject left")

    for item in data.items:
        if isinstance(item, Turn):
            pending.append(item)
            continue
        flush()
        rec = memory.ask(item.question)
        ok = recalls_answer(rec.best, item)
        rows.append(AbstentionRow(rec.features, True, ok, rec.outcome, rec.confidence, ok, item.kind or ""))
        neg = memory.ask(never_stated())
        rows.append(AbstentionRow(neg.features, False, False, neg.outcome, neg.confidence, False, "absent"))
        asked += 1
        if asked % 10 == 0:
            question = "What was said in the last minute?"
            now = memory.stream_time
            old = memory.recall(memory.encode_question(question), question=question)  # today: no time reference
            rec = memory.ask(question)
            ok = rec.best is not None and rec.best.t >= now - 60.0
            before = old.best is not None and old.best.t >= now - 60.0
            rows.append(AbstentionRow(rec.features, True, ok, rec.outcome, rec.confidence, before, "time"))
            neg = memory.ask(f"What did we talk about at {now + 1000:.0f} s?")
            rows.append(AbstentionRow(neg.features, False, False, neg.outcome, neg.confidence, False, "time"))
    flush()
    memory.finish()
    return rows


_BUILT: dict = {}  # (system, seed, encoder, size) -> what a seed's rows are asked of, built once per run
ROWS = {"pipeline": pipeline_rows, "videoagent": videoagent_rows, "memverse": memverse_rows,
        "prostream": prostream_rows}


def default_calibration(system: str, encoder) -> Calibration:
    if system == "pipeline":
        from streammem.stream.calibration import default_calibration as d
    elif system == "videoagent":
        from streammem.recipes.videoagent.calibration import default_calibration as d
    elif system == "memverse":
        from streammem.recipes.memverse.calibration import default_calibration as d
    else:
        from streammem.recipes.prostream.answering import default_calibration as d
    return d(encoder)


def fit(system: str, encoder, seeds, size) -> tuple[Calibration, list[AbstentionRow]]:
    """Fit on the calibration seeds (the pipeline twice: the anchors of its "right before the <cue> appeared"
    questions are judged by the calibration itself, so the second pass uses the first fit)."""
    note = f"bench/bench_abstention.py --system {system}: calibration seeds {list(seeds)}, {size}"
    calibration = default_calibration(system, encoder)
    for _ in range(2 if system == "pipeline" else 1):
        rows = [r for s in seeds for r in ROWS[system](s, size, encoder, calibration)]
        decided = [r for r in rows if r.features]  # rows without a basis are not in memory by rule
        calibration = Calibration.fit(decided, max_false_answer=MAX_FALSE_ANSWER, fitted_on=note)
    return calibration, rows


def as_python(system: str, encoder_name: str, c: Calibration) -> str:
    weights = ", ".join(f'"{k}": {v:.4f}' for k, v in c.weights.items())
    return f'    "{encoder_name}": Calibration({{{weights}}}, {c.bias:.4f}, {c.threshold:.4f}, _FITTED_ON),'


def run_clips() -> list[str]:
    """The reported cases on real clips, with the real models."""
    from streammem import load_frame_encoder
    from streammem.cli import main
    from streammem.io.video import VideoSource
    from streammem.recipes.videoagent import VideoAgent
    from streammem_kernels.samples import sample_video_path

    lines = []
    frame_encoder = load_frame_encoder("auto")
    text = text_encoder("minilm")
    for clip, question, options in (("carphone_pristine.mp4", "Is there a phone?", ("yes", "no")),
                                    ("bikes.mp4", "Is there a taxi?", None),
                                    ("bikes.mp4", "What happened at the beginning?", None)):
        agent = VideoAgent.from_video(sample_video_path(clip), frame_encoder, text, fps=5)
        res = agent.ask(question, options)
        lines.append(f"| videoagent | {clip} | {question} {'/'.join(options or ())} | {res.answer.outcome.value} | "
                     f"{res.answer.confidence:.3f} | {res.answer.text} (candidate: {res.answer.candidate}) |")
    for clip in ("bikes.mp4", "carphone_pristine.mp4"):
        memory = StreamMemory("base", frame_encoder, text)
        for t, frame in VideoSource(sample_video_path(clip), size=320, fps=5):
            memory.push(t, frame)
        memory.finish()
        for question in ("What happened at the beginning?", "What did we see at the end of the video?",
                         "Is there a giraffe?"):
            ctx = memory.ask(question, answer=False)
            b = ctx.basis
            span = "-" if b is None else f"{b['t_start']:.1f}-{b['t_end']:.1f} s: {b['text']}"
            lines.append(f"| pipeline | {clip} | {question} | {ctx.outcome.value} | {ctx.confidence:.3f} | {span} |")
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["memverse", "--json", "--fps", "5"])
    for q in json.loads(out.getvalue())["questions"]:
        lines.append(f"| memverse demo | bikes.mp4 | {q['question']} | {q['outcome']} | {q['confidence']:.3f} | "
                     f"{q['answer']} |")
    return lines


QUALITY_ABOUT = (
    "Planted questions, half of them about something the stream never held (animals, places, people or kin "
    "never mentioned, times after the end of the stream), built by the module docstring's rules; each system's "
    "calibration is fitted on the calibration seeds (at most {cap:.0%} false answers there) and scored on the "
    "disjoint evaluation seeds (calibration / evaluation seeds: {seeds}). False answers: unanswerable questions "
    "answered. Accuracy before: answerable questions the system answered right before abstention existed (the "
    "answer it gave then); after: answered and right. The thresholds are this run's fit; the shipped constants "
    "(stream/calibration.py, the recipes' calibration modules) are such a fit written back, possibly an earlier one. "
    "Time-aware questions are the kind \"time\": \"What "
    "happened at the beginning?\", \"What did you see at T s?\", \"right before the <cue> appeared\", \"What "
    "was said in the last minute?\" (answerable: the basis lies in that span), and times after the end "
    "(unanswerable); the parsing of time references is tested against known spans in "
    "tests/streammem/test_timeref.py.")


def _kind_counts(rows, kind=None) -> dict:
    pos = [r for r in rows if r.answerable and kind in (None, r.kind)]
    neg = [r for r in rows if not r.answerable and kind in (None, r.kind)]
    before = sum(bool(r.correct if r.correct_before is None else r.correct_before) for r in pos)
    after = sum(bool(r.correct) and r.outcome == Outcome.ANSWERED for r in pos)
    false = sum(r.outcome == Outcome.ANSWERED for r in neg)
    return {"answerable": len(pos), "unanswerable": len(neg), "false_answers": [false, len(neg)],
            "before": [before, len(pos)], "after": [after, len(pos)]}


def quality_tables(evaluated: dict) -> list[dict]:
    """The record's tables (bench/quality.py): per system and encoder, overall, per kind, time-aware."""
    col = quality.column
    overall, kinds, times = [], [], []
    for (system, encoder), (rows, threshold) in evaluated.items():
        c = _kind_counts(rows)
        overall.append({"system": system, "encoder": encoder, **c, "threshold": threshold})
        for kind in sorted({r.kind for r in rows if r.answerable}):
            k = _kind_counts(rows, kind)
            kinds.append({"system": system, "encoder": encoder, "kind": kind, "n": k["answerable"],
                          "before": k["before"], "after": k["after"]})
        if any(r.kind == "time" for r in rows):
            times.append({"system": system, "encoder": encoder, **_kind_counts(rows, "time")})
    head = [col("system", "system"), col("encoder", "encoder")]
    rates = [col("false_answers", "false answers (unanswerable answered)", "share"),
             col("before", "accuracy before (no abstention)", "share"),
             col("after", "accuracy after (answered and right)", "share")]
    return [
        {"title": "Calibrated abstention, evaluation seeds",
         "columns": head + [col("answerable", "answerable", "int"), col("unanswerable", "unanswerable", "int"),
                            *rates, col("threshold", "threshold", "rate")], "rows": overall},
        {"title": "Time-aware questions (kind \"time\")",
         "columns": head + [col("answerable", "answerable", "int"), col("unanswerable", "unanswerable", "int"),
                            *rates], "rows": times},
        {"title": "Accuracy per kind of answerable question",
         "columns": head + [col("kind", "kind"), col("n", "questions", "int"), *rates[1:]], "rows": kinds},
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    parser.add_argument("--encoder", nargs="+", default=["hashing", "minilm"], choices=("hashing", "minilm"))
    parser.add_argument("--quick", action="store_true", help="smaller sets (a smoke run; not the record)")
    parser.add_argument("--no-clips", action="store_true", help="skip the real-clip cases (real models)")
    parser.add_argument("--clips-only", action="store_true", help="only the real-clip cases (default calibrations)")
    parser.add_argument("--write", action="store_true",
                        help="write bench/results/abstention_summary[_<systems>][_quick].md")
    args = parser.parse_args()
    torch.set_num_threads(1)
    sets = QUICK if args.quick else SETS
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load = os.getloadavg()
    started_s, load_before = time.time(), f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}"
    t_start = time.perf_counter()
    table, constants, results, evaluated = [], [], {}, {}
    for encoder_name in ([] if args.clips_only else args.encoder):
        encoder = text_encoder(encoder_name)
        for system in args.system:
            cal_seeds, eval_seeds, size = sets[system]
            t0 = time.perf_counter()
            calibration, cal_rows = fit(system, encoder, cal_seeds, size)
            t1 = time.perf_counter()
            rows = [r for s in eval_seeds for r in ROWS[system](s, size, encoder, calibration)]
            report = abstention_report(rows)
            cal_report = abstention_report([r for r in cal_rows])
            results[system, encoder_name] = {"calibration": calibration.to_dict(), "evaluation": report,
                                             "calibration_set": cal_report}
            evaluated[system, getattr(encoder, "name", encoder_name)] = (rows, calibration.threshold)
            kinds = ", ".join(f"{k} {report['by_kind_before'][k]:.2f} -> {v:.2f}" for k, v in report["by_kind"].items())
            table.append(f"| {system} | {getattr(encoder, 'name', encoder_name)} | {report['answerable']} + "
                         f"{report['unanswerable']} | {report['false_answer_rate']:.3f} | "
                         f"{report['accuracy_before']:.3f} | {report['accuracy']:.3f} | {report['retained']:.3f} | "
                         f"{calibration.threshold:.4f} | {kinds} |")
            constants.append(f"# {system}\n" + as_python(system, getattr(encoder, "name", encoder_name), calibration))
            print(table[-1], f"(fit {t1 - t0:.0f} s, evaluation {time.perf_counter() - t1:.0f} s)", flush=True)
            print(constants[-1], flush=True)
    clips = [] if args.no_clips else run_clips()
    load_end = os.getloadavg()
    header = ["| system | encoder | evaluation questions (answerable + unanswerable) | false-answer rate "
              "(unanswerable answered) | accuracy before (no abstention) | accuracy after (answered and right) | "
              "retained (after / before) | threshold | accuracy per kind, before -> after |",
              "|---|---|---|---|---|---|---|---|---|"]
    text = [f"`bench/bench_abstention.py {' '.join(sys.argv[1:])}`; started {started}; "
            f"{time.perf_counter() - t_start:.0f} s; load average (1/5/15 min) "
            f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} at the start, "
            f"{load_end[0]:.1f} / {load_end[1]:.1f} / {load_end[2]:.1f} at the end; torch {torch.__version__}, one "
            f"intra-op thread.  Calibration seeds and evaluation seeds are disjoint (`SETS`); the calibration "
            f"allows {MAX_FALSE_ANSWER:.0%} false answers on its own unanswerable questions.", "", *header, *table]
    if clips:
        text += ["", "Real clips and demos (EfficientNet-lite0 labels, all-MiniLM-L6-v2, default calibrations):", "",
                 "| system | clip | question | outcome | confidence | answer / basis |", "|---|---|---|---|---|---|",
                 *clips]
    text += ["", "Fitted constants:", "", "```", *constants, "```"]
    print("\n".join(text))
    if quality is not None and quality.saving() and evaluated and not args.quick:
        quality.save("abstention", quality_tables(evaluated), about=QUALITY_ABOUT.format(
            seeds=", ".join(f"{s} {SETS[s][0]} / {SETS[s][1]}" for s in args.system), cap=MAX_FALSE_ANSWER),
            started=started_s, load_before=load_before)
    if args.write:
        os.makedirs(RESULTS, exist_ok=True)
        # A run of some of the systems writes its own record beside the whole table, not over it.
        subset = "" if set(args.system) == set(SYSTEMS) else "_" + "_".join(s for s in SYSTEMS if s in args.system)
        name = "abstention_summary" + subset + ("_quick" if args.quick else "")
        with open(os.path.join(RESULTS, name + ".md"), "w") as fh:
            fh.write("\n".join(text) + "\n")
        with open(os.path.join(RESULTS, name + ".json"), "w") as fh:
            json.dump({f"{s}/{e}": v for (s, e), v in results.items()}, fh, indent=1, default=float)


if __name__ == "__main__":
    main()
