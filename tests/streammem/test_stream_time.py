"""StreamPipeline's stream time: a question scheduled at T is answered from the memory of exactly
the frames with timestamp <= T, whatever the motion gate dropped and however far frame stacking
runs ahead; and ``gate_hook`` sees every decoded frame's score and decision once, in order."""
import time

import numpy as np
import pytest

from streammem import HashingTextEncoder, MemoryConfig, MotionGate, PixelEncoder, Preset, StreamPipeline, SyntheticVideo
from streammem_kernels import select_frames

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

THRESHOLD = 0.2


def _frames():
    """180 frames at 10 fps with three still stretches (the gate drops all but their first frame)."""
    video = SyntheticVideo(["red", "green", "blue", "yellow", "purple", "cyan"], 30, size=(24, 24), shift=1)
    frames = np.stack([f for _, f in video])
    for a, b in ((40, 60), (95, 110), (150, 180)):
        frames[a:b] = frames[a]
    return frames


def _config():
    return MemoryConfig(preset=Preset("t", THRESHOLD, 10, 3, 3), motion_size=None)


def test_question_at_t_sees_exactly_the_frames_up_to_t():
    frames = _frames()
    times = [i / 10.0 for i in range(len(frames))]
    kept = select_frames(frames, THRESHOLD, size=None)
    assert 45 not in kept and 100 not in kept and 170 not in kept  # the still stretches are dropped
    at_retrieval = {}

    def instantaneity(question, embedding):  # runs inside retrieve, under the memory lock
        at_retrieval[question] = (pipe.memory.stream_time, pipe.memory.frames_formed)
        return 0.5

    def slow_formation(record):  # frame stacking runs ahead of memory formation
        time.sleep(0.003)

    pipe = StreamPipeline(list(zip(times, frames)), PixelEncoder(), HashingTextEncoder(), config=_config(),
                          instantaneity=instantaneity, frame_hook=slow_formation, gate_batch=8, queue_size=8)
    asked = [(3.05, "between two kept frames"), (5.5, "inside a still stretch"), (10.0, "on a dropped frame"),
             (12.0, "on a kept frame"), (17.0, "in the last still stretch"), (99.0, "after the end")]
    results = pipe.run(asked)
    for (at, question), ctx in zip(asked, results):
        last = max(t for t in times if t <= at + 1e-9)
        stream_time, formed = at_retrieval[question]
        assert stream_time == pytest.approx(last) and ctx.stream_time == pytest.approx(last), question
        assert formed == sum(1 for i in kept if times[i] <= at + 1e-9), question
        assert all(f["t"] <= at + 1e-9 for f in ctx.short_term), question
        assert all(n["t_end"] <= at + 1e-9 for n in ctx.tree_path + ctx.knowledge), question
    assert pipe.summary()["frames_formed"] == len(kept)


def test_gate_hook_sees_every_decoded_frame_once():
    frames = _frames()
    seen = []
    pipe = StreamPipeline([(i / 10.0, f) for i, f in enumerate(frames)], PixelEncoder(), HashingTextEncoder(),
                          config=_config(), gate_hook=seen.append, gate_batch=7)
    pipe.run()
    indices = [i for b in seen for i in b.indices]
    assert indices == list(range(len(frames)))
    assert [t for b in seen for t in b.timestamps] == [i / 10.0 for i in range(len(frames))]
    assert all(b.frames.shape[0] == len(b.indices) == len(b.scores) == len(b.kept) for b in seen)
    decided = [i for b in seen for i, k in zip(b.indices, b.kept) if k]
    assert decided == select_frames(frames, THRESHOLD, size=None)
    # The scores are the gate's own: a fresh MotionGate over the same frames gives the same numbers.
    reference_scores, _ = MotionGate(THRESHOLD, size=None).push(frames)
    np.testing.assert_allclose([s for b in seen for s in b.scores], reference_scores, rtol=1e-5, atol=1e-6)
