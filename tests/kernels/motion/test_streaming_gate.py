"""StreamingMotionGate, the motion gate over a stream: its scores are motion_magnitude's on the stacked
frames, its decisions select_frames_mask's, its state the reference frame's working-size gray; on the
C++ backend its native steps give the general path's numbers bit for bit."""
import io

import numpy as np
import pytest
import torch

from tests.support.motion_clips import MovingObject, moving_object_clip
from streammem_kernels import StreamingMotionGate, motion_magnitude, select_frames_mask
from streammem_kernels.runtime.dispatch import load_native


@pytest.mark.parametrize("reference", ["previous", "last_kept"])
@pytest.mark.parametrize("kind", ["gray_uint8", "gray_float32", "rgb_tensor"])
def test_gate_scores_equal_motion_magnitude_on_the_full_frames(kind, reference):
    """The gate keeps its reference frame's working-size gray and converts each frame once; its
    scores are motion_magnitude's on the stacked full-size frames, bit for bit, when the caller
    reuses its buffer (gray frames at the working size are views of it before the gate copies
    them), across batches and a state_dict round trip."""
    rng = np.random.default_rng(3)
    frames = rng.integers(0, 256, (7, 24, 32) if kind != "rgb_tensor" else (7, 24, 32, 3), dtype=np.uint8)
    frames[3] = frames[2]  # a still frame
    if kind == "gray_float32":
        frames = frames.astype(np.float32) / 255.0
    size = None if kind != "rgb_tensor" else 20
    gate = StreamingMotionGate(0.3, size=size, reference=reference)
    buffer = np.empty_like(frames[:2])
    scores, kept, anchors = [], [], [0]
    for start in range(0, len(frames), 2):
        n = min(2, len(frames) - start)
        buffer[:n] = frames[start:start + n]
        batch = torch.from_numpy(buffer[:n]) if kind == "rgb_tensor" else buffer[:n]
        s, k = gate.push(batch)
        buffer[:] = 0  # the caller reuses its buffer at once
        scores += s
        kept += k
        if start == 2:  # restore into a fresh gate mid-stream
            state = gate.state_dict()
            gate = StreamingMotionGate(0.3, size=size, reference=reference)
            gate.load_state_dict(state)
    for t in range(1, len(frames)):
        pair = np.stack([frames[anchors[-1]], frames[t]])
        want = float(motion_magnitude(pair, size=size).score[0])
        assert scores[t] == want, (t, scores[t], want)
        assert kept[t] == (want > 0.3)
        if reference == "previous" or kept[t]:
            anchors.append(t)
    assert kept[0] and not kept[3]


