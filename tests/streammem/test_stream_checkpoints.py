"""StreamMemory checkpoints you can trust: a checksummed file (flipped bits and truncations refused
naming the file), every field checked on load (naming it), atomic saves that a kill at any
instant leaves whole and whose temporaries the next save removes."""
import numpy as np
import pytest

from tests.support.checkpoint_checks import (
    assert_damage_refused_or_identical, assert_plain_torch_file_refused, edit_field, same_state, temporaries,
)
from tests.support.kill_points import kill_writer

from streammem import HashingTextEncoder, MemoryConfig, PixelEncoder, Preset, StreamMemory, SyntheticVideo

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

COLOURS = ["red", "green", "blue", "yellow", "purple", "cyan"]


def _frames():
    video = SyntheticVideo(COLOURS, [12, 14, 10, 16, 12, 14], size=(16, 16), fps=10.0, seed=3)
    frames = np.stack([f for _, f in video])
    return [i / 10.0 for i in range(len(frames))], frames


def _memory():
    config = MemoryConfig(preset=Preset("t", 0.1, 6, 3, 2), motion_size=None)
    return StreamMemory(config, PixelEncoder(), HashingTextEncoder(64))


def _filled(stop=60):
    times, frames = _frames()
    memory = _memory()
    for i in range(0, stop, 6):
        memory.push(times[i:i + 6], frames[i:i + 6])
    memory.ask("what colour was it?")
    return memory


def _scaled(t, value):
    t = t.clone()
    t[0] = value
    return t


@pytest.mark.parametrize("field, change", [
    ("long_term.nodes.embedding", lambda t: _scaled(t, float("nan"))),
    ("long_term.nodes.embedding", lambda t: _scaled(t, 1e30)),
    ("long_term.nodes.centres", lambda t: _scaled(t, float("nan"))),
    ("long_term.nodes.children", lambda c: [[10_000] + list(k) for k in c]),
    ("long_term.nodes.parent", lambda p: [10_000] + list(p[1:])),
    ("long_term.nodes.access_count", lambda c: [-1] + list(c[1:])),
    ("long_term.next_id", 0),
    ("counters.frames_seen", -5),
    ("counters.questions", "3"),
    ("stream_time", float("nan")),
    ("stream_time", "5.0"),
    ("short_term.buffer.feature", lambda t: _scaled(t, float("inf"))),
    ("events.knowledge_base.embedding", lambda t: _scaled(t, 1e30)),
    ("dialogue.timestamp", lambda t: [float("nan")] * max(1, len(t))),
    ("timings", lambda t: dict(t, caption=-1.0)),
])
def test_streammemory_load_refuses_each_invalid_field_naming_it(field, change):
    """NaN or 1e30 embeddings, NaN centres, out-of-range children, negative counters and a NaN or
    string stream_time were accepted (and ask() then returned NaN scores); each is now a ValueError
    naming the field, before the memory changes."""
    state = edit_field(field, change)(_filled().state_dict())
    fresh = _memory()
    top = field.split(".")[0]
    with pytest.raises(ValueError, match=rf"field '{top}[^']*'"):
        fresh.load_state_dict(state)
    assert fresh.frames_seen == 0 and not fresh.long_term.nodes


def test_streammemory_damaged_files_are_refused_naming_the_file(tmp_path):
    """Single-bit flips loaded silently with different contents in 48/48 trials (no checksum); every
    flip and truncation is now refused naming state.pt, or loads the identical state."""
    memory = _filled()
    folder = memory.save(tmp_path / "m")
    want = memory.state_dict()
    path = folder / "state.pt"

    def load():
        return StreamMemory.load(folder, PixelEncoder(), HashingTextEncoder(64))

    def same(back):
        got = back.state_dict()
        got["timings"] = want["timings"]  # wall-clock timings are not part of the compared state
        return same_state(got, want)

    assert assert_damage_refused_or_identical(path, load, same, flips=24, cuts=8) > 30
    assert_plain_torch_file_refused(path, load, want)


@pytest.mark.parametrize("content", [b"", b"\x00" * 7, bytes(range(256)) * 40, b"SMKCKPT\x00" + b"\xff" * 90])
def test_streammemory_empty_random_or_hostile_file_is_one_value_error(tmp_path, content):
    """EOFError, UnpicklingError, KeyError... were raised raw; now one ValueError naming the file."""
    folder = _filled(12).save(tmp_path / "m")
    (folder / "state.pt").write_bytes(content)
    with pytest.raises(ValueError, match="state.pt"):
        StreamMemory.load(folder)


_KILL = {}


def _writer_setup(folder):
    _KILL["times"], _KILL["frames"] = _frames()
    _KILL["memory"] = _memory()


def _push_and_save(folder, step):
    """Each step pushes three more frames (the stream restarts after 72) and saves."""
    memory, times, frames = _KILL["memory"], _KILL["times"], _KILL["frames"]
    i = (step % 1_000_000) * 3 % 72
    if i == 0:
        memory = _KILL["memory"] = _memory()
    memory.push(times[i:i + 3], frames[i:i + 3])
    memory.save(folder)


def test_a_streammemory_writer_killed_at_random_points_leaves_a_whole_memory(tmp_path):
    """An interrupted save left a checkpoint-sized *.tmp that was never removed; killed 24 times at
    random instants, every load afterwards is a whole memory of some step, and the next save sweeps
    what the killed writers left."""
    folder = tmp_path / "m"
    _writer_setup(str(folder))
    _memory().save(folder)

    def check():
        memory = StreamMemory.load(folder, PixelEncoder(), HashingTextEncoder(64))
        assert memory.frames_seen % 3 == 0 and memory.frames_seen <= 72
        return memory.frames_seen

    seen = kill_writer(__file__, "_push_and_save", [str(folder)], check, kills=24, max_delay=0.15,
                       setup="_writer_setup")
    assert len(set(seen)) > 1
    _filled(6).save(folder)
    assert temporaries(folder) == []


def test_asking_a_restored_memory_never_scores_nan(tmp_path):
    memory = _filled()
    folder = memory.save(tmp_path / "m")
    back = StreamMemory.load(folder)
    ctx = back.ask("what colour was it?")
    scores = [node["score"] for node in ctx.tree_path] + [ctx.confidence]
    assert len(scores) > 1 and all(np.isfinite(s) for s in scores)
