"""Hostile inputs, orchestration layer: nothing in python/streammem crashes, hangs or answers silently
wrong.  Every pipeline future resolves on every path, stream times are checked where they enter,
lifecycle misuse raises instead of blocking, close() ends the threads even with a blocking source,
caller buffers are copied, damaged videos are reported, parameters are validated by name, and the
written thread-safety contracts hold under concurrent callers."""
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import numpy as np
import pytest
import torch

from streammem import (
    BoundedConfig, HashingTextEncoder, MemoryConfig, PipelineStopped, PixelEncoder, Preset, StreamMemory,
    StreamPipeline, SyntheticVideo,
)
from streammem.components.bounded import BoundedMemory
from streammem.cli import main
from streammem.stream.calibration import default_calibration
from streammem.stream.questions import parse_query
from streammem import MotionGate
from streammem.components.knowledge import DialogueMemory, KnowledgeBase
from streammem.components.memory import LongTermMemory
from streammem.io.video import VideoSource, VideoTruncatedWarning

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

COLOURS = ["red", "green", "blue", "yellow"]
WAIT_S = 30  # every blocking call in this file has a timeout: a hang fails the test instead of the run


def _config(**changes):
    changes.setdefault("preset", Preset("t", 0.0, 6, 3, 2))
    changes.setdefault("motion_size", None)
    return MemoryConfig(**changes)


NEVER_ABSTAIN = default_calibration(HashingTextEncoder()).with_threshold(0.0)


def _pipeline(source, text=None, **kwargs):
    return StreamPipeline(source, PixelEncoder(), text or HashingTextEncoder(), config=_config(), **kwargs)