def _reloaded(state):
    """``state`` through torch.save and torch.load(weights_only=True), as checkpoints travel."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("reference", ["previous", "last_kept"])
@pytest.mark.parametrize("as_tensor", [False, True], ids=["numpy", "tensor"])
def test_gate_state_holds_the_reference_gray_and_refuses_the_raw_frame_layout(reference, as_tensor):
    """The gate keeps (and checkpoints) its reference frame's working-size gray, not the full-size
    frame: no copy of the frame per push, nothing of a batch's other grays held.  The state
    continues the stream exactly as the gate that never stopped; the stream's frame shape and dtype
    survive the round trip, and a gate of another size refuses the state.  A state of the earlier
    layout (the raw reference frame under "anchor") is refused with the layout version named."""
    rng = np.random.default_rng(5)
    frames = rng.integers(0, 256, (9, 48, 64, 3), dtype=np.uint8)
    frames[4] = frames[3]  # a still frame: dropped in both modes
    frames = torch.from_numpy(frames) if as_tensor else frames
    full = StreamingMotionGate(0.3, size=32, reference=reference)
    want = full.push(frames)
    gate = StreamingMotionGate(0.3, size=32, reference=reference)
    first = gate.push(frames[:4])
    state = gate.state_dict()
    assert "anchor" not in state and tuple(state["anchor_gray"].shape) == (24, 32)
    assert state["anchor_gray"].untyped_storage().nbytes() == 24 * 32 * 4
    assert gate._anchor_gray.untyped_storage().nbytes() == 24 * 32 * 4  # not the batch's four grays
    anchor = 3 if reference == "previous" else max(t for t in range(4) if first[1][t])
    legacy = {"anchor": torch.as_tensor(frames[anchor]).clone(), "anchor_is_numpy": not as_tensor,
              "frames_seen": 4, "frames_kept": sum(first[1])}
    with pytest.raises(ValueError, match="layout version 1"):
        StreamingMotionGate(0.3, size=32, reference=reference).load_state_dict(_reloaded(legacy))
    for saved in (state,):
        restored = StreamingMotionGate(0.3, size=32, reference=reference)
        restored.load_state_dict(_reloaded(saved))
        rest = restored.push(frames[4:])
        assert (first[0] + rest[0], first[1] + rest[1]) == want
        assert not want[1][4] and (restored.frames_seen, restored.frames_kept) == (9, full.frames_kept)
        with pytest.raises(ValueError, match="frame shape"):
            restored.push(frames[:1, :40])
        other = torch.as_tensor(frames[:1]).float() / 255 if not as_tensor else frames[:1].numpy()
        with pytest.raises(ValueError, match="dtype"):
            restored.push(other)
    with pytest.raises(ValueError, match="anchor_gray"):
        StreamingMotionGate(0.3, size=48, reference=reference).load_state_dict(_reloaded(state))
    # A gate that has seen nothing: the next frame starts the stream.
    for empty in (StreamingMotionGate(0.3).state_dict(),):
        fresh = StreamingMotionGate(0.3, size=32, reference=reference)
        fresh.load_state_dict(_reloaded(empty))
        assert fresh.push(frames[:2])[1][0] is True


@pytest.mark.parametrize("reference", ["previous", "last_kept"])
def test_native_gate_step_equals_the_general_path(monkeypatch, reference):
    """Contiguous uint8 frames that the C++ backend shrinks take one C++ gate step per push
    ("previous") or per frame ("last_kept"): gray written after the reference's, LK and score.
    Scores, decisions and the kept reference gray must be the general path's bit for bit (the
    same frames as non-contiguous views take it), over batches of 1 and 3, numpy and tensors; a
    spy checks which path ran, and the reference gray of a batch holds one frame, not the batch.
    (Batches of different sizes may differ in the last bit: the C++ LK splits a pair into row
    strips by the number of pairs, and sums the strips in that order.)"""
    from streammem_kernels.motion import streaming
    from streammem_kernels.runtime.dispatch import load_native

    mod, why = load_native("cpu", "motion")
    if mod is None:
        pytest.skip(why)
    rng = np.random.default_rng(9)
    frames = rng.integers(0, 256, (10, 30, 40, 3), dtype=np.uint8)
    frames[5] = frames[4]
    frames[6] = frames[4]  # still frames: dropped, so "last_kept" keeps an older reference
    padded = np.zeros((10, 30, 40, 4), dtype=np.uint8)
    padded[..., :3] = frames
    strided = padded[..., :3]  # the same frames, not contiguous: the general path
    calls = []  # frames per C++ step, the allocating step's and the bound one-frame step's
    native_step, bound_score = streaming._gate_step_cpp, streaming._BoundGateStep.score
    monkeypatch.setattr(streaming, "_gate_step_cpp", lambda *a: calls.append(len(a[1])) or native_step(*a))
    monkeypatch.setattr(streaming._BoundGateStep, "score",
                        lambda self, *a: calls.append(len(a[0])) or bound_score(self, *a))
    for batch in (1, 3):
        for source, native in ((strided, False), (frames, True), (torch.from_numpy(frames), True)):
            calls.clear()
            gate = StreamingMotionGate(0.3, size=24, reference=reference)
            got = ([], [])
            for start in range(0, len(source), batch):
                s, k = gate.push(source[start:start + batch])
                got[0].extend(s)
                got[1].extend(k)
                assert gate._anchor_gray.untyped_storage().nbytes() <= 2 * 18 * 24 * 4
            assert bool(calls) == native, (batch, type(source), calls)
            if native:  # one C++ step per push, or per frame with "last_kept"
                assert len(calls) == (len(source) if reference == "last_kept" else -(-len(source) // batch))
            if native and reference == "last_kept":
                assert set(calls) == {1}  # one frame per call
            if not native:
                want, want_gray = got, gate._anchor_gray
                assert not want[1][5] and not want[1][6] and all(want[1][:5])
            else:
                assert got == want, (batch, type(source))
                assert torch.equal(gate._anchor_gray, want_gray)


@pytest.mark.parametrize("reference", ["previous", "last_kept"])
def test_bound_gate_step_follows_the_reference_it_is_given(reference):
    """The C++ one-frame step keeps the reference gray in a stack of its own.  A reference replaced
    behind it (a push on the general path, a state loaded into a new gate, a reset into frames of
    another size) must be the one it scores against: the scores are those of gates fed the same
    frames on the general path only (non-contiguous views)."""
    if load_native("cpu", "motion")[0] is None:
        pytest.skip("the C++ backend is not built")
    rng = np.random.default_rng(5)
    frames = rng.integers(0, 256, (12, 30, 40, 3), dtype=np.uint8)
    frames[6] = frames[5]  # a still frame: "last_kept" keeps the older reference
    padded = np.zeros((12, 30, 40, 4), dtype=np.uint8)
    padded[..., :3] = frames

    def general(clip):
        gate = StreamingMotionGate(0.3, size=24, reference=reference)
        return [gate.push(clip[t:t + 1])[0][0] for t in range(len(clip))]

    gate = StreamingMotionGate(0.3, size=24, reference=reference)
    got = []
    for t in range(12):
        if t == 8:  # a new gate from the state: the reference comes from a checkpoint
            state = gate.state_dict()
            gate = StreamingMotionGate(0.3, size=24, reference=reference)
            gate.load_state_dict(state)
        got += gate.push((padded[..., :3] if t in (3, 4, 10) else frames)[t:t + 1])[0]
    assert got == general(padded[..., :3])
    gate.reset()
    small = np.ascontiguousarray(frames[:, :20, :28])
    assert [gate.push(small[t:t + 1])[0][0] for t in range(6)] == general(np.asarray(padded[:6, :20, :28, :3]))


@pytest.mark.parametrize("reference", ["previous", "last_kept"])
@pytest.mark.parametrize("backend", ["torch", "cpp"])
def test_streaming_gate_keeps_what_select_frames_mask_keeps(reference, backend):
    """The kernel-level streaming gate, fed a clip in uneven batches, keeps exactly the frames that
    select_frames_mask keeps on the whole clip (the same keep rule on the same float32 scores)."""
    clip = moving_object_clip(14, [MovingObject(size=16, speed=3.0, stop=5), MovingObject(size=12, speed=1.5, start=9)],
                              height=60, width=84, seed=2).frames
    want = select_frames_mask(clip, 0.35, reference=reference, size=32, backend=backend).tolist()
    gate = StreamingMotionGate(0.35, size=32, reference=reference, backend=backend)
    kept = []
    for a, b in ((0, 1), (1, 4), (4, 9), (9, 14)):
        kept += gate.push(clip[a:b])[1]
    assert kept == want and 0 < sum(kept) < len(kept)


# --------------------------------------------------------------------------
# Checkpoints: every field of a restored state checked; the gate's own file
# --------------------------------------------------------------------------
def _gate_after(frames=5, reference="previous"):
    rng = np.random.default_rng(11)
    gate = StreamingMotionGate(0.3, size=32, reference=reference)
    gate.push(rng.integers(0, 256, (frames, 24, 32, 3), dtype=np.uint8))
    return gate


def _edit(**changes):
    def edit(state):
        for key, value in changes.items():
            state[key] = value(state) if callable(value) else value
        return state
    return edit


@pytest.mark.parametrize("edit, field", [
    (_edit(anchor_gray=lambda s: s["anchor_gray"].fill_(float("nan"))), "anchor_gray"),
    (_edit(anchor_gray=lambda s: s["anchor_gray"] * 3), "anchor_gray"),
    (_edit(anchor_gray=lambda s: s["anchor_gray"][:, :5]), "anchor_gray"),
    (_edit(anchor_gray=None), "anchor_gray"),
    (_edit(frames_seen=-1), "frames_seen"),
    (_edit(frames_seen="5"), "frames_seen"),
    (_edit(frames_kept=lambda s: s["frames_seen"] + 1), "frames_kept"),
    (_edit(frames_kept=0), "frames_kept"),
    (_edit(frame_shape=[24, 32, 7]), "frame_shape"),
    (_edit(frame_shape=[24, -32, 3]), "frame_shape"),
    (_edit(frame_dtype="object"), "frame_dtype"),
    (_edit(anchor_is_numpy="yes"), "anchor_is_numpy"),
    (_edit(version=7), "version"),
])
def test_gate_load_state_dict_refuses_each_invalid_field_naming_it(edit, field):
    """A restored gate state was trusted field by field; each invalid field is now a ValueError
    naming it, and the gate is left as it was."""
    state = edit(_gate_after().state_dict())
    gate = StreamingMotionGate(0.3, size=32)
    with pytest.raises(ValueError, match=rf"field '{field}(\[\d+\])?'"):
        gate.load_state_dict(state)
    assert gate.frames_seen == 0 and gate.state_dict()["anchor_gray"] is None


def test_gate_save_load_continues_the_stream_and_damaged_files_are_refused(tmp_path):
    from tests.support.checkpoint_checks import assert_damage_refused_or_identical, assert_plain_torch_file_refused

    rng = np.random.default_rng(12)
    frames = rng.integers(0, 256, (8, 24, 32, 3), dtype=np.uint8)
    whole = StreamingMotionGate(0.2, size=32, reference="last_kept")
    want = whole.push(frames)
    gate = StreamingMotionGate(0.2, size=32, reference="last_kept")
    first = gate.push(frames[:5])
    path = tmp_path / "gate.ckpt"
    gate.save(path)
    back = StreamingMotionGate.load(path)
    assert back.params() == gate.params()
    rest = back.push(frames[5:])
    assert (first[0] + rest[0], first[1] + rest[1]) == want

    def same(loaded):
        a, b = loaded.state_dict(), gate.state_dict()
        return loaded.params() == gate.params() and torch.equal(a["anchor_gray"], b["anchor_gray"]) and \
            (a["frames_seen"], a["frames_kept"]) == (b["frames_seen"], b["frames_kept"])

    assert assert_damage_refused_or_identical(path, lambda: StreamingMotionGate.load(path), same) > 40
    assert_plain_torch_file_refused(path, lambda: StreamingMotionGate.load(path), gate.state_dict())


_KILL_FRAMES = None


def _gate_writer_setup(path):
    global _KILL_FRAMES
    _KILL_FRAMES = np.random.default_rng(13).integers(0, 256, (64, 24, 32), dtype=np.uint8)


def _gate_writer(path, step):
    """Each step pushes one more frame into a gate of this child and saves it."""
    global _KILL_GATE
    if step % 1_000_000 == 1:
        _KILL_GATE = StreamingMotionGate(0.3, size=None)
    _KILL_GATE.push(_KILL_FRAMES[step % 64][None])
    _KILL_GATE.save(path)


def test_a_gate_writer_killed_at_random_points_leaves_a_whole_gate(tmp_path):
    """Killed 24 times at random instants while pushing and saving: every load is a whole gate (its
    reference gray is one of the frames pushed, its counters consistent), never a torn file."""
    from tests.support.checkpoint_checks import temporaries
    from tests.support.kill_points import kill_writer

    path = tmp_path / "gate.ckpt"
    _gate_writer_setup(str(path))
    StreamingMotionGate(0.3, size=None).save(path)

    def check():
        gate = StreamingMotionGate.load(path)
        if gate.frames_seen:
            anchor = gate.state_dict()["anchor_gray"].numpy()  # uint8 frames at their own size: the frame
            assert any(np.array_equal(anchor, f) for f in _KILL_FRAMES)
        return gate.frames_seen

    seen = kill_writer(__file__, "_gate_writer", [str(path)], check, kills=24, max_delay=0.1,
                       setup="_gate_writer_setup")
    assert len(set(seen)) > 1
    StreamingMotionGate(0.3, size=None).save(path)
    assert temporaries(tmp_path) == []
