"""StreamMemory's answers: the outcome and confidence of every context, "not in memory" for what the stream
never showed, and time references ("at 20 s", "at the beginning", "before X") answered from their span -- on a
stream of label frames with planted events at known times, and on two real clips."""
import math

import numpy as np
import pytest

from streammem import HashingTextEncoder, PixelEncoder, StreamMemory, StreamPipeline, VideoSource
from streammem.components.answers import NOT_IN_MEMORY_ANSWER, Outcome
from streammem_kernels.samples import sample_video_path

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

TEXT = HashingTextEncoder()
SCENES = (("kitchen", ("refrigerator", "stove", "toaster", "sink")),
          ("street", ("minivan", "traffic light", "parking meter", "tram")),
          ("office", ("desk", "printer", "monitor", "filing cabinet")))
# Planted events: (first second, seconds, labels shown instead of the scene's).
EVENTS = ((20, 5, ("Border Terrier", "tennis ball")), (55, 5, ("tabby cat", "umbrella")),
          (80, 5, ("macaw", "violin")))


def _stream():
    """120 s at 1 frame/s: scenes of 40 s (kitchen, street, office), three planted events; every frame's
    feature is the hashing embedding of its labels (what push_encoded takes for a label-only stream)."""
    labels = []
    for t in range(120):
        frame = SCENES[t // 40][1][:3]
        for start, n, shown in EVENTS:
            if start <= t < start + n:
                frame = shown
        labels.append(tuple(frame))
    features = TEXT.encode([", ".join(x) for x in labels])
    return np.arange(120, dtype=np.float64), features, labels


@pytest.fixture(scope="module")
def memory():
    times, features, labels = _stream()
    mem = StreamMemory("base", None, TEXT, answer_fn=lambda ctx: "answered by the hook")
    mem.push_encoded(times, features, labels)
    mem.finish()
    return mem


def test_every_context_carries_its_decision(memory):
    ctx = memory.ask("When did we see the Border Terrier?")
    assert ctx.outcome == Outcome.ANSWERED and ctx.answer == "answered by the hook"
    assert 0.0 <= ctx.confidence <= 1.0 and ctx.confidence >= memory.calibration.threshold
    assert 20.0 <= ctx.basis["t_end"] and ctx.basis["t_start"] <= 22.0 and "Border Terrier" in ctx.basis["text"]
    assert set(ctx.features) >= {"cosine", "grounding", "names"}
    d = ctx.to_dict()
    assert d["outcome"] == "answered" and d["confidence"] == round(ctx.confidence, 4) and d["basis"] == ctx.basis


@pytest.mark.parametrize("question", ["When did we see the giraffe?", "Was there a Cairn Terrier?",
                                      "What was next to the accordion?"])
def test_what_the_stream_never_showed_is_not_in_memory(memory, question):
    calls = []
    memory.answer_fn, hook = (lambda ctx: calls.append(ctx) or "hook"), memory.answer_fn
    try:
        ctx = memory.ask(question)
    finally:
        memory.answer_fn = hook
    assert ctx.outcome == Outcome.NOT_IN_MEMORY and ctx.confidence < memory.calibration.threshold
    assert ctx.answer == NOT_IN_MEMORY_ANSWER and calls == []  # the hook is not asked to answer from nothing
    assert memory.dialogue.entries[-1].answer == NOT_IN_MEMORY_ANSWER


@pytest.mark.parametrize("question, span", [
    ("What happened at the beginning?", (0, 12)),
    ("What did we see at the end of the video?", (108, 120)),
    ("What did you see at 21 s?", (19, 24)),
    ("What was on screen at 0:57?", (55, 59)),
    ("What happened in the last 10 seconds?", (109, 120)),
    ("What happened right before the tabby cat appeared?", (30, 55)),
    ("What happened right after the tabby cat appeared?", (59, 70)),
])
def test_time_references_answer_from_their_span(memory, question, span):
    ctx = memory.ask(question, answer=False)
    assert ctx.outcome == Outcome.ANSWERED, (question, ctx.time_reference)
    assert span[0] <= ctx.basis["t_end"] and ctx.basis["t_start"] <= span[1], (question, ctx.basis)
    assert ctx.time_reference["window"] is not None


def test_the_beginning_is_the_first_span_not_the_best_match(memory):
    ctx = memory.ask("What happened at the beginning?", answer=False)
    first = min([n.t_start for n in memory.long_term.nodes.values()] +
                [e.t_start for e in memory.knowledge_base.entries])
    assert ctx.basis["t_start"] == first == 0.0
    assert ctx.time_reference["kind"] == "beginning" and ctx.time_reference["window"][0] == 0.0


@pytest.mark.parametrize("question, reason", [
    ("What happened at 500 s?", "nothing in memory in that span"),
    ("What happened before the giraffe appeared?", "the anchor is not in memory"),
])
def test_a_span_that_holds_nothing_is_not_in_memory(memory, question, reason):
    ctx = memory.ask(question, answer=False)
    assert ctx.outcome == Outcome.NOT_IN_MEMORY and ctx.basis is None and ctx.confidence == 0.0
    assert ctx.time_reference["reason"] == reason


def test_an_empty_memory_answers_nothing():
    ctx = StreamMemory("base", None, TEXT).ask("What happened?", answer=False)
    assert ctx.outcome == Outcome.NOT_IN_MEMORY and ctx.basis is None


def test_pipeline_follows_the_decision():
    rng = np.random.default_rng(0)
    frames = [(i / 10.0, rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)) for i in range(40)]
    pipe = StreamPipeline(frames, PixelEncoder(), TEXT, answer_fn=lambda ctx: "from the hook")
    ctx_seen, ctx_unseen = pipe.run([(math.inf, "What happened at the beginning?"),
                                     (math.inf, "Was there a giraffe?")])
    assert ctx_seen.outcome == Outcome.ANSWERED and ctx_seen.answer == "from the hook"
    assert ctx_unseen.outcome == Outcome.NOT_IN_MEMORY and ctx_unseen.answer == NOT_IN_MEMORY_ANSWER


@pytest.mark.parametrize("clip", ["bikes.mp4", "carphone_pristine.mp4"])
def test_the_beginning_of_a_real_clip_is_its_first_span(clip):
    """The reported case: "What happened at the beginning?" was answered from the 1.0-2.0 s node on two clips."""
    memory = StreamMemory("base", PixelEncoder(), TEXT)
    for t, frame in VideoSource(sample_video_path(clip), size=96, fps=10):
        memory.push(t, frame)
    memory.finish()
    ctx = memory.ask("What happened at the beginning?", answer=False)
    assert ctx.outcome == Outcome.ANSWERED and ctx.basis["t_start"] == 0.0 < 1.0
    end = memory.ask("What happened at the end?", answer=False)
    assert end.basis["t_end"] == pytest.approx(memory.stream_time, abs=0.2)
