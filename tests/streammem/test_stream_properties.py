"""Property-based tests (Hypothesis) of the streammem public API.

Generated configurations, parameters, frames, timestamps, features, query embeddings, question
schedules and hostile sources.  Every call either succeeds and keeps the documented invariants,
or raises ``ValueError`` naming the argument; a pipeline resolves every future it hands out.
Nothing can hang the run: every blocking call has a timeout, and a watchdog ends the process
with a traceback of every thread should a property ever run past its limit.  Derandomised (the
same examples on every run, no example database written), about 30 s on 2 cores.
"""
import faulthandler
import math
import re
import threading
from concurrent.futures import TimeoutError as FutureTimeout

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from streammem import (
    BoundedConfig, HashingTextEncoder, InjectorConfig, MemoryConfig, PipelineStopped, PixelEncoder, Preset,
    SegmenterConfig, ShortTermConfig, StreamMemory, StreamPipeline,
)
from streammem.components.answers import NOT_IN_MEMORY_ANSWER, Outcome
from streammem.components.bounded import BoundedMemory
from streammem.stream.calibration import default_calibration
from streammem.stream.questions import parse_query
from streammem import MotionGate
from streammem.components.knowledge import DialogueMemory, KnowledgeBase, KnowledgeEntry
from streammem.components.memory import LongTermMemory, ShortTermMemory

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

WAIT_S = 30.0
WATCHDOG_S = 240.0

settings.register_profile(
    "streammem", derandomize=True, database=None, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)
FAST = settings(settings.get_profile("streammem"), max_examples=60)
SLOW = settings(settings.get_profile("streammem"), max_examples=20)


@pytest.fixture(autouse=True)
def _watchdog():
    """A hang ends the process with every thread's traceback instead of stalling the run."""
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


# --------------------------------------------------------------------------
# Strategies
# --------------------------------------------------------------------------
HOSTILE = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.integers(-3, 300),
    st.floats(allow_nan=True, allow_infinity=True), st.floats(-2.0, 2.0),
    st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e308, -0.0, 0.5, 2**63, 2**31]),
    st.text(max_size=4), st.just([1, 2]), st.just({"a": 1}),
    st.integers(-3, 300).map(np.int64), st.floats(-1e3, 1e3).map(np.float32), st.just(np.bool_(True)),
    st.just(torch.tensor(3.0)),
)

CONFIG_FIELDS = {
    MemoryConfig: ["preset", "motion_size", "motion_window", "motion_reference", "short_term", "kmeans_iters",
                   "segmenter", "bounded", "injector", "dialogue_k", "seed", "backend"],
    ShortTermConfig: ["candidates", "keep", "tau"],
    SegmenterConfig: ["window", "tau", "min_depth", "max_event", "drift"],
    BoundedConfig: ["budget", "alpha", "beta", "tau", "theta_sim", "theta_concept", "tokens_per_centre",
                    "low_water"],
    InjectorConfig: ["gamma", "theta1", "theta2"],
}
PREFIX = {MemoryConfig: "", ShortTermConfig: "short_term.", SegmenterConfig: "segmenter.",
          BoundedConfig: "bounded.", InjectorConfig: "injector."}


def _names(message: str, name: str) -> bool:
    return re.search(rf"(^|\W){re.escape(name)}(\W|$)", message) is not None


# --------------------------------------------------------------------------
# Configuration and parameters: accepted, or ValueError naming the argument
# --------------------------------------------------------------------------
@FAST
@given(cls=st.sampled_from(list(CONFIG_FIELDS)), data=st.data())
def test_config_fields_accept_or_name_the_field(cls, data):
    field = data.draw(st.sampled_from(CONFIG_FIELDS[cls]), label="field")
    value = data.draw(HOSTILE, label="value")
    kwargs = {"budget": 10} if cls is BoundedConfig and field != "budget" else {}
    kwargs[field] = value
    try:
        config = cls(**kwargs)
    except ValueError as exc:
        assert _names(str(exc), PREFIX[cls] + field) or _names(str(exc), field), str(exc)
        return
    # accepted: the stored value is a clean Python value that survives the documented round trip
    stored = getattr(config, field)
    if field not in ("preset", "short_term", "segmenter", "bounded", "injector"):
        assert type(stored) in (int, float, str, type(None)), (field, value, stored)  # no numpy/tensor/bool leaks
    if isinstance(stored, float):
        assert math.isfinite(stored)
    if cls is MemoryConfig:
        assert MemoryConfig.from_dict(config.to_dict()) == config