def _video(n=40):
    return SyntheticVideo(COLOURS, n // len(COLOURS), size=(16, 16))


class _FailingText(HashingTextEncoder):
    """A text encoder that raises for questions containing 'boom'."""

    def encode(self, texts):
        if any("boom" in t for t in texts):
            raise RuntimeError("encoder exploded")
        return super().encode(texts)


# --------------------------------------------------------------------------
# Every future is resolved
# --------------------------------------------------------------------------
def test_answer_fn_raising_fails_that_question_only():
    def answer(ctx):
        if "bad" in ctx.question:
            raise KeyError("answer_fn failed")
        return "fine"

    # Asked once frames are in memory, with a calibration that never abstains: answer_fn is asked every time.
    with _pipeline(_video(), answer_fn=answer, calibration=NEVER_ABSTAIN) as pipe:
        good, bad = pipe.submit("good?", at=0.5), pipe.submit("bad?", at=0.5)
        later = pipe.submit("good later?", at=2.0)
        with pytest.raises(KeyError, match="answer_fn failed"):
            bad.result(WAIT_S)
        assert good.result(WAIT_S).answer == "fine" and later.result(WAIT_S).answer == "fine"
        pipe.wait(WAIT_S)
        assert pipe.ask("good at the end?", timeout=WAIT_S).answer == "fine"
    assert pipe.questions_failed == 1 and pipe.summary()["questions_failed"] == 1
    assert pipe.error is None  # the stream went on
    assert len(pipe.dialogue) == 3  # the failed question left no dialogue entry


def test_text_encoder_raising_and_wrong_answer_type_resolve_the_future():
    with _pipeline(_video(), _FailingText(), answer_fn=lambda ctx: 42 if "int" in ctx.question else "ok",
                   calibration=NEVER_ABSTAIN) as pipe:
        boom = pipe.submit("boom?", at=1.0)
        wrong = pipe.submit("int please", at=0.5)
        fine = pipe.submit("what now?", at=0.5)
        with pytest.raises(RuntimeError, match="encoder exploded"):
            boom.result(WAIT_S)
        with pytest.raises(TypeError, match="answer_fn must return a str"):
            wrong.result(WAIT_S)
        assert fine.result(WAIT_S).answer == "ok"
        pipe.wait(WAIT_S)
    # run() raises the first failing question's error instead of blocking
    with pytest.raises(RuntimeError, match="encoder exploded"):
        _pipeline(_video(), _FailingText()).run([(1.0, "boom"), (None, "fine")])


def test_a_failing_question_at_a_stream_time_does_not_stall_memory_formation():
    # Formation waits until a due question's context is retrieved; a question whose encoding
    # raises must release it too.
    with _pipeline(_video(200), _FailingText()) as pipe:
        futures = [pipe.submit(f"boom {i}", at=i / 10.0) for i in range(0, 200, 7)]
        pipe.wait(WAIT_S)
    for f in futures:
        with pytest.raises(RuntimeError):
            f.result(WAIT_S)
    assert pipe.frames_formed == 200


# --------------------------------------------------------------------------
# Stream times checked where they enter
# --------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [float("nan"), -float("inf"), "3", True, np.nan])
def test_nan_release_times_are_rejected(bad):
    pipe = _pipeline(_video())
    with pytest.raises(ValueError, match=r"queries\[1\]\[0\] must be a stream time"):
        pipe.run([(1.0, "fine"), (bad, "never released?")])
    assert not pipe.running and not pipe._started  # checked before anything started
    with pipe:
        with pytest.raises(ValueError, match="at must be a stream time"):
            pipe.submit("q", at=bad)


def test_inf_release_time_means_after_the_end():
    pipe = _pipeline(_video())
    ctx, = pipe.run([(float("inf"), "what happened?")])
    assert ctx.stream_time == pytest.approx(3.9) and pipe.frames_formed == 40


@pytest.mark.parametrize("text", ["nan: what?", "inf: what?", "-inf: what?", "Infinity s: what?",
                                  "9" * 400 + ": what?"])
def test_cli_rejects_non_finite_query_times(text, capsys):
    with pytest.raises(ValueError, match="finite number of seconds"):
        parse_query(text)
    assert main(["run", "--no-progress", "--query", text]) == 2  # before any model or clip is loaded
    assert "finite number of seconds" in capsys.readouterr().err


@pytest.mark.parametrize("times, match", [
    ([0.0, float("nan"), 0.2], "timestamp nan for frame 1"),
    ([0.0, 0.1, float("inf")], "timestamp inf for frame 2"),
    ([0.5, 0.2, 0.3], "must not decrease"),
])
def test_bad_source_timestamps_stop_the_pipeline(times, match):
    frame = np.zeros((8, 8, 3), np.uint8)
    pipe = _pipeline([(t, frame) for t in times])
    with pytest.raises(ValueError, match=match):
        pipe.run([(None, "q")])


# --------------------------------------------------------------------------
# Lifecycle: nothing blocks silently
# --------------------------------------------------------------------------
def test_never_started_pipeline_raises_instead_of_blocking():
    pipe = _pipeline(_video())
    for call in (lambda: pipe.wait(), lambda: pipe.wait(timeout=1), lambda: pipe.ask("q"),
                 lambda: pipe.submit("q")):
        t0 = time.perf_counter()
        with pytest.raises(RuntimeError, match="before start"):
            call()
        assert time.perf_counter() - t0 < 1.0
    pipe.close()
    with pytest.raises(PipelineStopped):
        pipe.start()
    with _pipeline(_video()) as started, pytest.raises(ValueError, match="timeout"):
        started.wait(timeout=float("nan"))


def test_wait_and_ask_from_the_pipelines_own_threads_raise():
    errors = []

    def hook(record):
        if record.index == 0:
            for call in (lambda: pipe.wait(), lambda: pipe.ask("q")):
                try:
                    call()
                except RuntimeError as exc:
                    errors.append(str(exc))

    pipe = _pipeline(_video(), frame_hook=hook)
    pipe.run()
    assert len(errors) == 2 and all("would wait for itself" in e for e in errors)


def test_close_ends_the_frame_stacking_thread_of_a_blocking_source():
    class Camera:
        """An iterator whose next() blocks until close() wakes it (a socket or camera read)."""

        def __init__(self):
            self.woken = threading.Event()
            self.closed = False
            self.i = 0

        def __iter__(self):
            return self

        def __next__(self):
            if self.i >= 5:
                self.woken.wait()
                raise StopIteration
            self.i += 1
            return self.i / 10.0, np.full((8, 8, 3), self.i * 40, np.uint8)

        def close(self):
            self.closed = True
            self.woken.set()

    cam = Camera()
    pipe = _pipeline(cam).start()
    pending = pipe.submit("after the end", at=float("inf"))
    deadline = time.monotonic() + WAIT_S
    while pipe.frames_decoded < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    t0 = time.perf_counter()
    pipe.close()
    assert time.perf_counter() - t0 < 1.5
    assert cam.closed and not pipe.running  # every thread is gone, not only detached
    with pytest.raises(PipelineStopped):
        pending.result(WAIT_S)
    with pytest.raises(PipelineStopped):
        pipe.wait(1)


def test_a_source_blocked_forever_cannot_keep_the_process_alive():
    # A generator blocked in next() cannot be interrupted from Python: close() still returns at once,
    # resolves every question, and the threads are daemons, so the interpreter exits.
    script = textwrap.dedent("""
        import threading, time
        import numpy as np
        from streammem import HashingTextEncoder, MemoryConfig, PixelEncoder, Preset, StreamPipeline

        def source():
            yield 0.0, np.zeros((8, 8, 3), np.uint8)
            threading.Event().wait()  # blocks forever

        pipe = StreamPipeline(source(), PixelEncoder(), HashingTextEncoder(),
                              config=MemoryConfig(preset=Preset("t", 0.0, 6, 3, 2), motion_size=None)).start()
        fut = pipe.submit("q", at=5.0)
        time.sleep(0.3)
        t0 = time.perf_counter()
        pipe.close()
        print("closed", round(time.perf_counter() - t0, 2), type(fut.exception(5)).__name__)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    closed = out.stdout.split()
    assert closed[0] == "closed" and float(closed[1]) < 1.5 and closed[2] == "PipelineStopped"


# --------------------------------------------------------------------------
# Caller buffers, frame sizes, damaged files
# --------------------------------------------------------------------------
def test_motion_gate_copies_the_callers_frame():
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (6, 24, 32, 3), dtype=np.uint8)
    frames[3] = frames[2]  # a still frame
    for reference in ("previous", "last_kept"):
        expected = MotionGate(0.1, size=None, reference=reference).push(frames)
        gate, buffer, got = MotionGate(0.1, size=None, reference=reference), np.empty_like(frames[:1]), ([], [])
        for f in frames:
            buffer[0] = f  # a decoder reusing its output buffer
            s, k = gate.push(buffer)
            got[0].extend(s)
            got[1].extend(k)
        assert got[1] == expected[1]
        np.testing.assert_allclose(got[0], expected[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"frame shape \(24, 32, 3\)"):
        gate.push(frames[:1, :16])


def test_frame_size_change_mid_stream_is_a_clear_error():
    small, big = np.zeros((8, 8, 3), np.uint8), np.zeros((8, 12, 3), np.uint8)
    pipe = _pipeline([(0.0, small), (0.1, small), (0.2, big)])
    with pytest.raises(ValueError, match="frame 2 of shape .* must not change"):
        pipe.run()
    memory = StreamMemory(_config(), PixelEncoder(), HashingTextEncoder())
    memory.push([0.0], small[None])
    with pytest.raises(ValueError, match="frames must keep the stream's frame shape"):
        memory.push([0.1], big[None])


def _write_avi(path, n=250):
    import cv2

    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 25.0, (32, 24))
    rng = np.random.default_rng(0)
    for _ in range(n):
        writer.write(rng.integers(0, 256, (24, 32, 3), dtype=np.uint8))
    writer.release()
    return path


def test_video_source_reports_a_truncated_file(tmp_path):
    whole = _write_avi(tmp_path / "whole.avi")
    cut = tmp_path / "cut.avi"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the intact file warns about nothing
        assert len(list(VideoSource(whole))) == 250
    src = VideoSource(cut)
    with pytest.warns(VideoTruncatedWarning, match=r"ended after \d+ of the 250 frames"):
        n = len(list(src))
    report = src.decode_report
    assert 0 < n < 250 and report.truncated and report.finished
    assert report.frames_decoded == n and report.frames_missing == 250 - n
    with pytest.raises(ValueError, match="damaged or was cut short"):
        list(VideoSource(cut, on_truncation="raise"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(list(VideoSource(cut, on_truncation="ignore"))) == n
    # the pipeline's summary carries the counts
    with pytest.warns(VideoTruncatedWarning):
        pipe = _pipeline(VideoSource(cut))
        pipe.run()
    assert pipe.summary()["source"]["frames_missing"] == 250 - n
    # stopping early (max_frames) is not truncation
    early = VideoSource(cut, max_frames=3)
    assert len(list(early)) == 3 and not early.decode_report.truncated and not early.decode_report.finished
    with pytest.raises(ValueError, match="size must be an int in"):
        VideoSource(whole, size=100_000)


# --------------------------------------------------------------------------
# Validation by name
# --------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, name", [
    ({"tokens_per_centre": -5}, "tokens_per_centre"),
    ({"tokens_per_centre": 0}, "tokens_per_centre"),
    ({"alpha": float("nan")}, "alpha"),
    ({"beta": float("inf")}, "beta"),
    ({"alpha": -1.0}, "alpha"),
    ({"budget": 0}, "budget"),
    ({"tau": 0.0}, "tau"),
    ({"low_water": 1.5}, "low_water"),
])
def test_bounded_memory_and_config_validate(kwargs, name):
    memory = LongTermMemory(HashingTextEncoder())
    args = {"budget": 10, **kwargs}
    with pytest.raises(ValueError, match=rf"^{name} must be"):
        BoundedMemory(memory, **args)
    with pytest.raises(ValueError, match=rf"^bounded\.{name} must be"):
        BoundedConfig(**args)


def test_unknown_preset_names_the_argument_and_lists_the_presets():
    for make in (lambda: MemoryConfig(preset="bogus"), lambda: MemoryConfig.from_preset("bogus"),
                 lambda: MotionGate.from_preset("bogus"),
                 lambda: StreamMemory("bogus", PixelEncoder(), HashingTextEncoder())):
        with pytest.raises(ValueError, match=r"preset must be one of \['base', 'fast', 'slow'\]"):
            make()
    assert MemoryConfig(preset="fast") == MemoryConfig.from_preset("fast")


def test_search_with_a_wrong_query_is_a_value_error():
    text = HashingTextEncoder()
    dialogue = DialogueMemory(text)
    dialogue.add("what?", "that", 1.0)
    kb = KnowledgeBase()
    for bad, match in ((torch.ones(text.dim + 1), "entries"), (torch.full((text.dim,), float("nan")), "finite"),
                       (torch.ones(2, text.dim), "1-d"), ("text", "1-d float")):
        with pytest.raises(ValueError, match=match):
            dialogue.search(bad)
    with pytest.raises(ValueError, match="k must be"):
        dialogue.search(torch.ones(text.dim), k=0)
    with pytest.raises(ValueError, match="k must be"):
        kb.search(torch.ones(4), k=-1)
    assert dialogue.search(text.encode(["what?"])[0])[0][1].answer == "that"


# --------------------------------------------------------------------------
# Thread-safety contracts
# --------------------------------------------------------------------------
def _structure(memory):
    lt = memory.long_term
    return ({i: (n.level, n.parent, tuple(n.children), n.t_start, n.t_end) for i, n in lt.nodes.items()},
            [(e.first_frame, e.last_frame) for e in memory.knowledge_base.entries], memory.frames_formed,
            memory.stream_time)


def test_stream_memory_is_safe_to_share_between_threads():
    """Pushes in one thread while four threads ask, summarise and snapshot: no error, and the memory
    forms exactly what a memory pushed alone forms (questions change no structure)."""
    video = SyntheticVideo(COLOURS * 2, 15, size=(16, 16))
    frames = np.stack([f for _, f in video])
    times = [i / 10.0 for i in range(len(frames))]
    alone = StreamMemory(_config(), PixelEncoder(), HashingTextEncoder())
    shared = StreamMemory(_config(), PixelEncoder(), HashingTextEncoder(), answer_fn=lambda ctx: "a")
    for i in range(0, len(frames), 5):
        alone.push(times[i:i + 5], frames[i:i + 5])
    errors, done = [], threading.Event()

    def pusher():
        try:
            for i in range(0, len(frames), 5):
                shared.push(times[i:i + 5], frames[i:i + 5])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            done.set()

    def reader(k):
        try:
            while not done.is_set():
                if k == 0:
                    shared.summary()
                elif k == 1:
                    state = shared.state_dict()  # a snapshot between two frames
                    assert state["counters"]["frames_formed"] <= len(frames)
                else:
                    ctx = shared.ask(f"what now {k}?")
                    assert ctx.stream_time is None or ctx.stream_time <= times[-1]
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=pusher)] + [threading.Thread(target=reader, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(WAIT_S)
    assert not any(th.is_alive() for th in threads) and errors == []
    assert _structure(shared) == _structure(alone)
    assert shared.questions > 0 and len(shared.dialogue) == shared.questions


def test_pipeline_methods_are_safe_from_many_threads():
    go = threading.Event()

    def source():  # the stream waits until every client has submitted, so no time has passed yet
        for i, item in enumerate(_video(400)):
            if i == 1:
                go.wait(WAIT_S)
            yield item

    with _pipeline(source(), answer_fn=lambda ctx: "a") as pipe:
        futures, lock = [], threading.Lock()

        def client(k):
            for i in range(5):
                fut = pipe.submit(f"q{k}.{i}", at=(k * 5 + i) / 10.0 if i % 2 else None)
                with lock:
                    futures.append(fut)
                pipe.summary()

        threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(WAIT_S)
        go.set()
        results = [f.result(WAIT_S) for f in futures]
        pipe.wait(WAIT_S)
    assert len(results) == 40 and len(pipe.dialogue) == 40
    # questions at a time are answered from exactly the frames up to that time
    for ctx in results:
        asked = ctx.question.split("q")[1].split(".")
        k, i = int(asked[0]), int(asked[1])
        if i % 2:
            assert ctx.stream_time == pytest.approx((k * 5 + i) / 10.0)


def test_encoders_are_safe_to_call_from_many_threads(minilm):
    """The contract ``StreamMemory.ask`` relies on: encoders called concurrently give what they give alone."""
    frames = np.stack([f for _, f in _video(16)])
    texts = [f"what happened {i} times " + "and then " * (i % 5) for i in range(24)]
    jobs = [(minilm.encode, texts), (HashingTextEncoder().encode, texts),
            (lambda xs: PixelEncoder().encode(xs).features, frames)]
    expected = [[fn(items[i:i + 1]) for i in range(len(items))] for fn, items in jobs]
    got, errors = [[None] * len(items) for _, items in jobs], []

    def worker(start):
        try:
            for j, (fn, items) in enumerate(jobs):
                for i in range(start, len(items), 4):
                    got[j][i] = fn(items[i:i + 1])
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(WAIT_S)
    assert errors == []
    for want, have in zip(expected, got):
        for w, h in zip(want, have):
            torch.testing.assert_close(torch.as_tensor(h), torch.as_tensor(w), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cls", [
    "StreamMemory", "StreamPipeline", "MotionGate", "ShortTermMemory", "LongTermMemory", "BoundedMemory",
    "KnowledgeBase", "EventSegmenter", "DialogueMemory", "KnowledgeInjector", "VideoSource", "InstantaneityScorer",
    "LanguageModelCaptioner", "LabelCaptioner", "PixelEncoder", "HashingTextEncoder", "MiniLMTextEncoder",
    "EfficientNetLiteEncoder", "FrameEncoder", "TextEncoder", "SyntheticVideo",
])
def test_every_stateful_class_states_its_thread_safety(cls):
    import streammem

    doc = " ".join(getattr(streammem, cls).__doc__.split())
    assert "thread" in doc.lower(), f"{cls} has no thread-safety contract in its docstring"