@FAST
@given(name=st.sampled_from(["budget", "alpha", "beta", "tau", "theta_sim", "theta_concept", "tokens_per_centre",
                             "low_water"]), value=HOSTILE)
def test_bounded_memory_parameters(name, value):
    memory = LongTermMemory(HashingTextEncoder(dim=16))
    kwargs = {"budget": 10, name: value}
    try:
        bounded = BoundedMemory(memory, **kwargs)
    except ValueError as exc:
        assert _names(str(exc), name), str(exc)
        return
    assert bounded.tokens_per_centre >= 1 and bounded.budget >= 1
    assert all(math.isfinite(getattr(bounded, n)) for n in ("alpha", "beta", "tau", "theta_sim", "low_water"))


@FAST
@given(name=st.sampled_from(["threshold", "size", "reference", "window"]), value=HOSTILE)
def test_motion_gate_parameters(name, value):
    kwargs = {"threshold": 0.3, "size": None, name: value}
    try:
        MotionGate(**kwargs)
    except ValueError as exc:
        assert _names(str(exc), name), str(exc)


@FAST
@given(name=st.sampled_from(["candidates", "keep", "tau", "seed"]), value=HOSTILE)
def test_short_term_memory_parameters(name, value):
    try:
        memory = ShortTermMemory(**{name: value})
    except ValueError as exc:
        assert _names(str(exc), name), str(exc)
        return
    assert memory.candidates >= 1 and memory.keep >= 1 and math.isfinite(memory.tau) and memory.tau > 0


@FAST
@given(text=st.one_of(
    st.text(max_size=30),
    st.tuples(st.sampled_from(["", " ", "+", "-"]),
              st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr), st.integers(0, 10**400).map(str),
                        st.sampled_from(["1:30", "1:02:03", ".5", "12.", "nan", "inf", "Infinity", "-0"])),
              st.sampled_from(["", "s", " s"]), st.sampled_from([":", ": ", ":: "]), st.text(max_size=12))
    .map("".join)))
def test_parse_query(text):
    try:
        at, question = parse_query(text)
    except ValueError as exc:
        assert "query" in str(exc)
        return
    assert question and question == question.strip()
    assert at is None or (math.isfinite(at) and at >= 0.0)


# --------------------------------------------------------------------------
# MotionGate: caller buffers are never aliased; any batching gives the same scores
# --------------------------------------------------------------------------
@st.composite
def _frames(draw, max_n=8):
    n = draw(st.integers(1, max_n))
    h, w = draw(st.integers(8, 20)), draw(st.integers(8, 20))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8)
    for i in draw(st.lists(st.integers(1, max(1, n - 1)), max_size=3)):  # still frames
        if i < n:
            frames[i] = frames[i - 1]
    return frames


def _splits(draw, n):
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, n - 1)), max_size=4)))) if n > 1 else []
    return [b for b in zip([0] + cuts, cuts + [n]) if b[0] < b[1]]


@FAST
@given(frames=_frames(), reference=st.sampled_from(["previous", "last_kept"]),
       threshold=st.sampled_from([0.0, 0.2, 0.5]), data=st.data())
def test_motion_gate_batching_and_buffer_reuse(frames, reference, threshold, data):
    expected = MotionGate(threshold, size=None, reference=reference).push(frames.copy())
    gate = MotionGate(threshold, size=None, reference=reference)
    scores, kept = [], []
    for a, b in _splits(data.draw, len(frames)):
        buffer = np.zeros((8 if b - a > 0 else 1,) + frames.shape[1:], np.uint8)[: b - a]
        buffer[:] = frames[a:b]
        s, k = gate.push(buffer)
        buffer[:] = 255 - buffer  # the caller reuses its buffer at once
        scores += s
        kept += k
    assert kept == expected[1]
    np.testing.assert_allclose(scores, expected[0], rtol=1e-4, atol=1e-5)
    assert scores[0] == 1.0 and kept[0] and all(0.0 <= v <= 1.0 + 1e-6 for v in scores)


# --------------------------------------------------------------------------
# StreamMemory: a rejected push changes nothing; an accepted one keeps the invariants
# --------------------------------------------------------------------------
TIME = st.one_of(st.floats(-5.0, 50.0), st.sampled_from([float("nan"), float("inf"), -float("inf")]))


@st.composite
def _encoded_batch(draw, dim):
    n = draw(st.integers(0, 6))
    d = draw(st.sampled_from([dim, dim, dim, dim + 1, 1]))
    kind = draw(st.sampled_from(["ok", "ok", "ok", "nan", "huge", "int", "3d"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    feats = torch.from_numpy(rng.standard_normal((n, d)).astype(np.float32))
    if kind == "nan" and n:
        feats[0, 0] = float("nan")
    elif kind == "huge":  # 1e14 is accepted and must stay finite; 1e30 is beyond MAX_FEATURE_ABS
        feats = feats * draw(st.sampled_from([1e14, 1e30]))
    elif kind == "int":
        feats = feats.to(torch.int64)
    elif kind == "3d":
        feats = feats[None]
    times = draw(st.one_of(st.lists(TIME, min_size=n, max_size=n), st.lists(TIME, max_size=3), TIME))
    if draw(st.booleans()) and isinstance(times, list):
        times = sorted(t for t in times if not math.isnan(t))  # mostly valid schedules
        times += [times[-1] if times else 0.0] * (n - len(times))
    labels = draw(st.one_of(st.none(), st.just([("red",)] * n), st.just(["red"] * n), st.just([(1,)] * n)))
    return times, feats, labels


def _memory_state(memory):
    return (memory.frames_seen, memory.frames_formed, memory.stream_time, len(memory.long_term.nodes),
            len(memory.short_term))


@SLOW
@given(data=st.data())
def test_stream_memory_push_encoded(data):
    dim = 12
    memory = StreamMemory(MemoryConfig(preset=Preset("t", 0.0, 3, 2, 2), motion_size=None), None,
                          HashingTextEncoder(dim=16))
    pushed = []
    for _ in range(data.draw(st.integers(1, 5), label="batches")):
        times, feats, labels = data.draw(_encoded_batch(dim), label="batch")
        before = _memory_state(memory)
        try:
            result = memory.push_encoded(times, feats, labels)
        except ValueError:
            assert _memory_state(memory) == before  # validated before anything moved
            continue
        n = feats.shape[0]
        assert result.frames == n and result.kept == list(range(len(pushed), len(pushed) + n))
        pushed += list(np.atleast_1d(np.asarray(times, np.float64)))
        assert memory.frames_seen == memory.frames_formed == len(pushed)
        assert memory.stream_time == max(pushed)
        assert all(math.isfinite(t) for t in pushed) and pushed == sorted(pushed)
    memory.finish()
    assert all(bool(torch.isfinite(node.centres).all()) for node in memory.long_term.nodes.values())
    ctx = memory.ask("what happened?")
    assert ctx.stream_time == (max(pushed) if pushed else None)
    assert all(-1.0 - 1e-4 <= s["score"] <= 1.0 + 1e-4 for s in ctx.tree_path if s.get("score") is not None)
    assert {f["frame"] for f in ctx.short_term} <= set(range(len(pushed)))


@SLOW
@given(frames=_frames(max_n=12), threshold=st.sampled_from([0.0, 0.3]), data=st.data())
def test_stream_memory_push_is_independent_of_batching(frames, threshold, data):
    config = MemoryConfig(preset=Preset("t", threshold, 3, 2, 2), motion_size=None)
    times = np.cumsum(data.draw(st.lists(st.sampled_from([0.0, 0.04, 0.1]), min_size=len(frames),
                                         max_size=len(frames)), label="gaps")).tolist()
    whole = StreamMemory(config, PixelEncoder(), HashingTextEncoder(dim=16))
    whole.push(times, frames)
    split = StreamMemory(config, PixelEncoder(), HashingTextEncoder(dim=16))
    buffer = np.empty_like(frames)
    for a, b in _splits(data.draw, len(frames)):
        buffer[: b - a] = frames[a:b]
        split.push(times[a:b], buffer[: b - a])
    for m in (whole, split):
        m.finish()
    assert split.summary()["nodes_per_level"] == whole.summary()["nodes_per_level"]
    assert [(n.first_frame, n.last_frame) for n in split.long_term.nodes.values()] == \
        [(n.first_frame, n.last_frame) for n in whole.long_term.nodes.values()]
    assert split.stream_time == whole.stream_time == times[-1]
    assert split.frames_formed == whole.frames_formed


# --------------------------------------------------------------------------
# Searches: ValueError for a wrong query, sorted cosines in [-1, 1] otherwise
# --------------------------------------------------------------------------
QUERY = st.one_of(
    st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), min_size=0, max_size=18),
    st.lists(st.floats(-1e30, 1e30), min_size=16, max_size=16),
    st.lists(st.lists(st.floats(-1, 1), min_size=16, max_size=16), min_size=1, max_size=2),
    st.text(max_size=3),
)


@FAST
@given(query=QUERY, k=st.one_of(st.integers(-2, 9), HOSTILE))
def test_dialogue_and_knowledge_search(query, k):
    text = HashingTextEncoder(dim=16)
    dialogue = DialogueMemory(text)
    kb = KnowledgeBase()
    for i, q in enumerate(["what colour?", "who spoke?", "where now?"]):
        dialogue.add(q, f"answer {i}", float(i))
        kb.add(KnowledgeEntry(i, i * 10, i * 10 + 9, float(i), float(i) + 1, f"event {i}", text.encode([q])[0], 10))
    for store in (dialogue, kb):
        try:
            q = torch.tensor(query, dtype=torch.float32) if not isinstance(query, str) else query
            found = store.search(q, k)
        except ValueError as exc:
            assert _names(str(exc), "query_embedding") or _names(str(exc), "k"), str(exc)
            continue
        scores = [s for s, _ in found]
        assert 1 <= len(found) <= min(int(k), 3) and scores == sorted(scores, reverse=True)
        assert all(math.isfinite(s) and -1.0 - 1e-4 <= s <= 1.0 + 1e-4 for s in scores)


# --------------------------------------------------------------------------
# StreamPipeline: every future resolves; a question at T sees exactly the frames up to T
# --------------------------------------------------------------------------
def _gated(items, go):
    def source():
        if not go.wait(WAIT_S):
            raise TimeoutError("the test never opened the source")
        yield from items
    return source()


@st.composite
def _schedule(draw):
    n = draw(st.integers(1, 40))
    times = np.round(np.cumsum(draw(st.lists(st.sampled_from([0.0, 0.1, 0.25]), min_size=n, max_size=n))), 6)
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    frames = rng.integers(0, 256, (n, 8, 8, 3), dtype=np.uint8)
    for i in range(1, n):
        if rng.random() < 0.3:
            frames[i] = frames[i - 1]  # still: the gate drops it, stream time still advances
    at = st.one_of(st.none(), st.floats(-1.0, float(times[-1]) + 1.0), st.sampled_from(list(times)),
                   st.just(float("inf")))
    questions = draw(st.lists(st.tuples(at, st.booleans()), max_size=8))
    return [(float(t), f) for t, f in zip(times, frames)], questions


@SLOW
@given(schedule=_schedule(), gate_batch=st.integers(1, 6), queue_size=st.integers(1, 4),
       threshold=st.sampled_from([0.0, 0.3]))
def test_pipeline_resolves_every_future_and_answers_from_the_past(schedule, gate_batch, queue_size, threshold):
    items, questions = schedule

    def answer(ctx):
        if ctx.question.startswith("fail"):
            raise ArithmeticError(ctx.question)
        return "ok"

    go = threading.Event()
    # Threshold 0: every question with something in memory is answered (answer_fn asked); one asked before
    # any frame is formed is not in memory, and answer_fn is not asked.
    never_abstain = default_calibration(HashingTextEncoder()).with_threshold(0.0)
    pipe = StreamPipeline(_gated(items, go), PixelEncoder(), HashingTextEncoder(dim=16),
                          config=MemoryConfig(preset=Preset("t", threshold, 4, 2, 2), motion_size=None),
                          answer_fn=answer, calibration=never_abstain, gate_batch=gate_batch, queue_size=queue_size)
    try:
        pipe.start()
        futures = [(at, fail, pipe.submit(f"{'fail' if fail else 'ask'} {i}", at=at))
                   for i, (at, fail) in enumerate(questions)]
        go.set()
        pipe.wait(WAIT_S)
        times = [t for t, _ in items]
        failed = 0
        for at, fail, fut in futures:
            if fut.exception(WAIT_S) is not None:
                assert fail and isinstance(fut.exception(), ArithmeticError)
                failed += 1
                continue
            ctx = fut.result(WAIT_S)
            assert (ctx.outcome == Outcome.ANSWERED) == (ctx.basis is not None)
            assert ctx.answer == ("ok" if ctx.outcome == Outcome.ANSWERED else NOT_IN_MEMORY_ANSWER)
            if at is not None:
                past = [t for t in times if t <= at]
                assert ctx.stream_time == (max(past) if past else None), (at, ctx.stream_time)
        assert pipe.frames_decoded == len(items)
        assert len(pipe.dialogue) == len(questions) - failed
        assert pipe.questions_failed == failed
    except FutureTimeout:  # pragma: no cover - reported as a failure with the schedule
        pytest.fail(f"a future did not resolve within {WAIT_S} s")
    finally:
        go.set()
        pipe.close()
    assert not pipe.running


BAD_ITEMS = [
    ("nan time", lambda f: (float("nan"), f)), ("inf time", lambda f: (float("inf"), f)),
    ("going back", lambda f: (-1.0, f)), ("not a pair", lambda f: f), ("float frame", lambda f: (99.0, f / 255.0)),
    ("grey frame", lambda f: (99.0, f[..., 0])), ("size change", lambda f: (99.0, f[:4])),
    ("string time", lambda f: ("1.0", f)), ("source raises", None),
]


@SLOW
@given(n=st.integers(1, 20), bad_at=st.integers(0, 20), bad=st.sampled_from(BAD_ITEMS),
       n_questions=st.integers(0, 4), gate_batch=st.integers(1, 5))
def test_pipeline_hostile_source_fails_cleanly(n, bad_at, bad, n_questions, gate_batch):
    name, make = bad
    assume(bad_at <= n and not (name == "going back" and bad_at == 0))  # -1.0 first is a valid start
    frames = [np.full((8, 8, 3), (i * 53) % 256, np.uint8) for i in range(n)]

    def source():
        for i, f in enumerate(frames):
            if i == bad_at:
                if make is None:
                    raise ConnectionError("camera unplugged")
                yield make(f)
            yield i / 10.0, f
        if bad_at == n:
            if make is None:
                raise ConnectionError("camera unplugged")
            yield make(frames[-1])

    go = threading.Event()
    pipe = StreamPipeline(_gated(source(), go), PixelEncoder(), HashingTextEncoder(dim=16),
                          config=MemoryConfig(preset=Preset("t", 0.0, 4, 2, 2), motion_size=None),
                          gate_batch=gate_batch)
    expected = ConnectionError if make is None else ValueError
    try:
        pipe.start()
        futures = [pipe.submit(f"q{i}", at=100.0) for i in range(n_questions)]
        go.set()
        with pytest.raises(expected):
            pipe.wait(WAIT_S)
        for fut in futures:
            with pytest.raises((expected, PipelineStopped)):
                fut.result(WAIT_S)
        assert isinstance(pipe.error, expected)
        with pytest.raises(expected):
            pipe.submit("after the failure")
    finally:
        go.set()
        pipe.close()
    assert not pipe.running
